"""Metrics as plain functions over plain values, so anyone can check them by hand.

Ranking metrics take `ranked` (ids best first) and `relevant` (a set of ids, or a mapping
id -> graded relevance for nDCG). Duplicated ids in `ranked` count once, at their best rank.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence


def _dedupe(ranked: Sequence[str]) -> list[str]:
    seen, out = set(), []
    for r in ranked:
        if r not in seen:
            seen.add(r)
            out.append(r)
    return out


def hit_at_k(ranked: Sequence[str], relevant: Iterable[str], k: int) -> float:
    """1.0 if any relevant id is in the top k, else 0.0."""
    rel = set(relevant)
    return float(any(r in rel for r in _dedupe(ranked)[:k]))


def recall_at_k(ranked: Sequence[str], relevant: Iterable[str], k: int) -> float:
    """Share of the relevant ids found in the top k (0.0 when nothing is relevant)."""
    rel = set(relevant)
    if not rel:
        return 0.0
    return len(rel & set(_dedupe(ranked)[:k])) / len(rel)


def reciprocal_rank(ranked: Sequence[str], relevant: Iterable[str], k: int | None = None
                    ) -> float:
    """1 / rank of the first relevant id (0.0 if none within k)."""
    rel = set(relevant)
    for i, r in enumerate(_dedupe(ranked)[:k], start=1):
        if r in rel:
            return 1.0 / i
    return 0.0


def ndcg_at_k(ranked: Sequence[str], relevant: Mapping[str, float] | Iterable[str], k: int
              ) -> float:
    """nDCG@k with gain (2^rel - 1) and discount log2(rank + 1) (Jarvelin and Kekalainen
    2002; the trec_eval/BEIR form). Binary relevance when `relevant` is a set."""
    gains = dict(relevant) if isinstance(relevant, Mapping) else {r: 1.0 for r in relevant}
    dcg = sum((2 ** gains.get(r, 0.0) - 1) / math.log2(i + 1)
              for i, r in enumerate(_dedupe(ranked)[:k], start=1))
    ideal = sorted(gains.values(), reverse=True)[:k]
    idcg = sum((2 ** g - 1) / math.log2(i + 1) for i, g in enumerate(ideal, start=1))
    return dcg / idcg if idcg > 0 else 0.0


def accuracy(predictions: Sequence[str | None], golds: Sequence[str]) -> float:
    if not golds:
        return 0.0
    return sum(p == g for p, g in zip(predictions, golds, strict=True)) / len(golds)


def macro_f1(predictions: Sequence[str | None], golds: Sequence[str]) -> float:
    """Unweighted mean of per-class F1 over the classes seen in gold or predictions."""
    labels = sorted({g for g in golds} | {p for p in predictions if p is not None})
    if not labels:
        return 0.0
    f1s = []
    for lab in labels:
        tp = sum(p == lab and g == lab for p, g in zip(predictions, golds, strict=True))
        fp = sum(p == lab and g != lab for p, g in zip(predictions, golds, strict=True))
        fn = sum(p != lab and g == lab for p, g in zip(predictions, golds, strict=True))
        prec = tp / (tp + fp) if tp + fp else 0.0
        rec = tp / (tp + fn) if tp + fn else 0.0
        f1s.append(2 * prec * rec / (prec + rec) if prec + rec else 0.0)
    return sum(f1s) / len(f1s)


def binary_f1(predictions: Sequence[str | None], golds: Sequence[str], positive: str) -> float:
    """F1 of one class taken as the positive one (a missing prediction is a negative)."""
    pairs = list(zip(predictions, golds, strict=True))
    tp = sum(p == positive and g == positive for p, g in pairs)
    fp = sum(p == positive and g != positive for p, g in pairs)
    fn = sum(p != positive and g == positive for p, g in pairs)
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0
