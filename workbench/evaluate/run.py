"""Benchmark runs: a model (base, + adapter, merged, or an HTTP endpoint) under retrieval
conditions, with per-example results and a typed summary. Retrieved contexts come from the
caller as one `ContextProvider` per RAG condition."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from workbench.errors import WorkbenchError
from workbench.evaluate.benchmark import load_benchmark
from workbench.evaluate.config import CONDITIONS, EvalConfig
from workbench.evaluate.contexts import ContextProvider, miss_ranks
from workbench.evaluate.mc import evaluate_mc, with_headline
from workbench.evaluate.report import write_eval
from workbench.evaluate.summary import EvalSummary, summarize_eval
from workbench.models.backends import load_model
from workbench.models.base import ChatModel, GenerationParams, ScoreRequest
from workbench.models.factory import open_chat_model
from workbench.models.templates import fingerprint_warning
from workbench.records import EvalResult, MCItem, QTSASample, read_records

Log = Callable[[str], None]


@dataclass
class EvalRun:
    output: Path
    summary: EvalSummary
    results: list[EvalResult]


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


def check_contexts(conditions: Sequence[str],
                   contexts: Mapping[str, ContextProvider] | None) -> None:
    """A clear error when a RAG condition has no context provider (or a provider is named
    for something that is not a RAG condition)."""
    given = dict(contexts or {})
    if bad := [c for c in given if c not in CONDITIONS or c == "none"]:
        raise WorkbenchError(f"context providers given for {bad}: providers are for the RAG "
                             f"conditions {', '.join(CONDITIONS[1:])}")
    if missing := [c for c in conditions if c != "none" and c not in given]:
        raise WorkbenchError(
            f"condition(s) {', '.join(missing)} need retrieved contexts but no context "
            "provider was given for them: set eval.index to a RAG index (build one with "
            "`workbench rag build`) or leave them out of eval.conditions")


def _contexts(provider: ContextProvider, cond: str, items: Sequence[MCItem],
              ranks: tuple[int, int] | None = None) -> list[str]:
    ctx = provider([it.question for it in items], ranks)
    if len(ctx) != len(items) or not all(isinstance(c, str) for c in ctx):
        raise WorkbenchError(f"the context provider of {cond!r} returned {len(ctx)} contexts "
                             f"for {len(items)} questions (expected one string each)")
    return ctx


class _Scoring(TypedDict):
    """The `evaluate_mc` options every condition shares."""

    methods: Sequence[str]
    formulations: Sequence[str]
    template: str
    model_name: str


def evaluate_conditions(model: ChatModel, items: Sequence[MCItem], cfg: EvalConfig, *,
                        contexts: Mapping[str, ContextProvider] | None = None,
                        model_name: str | None = None, log: Log = print
                        ) -> tuple[list[EvalResult], EvalSummary]:
    """Score `items` under each of `cfg.conditions` (RAG ones with their provider's contexts;
    with `cfg.hit_vs_miss`, also with the ranks just below its top k). Rows' `prediction` /
    `correct` follow the headline formulation the summary picks."""
    check_contexts(cfg.conditions, contexts)
    name = model_name or model.identity
    kw: _Scoring = {"methods": cfg.methods, "formulations": cfg.formulations,
                    "template": cfg.template, "model_name": name}
    results: list[EvalResult] = []
    for cond in cfg.conditions:
        provider = (contexts or {}).get(cond)
        ctx = _contexts(provider, cond, items) if provider is not None else None
        kw["formulations"] = [f for f in cfg.formulations if f != "letter" or
                              cfg.letter_conditions is None or cond in cfg.letter_conditions]
        rows = evaluate_mc(model, items, condition=cond, contexts=ctx, circular=cfg.circular,
                           max_tokens=cfg.max_tokens, **kw)
        results += rows
        accs = {k: sum(r.scores[k] for r in rows) / len(rows) for k in rows[0].scores} \
            if rows else {}
        log(f"{name} / {cond}: " + (", ".join(f"{k}={v:.3f}" for k, v in accs.items())
                                    or "no items"))
        if cfg.hit_vs_miss and provider is not None and "loglik" in cfg.methods \
                and cond != "oracle":
            lo, hi = miss_ranks(provider)
            loglik: _Scoring = {**kw, "methods": ["loglik"]}
            results += evaluate_mc(model, items, condition=f"{cond}_ranks{lo}-{hi}",
                                   contexts=_contexts(provider, cond, items, (lo, hi)),
                                   **loglik)
    chance = sum(1 / len(it.options) for it in items) / max(len(items), 1)
    summary = summarize_eval(results, model=name, model_identity=model.identity,
                             chance=chance, seed=cfg.bootstrap_seed)
    h = summary.headline
    log(f"{name}: headline formulation {h.formulation or 'none (all degenerate)'}"
        + "".join(f"; {f} left out ({why})" for f, why in h.excluded.items()))
    return with_headline(results, h.formulation), summary


def run_eval(cfg, *, contexts: Mapping[str, ContextProvider] | None = None,
             retrieval: Mapping[str, Mapping[str, float]] | None = None, log: Log = print
             ) -> EvalRun:
    """`workbench eval CONFIG`: the configured model (+ adapter) on the benchmark, with the
    caller's context providers for the RAG conditions and, optionally, the retrievers'
    metrics to keep in the summary. Writes the evaluation folder and returns what it wrote."""
    ec: EvalConfig = cfg.eval
    if not ec.benchmark:
        raise WorkbenchError("eval.benchmark is not set")
    check_contexts(ec.conditions, contexts)
    items = load_benchmark(ec.benchmark, fmt=ec.benchmark_format, mapping=ec.field_map,
                           max_items=ec.max_items)
    mc = cfg.models.chat
    if ec.adapter:
        mc = mc.model_copy(update={"options": {**mc.options, "adapter": ec.adapter}})
    model = open_chat_model(mc, cfg)
    _warn_template(ec.adapter, model, log)
    results, summary = evaluate_conditions(model, items, ec, contexts=contexts, log=log)
    if ec.open_ended:
        samples = read_records(ec.open_ended, QTSASample)[:ec.max_items or None]
        judge = None
        if ec.judge:
            judge = load_model(ec.judge)
        results += evaluate_open(model, samples, judge=judge, model_name=summary.model)
    summary = summarize_eval(results, model=summary.model, model_identity=model.identity,
                             chance=summary.chance, seed=ec.bootstrap_seed,
                             retrieval=retrieval)
    out = Path(ec.output) if ec.output else cfg.layout.folder("eval")
    write_eval(out, results, summary)
    return EvalRun(output=out, summary=summary, results=results)


def _warn_template(adapter, model, log: Log) -> None:
    if not adapter:
        return

    inner = getattr(model, "inner", model)
    tok = getattr(inner, "tokenizer", None)
    if tok is not None and (w := fingerprint_warning(adapter, tok)):
        log(w)
