"""Benchmark runs: a model (base, + adapter, merged, or an HTTP endpoint) under retrieval
conditions, with per-example results, a summary, retrieval metrics and plots."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.evaluate.config import EvalConfig
from workbench.evaluate.mc import evaluate_mc, summarize
from workbench.io import atomic_write_json, write_jsonl
from workbench.models.base import ChatModel, GenerationParams, ScoreRequest
from workbench.records import EvalResult, MCItem, QTSASample, read_records


def load_benchmark(path: str | Path, max_items: int | None = None) -> list[MCItem]:
    p = Path(path)
    if p.is_dir():
        for cand in (p / "distill" / "benchmark.jsonl", p / "benchmark.jsonl"):
            if cand.exists():
                p = cand
                break
        else:
            raise WorkbenchError(f"{path}: no benchmark.jsonl in this folder")
    items = read_records(p, MCItem)
    if not items:
        raise WorkbenchError(f"{p}: the benchmark is empty")
    return items[:max_items] if max_items else items


def contexts_for(index, retriever: str, items: Sequence[MCItem], *,
                 ranks: tuple[int, int] | None = None) -> list[str]:
    """Formatted contexts from ranks `ranks[0]..ranks[1]` (1-based, inclusive; default the
    index's top_k, RF-Agent's top 3), within the index's context token budget."""
    from workbench.rag.context import format_context, token_counter

    r = index.retriever(retriever)
    lo, hi = ranks or (1, index.config.top_k)
    hits = r.retrieve_batch([it.question for it in items], hi)
    count = token_counter(index)
    return [format_context(h[lo - 1:hi], max_tokens=index.config.context_tokens,
                           count_tokens=count) for h in hits]


def retrieval_metrics(index, items: Sequence[MCItem]) -> dict:
    """Hit@k / MRR / nDCG of each retriever, judged at section level from provenance: each
    benchmark question knows the section it was written from, so no labelling is needed."""
    from workbench.rag.evaluate import Qrel, evaluate_retrievers

    qrels = [Qrel(it.id, it.question, {it.provenance.section_id: 1.0})
             for it in items if it.provenance]
    if not qrels:
        return {}
    summary = evaluate_retrievers({n: index.retriever(n) for n in ("keyword", "semantic",
                                                                    "hybrid")},
                                  qrels, level="section", ks=(1, 3, 5, 10))
    return {k: v for k, v in summary.items() if not k.startswith("_")}


def token_f1(pred: str, ref: str) -> float:
    p = re.findall(r"\w+", pred.lower())
    r = re.findall(r"\w+", ref.lower())
    if not p or not r:
        return 0.0
    common = sum(min(p.count(w), r.count(w)) for w in set(p))
    if common == 0:
        return 0.0
    prec, rec = common / len(p), common / len(r)
    return 2 * prec * rec / (prec + rec)


def evaluate_open(model: ChatModel, samples: Sequence[QTSASample], *, judge: ChatModel | None
                  = None, max_tokens: int = 128, model_name: str | None = None
                  ) -> list[EvalResult]:
    """Open-ended answers scored by token-F1 against the reference, or by a judge model
    (log-likelihood of "yes" vs "no" to "is this answer correct?")."""
    convs = [[{"role": "user", "content": s.question}] for s in samples]
    gens = model.generate(convs, GenerationParams(max_tokens=max_tokens))
    verdicts = None
    if judge is not None:
        reqs = [ScoreRequest([{"role": "user", "content":
                               f"Question: {s.question}\nReference answer: {s.answer}\n"
                               f"Candidate answer: {g.text}\nIs the candidate answer correct? "
                               "Reply yes or no."}], ["yes", "no"])
                for s, g in zip(samples, gens, strict=True)]
        verdicts = [row[0].logprob > row[1].logprob for row in judge.score(reqs)]
    out = []
    for i, (s, g) in enumerate(zip(samples, gens, strict=True)):
        f1 = token_f1(g.text, s.answer)
        correct = verdicts[i] if verdicts is not None else f1 >= 0.5
        out.append(EvalResult(example_id=s.id, condition="open", model=model_name or
                              model.identity, prediction=g.text[:1000], gold=s.answer,
                              correct=bool(correct), score=f1,
                              scores={"token_f1": f1, "correct": float(correct)},
                              extra={"judge": judge.identity if judge else "token_f1>=0.5"}))
    return out


