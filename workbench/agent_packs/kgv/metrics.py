"""KGV metrics over trajectories: macro-F1, Pos-F1 under both conventions, search calls,
routes, each with its interval and the prediction distribution behind it, overall and by
seen vs long-tail predicates."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from workbench.agents.steps import AgentTrajectory
from workbench.evaluate.metrics import binary_f1, macro_f1
from workbench.evaluate.stats import bootstrap_interval, wilson_interval

TRUE, ERROR = "SUPPORTED", "REFUTED"


def _f1_interval(preds: list[str | None], golds: list[str], fn) -> tuple[float, float]:
    """Percentile bootstrap over claims for an F1-type statistic."""
    n = len(golds)
    if n == 0:
        return (0.0, 1.0)
    idx = np.arange(n, dtype=float)

    def stat(rows: np.ndarray) -> np.ndarray:
        return np.array([fn([preds[int(i)] for i in r], [golds[int(i)] for i in r])
                         for r in rows])

    return bootstrap_interval(idx.tolist(), statistic=stat, n_resamples=400, seed=0)


def route(t: AgentTrajectory) -> str:
    """"search" when the agent searched before answering, else "parametric"."""
    return "search" if t.calls_to("search") else "parametric"


def prediction(t: AgentTrajectory) -> str | None:
    return (t.final or {}).get("label")


def cited_ids(t: AgentTrajectory) -> set[str]:
    """What a verdict cites: its evidence ids, and the documents of the passages among them
    (a prebuilt index's chunk ids count for the entry that holds them)."""
    ids = {i for i in (t.final or {}).get("evidence") or () if isinstance(i, str)}
    return ids | {p["doc"] for p in t.metadata.get("cited") or ()
                  if isinstance(p, dict) and isinstance(p.get("doc"), str)}


def summarise(trajs: Sequence[AgentTrajectory]) -> dict[str, Any]:
    golds = [t.metadata["claim"]["label"] for t in trajs]
    preds = [prediction(t) for t in trajs]
    n = len(trajs)
    correct = [p == g for p, g in zip(preds, golds, strict=True)]
    k = sum(correct)
    searches = [t.calls_to("search") for t in trajs]
    out: dict[str, Any] = {
        "n": n,
        "accuracy": k / n if n else 0.0, "accuracy_ci95": list(wilson_interval(k, n)),
        "macro_f1": macro_f1(preds, golds),
        "macro_f1_ci95": list(_f1_interval(preds, golds, macro_f1)),
        "pos_f1_true": binary_f1(preds, golds, TRUE),
        "pos_f1_true_ci95": list(_f1_interval(preds, golds,
                                              lambda p, g: binary_f1(p, g, TRUE))),
        "pos_f1_error": binary_f1(preds, golds, ERROR),
        "pos_f1_error_ci95": list(_f1_interval(preds, golds,
                                               lambda p, g: binary_f1(p, g, ERROR))),
        "predictions": {lab: sum(p == lab for p in preds) for lab in (TRUE, ERROR)}
        | {"none": sum(p is None for p in preds)},
        "gold": dict(Counter(golds)),
        "search_calls_mean": float(np.mean(searches)) if n else 0.0,
        "search_calls_ci95": list(bootstrap_interval(searches, n_resamples=1000))
        if n else [0.0, 0.0],
        "model_turns_mean": float(np.mean([t.model_turns for t in trajs])) if n else 0.0,
        "errors": sum(t.errors for t in trajs),
        "stops": dict(Counter(t.stop for t in trajs)),
        # runs share batched model calls: a run's seconds are its batch's latency
        "latency_seconds_mean": float(np.mean([t.seconds for t in trajs])) if n else 0.0,
    }
    routes: dict[str, Any] = {}
    for r in ("parametric", "search"):
        sel = [c for c, t in zip(correct, trajs, strict=True) if route(t) == r]
        routes[r] = {"n": len(sel), "rate": len(sel) / n if n else 0.0,
                     "accuracy": sum(sel) / len(sel) if sel else None,
                     "accuracy_ci95": list(wilson_interval(sum(sel), len(sel)))}
    out["routes"] = routes
    cited = [t for t in trajs if prediction(t) == t.metadata["claim"]["label"] == TRUE]
    hit = sum(bool(cited_ids(t) & set(t.metadata["claim"]["evidence"])) for t in cited)
    out["evidence_hit"] = {"n": len(cited), "rate": hit / len(cited) if cited else None,
                           "ci95": list(wilson_interval(hit, len(cited)))}
    return out


FORMS = ("triple", "wording", "sentence")


def by_split(trajs: Sequence[AgentTrajectory]) -> dict[str, Any]:
    """All claims, then by split (seen/long-tail predicates) and, when claims came in more
    than one form, by how each was read (triple, worded sentence, sentence as a whole)."""
    out = {"all": summarise(trajs)}
    for split in ("seen", "longtail"):
        sel = [t for t in trajs if t.metadata["claim"]["split"] == split]
        if sel:
            out[split] = summarise(sel)
    forms = {t.metadata["claim"].get("form", "triple") for t in trajs}
    if forms != {"triple"}:
        for form in FORMS:
            sel = [t for t in trajs if t.metadata["claim"].get("form", "triple") == form]
            if sel:
                out[form] = summarise(sel)
    return out
