"""Context size and placement against accuracy (issue 43 item 3): the oracle passage (each
item's own source section, a window around its answer sentence) at several sizes, put before
or after the question, and each retriever's top passages, on a finished compare run's
benchmark, scored by the bundled model as the main job scores it (cloze, per-character
normalised; and the letter scoring).

    python benchmarks/bench_context.py runs/rf_demo [--benchmark unseen|seen]
        [--sizes 32,64,128,256] [--top-k 1,2,3] [--placements before,after]
        [--adapter runs/rf_demo/adapter]

Prints one row per setting with its accuracy, Wilson interval and prediction distribution,
and an exact McNemar test against the main job's setting (oracle, 256 words, before); writes
the rows to benchmarks/results/context_<benchmark>.json. "before" is the evaluation's own
prompt (passages, then the question); "after" puts the question first and the passages under
it, the answer then following the passage it may copy from.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from workbench.evaluate.contexts import OracleContexts, with_context
from workbench.evaluate.mc import LETTERS, argmax, letter_request
from workbench.evaluate.stats import mcnemar_exact, wilson_interval
from workbench.models.base import ScoreRequest
from workbench.records import MCItem, Section, read_records


def after(body: str, context: str | None) -> str:
    """The question first, the passages under it."""
    if not context:
        return body
    return f"Question: {body}\n\nReference passages:\n{context}\n\nAnswer using the passages."


def cloze_norm(model, items: list[MCItem], contexts: list[str], place) -> list[str]:
    reqs = [ScoreRequest([{"role": "user", "content": place(it.question, c)}],
                         list(it.options)) for it, c in zip(items, contexts, strict=True)]
    rows = model.score(reqs)
    return [LETTERS[argmax([s.logprob / max(len(o), 1) for s, o in zip(row, it.options,
                                                                         strict=True)])]
            for row, it in zip(rows, items, strict=True)]


def letters(model, items: list[MCItem], contexts: list[str]) -> list[str]:
    rows = model.score([letter_request(it, c or None) for it, c in zip(items, contexts,
                                                                        strict=True)])
    return [LETTERS[argmax([s.logprob for s in row])] for row in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--benchmark", default="unseen", choices=["unseen", "seen"])
    ap.add_argument("--sizes", default="32,64,128,256")
    ap.add_argument("--rag", default="semantic,keyword,hybrid")
    ap.add_argument("--top-k", default="1,2,3", help="retrieved passages per prompt")
    ap.add_argument("--placements", default="before,after")
    ap.add_argument("--letter", action="store_true",
                    help="also the letter scoring (degenerate for the 135M model: a pass each)")
    ap.add_argument("--adapter", default=None)
    args = ap.parse_args()

    from workbench.models.backends import load_model

    name = "benchmark.jsonl" if args.benchmark == "unseen" else "benchmark_seen.jsonl"
    items = read_records(args.run / "distill" / name, MCItem)
    sections = read_records(args.run / "distill" / "sections.jsonl", Section)
    opts = {"adapter": args.adapter, "merge_adapter": True} if args.adapter else {}
    model = load_model("default", **opts)
    places = {"before": with_context, "after": after}
    chosen = [(k, places[k]) for k in args.placements.split(",")]
    questions = [it.question for it in items]
    settings: list[tuple[str, list[str], object]] = [("none", [""] * len(items), with_context)]
    for size in (int(x) for x in args.sizes.split(",")):
        ctx = OracleContexts(items, sections, max_words=size)(questions)
        settings += [(f"oracle {size} words, {k}", ctx, f) for k, f in chosen]
    if args.rag:
        from workbench.retrieval.search import context_providers

        index = next(p for p in (args.run / "index", args.run / "rag") if p.is_dir())
        for k, p in context_providers(index, args.rag.split(",")).items():
            for top in (int(x) for x in args.top_k.split(",")):
                ctx = p(questions, (1, top))
                settings += [(f"{k} top {top}, {w}", ctx, f) for w, f in chosen]
    from workbench.evaluate.config import EvalConfig

    main_size = EvalConfig.model_fields["oracle_tokens"].default  # the evaluation's own window
    gold = [it.answer for it in items]
    rows, ref = [], None
    for label, ctx, place in settings:
        t0 = time.perf_counter()
        preds = {"cloze_norm": cloze_norm(model, items, ctx, place)}
        if args.letter and place is with_context:
            preds["letter"] = letters(model, items, ctx)
        row = {"setting": label, "seconds": round(time.perf_counter() - t0, 1),
               "context_words": round(sum(len(c.split()) for c in ctx) / len(ctx), 1)}
        for k, p in preds.items():
            ok = [a == b for a, b in zip(p, gold, strict=True)]
            lo, hi = wilson_interval(sum(ok), len(ok))
            row[k] = {"correct": sum(ok), "n": len(ok), "interval": [lo, hi],
                      "predictions": dict(sorted(Counter(p).items()))}
            if k == "cloze_norm":
                row["_ok"] = ok
        if label == f"oracle {main_size} words, before":
            ref = row["_ok"]
        rows.append(row)
        cn = row["cloze_norm"]
        print(f"{label:<32} cloze_norm {cn['correct']}/{len(items)} "
              f"[{cn['interval'][0]:.0%}, {cn['interval'][1]:.0%}] {cn['predictions']}"
              + (f"  letter {row['letter']['correct']}/{len(items)}" if "letter" in row
                 else "") + f"  ({row['seconds']} s)", flush=True)
    for row in rows:
        ok = row.pop("_ok")
        if ref is not None:
            b = sum(x and not y for x, y in zip(ok, ref, strict=True))
            c = sum(y and not x for x, y in zip(ok, ref, strict=True))
            row["vs_main_setting"] = {"only_this": b, "only_main": c,
                                      "p": mcnemar_exact(ok, ref)}
    out = Path(__file__).parent / "results" / f"context_{args.benchmark}.json"
    out.write_text(json.dumps({"run": str(args.run), "benchmark": args.benchmark,
                               "items": len(items), "adapter": args.adapter, "rows": rows},
                              indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
