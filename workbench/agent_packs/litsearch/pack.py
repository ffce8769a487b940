"""The literature-search agent (PaperPilot's loop on our runtime): papers and their citation
graph, the operators a workflow runs, the workflows and edits the agent chooses among, a
simulated user with a hidden intent, and multi-turn dialogues.

Turn 1: the agent submits a workflow for the query (`submit_workflow`; the validator's
problems come back as the tool's error and the agent may repair twice). The workflow runs
(memoised), the user accepts or rejects the top results, and the agent submits an edited
workflow: expand from the accepted papers, drop or filter out what was rejected; unaffected
nodes keep their hashes and come from the memo.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.agent_packs.litsearch import dag as D
from workbench.agent_packs.litsearch.library import library_files, load_library
from workbench.agent_packs.litsearch.papers import Intent, Paper
from workbench.agents.tools import Tool, Toolbox, ToolError
from workbench.errors import DataError, WorkbenchError
from workbench.evaluate.metrics import hit_at_k, ndcg_at_k, reciprocal_rank
from workbench.io import read_jsonl
from workbench.models.base import ScoreRequest
from workbench.records import Section, ToolCall


def load_corpus(folder: str | Path, log=None) -> tuple[dict[str, Paper], list[Intent]]:
    """Papers and intents: the pack's own papers.jsonl + anchors.jsonl, or a researcher's
    library (BibTeX, RIS, PubMed XML, OpenAlex or Semantic Scholar JSONL; a file or a folder
    of them), its intents made from its citations (`library.py`; `log` gets its notes)."""
    folder = Path(folder)
    if not (folder / "papers.jsonl").is_file() and (
            folder.is_file() or (folder.is_dir() and library_files(folder))):
        return load_library(folder, log)
    for name in ("papers.jsonl", "anchors.jsonl"):
        if not (folder / name).is_file():
            raise WorkbenchError(f"{folder}: no {name} (agent.data for the litsearch pack: "
                                 "a library file (.bib, .ris, PubMed .xml, OpenAlex or "
                                 "Semantic Scholar .jsonl), a folder of them, or the folder "
                                 "python -m workbench.agent_packs.litsearch.data builds)")
    papers = {p.pmid: p for p in read_jsonl(folder / "papers.jsonl", Paper.model_validate)}
    intents = read_jsonl(folder / "anchors.jsonl", Intent.model_validate)
    for n, it in enumerate(intents, start=1):
        missing = [p for p in (it.anchor, *it.relevance) if p not in papers]
        if missing:
            raise DataError(f"intent {it.id}: PMID(s) {', '.join(missing[:3])} not in "
                            "papers.jsonl", path=str(folder / "anchors.jsonl"), line=n)
    return papers, intents


def sections(papers: dict[str, Paper]) -> list[Any]:
    """Papers as `Section`s for the retrieval library's searcher (title, abstract, MeSH)."""
    out = []
    for i, p in enumerate(papers.values()):
        text = f"{p.title}\n{p.abstract}\nMeSH: {'; '.join(p.mesh)}"
        out.append(Section(id=p.pmid, doc_id=p.pmid, source="pubmed", heading_path=[p.title],
                           text=text, content_hash=hashlib.sha256(text.encode()).hexdigest(),
                           order=i))
    return out


