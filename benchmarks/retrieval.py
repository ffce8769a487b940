"""Retrieval speed and agreement, measured side by side in one run.

    python benchmarks/retrieval.py [--sizes 10000 100000] [--out benchmarks/results/retrieval.json]

Corpora are generated (Zipfian words, ~60 tokens a passage; workbench.rag.synthetic). FAISS at
scale uses vectors drawn to mimic MiniLM embeddings (384-d, clustered, anisotropic), since
embedding 100k passages with MiniLM takes over an hour on 2 cores; embedding speed itself is
measured on real MiniLM over a sample.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from workbench.rag.synthetic import make_passages, make_queries, make_vectors, perturb
from workbench.records import Chunk
from workbench.retrieval.analysis import Analyzer
from workbench.retrieval.base import ChunkStore, top_k
from workbench.retrieval.hybrid import HybridRetriever
from workbench.retrieval.keyword import KeywordRetriever, RankBM25Scorer, SparseBM25
from workbench.retrieval.semantic import SemanticRetriever, build_faiss, set_search_params


def ms(times):
    return 1000 * statistics.median(times)


def timeit(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


class LookupEmbedder:
    """Query 'embedding' by table lookup: isolates search cost from the embedder's 15 ms."""

    identity, batch_size = "synthetic", 64

    def __init__(self, table: dict[str, np.ndarray]):
        self.table = table
        self.dim = next(iter(table.values())).shape[0]

    def embed(self, texts, show_progress=False):
        return np.stack([self.table[t] for t in texts])


def same_top10(ref_scores, ours_idx):
    ref_top = np.sort(ref_scores)[::-1][:10]
    return bool(np.allclose(np.sort(ref_scores[ours_idx])[::-1], ref_top, atol=1e-9))


def bench_embedding(n=512):
    from workbench.models.embed import load_embedder

    emb = load_embedder("minilm", device="cpu", batch_size=64)
    texts = make_passages(n, seed=11)
    emb.embed(texts[:64])
    _, dt = timeit(emb.embed, texts)
    q = [f"query about {w}" for w in texts[0].split()[:20]]
    times = []
    for t in q:
        _, d = timeit(emb.embed, [t])
        times.append(d)
    return {"passages": n, "passages_per_s": n / dt, "query_ms": ms(times)}


def bench_keyword(n, n_queries_fast=1000, n_queries_ref=30):
    passages = make_passages(n, seed=5)
    queries = make_queries(passages, n_queries_fast, seed=6)
    an = Analyzer()
    toks, t_tok = timeit(an.batch, passages)
    ours, t_ours = timeit(SparseBM25.build, toks)
    ref, t_ref = timeit(RankBM25Scorer, toks)
    qtoks = [an(q) for q in queries]
    ours_times, agree, max_diff = [], 0, 0.0
    for qt in qtoks[:n_queries_ref]:
        t0 = time.perf_counter()
        s = ours.scores(qt)
        idx, _ = top_k(s, 10)
        ours_times.append(time.perf_counter() - t0)
    ref_times = []
    for qt in qtoks[:n_queries_ref]:
        t0 = time.perf_counter()
        r = ref.scores(qt)
        np.argsort(-r, kind="stable")[:10]
        ref_times.append(time.perf_counter() - t0)
        s = ours.scores(qt)
        agree += same_top10(r, top_k(s, 10)[0])
        max_diff = max(max_diff, float(np.max(np.abs(s - r))))
    # many queries one after another (the batched path of the keyword retriever is a loop)
    t0 = time.perf_counter()
    for qt in qtoks:
        top_k(ours.scores(qt), 10)
    batch_qps = len(qtoks) / (time.perf_counter() - t0)
    return {"passages": n, "tokenize_s": t_tok, "build_s_ours": t_ours, "build_s_rank_bm25": t_ref,
            "query_ms_ours": ms(ours_times), "query_ms_rank_bm25": ms(ref_times),
            "speedup": ms(ref_times) / ms(ours_times),
            "top10_agreement": agree / n_queries_ref, "max_abs_score_diff": max_diff,
            "queries_compared": n_queries_ref, "batch_qps_ours": batch_qps,
            "_state": (passages, queries, an, ours)}


