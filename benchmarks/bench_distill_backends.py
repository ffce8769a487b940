"""Distillation of the RF demo on each generation engine, side by side in one run (issues 15,
42).

    python benchmarks/bench_distill_backends.py --backends transformers,llamacpp \
        --json benchmarks/results/distill_engines.json

Each backend distils `configs/rf_demo.yaml` cold (a fresh run folder and call cache) in its
own process: transformers fp32 for everything, then CTranslate2 (int8 weights, the default
thread layout) for generation with scoring left where `scoring: auto` puts it (the
verifier's log-likelihood stays on transformers: int8 scoring failed its parity check).
llama.cpp (issue 42) generates from the f16 copy of the GGUF that it decodes by default
(`llamacpp`, with llama.cpp's host-memory prompt cache at its default size;
`llamacpp-nopromptcache` without it; `llamacpp-promptcache` with 1 GiB of it, as measured
before it was the default; `llamacpp-deterministic`: one slot, each prompt alone, replies the same run after run) or
from the Q4_1 file as it ships (`llamacpp-file`), with scoring (the
verifier's log-likelihood) on transformers. Reported: wall seconds, model calls made, calls per second,
tokens generated, samples accepted (MC / open / benchmark items) with Wilson intervals over
the tasks written, rejects per gate, verifier agreement, each engine's acceptance against
the first one's (Fisher's exact test, and exact McNemar over the same tasks: each task kept
or not on both engines), and the ratios. A backend named twice runs twice (its own folder
each time): `same_as` says which earlier run wrote byte-identical samples and items.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BACKENDS = {"transformers": ["-s", "models.chat.backend=transformers"],
            "llamacpp": ["-s", "models.chat.backend=llamacpp"],
            "llamacpp-file": ["-s", "models.chat.backend=llamacpp",
                              "-s", "models.chat.options.weights=file"],
            "llamacpp-nopromptcache": ["-s", "models.chat.backend=llamacpp",
                                       "-s", "models.chat.options.prompt_cache_mib=0"],
            "llamacpp-promptcache": ["-s", "models.chat.backend=llamacpp",
                                     "-s", "models.chat.options.prompt_cache_mib=1024"],
            "llamacpp-deterministic": ["-s", "models.chat.backend=llamacpp",
                                       "-s", "models.chat.options.deterministic=true"],
            "ctranslate2": ["-s", "models.chat.backend=ctranslate2"]}


def run(backend: str, extra: list[str], folder: Path, config: str) -> dict:
    cmd = [sys.executable, "-m", "workbench", "distill", "run", config,
           "-s", f"output_dir={folder}", "-s", f"name=distill_{backend}", *extra]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{backend}: exit {p.returncode}\n{p.stderr[-3000:]}")
    out = folder / f"distill_{backend}" / "distill"
    rep = json.loads((out / "report.json").read_text())
    calls = rep["model_calls"]
    return {"backend": backend, "wall_s": round(wall, 1), "distill_s": rep["seconds"],
            "calls": calls["made"], "calls_per_s": round(calls["made"] / rep["seconds"], 3),
            "completion_tokens": calls["completion_tokens"],
            "accepted": rep["accepted"]["total"], "mc": rep["accepted"]["mc"],
            "nd": rep["accepted"]["nd"], "benchmark_items": rep["accepted"]["benchmark_items"],
            "written": _written(rep), "rejects": rep["rejects"],
            "verifier": rep["verifier"], "models": rep["models"],
            "tasks": rep["stages"]["tasks"], "accepted_tasks": sorted(_accepted_tasks(out)),
            "outputs_sha256": _outputs_hash(out)}


def _outputs_hash(out: Path) -> str:
    """One hash of the samples and benchmark items written (run to run: the same text?)."""
    import hashlib

    h = hashlib.sha256()
    for name in ("mcQTSA.jsonl", "ndQTSA.jsonl", "benchmark.jsonl"):
        h.update((out / name).read_bytes())
    return h.hexdigest()


def _accepted_tasks(out: Path) -> set[str]:
    """The tasks (span, perspective, kind) that gave a kept sample or benchmark item: the same
    task list on every engine (it comes from the sections and the seed), so each task is a
    pair of outcomes. (With `benchmark_per_fact` a span has several benchmark tasks; they
    count as one here.)"""
    keys = set()
    for name, kind in (("mcQTSA.jsonl", None), ("ndQTSA.jsonl", None),
                       ("benchmark.jsonl", "mc")):
        for line in (out / name).read_text().splitlines():
            r = json.loads(line)
            p = r["provenance"]
            keys.add(f"{p['section_id']}:{p.get('span_hash')}:{p['perspective']}:"
                     f"{kind or r['kind']}")
    return keys


def _paired_p(a: dict, b: dict) -> tuple[int, int, float]:
    """Exact McNemar over the tasks: (kept by a only, kept by b only, p)."""
    from workbench.evaluate.stats import mcnemar_exact

    assert a["tasks"] == b["tasks"], "the engines planned different tasks"
    both = sorted(set(a["accepted_tasks"]) | set(b["accepted_tasks"]))
    ka = [k in a["accepted_tasks"] for k in both]
    kb = [k in b["accepted_tasks"] for k in both]
    return sum(x and not y for x, y in zip(ka, kb)), sum(y and not x for x, y in zip(ka, kb)), \
        mcnemar_exact(ka, kb)


def _written(rep: dict) -> int:
    """Tasks that reached the gates: accepted + every reject counted."""
    return rep["accepted"]["total"] + sum(rep["rejects"].values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/rf_demo.yaml")
    ap.add_argument("--backends", default="transformers,llamacpp,ctranslate2")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    from scipy.stats import fisher_exact

    from workbench.evaluate.stats import wilson_interval

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(a.backends.split(",")):
            rows.append(run(name, BACKENDS[name], Path(tmp) / f"{i}-{name}", a.config))
            rows[-1]["same_as"] = [j for j, r in enumerate(rows[:-1])
                                   if r["outputs_sha256"] == rows[-1]["outputs_sha256"]]
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "accepted_tasks"}),
                  flush=True)
    t = rows[0]
    print("\n| backend | distil s | model calls | calls/s | tokens generated | accepted "
          "(mc / open) of written [95% CI] | benchmark items | verifier agreement |"
          " p vs first (Fisher) | tasks kept only by first / only by this, p (McNemar) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        lo, hi = wilson_interval(r["accepted"], r["written"])
        r["acceptance_ci"] = [lo, hi]
        r["p_vs_first"] = fisher_exact(
            [[r["accepted"], r["written"] - r["accepted"]],
             [t["accepted"], t["written"] - t["accepted"]]])[1]
        only_first, only_this, r["p_paired_vs_first"] = _paired_p(t, r)
        r["discordant_vs_first"] = [only_first, only_this]
        v = r["verifier"]
        agree = f"{v['agreed']}/{v['checked']}" if v["checked"] else "-"
        print(f"| {r['backend']} | {r['distill_s']:.0f} | {r['calls']} | {r['calls_per_s']} | "
              f"{r['completion_tokens']} | {r['accepted']} ({r['mc']} / {r['nd']}) of "
              f"{r['written']} [{100 * lo:.0f}, {100 * hi:.0f}]% | {r['benchmark_items']} | "
              f"{agree} | {r['p_vs_first']:.2f} | {only_first} / {only_this}, "
              f"{r['p_paired_vs_first']:.2f} |")
    gates = sorted({g for r in rows for g in r["rejects"]})
    print("\n| rejects by gate | " + " | ".join(r["backend"] for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for g in gates:
        print(f"| {g} | " + " | ".join(str(r["rejects"].get(g, 0)) for r in rows) + " |")
    ratios = {f"{i}-{r['backend']}": t["distill_s"] / r["distill_s"]
              for i, r in enumerate(rows) if i}
    for i, r in enumerate(rows):
        if r["same_as"]:
            print(f"run {i} ({r['backend']}) wrote the same samples and items as run(s) "
                  f"{r['same_as']}")
    print("\nwall ratio " + ", ".join(f"{t['backend']} / {k}: {v:.2f}x"
                                      for k, v in ratios.items()))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"rows": rows, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