def evaluate_conditions(model: ChatModel, items: Sequence[MCItem], cfg: EvalConfig, *,
                        index=None, model_name: str | None = None, log=print
                        ) -> tuple[list[EvalResult], dict]:
    results: list[EvalResult] = []
    summary: dict = {}
    for cond in cfg.conditions:
        ctx = None
        if cond != "none":
            if index is None:
                raise WorkbenchError(f"condition {cond!r} needs eval.index (a RAG index)")
            ctx = contexts_for(index, cond, items)
        rows = evaluate_mc(model, items, condition=cond, contexts=ctx, methods=cfg.methods,
                           template=cfg.template, circular=cfg.circular,
                           max_tokens=cfg.max_tokens, model_name=model_name)
        results += rows
        summary[cond] = summarize(rows)
        log(f"{model_name or model.identity} / {cond}: " + ", ".join(
            f"{k}={v:.3f}" for k, v in summary[cond].items() if k.startswith("acc_")))
        if cfg.hit_vs_miss and cond != "none":
            miss = evaluate_mc(model, items, condition=f"{cond}_ranks4-6",
                               contexts=contexts_for(index, cond, items, ranks=(
                                   index.config.top_k + 1, 2 * index.config.top_k)),
                               methods=["loglik"], template=cfg.template,
                               model_name=model_name)
            results += miss
            summary[f"{cond}_ranks4-6"] = summarize(miss)
    return results, summary


def write_eval(out: Path, results: list[EvalResult], summary: dict, extra: dict | None = None
               ) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "results.jsonl", results)
    atomic_write_json(out / "summary.json", {"conditions": summary, **(extra or {})})
    plot_conditions(summary, out / "accuracy.png")


def plot_conditions(summary: dict, path: Path, title: str = "Multiple-choice accuracy") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conds = [c for c in summary if "acc_loglik_letter" in summary[c]
             or "acc_generate" in summary[c]]
    if not conds:
        return
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(conds)), 3.5))
    width = 0.38
    xs = range(len(conds))
    ll = [summary[c].get("acc_loglik_letter", 0) for c in conds]
    ge = [summary[c].get("acc_generate", 0) for c in conds]
    ax.bar([x - width / 2 for x in xs], ll, width, label="log-likelihood")
    ax.bar([x + width / 2 for x in xs], ge, width, label="generation")
    ax.axhline(0.25, color="grey", linestyle=":", linewidth=1, label="chance (4 options)")
    ax.set_xticks(list(xs), conds, rotation=20, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_eval(cfg, *, log=print) -> dict:
    """`workbench eval CONFIG`: the configured model (+ adapter) on the benchmark."""
    from workbench.models.factory import open_chat_model

    ec: EvalConfig = cfg.eval
    if not ec.benchmark:
        raise WorkbenchError("eval.benchmark is not set")
    items = load_benchmark(ec.benchmark, ec.max_items)
    mc = cfg.models.chat
    if ec.adapter:
        mc = mc.model_copy(update={"options": {**mc.options, "adapter": ec.adapter}})
    model = open_chat_model(mc, cfg)
    _warn_template(ec.adapter, model, log)
    index = None
    if any(c != "none" for c in ec.conditions):
        if not ec.index:
            raise WorkbenchError("RAG conditions need eval.index (build one with `workbench "
                                 "rag build`)")
        from workbench.rag.index import RagIndex

        index = RagIndex.load(ec.index)
    results, summary = evaluate_conditions(model, items, ec, index=index, log=log)
    extra = {"model": model.identity, "items": len(items)}
    if index is not None:
        extra["retrieval"] = retrieval_metrics(index, items)
    if ec.open_ended:
        samples = read_records(ec.open_ended, QTSASample)[:ec.max_items or None]
        judge = None
        if ec.judge:
            from workbench.models.registry import load_model

            judge = load_model(ec.judge)
        open_rows = evaluate_open(model, samples, judge=judge)
        results += open_rows
        summary["open"] = {"n": len(open_rows), "acc": sum(r.correct for r in open_rows)
                           / max(len(open_rows), 1),
                           "token_f1": sum(r.score for r in open_rows) / max(len(open_rows), 1)}
    out = Path(ec.output) if ec.output else cfg.run_dir / "eval"
    write_eval(out, results, summary, extra)
    return {"output": str(out), "conditions": summary, **extra}


def _warn_template(adapter, model, log) -> None:
    if not adapter:
        return
    from workbench.train.recipe import fingerprint_warning

    inner = getattr(model, "inner", model)
    tok = getattr(inner, "tokenizer", None)
    if tok is not None and (w := fingerprint_warning(adapter, tok)):
        log(w)


def format_summary(summary: dict) -> str:
    lines = ["| condition | n | acc (loglik letter) | acc (loglik text, norm) | acc (generate) "
             "| agreement | s/item |", "|---|---|---|---|---|---|---|"]
    for c, s in summary.items():
        if "n" not in s or c == "open":
            continue

        def f(key):
            return f"{s[key]:.3f}" if key in s else "-"

        lines.append(f"| {c} | {s['n']} | {f('acc_loglik_letter')} | "
                     f"{f('acc_loglik_text_norm')} | {f('acc_generate')} | "
                     f"{f('agreement_loglik_generate')} | {f('seconds_per_item')} |")
    return "\n".join(lines)


