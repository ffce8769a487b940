"""Distillation quality gates on real text (issue 30, item 6): gates off vs on.

    python benchmarks/distill_gates.py                  # distil (3 documents x 2), then score
    python benchmarks/distill_gates.py --score-only     # re-score after editing judgements

For each of three real documents of different kinds (`benchmarks/realdocs.py`: a manual, a
standard, lecture notes; found or fetched at run time, nothing committed), the first N
sections (default 24) are distilled with the bundled SmolLM2-135M teacher the way the issue
ran it: `configs/rf_demo.yaml` (composed mode, answers taken from the text, constrained
decoding, verifier flags) with the generic pack, all five perspectives and no cap on training
tasks. Once with `distill.gates.enabled=false`, then with the gates on: the same tasks, and
the second run starts from the first run's call cache, so it makes no new model call except
the verifier's for a question whose echoed prefix was stripped.

Written:
- `benchmarks/results/distill_gates/<doc>.json`: every question either run accepted or the
  gates removed (question, section, kind, split, accepted off/on, the gate that removed it
  with its reason), with a careful reader's judgement of each (reject/accept and a one-line
  reason) from `benchmarks/results/distill_gates_judgements.json` (written by hand: a
  question missing there is listed as "unjudged");
- `benchmarks/results/distill_gates.json`: per document and in all, the accepted samples,
  how many the reader would reject, off and on, as shares with Wilson 95% intervals; what
  each gate removed; of the removed questions, how many the reader would have rejected too.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from realdocs import DOCS, cache_dir, prepare  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
JUDGEMENTS = RESULTS / "distill_gates_judgements.json"
SETTINGS = ["-s", "domain=generic", "-s", "distill.perspectives=null",
            "-s", "distill.max_train_tasks=null"]


def _copy_db(src: Path, dst: Path) -> None:
    """A call cache copied through SQLite (its WAL may hold rows the file does not yet)."""
    import sqlite3

    with sqlite3.connect(f"file:{src}?mode=ro", uri=True) as a, sqlite3.connect(dst) as b:
        a.backup(b)


def distil(doc: str, corpus: Path, work: Path, n: int, gates_on: bool,
           config: str) -> dict:
    name = f"{doc}_{'on' if gates_on else 'off'}"
    run = work / name / "distill"
    if gates_on:  # start from the gates-off run's calls: the same tasks, no new generation
        run.mkdir(parents=True, exist_ok=True)
        src = work / f"{doc}_off" / "distill" / "calls.sqlite"
        if src.exists() and not (run / "calls.sqlite").exists():
            _copy_db(src, run / "calls.sqlite")
    cmd = [sys.executable, "-m", "workbench", "distill", "run", config,
           "-s", f"output_dir={work}", "-s", f"name={name}", "-s", f"distill.corpus={corpus}",
           "-s", f"distill.max_sections={n}", "-s", "cache.enabled=true",
           "-s", f"distill.gates.enabled={'true' if gates_on else 'false'}", *SETTINGS]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise SystemExit(f"{name}: exit {p.returncode}\n{p.stderr[-3000:]}")
    print(f"{name}: {time.perf_counter() - t0:.0f} s", flush=True)
    return {"run": run, "command": " ".join(["workbench", *cmd[3:]])}


def _samples(run: Path) -> list[dict]:
    out = []
    for f in ("mcQTSA.jsonl", "ndQTSA.jsonl"):
        for line in (run / f).read_text(encoding="utf-8").splitlines():
            out.append(json.loads(line))
    return out


def _row(s: dict, accepted_off: bool) -> dict:
    gold = s["answer"] if s["kind"] == "nd" else s["options"]["ABCD".index(s["answer"][0])]
    return {"question": s["question"], "kind": s["kind"], "split": s["split"],
            "answer": gold, "section_id": s["provenance"]["section_id"],
            "accepted_off": accepted_off, "accepted_on": False}


def absent_names(question: str, section: dict) -> list[str]:
    """The names in a question (the named_entities gate's rules) its section lacks."""
    from workbench.distill import gates

    hay = (" > ".join(section.get("heading_path", [])) + "\n" + section.get("text", "")).lower()
    return [e for e in gates.named_entities(question)
            if not gates.occurs(e, hay, gates.stems(hay))]


def collect(doc: str, off: Path, on: Path) -> dict:
    """Every question either run accepted (keyed by its text), with what the gates said."""
    sections = {x["id"]: x for x in map(json.loads, (on / "sections.jsonl").read_text(
        encoding="utf-8").splitlines())}
    rows: dict[str, dict] = {}
    for s in _samples(off):
        rows[s["question"]] = _row(s, True)
    for s in _samples(on):
        r = rows.setdefault(s["question"], _row(s, False))
        r["accepted_on"] = True
        r["flags"] = s["flags"]
    for g in map(json.loads, (on / "gates.jsonl").read_text(encoding="utf-8").splitlines()):
        r = rows.get(g.get("stripped_to", g["question"])) or rows.get(g["question"])
        if r is None:
            continue  # accepted by neither run (removed by the gates and by dedup)
        if g.get("stripped_to"):
            r["stripped_from"] = g["question"]
        r["task"] = g["task"]
        if g["removed_by"]:
            v = g["verdicts"][g["removed_by"]]
            r["removed_by"] = g["removed_by"]
            r["gate_reason"] = f"{v.get('reason', '')}: {v.get('detail', '')}".strip(": ")
        elif g["final"] != "accepted":
            r["later_rejected_on"] = g["final"]
    for r in rows.values():
        sec = sections.get(r["section_id"], {})
        r["section"] = " > ".join(sec.get("heading_path", []))
        r["absent_names"] = absent_names(r["question"], sec)
    return {"doc": doc, "samples": sorted(rows.values(), key=lambda r: (r["section_id"],
                                                                        r["question"]))}


def _wilson(k: int, n: int) -> list[float]:
    from workbench.evaluate.stats import wilson_interval

    lo, hi = wilson_interval(k, n)
    return [round(lo, 3), round(hi, 3)]


def score(docs: dict[str, dict], judgements: dict[str, dict[str, dict]]) -> dict:
    table, pooled = {}, {"off": [0, 0], "on": [0, 0], "removed": [0, 0], "unjudged": 0}
    for doc, d in docs.items():
        marks = judgements.get(doc, {})
        for r in d["samples"]:
            j = marks.get(r["question"])  # [verdict, reason] or {"verdict", "reason"}
            if isinstance(j, list):
                j = {"verdict": j[0], "reason": j[1]}
            r["reader"] = j or {"verdict": "unjudged", "reason": ""}
        row = {}
        for run in ("off", "on"):
            acc = [r for r in d["samples"] if r[f"accepted_{run}"]]
            bad = [r for r in acc if r["reader"]["verdict"] == "reject"]
            judged = [r for r in acc if r["reader"]["verdict"] != "unjudged"]
            row[run] = {"accepted": len(acc), "judged": len(judged), "reader_rejects":
                        len(bad), "share": round(len(bad) / len(judged), 3) if judged
                        else None, "wilson95": _wilson(len(bad), len(judged)),
                        "naming_what_the_section_lacks": sum(bool(r["absent_names"])
                                                             for r in acc)}
            pooled[run][0] += len(bad)
            pooled[run][1] += len(judged)
        removed = [r for r in d["samples"] if r.get("removed_by") and r["accepted_off"]]
        agree = [r for r in removed if r["reader"]["verdict"] == "reject"]
        row["gates_removed"] = {"total": len(removed), "reader_agrees": len(agree),
                                "share_of_reader_rejects": round(len(agree) / max(
                                    1, row["off"]["reader_rejects"]), 3),
                                "share": round(len(agree) / len(removed), 3) if removed
                                else None, "wilson95": _wilson(len(agree), len(removed)),
                                "by_gate": {}}
        for r in removed:
            g = row["gates_removed"]["by_gate"].setdefault(r["removed_by"], [0, 0])
            g[0] += r["reader"]["verdict"] == "reject"
            g[1] += 1
        pooled["removed"][0] += len(agree)
        pooled["removed"][1] += len(removed)
        pooled["unjudged"] += sum(r["reader"]["verdict"] == "unjudged" for r in d["samples"])
        table[doc] = row
    table["all"] = {run: {"reader_rejects": pooled[run][0], "judged": pooled[run][1],
                          "share": round(pooled[run][0] / pooled[run][1], 3)
                          if pooled[run][1] else None,
                          "wilson95": _wilson(*pooled[run])} for run in ("off", "on")}
    table["all"]["gates_removed"] = {"reader_agrees": pooled["removed"][0],
                                     "total": pooled["removed"][1],
                                     "wilson95": _wilson(*pooled["removed"])}
    table["all"]["unjudged"] = pooled["unjudged"]
    return table


def markdown(table: dict) -> str:
    lines = ["| document | accepted, gates off | reader rejects (off) | accepted, gates on | "
             "reader rejects (on) | removed by gates: reader agrees |", "|---|---|---|---|---|---|"]

    def share(x: dict) -> str:
        if x["share"] is None:
            return "n/a"
        lo, hi = x["wilson95"]
        return f"{x['reader_rejects']}/{x['judged']} = {x['share']:.0%} [{lo:.0%}, {hi:.0%}]"

    for doc, row in table.items():
        if doc == "all":
            continue
        g = row["gates_removed"]
        lines.append(f"| {doc} | {row['off']['accepted']} | {share(row['off'])} | "
                     f"{row['on']['accepted']} | {share(row['on'])} | "
                     f"{g['reader_agrees']}/{g['total']} |")
    a = table["all"]
    g = a["gates_removed"]
    lo, hi = g["wilson95"]
    lines.append(f"| all | {a['off']['judged']} | {share(a['off'])} | {a['on']['judged']} | "
                 f"{share(a['on'])} | {g['reader_agrees']}/{g['total']} [{lo:.0%}, {hi:.0%}]"
                 " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", type=int, default=24)
    ap.add_argument("--docs", default=",".join(DOCS))
    ap.add_argument("--work", type=Path, help="run folders (default: <cache>/runs)")
    ap.add_argument("--cache", help="where the documents are prepared (realdocs.py)")
    ap.add_argument("--config", default="configs/rf_demo.yaml")
    ap.add_argument("--score-only", action="store_true")
    a = ap.parse_args()
    folders = prepare(a.cache)
    work = a.work or cache_dir(a.cache) / "runs"
    docs = a.docs.split(",")
    out_dir = RESULTS / "distill_gates"
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {}
    for doc in docs:
        runs = {}
        for on in (False, True):
            if a.score_only:
                runs[on] = {"run": work / f"{doc}_{'on' if on else 'off'}" / "distill"}
            else:
                runs[on] = distil(doc, folders[doc], work, a.sections, on, a.config)
        d = collect(doc, runs[False]["run"], runs[True]["run"])
        reports = {k: json.loads((runs[v]["run"] / "report.json").read_text())
                   for k, v in (("off", False), ("on", True))}
        d["document"] = DOCS[doc]
        d["runs"] = {k: {"tasks": r["stages"]["tasks"], "accepted": r["accepted"]["total"],
                         "seconds": r["seconds"], "model_calls": r["model_calls"]["made"],
                         "from_cache": r["model_calls"]["from_cache"],
                         "verifier": f"{r['verifier']['agreed']}/{r['verifier']['checked']}"}
                     for k, r in reports.items()}
        d["gates"] = [{k: g[k] for k in ("name", "rule", "failed", "removed", "stripped")}
                      for g in reports["on"]["gates"]["gates"]]
        meta[doc] = d
    judgements = json.loads(JUDGEMENTS.read_text()) if JUDGEMENTS.exists() else {}
    table = score(meta, judgements)
    for doc, d in meta.items():
        (out_dir / f"{doc}.json").write_text(json.dumps(d, indent=1, ensure_ascii=False)
                                             + "\n", encoding="utf-8")
    summary = {"command": "python benchmarks/distill_gates.py --sections "
                          f"{a.sections}", "sections": a.sections,
               "settings": f"{a.config} " + " ".join(SETTINGS[1::2]),
               "documents": {doc: {"what": DOCS[doc], "runs": meta[doc]["runs"],
                                   "gates": meta[doc]["gates"]} for doc in meta},
               "reader": table}
    (RESULTS / "distill_gates.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(markdown(table))


if __name__ == "__main__":
    main()
