"""Distillation quality gates on real text (issue 30, item 6): gates off vs on.

    python benchmarks/distill_gates.py                  # distil (3 documents x 2), then score
    python benchmarks/distill_gates.py --score-only     # re-score after editing judgements
    python benchmarks/distill_gates.py --rescore        # today's gates on the judged questions

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

`--rescore` (issue 46, item 3) needs no distillation: it puts every judged question of the
results files through the gates as they are now (the rules, then the likelihood gate, scored
by the bundled model after the question's span as `realdocs.prepare` makes it), tunes the
likelihood floor on the manual alone (the midpoint between the lowest-scoring question the
reader keeps and the highest-scoring one below it that the reader rejects), and reports the
standard and the lecture notes as held out: accepted, reader-rejected share of accepted
(Wilson 95%), good rows lost against the gates before, rejects by gate, the curve of floor vs
precision vs good rows kept, and how well each model score separates good from bad (AUC).
Written: `benchmarks/results/distill_gates_rescore.json` (every question with its scores).
"""

from __future__ import annotations

import argparse
import json
import math
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
        if "likelihood" in g:
            r["likelihood"] = g["likelihood"]["mean_logprob"]
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


# --- --rescore: today's gates on the judged questions (no distillation) --------------------

TUNED_ON = "manual"
GRID = [round(-3.0 + 0.1 * i, 1) for i in range(23)]  # likelihood floors for the curve


def _rows_with_spans(doc: str, folder: Path) -> list[dict]:
    """The judged questions of a document, each with its section and span as the corpus
    reader makes them today (matched by id, else by heading path: the HTML reader no longer
    keeps the headings' '¶', which changed the standard's section ids)."""
    from workbench.corpus import load_sections
    from workbench.distill.config import DistillConfig
    from workbench.distill.write import Stats, make_spans

    secs, _ = load_sections(str(folder))
    by_id = {s.id: s for s in secs}
    by_head = {" > ".join(s.heading_path): s for s in secs}
    spans = make_spans(secs, DistillConfig(corpus=str(folder), domain="generic"), Stats())
    doc_stems: dict[str, set[str]] = {}
    from workbench.distill import gates

    for s in secs:
        doc_stems.setdefault(s.doc_id, set()).update(gates.stems(f"{s.title}\n{s.text}"))
    out = []
    d = json.loads((RESULTS / "distill_gates" / f"{doc}.json").read_text(encoding="utf-8"))
    for r in d["samples"]:
        sec = by_id.get(r["section_id"]) or by_head[r["section"].replace("¶", "")]
        mine = [sp for sp in spans if sp.section.id == sec.id]
        span = next((sp for sp in mine if r["answer"][:60] in sp.text), mine[0])
        out.append(dict(r, doc=doc, _sec=sec, _span=span.text,
                        _doc_stems=doc_stems[sec.doc_id]))
    return out


def _rule_verdicts(rows: list[dict]) -> None:
    """Each question (as the teacher wrote it) through today's rule gates."""
    from workbench.distill import gates
    from workbench.domain_packs import load_pack

    pack = load_pack("generic")
    for r in rows:
        sec = r["_sec"]
        persp = r["task"].split(":")[1] if r.get("task") else ""
        ctx = gates.Context(section_text=sec.text, headings=sec.title, answer=r["answer"],
                            perspective=pack.perspective(persp).name if persp else "",
                            document_stems=r["_doc_stems"])
        res = gates.check(r.get("stripped_from") or r["question"], ctx)
        first = res.removed_by
        r["now_question"] = res.question
        r["rules_removed_by"] = first.gate if first else None
        r["rules_reason"] = f"{first.reason}: {first.detail}" if first else ""