class Library:
    """The operators over one corpus: keyword and semantic search (`retrieval.search.Searcher`),
    the citation graph, filters, fusion."""

    def __init__(self, papers: dict[str, Paper], keyword, semantic, model=None):
        self.papers, self.keyword, self.semantic, self.model = papers, keyword, semantic, model
        self.cited_by: dict[str, list[str]] = {}
        for p in papers.values():
            for r in p.refs:
                self.cited_by.setdefault(r, []).append(p.pmid)
        self.searches = 0
        self.intents: list[Intent] = []
        # a library without citations (BibTeX, RIS) runs with the citation operators off
        self.citations = any(p.refs for p in papers.values())

    def _search(self, searcher, query: str, k: int) -> D.Ranked:
        self.searches += 1
        return [(h.doc_id, float(h.score)) for h in searcher([query], k)[0]]

    def ops(self) -> dict[str, Any]:
        """Operator name -> function(inputs, **params), each input a ranked list."""
        return {
            "keyword_search": lambda inputs, query, k=50: self._search(self.keyword, query, k),
            "semantic_search": lambda inputs, query, k=50: self._search(self.semantic, query,
                                                                         k),
            "seed": self._seed,
            "cite_backward": lambda inputs, per_paper=20: self._graph(
                inputs, per_paper, lambda pid: [r for r in self.papers[pid].refs
                                                if r in self.papers]),
            "cite_forward": lambda inputs, per_paper=20: self._graph(
                inputs, per_paper, lambda pid: self.cited_by.get(pid, [])),
            "filter_year": self._filter_year, "filter_venue": self._filter_venue,
            "filter_terms": self._filter_terms,
            "exclude": lambda inputs, pmids: [(pid, s) for pid, s in _first(inputs)
                                              if pid not in set(pmids)],
            "filter_model": self._filter_model, "rerank": self._rerank, "fuse": _fuse,
            "union": _union, "dedup": self._dedup, "evidence": self._evidence,
        }

    def _graph(self, inputs, per_paper, edges) -> D.Ranked:
        """Papers one citation step from the top 20, scored by their source's rank."""
        out, seen = [], set()
        for rank, (pid, _) in enumerate(_first(inputs)[:20]):
            for other in edges(pid)[:per_paper]:
                if other not in seen:
                    seen.add(other)
                    out.append((other, 1.0 / (rank + 1)))
        return out

    def _seed(self, inputs, pmids) -> D.Ranked:
        bad = [p for p in pmids if p not in self.papers]
        if bad:
            raise ValueError(f"unknown PMID(s) {', '.join(bad[:3])}")
        return [(p, 1.0) for p in pmids]

    def _filter_year(self, inputs, min=None, max=None) -> D.Ranked:
        P = self.papers
        return [(pid, s) for pid, s in _first(inputs) if P[pid].year is None or
                ((min is None or P[pid].year >= min) and (max is None or P[pid].year <= max))]

    def _filter_venue(self, inputs, journals, mode="include") -> D.Ranked:
        return [(pid, s) for pid, s in _first(inputs)
                if (self.papers[pid].journal in journals) == (mode == "include")]

    def _filter_terms(self, inputs, terms, field="any", mode="include") -> D.Ranked:
        low = [t.lower() for t in terms]

        def has(pid):
            p = self.papers[pid]
            hay = {"mesh": " ".join(p.mesh), "title": p.title}.get(
                field, f"{p.title} {p.abstract} {' '.join(p.mesh)}").lower()
            return any(t in hay for t in low)

        return [(pid, s) for pid, s in _first(inputs) if has(pid) == (mode == "include")]

    def _filter_model(self, inputs, criterion, keep=20) -> D.Ranked:
        """The top 60 reordered by the model's yes-vs-no log-odds on the criterion."""
        if self.model is None:
            raise ValueError("no model to judge the criterion")

        cands = _first(inputs)[:60]
        reqs = [ScoreRequest(f"Paper: {self.papers[pid].title}\nIs this paper about "
                             f"{criterion}? Answer:", [" yes", " no"]) for pid, _ in cands]
        rows = self.model.score(reqs)
        judged = sorted(zip(cands, rows, strict=True),
                        key=lambda x: -(x[1][0].logprob - x[1][1].logprob))
        return [c for c, _ in judged[:keep]]

    def _rerank(self, inputs, query) -> D.Ranked:
        sims = dict(self._search(self.semantic, query, len(self.papers)))
        return sorted(_first(inputs), key=lambda x: -sims.get(x[0], -1e9))

    def _dedup(self, inputs) -> D.Ranked:
        """The first paper of each title (compared without case and punctuation)."""
        seen, out = set(), []
        for pid, s in _first(inputs):
            t = re.sub(r"\W+", " ", self.papers[pid].title.lower()).strip()
            if t not in seen:
                seen.add(t)
                out.append((pid, s))
        return out

    def _evidence(self, inputs, query) -> dict[str, Any]:
        """The ranking, with the abstract sentence of each top-20 paper that shares the most
        words with the query."""
        words = set(re.findall(r"\w+", query.lower()))
        ev = {}
        for pid, _ in _first(inputs)[:20]:
            sents = re.split(r"(?<=[.!?])\s+", self.papers[pid].abstract or self.papers[pid].title)
            ev[pid] = max(sents, key=lambda s: len(words & set(re.findall(r"\w+", s.lower()))))
        return {"papers": _first(inputs), "evidence": ev}


