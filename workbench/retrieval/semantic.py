"""Semantic retrieval: sentence embeddings + FAISS inner product on L2-normalised vectors
(cosine similarity). Exact `flat` search by default; `hnsw` and `ivf` for large corpora (their
recall against flat is measured in BENCHMARKS.md). faiss-gpu is used when installed and a GPU
is visible (`pip install .[gpu]`), faiss-cpu otherwise."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workbench.errors import DataError
from workbench.retrieval.base import BaseRetriever, ChunkStore

INDEX_TYPES = ("flat", "hnsw", "ivf")


def build_faiss(vectors: np.ndarray, index_type: str = "flat", *, hnsw_m: int = 32,
                ef_construction: int = 80, ivf_nlist: int | None = None, seed: int = 0):
    import faiss

    if index_type not in INDEX_TYPES:
        raise ValueError(f"index type must be one of {', '.join(INDEX_TYPES)}, "
                         f"got {index_type!r}")
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, dim = vectors.shape
    index: faiss.Index
    if index_type == "flat":
        index = faiss.IndexFlatIP(dim)
    elif index_type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
    else:
        nlist = ivf_nlist or max(1, min(int(4 * np.sqrt(n)), n // 39 or 1))
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = seed
        index.train(vectors)
    index.add(vectors)
    return index


def set_search_params(index, *, ef_search: int = 64, nprobe: int = 16) -> None:
    import faiss

    base = faiss.downcast_index(index)
    if hasattr(base, "hnsw"):
        base.hnsw.efSearch = ef_search
    if hasattr(base, "nprobe"):
        base.nprobe = nprobe


def maybe_to_gpu(index):
    """Move a flat index to the GPUs when faiss-gpu sees any; otherwise return it unchanged."""
    import faiss

    if hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0 and \
            isinstance(faiss.downcast_index(index), faiss.IndexFlat):
        return faiss.index_cpu_to_all_gpus(index)
    return index


class SemanticRetriever(BaseRetriever):
    name = "semantic"

    def __init__(self, store: ChunkStore, embedder, index=None, *, index_type: str = "flat",
                 vectors: np.ndarray | None = None, ef_search: int = 64, nprobe: int = 16):
        super().__init__(store)
        self.embedder = embedder
        if index is None:
            if vectors is None:
                vectors = embedder.embed([c.text for c in store.chunks])
            index = build_faiss(vectors, index_type)
        if index.ntotal != len(store):
            raise ValueError(f"FAISS index holds {index.ntotal} vectors for {len(store)} chunks")
        self.index_type = index_type
        set_search_params(index, ef_search=ef_search, nprobe=nprobe)
        self.index = maybe_to_gpu(index)

    def embed_queries(self, queries) -> np.ndarray:
        return self.embedder.embed(list(queries), show_progress=False)

    def _search_vectors(self, q: np.ndarray, k: int, mask: np.ndarray | None):
        import faiss

        params = None
        if mask is not None:
            allowed = np.flatnonzero(mask).astype(np.int64)
            if len(allowed) == 0:
                return [(np.empty(0, dtype=np.int64), np.empty(0))] * len(q)
            sel = faiss.IDSelectorBatch(allowed)
            # faiss's Python layer sets keyword fields; the SWIG signature names none
            params = faiss.SearchParameters(sel=sel)  # type: ignore[call-arg]
            k = min(k, len(allowed))
        k = min(k, len(self.store))
        scores, ids = (self.index.search(q, k, params=params) if params is not None
                       else self.index.search(q, k))
        out = []
        for srow, irow in zip(scores, ids, strict=True):
            keep = irow >= 0
            srow, irow = srow[keep].astype(np.float64), irow[keep].astype(np.int64)
            order = np.lexsort((irow, -srow))  # deterministic ties: chunk position
            out.append((irow[order], srow[order]))
        return out

    def _search(self, query, k, mask):
        return self._search_vectors(self.embed_queries([query]), k, mask)[0]

    def _search_batch(self, queries, k, mask):
        return self._search_vectors(self.embed_queries(queries), k, mask)

    def save(self, folder: Path) -> None:
        import faiss

        index = self.index
        if hasattr(faiss, "index_gpu_to_cpu") and not hasattr(index, "hnsw") and \
                type(index).__name__.startswith("Gpu"):
            index = faiss.index_gpu_to_cpu(index)
        faiss.write_index(index, str(folder / "faiss.index"))


def load_faiss(path: Path):
    import faiss

    try:
        return faiss.read_index(str(path))
    except RuntimeError as e:  # faiss reports a truncated or foreign file this way
        reason = str(e).strip().splitlines()[-1][:200] if str(e).strip() else "unreadable"
        raise DataError(f"not a readable FAISS index ({reason}); rebuild the index",
                        path=str(path)) from None
