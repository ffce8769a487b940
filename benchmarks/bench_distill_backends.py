"""Distillation of the RF demo on both backends, side by side in one run (issue 15).

    python benchmarks/bench_distill_backends.py --json benchmarks/results/distill_backends.json

Each backend distils `configs/rf_demo.yaml` cold (a fresh run folder and call cache) in its
own process: transformers fp32 for everything, then CTranslate2 (int8 weights, the default
thread layout) for generation with scoring left where `scoring: auto` puts it (the
verifier's log-likelihood stays on transformers: int8 scoring failed its parity check).
Reported: wall seconds, model calls made, calls per second, tokens generated, samples
accepted (MC / open / benchmark items), and the ratios.
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
BACKENDS = {"transformers": [], "ctranslate2": ["-s", "models.chat.backend=ctranslate2"]}


def run(backend: str, extra: list[str], folder: Path, config: str) -> dict:
    cmd = [sys.executable, "-m", "workbench", "distill", "run", config,
           "-s", f"output_dir={folder}", "-s", f"name=distill_{backend}", *extra]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{backend}: exit {p.returncode}\n{p.stderr[-3000:]}")
    rep = json.loads((folder / f"distill_{backend}" / "distill" / "report.json").read_text())
    calls = rep["model_calls"]
    return {"backend": backend, "wall_s": round(wall, 1), "distill_s": rep["seconds"],
            "calls": calls["made"], "calls_per_s": round(calls["made"] / rep["seconds"], 3),
            "completion_tokens": calls["completion_tokens"],
            "accepted": rep["accepted"]["total"], "mc": rep["accepted"]["mc"],
            "nd": rep["accepted"]["nd"], "benchmark_items": rep["accepted"]["benchmark_items"],
            "models": rep["models"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/rf_demo.yaml")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in BACKENDS.items():
            rows.append(run(name, extra, Path(tmp) / name, a.config))
            print(json.dumps(rows[-1]), flush=True)
    t, c = rows
    print("\n| backend | distil s | model calls | calls/s | tokens generated | accepted "
          "(mc / open) | benchmark items |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['distill_s']:.0f} | {r['calls']} | {r['calls_per_s']} | "
              f"{r['completion_tokens']} | {r['accepted']} ({r['mc']} / {r['nd']}) | "
              f"{r['benchmark_items']} |")
    print(f"\nwall ratio transformers / ctranslate2: {t['distill_s'] / c['distill_s']:.2f}x; "
          f"calls/s ratio: {c['calls_per_s'] / t['calls_per_s']:.2f}x")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"rows": rows, "ratio": t["distill_s"] / c["distill_s"]},
                                     indent=1))


if __name__ == "__main__":
    main()
