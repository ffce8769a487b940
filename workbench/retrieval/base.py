"""The retriever interface: a concrete `retrieve`, an abstract scoring step.

Every retriever works over a `ChunkStore` (the chunks in a fixed order, so an integer index
names a chunk). `retrieve` applies metadata filters, asks the subclass for scored candidates,
breaks ties by chunk position (deterministic) and returns `RetrievalHit` records.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from workbench.records import Chunk, RetrievalHit


@dataclass(frozen=True)
class Filters:
    """Metadata filters: keep chunks of these documents (ids or source paths) and/or whose
    heading path starts with `heading_prefix`."""

    documents: tuple[str, ...] = ()
    heading_prefix: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.documents or self.heading_prefix)


class ChunkStore:
    def __init__(self, chunks: Sequence[Chunk]):
        self.chunks = list(chunks)
        self.index_of = {c.id: i for i, c in enumerate(self.chunks)}
        if len(self.index_of) != len(self.chunks):
            raise ValueError("duplicate chunk ids in the store")

    def __len__(self) -> int:
        return len(self.chunks)

    def mask(self, filters: Filters | None) -> np.ndarray | None:
        """Boolean array of allowed chunks, or None for no filtering."""
        if not filters:
            return None
        docs = set(filters.documents)
        prefix = list(filters.heading_prefix)
        keep = np.ones(len(self.chunks), dtype=bool)
        for i, c in enumerate(self.chunks):
            if (docs and c.doc_id not in docs and c.source not in docs) \
                    or (prefix and c.heading_path[:len(prefix)] != prefix):
                keep[i] = False
        return keep

    def hits(self, order: np.ndarray, scores: np.ndarray, retriever: str) -> list[RetrievalHit]:
        out = []
        for rank, (i, s) in enumerate(zip(order.tolist(), scores.tolist(), strict=True),
                                      start=1):
            c = self.chunks[i]
            out.append(RetrievalHit(rank=rank, chunk_id=c.id, score=float(s),
                                    section_id=c.section_id, doc_id=c.doc_id,
                                    heading_path=c.heading_path, text=c.text,
                                    retriever=retriever, source=c.source))
        return out


def top_k(scores: np.ndarray, k: int, mask: np.ndarray | None = None,
          candidates: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Indices and scores of the k best, best first; equal scores in index order.

    `candidates` restricts the search to those indices (scores then has the same length).
    """
    s = np.asarray(scores, dtype=np.float64)
    if candidates is None and mask is None:
        idx = None
    else:
        idx = np.arange(len(s)) if candidates is None else np.asarray(candidates)
        if mask is not None:
            keep = mask[idx]
            idx, s = idx[keep], s[keep]
    n = len(s)
    k = min(k, n)
    if k <= 0:
        return np.empty(0, dtype=np.int64), np.empty(0)
    if k < n:
        # Any k scores bound the k-th best from below: the k-th best of a strided sample
        # gives a threshold that keeps ~n/(32k)*k candidates, all ties included; then sort those.
        sample = s[:: max(1, n // max(32 * k, 1024))]
        kth = np.partition(sample, len(sample) - k)[len(sample) - k] if len(sample) > k \
            else -np.inf
        sel = np.flatnonzero(s >= kth)
        if len(sel) > max(n // 16, 256 * k):  # flat scores (many ties): select exactly
            part = np.argpartition(-s, k - 1)[:k]
            sel = np.flatnonzero(s >= s[part].min())
    else:
        sel = np.arange(n)
    pos = sel if idx is None else idx[sel]
    order = np.lexsort((pos, -s[sel]))[:k]
    return pos[order], s[sel[order]]


class BaseRetriever(abc.ABC):
    name = "base"

    def __init__(self, store: ChunkStore):
        self.store = store

    def retrieve(self, query: str, k: int = 10,
                 filters: Filters | None = None) -> list[RetrievalHit]:
        if not query.strip():
            return []
        mask = self.store.mask(filters)
        order, scores = self._search(query, k, mask)
        return self.store.hits(order, scores, self.name)

    def retrieve_batch(self, queries: Sequence[str], k: int = 10,
                       filters: Filters | None = None) -> list[list[RetrievalHit]]:
        mask = self.store.mask(filters)
        return [self.store.hits(order, scores, self.name)
                for order, scores in self._search_batch(queries, k, mask)]

    @abc.abstractmethod
    def _search(self, query: str, k: int, mask: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray]:
        """(chunk indices, scores), best first, at most k, honouring `mask`."""

    def _search_batch(self, queries: Sequence[str], k: int, mask: np.ndarray | None
                      ) -> list[tuple[np.ndarray, np.ndarray]]:
        return [self._search(q, k, mask) for q in queries]