def _first(inputs):
    return inputs[0]


def _fuse(inputs, k=60) -> D.Ranked:
    """Reciprocal-rank fusion."""
    score: Counter = Counter()
    for ranked in inputs:
        for rank, (pid, _) in enumerate(ranked):
            score[pid] += 1.0 / (k + rank + 1)
    return sorted(score.items(), key=lambda x: (-x[1], x[0]))


def _union(inputs) -> D.Ranked:
    """Every paper of any input, at its best reciprocal rank."""
    best: dict[str, float] = {}
    for ranked in inputs:
        for rank, (pid, _) in enumerate(ranked):
            best[pid] = max(best.get(pid, 0.0), 1.0 / (rank + 1))
    return sorted(best.items(), key=lambda x: (-x[1], x[0]))


def ranking(value: Any) -> list[str]:
    ranked = value["papers"] if isinstance(value, dict) else value
    return [pid for pid, _ in ranked]


# --- the workflows the agent chooses among ---------------------------------------------------

def _n(nid, op, inputs=(), **params) -> dict[str, Any]:
    return {"id": nid, "op": op, "params": params, "inputs": list(inputs)}


def templates(it: Intent, citations: bool = True) -> dict[str, dict[str, Any]]:
    """Initial workflows for a query (each ends by dropping the anchor itself); without
    `citations` (a library that has none) the citation workflows are left out."""
    q = it.query[:300]
    kw, sem = _n("kw", "keyword_search", query=q, k=50), _n("sem", "semantic_search", query=q,
                                                             k=50)
    anchor = _n("anchor", "seed", pmids=[it.anchor])
    back, fwd = (_n("refs", "cite_backward", ["anchor"], per_paper=50),
                 _n("citing", "cite_forward", ["anchor"], per_paper=50))

    def wf(nodes, last):
        return {"nodes": [*nodes, _n("out", "exclude", [last], pmids=[it.anchor])],
                "output": "out"}

    out = {
        "keyword": wf([kw], "kw"),
        "semantic": wf([sem], "sem"),
        "hybrid": wf([kw, sem, _n("fused", "fuse", ["kw", "sem"])], "fused"),
    }
    if citations:
        out["citations"] = wf([anchor, back, fwd, _n("graph", "union", ["refs", "citing"]), kw,
                               sem, _n("fused", "fuse", ["graph", "kw", "sem"])], "fused")
        out["citations_reranked"] = wf([anchor, back, fwd,
                                        _n("graph", "union", ["refs", "citing"]), kw, sem,
                                        _n("fused", "fuse", ["graph", "kw", "sem"]),
                                        _n("ranked", "rerank", ["fused"], query=q)], "ranked")
    return out


def edits(wf: dict[str, Any], accepted: list[str], rejected: list[str], papers: dict[str, Paper]
          ) -> dict[str, dict[str, Any]]:
    """Workflows edited after feedback. Earlier nodes keep ids and parameters (memo hits).
    Expansion through citations is offered only when the library has citations."""
    tail = next(n for n in wf["nodes"] if n["id"] == wf["output"])
    if tail["op"] == "exclude" and tail.get("inputs"):  # our templates end by dropping pmids
        nodes = [n for n in wf["nodes"] if n["id"] != tail["id"]]
        last, drop = tail["inputs"][0], list(tail.get("params", {}).get("pmids", []))
    else:  # a workflow the model wrote: edit after its output
        nodes, last, drop = list(wf["nodes"]), wf["output"], []
    used = {n["id"] for n in nodes}
    if "out" in used:  # the new tail needs a free id
        return {"keep": wf}
    out: dict[str, dict[str, Any]] = {}

    def finish(extra, tail, pmids=drop):
        return {"nodes": [*nodes, *extra, _n("out", "exclude", [tail], pmids=pmids)],
                "output": "out"}

    dropped = sorted(set(drop) | set(rejected))
    expand: list[dict[str, Any]] = []
    if accepted and any(p.refs for p in papers.values()):
        t = len([n for n in nodes if n["id"].startswith("acc")])
        a, b, f, u, m = (f"acc{t}", f"acc{t}_refs", f"acc{t}_citing", f"acc{t}_graph",
                         f"acc{t}_fused")
        expand = [_n(a, "seed", pmids=accepted[:10]),
                  _n(b, "cite_backward", [a], per_paper=30),
                  _n(f, "cite_forward", [a], per_paper=30),
                  _n(u, "union", [b, f]), _n(m, "fuse", [a, u, last])]
        out["expand_accepted"] = finish(expand, m)
    if rejected:
        out["drop_rejected"] = finish([], last, pmids=dropped)
        bad = Counter(t for pid in rejected for t in papers[pid].mesh if pid in papers)
        good = {t for pid in accepted for t in papers[pid].mesh if pid in papers}
        terms = [t for t, _ in bad.most_common() if t not in good][:3]
        if terms:
            k = len([n for n in nodes if n["id"].startswith("filt")])
            out["filter_rejected_terms"] = finish(
                [_n(f"filt{k}", "filter_terms", [last], terms=terms, field="mesh",
                    mode="exclude")], f"filt{k}", pmids=dropped)
    if expand and rejected:
        out["expand_and_drop"] = finish(expand, expand[-1]["id"], pmids=dropped)
    out["keep"] = wf  # ignore the feedback
    return out