def _scores(rows: list[dict], spec: str, calls: Path) -> None:
    """Each question's likelihood after its span, and the answer's PMI (the scores kept in a
    call cache under the documents' cache folder: a re-run scores nothing again)."""
    from workbench.distill.likelihood import answer_pmi, question_likelihoods
    from workbench.models.backends import load_model
    from workbench.models.cache import CachedModel, CallCache

    model = CachedModel(load_model(spec), CallCache(calls))
    try:
        t0 = time.perf_counter()
        lik = question_likelihoods(model, [(r["_span"], r["now_question"]) for r in rows])
        t1 = time.perf_counter()
        pmi = answer_pmi(model, [(r["now_question"], " ".join(r["answer"].split()))
                                 for r in rows])
        print(f"scored {len(rows)} questions: likelihood {t1 - t0:.0f} s, pmi "
              f"{time.perf_counter() - t1:.0f} s", flush=True)
    finally:
        model.close()
    for r, lk, pm in zip(rows, lik, pmi, strict=True):
        r["likelihood"] = round(lk.mean, 4)
        r["answer_pmi"] = round(pm, 4)


def _verdict(r: dict, judgements: dict) -> str:
    j = judgements.get(r["doc"], {}).get(r["now_question"])
    if j is None and r["now_question"] == r["question"]:
        j = r["reader"]
    if isinstance(j, list):
        return j[0]
    return j["verdict"] if j else "unjudged"


def _tally(rows: list[dict], floor: float) -> dict:
    """Accepted now (the rules pass and the likelihood is at least `floor`) vs the gates
    before (accepted_on), with the reader's verdicts."""
    now = [r for r in rows if r["rules_removed_by"] is None and r["likelihood"] >= floor]
    before = [r for r in rows if r["accepted_on"]]
    bad = [r for r in now if r["verdict"] == "reject"]
    judged = [r for r in now if r["verdict"] != "unjudged"]
    good_before = [r for r in before if r["reader"]["verdict"] == "accept"]
    lost = [r for r in good_before if r not in now]
    by_gate: dict[str, int] = {}
    for r in rows:
        gate = r["rules_removed_by"] or ("likelihood" if r["likelihood"] < floor else None)
        if gate:
            by_gate[gate] = by_gate.get(gate, 0) + 1
    return {"accepted": len(now), "judged": len(judged), "reader_rejects": len(bad),
            "sensible": len(judged) - len(bad),
            "reject_share": round(len(bad) / len(judged), 3) if judged else None,
            "wilson95": _wilson(len(bad), len(judged)),
            "good_before": len(good_before), "good_kept": len(good_before) - len(lost),
            "good_lost": [r["now_question"] for r in lost],
            "good_gained": [r["now_question"] for r in now if r["verdict"] == "accept"
                            and r not in good_before],
            "rejects_by_gate": by_gate}


def _auc(rows: list[dict], key: str) -> float | None:
    good = [r[key] for r in rows if r["verdict"] == "accept"]
    bad = [r[key] for r in rows if r["verdict"] == "reject"]
    if not good or not bad:
        return None
    wins = sum((g > b) + 0.5 * (g == b) for g in good for b in bad)
    return round(wins / (len(good) * len(bad)), 3)


def tune_floor(rows: list[dict]) -> float:
    """The likelihood floor from one document's judgements: the midpoint between the lowest
    score of a question the reader keeps (and the rules pass) and the highest score below it
    of one the reader rejects, to 0.1; keeps every good row."""
    live = [r for r in rows if r["rules_removed_by"] is None]
    low = min(r["likelihood"] for r in live if r["verdict"] == "accept")
    below = [r["likelihood"] for r in live if r["verdict"] == "reject" and r["likelihood"] < low]
    mid = (low + max(below)) / 2 if below else low
    return round(mid, 1)


