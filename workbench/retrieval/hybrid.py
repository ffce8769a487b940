"""Hybrid retrieval by composition: fuse the ranked lists of other retrievers.

Modes (a str enum, as llama-index's QueryFusionRetriever):
- `reciprocal_rank`: score(d) = sum_r w_r / (k + rank_r(d)), ranks from 1. k = 60 is the
  constant of Cormack, Clarke and Buettcher, "Reciprocal Rank Fusion outperforms Condorcet and
  individual Rank Learning Methods", SIGIR 2009.
- `relative_score`: each list's scores min-max normalised to [0, 1], times w_r, summed
  (llama-index's "relative_score"; a list whose scores are all equal normalises to 1).
Weights are really applied in both modes. Ties are broken by chunk position. An optional
reranker (a cross-encoder hook, off by default) re-scores the fused top candidates.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from workbench.retrieval.base import BaseRetriever, ChunkStore

RRF_K = 60  # Cormack et al., SIGIR 2009


class FusionMode(str, enum.Enum):
    RECIPROCAL_RANK = "reciprocal_rank"
    RELATIVE_SCORE = "relative_score"


Ranked = tuple[np.ndarray, np.ndarray]  # (indices best first, scores)


def rrf_fuse(lists: Sequence[Ranked], weights: Sequence[float], k: int = RRF_K
             ) -> dict[int, float]:
    fused: dict[int, float] = {}
    for (idx, _), w in zip(lists, weights, strict=True):
        for rank, i in enumerate(idx.tolist(), start=1):
            fused[i] = fused.get(i, 0.0) + w / (k + rank)
    return fused


def relative_score_fuse(lists: Sequence[Ranked], weights: Sequence[float]) -> dict[int, float]:
    fused: dict[int, float] = {}
    for (idx, scores), w in zip(lists, weights, strict=True):
        if len(scores) == 0:
            continue
        lo, hi = float(scores.min()), float(scores.max())
        norm = (scores - lo) / (hi - lo) if hi > lo else np.ones_like(scores)
        for i, s in zip(idx.tolist(), norm.tolist(), strict=True):
            fused[i] = fused.get(i, 0.0) + w * s
    return fused


class Reranker:
    """Hook: give each (query, passage) a relevance score; higher is better."""

    def score(self, query: str, passages: Sequence[str]) -> Sequence[float]:
        raise NotImplementedError


class CrossEncoderReranker(Reranker):
    """A sentence-transformers CrossEncoder from a local folder (never downloaded)."""

    def __init__(self, path: str, device: str = "cpu", batch_size: int = 32):
        from sentence_transformers import CrossEncoder

        self.model = CrossEncoder(path, device=device, local_files_only=True)
        self.batch_size = batch_size

    def score(self, query, passages):
        return self.model.predict([(query, p) for p in passages], batch_size=self.batch_size,
                                  show_progress_bar=False)


class HybridRetriever(BaseRetriever):
    name = "hybrid"

    def __init__(self, store: ChunkStore, retrievers: Mapping[str, BaseRetriever], *,
                 weights: Mapping[str, float] | None = None,
                 mode: FusionMode | str = FusionMode.RECIPROCAL_RANK, rrf_k: int = RRF_K,
                 candidates: int = 15, reranker: Reranker | Callable | None = None,
                 rerank_top: int = 20):
        super().__init__(store)
        if not retrievers:
            raise ValueError("hybrid retrieval needs at least one retriever")
        for name, r in retrievers.items():
            if r.store is not store and len(r.store) != len(store):
                raise ValueError(f"retriever {name!r} covers another chunk store")
        self.retrievers = dict(retrievers)
        weights = dict(weights or {})
        unknown = set(weights) - set(self.retrievers)
        if unknown:
            raise ValueError(f"weights for unknown retrievers: {sorted(unknown)}")
        self.weights = {n: float(weights.get(n, 1.0)) for n in self.retrievers}
        self.mode = FusionMode(mode)
        self.rrf_k, self.candidates = rrf_k, candidates
        self.reranker, self.rerank_top = reranker, rerank_top

    def _fuse(self, lists: Sequence[Ranked]) -> dict[int, float]:
        w = [self.weights[n] for n in self.retrievers]
        if self.mode is FusionMode.RECIPROCAL_RANK:
            return rrf_fuse(lists, w, self.rrf_k)
        return relative_score_fuse(lists, w)

    def _finish(self, query: str, fused: dict[int, float], k: int) -> Ranked:
        if not fused:
            return np.empty(0, dtype=np.int64), np.empty(0)
        idx = np.fromiter(fused, dtype=np.int64, count=len(fused))
        scores = np.fromiter(fused.values(), dtype=np.float64, count=len(fused))
        if self.reranker is not None:
            top_idx, _ = _best(idx, scores, self.rerank_top)
            passages = [self.store.chunks[i].text for i in top_idx.tolist()]
            fn = self.reranker.score if isinstance(self.reranker, Reranker) else self.reranker
            new = np.asarray(fn(query, passages), dtype=np.float64)
            return _best(top_idx, new, k)
        return _best(idx, scores, k)

    def _search(self, query, k, mask):
        n = max(self.candidates, k)
        lists = [r._search(query, n, mask) for r in self.retrievers.values()]
        return self._finish(query, self._fuse(lists), k)

    def _search_batch(self, queries, k, mask):
        n = max(self.candidates, k)
        per = [r._search_batch(queries, n, mask) for r in self.retrievers.values()]
        return [self._finish(q, self._fuse([p[i] for p in per]), k)
                for i, q in enumerate(queries)]


def _best(idx: np.ndarray, scores: np.ndarray, k: int) -> Ranked:
    order = np.lexsort((idx, -scores))[:k]
    return idx[order], scores[order]
