"""Retrieval evaluation from qrels: Hit@k, Recall@k, MRR and nDCG@k, retrievers side by side.

Qrels come as JSONL (`{"query_id", "query", "relevant": [ids] | {id: grade}}`) or in TREC form
(`qid 0 docid rel` lines, with the query texts in a separate TSV `qid<TAB>text` or JSONL
file). Relevance may be judged at chunk, section or document level; retrieved chunks are
mapped to that level (keeping each id's best rank) before scoring.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import DataError
from workbench.evaluate.metrics import hit_at_k, mean, ndcg_at_k, recall_at_k, reciprocal_rank
from workbench.io import iter_jsonl_raw
from workbench.records import RetrievalHit
from workbench.text import markdown_table, number

LEVELS = {"chunk": "chunk_id", "section": "section_id", "doc": "doc_id"}


@dataclass
class Qrel:
    query_id: str
    query: str
    relevant: dict[str, float]


def _read_queries(path: Path) -> dict[str, str]:
    if path.suffix == ".jsonl":
        out = {}
        for line, obj in iter_jsonl_raw(path):
            if not isinstance(obj, dict) or "query_id" not in obj or "query" not in obj:
                raise DataError("expected query_id and query", path=str(path), line=line)
            out[str(obj["query_id"])] = obj["query"]
        return out
    out = {}
    for i, row in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not row.strip():
            continue
        qid, sep, text = row.partition("\t")
        if not sep:
            raise DataError("expected 'query_id<TAB>query text'", path=str(path), line=i)
        out[qid.strip()] = text.strip()
    return out


def read_qrels(path: str | Path, queries: str | Path | None = None) -> list[Qrel]:
    path = Path(path)
    if not path.exists():
        raise DataError("file not found", path=str(path))
    if path.suffix == ".jsonl":
        out = []
        for line, obj in iter_jsonl_raw(path):
            try:
                rel = obj["relevant"]
                rel = {str(r): 1.0 for r in rel} if isinstance(rel, list) else \
                    {str(k): float(v) for k, v in rel.items()}
                out.append(Qrel(str(obj["query_id"]), str(obj["query"]), rel))
            except (KeyError, TypeError, AttributeError, ValueError) as e:
                raise DataError(f"expected query_id, query and relevant ({e})", path=str(path),
                                line=line) from None
        return out
    if queries is None:
        raise DataError("TREC qrels need the query texts: pass --queries FILE", path=str(path))
    texts = _read_queries(Path(queries))
    grouped: dict[str, dict[str, float]] = {}
    for i, row in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        parts = row.split()
        if not parts:
            continue
        if len(parts) != 4:
            raise DataError("expected 'query_id iteration doc_id relevance'", path=str(path),
                            line=i)
        qid, _, did, rel = parts
        try:
            grouped.setdefault(qid, {})[did] = float(rel)
        except ValueError:
            raise DataError(f"relevance {rel!r} is not a number", path=str(path),
                            line=i) from None
    missing = [q for q in grouped if q not in texts]
    if missing:
        raise DataError(f"no query text for {len(missing)} query ids (e.g. {missing[0]})",
                        path=str(queries))
    return [Qrel(q, texts[q], {d: r for d, r in rels.items() if r > 0})
            for q, rels in grouped.items()]


def ranked_ids(hits: list[RetrievalHit], level: str) -> list[str]:
    attr = LEVELS[level]
    seen, out = set(), []
    for h in hits:
        v = getattr(h, attr)
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out


def evaluate_retrievers(retrievers: dict, qrels: list[Qrel], *, ks=(1, 3, 5, 10),
                        level: str = "chunk", depth: int | None = None) -> dict:
    """{retriever: {metric@k: value}}, plus per-query rows under "_per_query"."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}")
    depth = depth or max(ks)
    # chunk-level hits may repeat a section: retrieve deeper so k distinct ids exist
    fetch = depth if level == "chunk" else depth * 4
    summary: dict = {}
    per_query: list[dict] = []
    queries = [q.query for q in qrels]
    for name, r in retrievers.items():
        results = r.retrieve_batch(queries, fetch)
        rows = []
        for q, hits in zip(qrels, results, strict=True):
            ranked = ranked_ids(hits, level)[:depth]
            row = {"query_id": q.query_id, "retriever": name}
            for k in ks:
                row[f"hit@{k}"] = hit_at_k(ranked, q.relevant, k)
                row[f"recall@{k}"] = recall_at_k(ranked, q.relevant, k)
                row[f"ndcg@{k}"] = ndcg_at_k(ranked, q.relevant, k)
            row["mrr"] = reciprocal_rank(ranked, q.relevant, depth)
            rows.append(row)
        per_query += rows
        summary[name] = {m: mean(r_[m] for r_ in rows) for m in rows[0] if m not in
                         ("query_id", "retriever")} if rows else {}
    summary["_per_query"] = per_query
    return summary


def format_table(summary: dict, ks=(1, 3, 5, 10)) -> str:
    cols = [f"hit@{k}" for k in ks] + [f"recall@{max(ks)}", "mrr", f"ndcg@{max(ks)}"]
    return markdown_table(["retriever", *cols],
                          [[name, *(number(m[c]) for c in cols)]
                           for name, m in summary.items() if not name.startswith("_")])


def dumps_summary(summary: dict) -> str:
    return json.dumps({k: v for k, v in summary.items() if not k.startswith("_")}, indent=2)


def benchmark_retrieval_metrics(index, items, *, ks=(1, 3, 5, 10)) -> dict:
    """Hit@k / MRR / nDCG of each retriever on a multiple-choice benchmark, judged at section
    level from provenance: each question knows the section it was written from, so no
    labelling is needed. Items without provenance are left out ({} when none has one)."""
    qrels = [Qrel(it.id, it.question, {it.provenance.section_id: 1.0})
             for it in items if it.provenance]
    if not qrels:
        return {}
    summary = evaluate_retrievers({n: index.retriever(n) for n in ("keyword", "semantic",
                                                                    "hybrid")},
                                  qrels, level="section", ks=ks)
    return {k: v for k, v in summary.items() if not k.startswith("_")}