@dataclass
class SimulatedUser:
    """Judges the top results against the hidden relevance: grade >= 1 accepted, 0 rejected;
    papers judged before are not judged again."""

    intent: Intent
    top: int = 5
    judged: set[str] = field(default_factory=set)

    def feedback(self, ranked: list[str]) -> tuple[list[str], list[str]]:
        fresh = [p for p in ranked if p not in self.judged][:self.top]
        self.judged |= set(fresh)
        acc = [p for p in fresh if self.intent.relevance.get(p, 0) >= 1]
        return acc, [p for p in fresh if p not in set(acc)]

    def message(self, acc: list[str], rej: list[str]) -> str:
        parts = []
        if acc:
            parts.append(f"Relevant: {', '.join(acc)}.")
        if rej:
            parts.append(f"Not relevant: {', '.join(rej)}.")
        return " ".join(parts) + " Please revise the search." if parts else \
            "Nothing new. Please revise the search."


def metrics(ranked: list[str], it: Intent) -> dict[str, float]:
    rel2 = {p for p, g in it.relevance.items() if g >= 2}
    return {"hit5": hit_at_k(ranked, rel2, 5), "mrr": reciprocal_rank(ranked, rel2, 10),
            "ndcg10": ndcg_at_k(ranked, {p: float(g) for p, g in it.relevance.items()}, 10)}


def results_text(ranked: list[str], papers: dict[str, Paper], n: int = 5) -> str:
    return "\n".join(f"[{pid}] {papers[pid].title[:110]} ({papers[pid].year})"
                     for pid in ranked[:n]) or "(no papers)"


def toolbox() -> Toolbox:
    """`submit_workflow` is the final tool of a turn: its arguments are validated (schema and
    DAG checks) before the turn ends; problems go back to the model to repair."""
    def submit(workflow: dict[str, Any]) -> dict[str, Any]:
        wf, problems = D.parse(workflow)
        if wf is not None:
            problems = D.validate(wf)
        if problems:
            raise ToolError("; ".join(map(str, problems[:4])))
        return {"workflow": workflow}

    schema = {"type": "object", "properties": {"workflow": {
        "type": "object", "description": "A DAG: {nodes: [{id, op, params, inputs}], output}. "
        "Operators: " + "; ".join(f"{o.name} ({o.help or 'inputs ' + str(o.inputs)})"
                                  for o in D.OPS.values())}}, "required": ["workflow"],
              "additionalProperties": False}
    return Toolbox([Tool("submit_workflow", "Submit the search workflow to run.", schema,
                         submit, final=True)])


def describe(wf: dict[str, Any]) -> str:
    """A workflow in a line: its operators in order, with what the edits add
    ("keyword_search, semantic_search, fuse, exclude")."""
    parts = []
    for n in wf["nodes"]:
        p = n.get("params", {})
        extra = f" {len(p['pmids'])} papers" if n["op"] in ("seed", "exclude") else \
            f" {', '.join(p['terms'])}" if n["op"] == "filter_terms" else ""
        parts.append(n["op"] + extra)
    return "Workflow: " + ", ".join(parts)


def workflow_call(wf: dict[str, Any]) -> ToolCall:
    return ToolCall.make("submit_workflow", {"workflow": wf})


def call_text(wf: dict[str, Any]) -> str:
    return json.dumps(wf, separators=(",", ":"))