def rescore(folders: dict[str, Path], docs: list[str], spec: str, calls: Path) -> dict:
    judgements = json.loads(JUDGEMENTS.read_text()) if JUDGEMENTS.exists() else {}
    rows = [r for doc in docs for r in _rows_with_spans(doc, folders[doc])]
    _rule_verdicts(rows)
    _scores(rows, spec, calls)
    for r in rows:
        r["verdict"] = _verdict(r, judgements)
    floor = tune_floor([r for r in rows if r["doc"] == TUNED_ON])
    held = [d for d in docs if d != TUNED_ON]
    groups = {d: [r for r in rows if r["doc"] == d] for d in docs}
    groups["held_out"] = [r for r in rows if r["doc"] in held]
    groups["all"] = rows
    live = {k: [r for r in v if r["rules_removed_by"] is None] for k, v in groups.items()}
    tasks = {d: json.loads((RESULTS / "distill_gates" / f"{d}.json").read_text(
        encoding="utf-8"))["runs"]["on"]["tasks"] for d in docs}
    tasks["held_out"] = sum(tasks[d] for d in held)
    tasks["all"] = sum(tasks[d] for d in docs)
    out = {"tuned_on": TUNED_ON, "held_out": held, "floor": floor, "scorer": spec,
           "documents": {k: {"tasks": tasks[k], "rules_only": _tally(v, -math.inf),
                             "with_likelihood":
                             _tally(v, floor),
                             "auc_after_rules": {"likelihood": _auc(live[k], "likelihood"),
                                                 "answer_pmi": _auc(live[k], "answer_pmi")},
                             "auc_all": {"likelihood": _auc(v, "likelihood"),
                                         "answer_pmi": _auc(v, "answer_pmi")}}
                         for k, v in groups.items()},
           "curve": {k: [{"floor": f, **{x: _tally(v, f)[x] for x in (
               "accepted", "sensible", "reader_rejects", "wilson95", "good_kept")}}
                         for f in GRID] for k, v in groups.items()},
           "questions": [{k: r.get(k) for k in (
               "doc", "question", "now_question", "kind", "section", "answer", "accepted_on",
               "removed_by", "rules_removed_by", "rules_reason", "likelihood", "answer_pmi",
               "verdict")} | {"verdict_before": r["reader"]["verdict"],
                              "accepted_now": r["rules_removed_by"] is None
                             and r["likelihood"] >= floor} for r in rows]}
    (RESULTS / "distill_gates_rescore.json").write_text(
        json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


def rescore_markdown(out: dict) -> str:
    def share(t: dict) -> str:
        if not t["judged"]:
            return "n/a"
        lo, hi = t["wilson95"]
        return f"{t['reader_rejects']}/{t['judged']} = {t['reject_share']:.0%} [{lo:.0%}, {hi:.0%}]"

    lines = [f"likelihood floor {out['floor']} (tuned on {out['tuned_on']})", "",
             "| document | tasks | accepted before | rejects before | accepted: rules | rejects: "
             "rules | accepted: rules + likelihood | rejects: rules + likelihood | good kept | "
             "AUC likelihood / pmi (after rules) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for k, d in out["documents"].items():
        before = out["questions"]
        b = [q for q in before if (k in ("all",) or q["doc"] == k or (
            k == "held_out" and q["doc"] in out["held_out"])) and q["accepted_on"]]
        bb = sum(q["verdict_before"] == "reject" for q in b)
        r, w = d["rules_only"], d["with_likelihood"]
        a = d["auc_after_rules"]
        lines.append(f"| {k} | {d['tasks']} | {len(b)} | {bb} | {r['accepted']} | {share(r)} | "
                     f"{w['accepted']} | {share(w)} | {w['good_kept']}/{w['good_before']} | "
                     f"{a['likelihood']} / {a['answer_pmi']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", type=int, default=24)
    ap.add_argument("--docs", default=",".join(DOCS))
    ap.add_argument("--work", type=Path, help="run folders (default: <cache>/runs)")
    ap.add_argument("--cache", help="where the documents are prepared (realdocs.py)")
    ap.add_argument("--config", default="configs/rf_demo.yaml")
    ap.add_argument("--score-only", action="store_true")
    ap.add_argument("--rescore", action="store_true", help="today's gates on the judged "
                    "questions, the likelihood floor tuned on the manual (no distillation)")
    ap.add_argument("--model", default="default", help="--rescore: the scoring model")
    a = ap.parse_args()
    folders = prepare(a.cache)
    if a.rescore:
        print(rescore_markdown(rescore(folders, a.docs.split(","), a.model,
                                       cache_dir(a.cache) / "rescore_calls.sqlite")))
        return
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