def bench_faiss(n, n_queries=200):
    import faiss

    x = make_vectors(n, seed=7)
    q = perturb(x[np.random.default_rng(8).integers(n, size=n_queries)])
    out = {"vectors": n}
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    flat, t = timeit(build_faiss, x, "flat")
    out["flat_build_s"] = t
    faiss.omp_set_num_threads(1)
    single = []
    for row in q[:100]:
        _, d = timeit(flat.search, row[None], 10)
        single.append(d)
    out["flat_query_ms_1thread"] = ms(single)
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    _, d = timeit(flat.search, q, 10)
    out["flat_batch_qps"] = len(q) / d
    _, truth = flat.search(q, 10)
    for kind in ("hnsw", "ivf"):
        index, t = timeit(build_faiss, x, kind)
        out[f"{kind}_build_s"] = t
        knobs = (16, 64, 128) if kind == "hnsw" else (4, 16, 64)
        for knob in knobs:
            set_search_params(index, ef_search=knob, nprobe=knob)
            faiss.omp_set_num_threads(1)
            single = []
            for row in q[:100]:
                _, d = timeit(index.search, row[None], 10)
                single.append(d)
            faiss.omp_set_num_threads(os.cpu_count() or 1)
            _, ids = index.search(q, 10)
            recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, truth)])
            name = "ef" if kind == "hnsw" else "nprobe"
            out[f"{kind}_{name}{knob}_query_ms_1thread"] = ms(single)
            out[f"{kind}_{name}{knob}_recall@10"] = float(recall)
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    return out, x


def bench_hybrid(state, vectors, n_queries=100):
    import faiss

    from workbench.retrieval.interop import as_llamaindex

    passages, queries, an, ours = state
    n = len(passages)
    chunks = [Chunk(id=f"c{i}", section_id=f"s{i}", doc_id="d", source="x", text=p,
                    content_hash="h") for i, p in enumerate(passages)]
    store = ChunkStore(chunks)
    qs = queries[:n_queries]
    qv = perturb(vectors[:n_queries], seed=9)
    emb = LookupEmbedder({q: v for q, v in zip(qs, qv)})
    kw = KeywordRetriever(store, an, scorer=ours)
    sem = SemanticRetriever(store, emb, build_faiss(vectors[:n], "flat"))
    hyb = HybridRetriever(store, {"keyword": kw, "semantic": sem}, candidates=15)
    faiss.omp_set_num_threads(1)

    def per_query(r, k=3):
        r.retrieve(qs[0], k)
        times = []
        for q in qs:
            _, d = timeit(r.retrieve, q, k)
            times.append(d)
        return ms(times)

    kw15, sem15 = per_query(kw, 15), per_query(sem, 15)
    h = per_query(hyb, 3)
    from llama_index.core.llms import MockLLM
    from llama_index.core.retrievers import QueryFusionRetriever

    li = QueryFusionRetriever([as_llamaindex(kw, 15), as_llamaindex(sem, 15)], llm=MockLLM(),
                              mode="reciprocal_rerank", num_queries=1, similarity_top_k=3,
                              use_async=False)
    times = []
    for q in qs:
        _, d = timeit(li.retrieve, q)
        times.append(d)
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    t0 = time.perf_counter()
    hyb.retrieve_batch(qs, 3)
    batch = len(qs) / (time.perf_counter() - t0)
    return {"passages": n, "keyword_top15_ms": kw15, "semantic_top15_ms": sem15,
            "hybrid_top3_ms": h, "hybrid_over_sum_of_parts": h / (kw15 + sem15),
            "llamaindex_query_fusion_ms": ms(times),
            "llamaindex_over_ours": ms(times) / h, "hybrid_batch_qps": batch}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10000, 100000])
    ap.add_argument("--out", default="benchmarks/results/retrieval.json")
    args = ap.parse_args()
    results = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
               "embedding": bench_embedding(), "keyword": [], "faiss": [], "hybrid": []}
    print("embedding", json.dumps(results["embedding"]), flush=True)
    for n in args.sizes:
        kw = bench_keyword(n)
        state = kw.pop("_state")
        results["keyword"].append(kw)
        print("keyword", json.dumps(kw), flush=True)
        fa, vectors = bench_faiss(n)
        results["faiss"].append(fa)
        print("faiss", json.dumps(fa), flush=True)
        hy = bench_hybrid(state, vectors)
        results["hybrid"].append(hy)
        print("hybrid", json.dumps(hy), flush=True)
        del state, vectors
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
