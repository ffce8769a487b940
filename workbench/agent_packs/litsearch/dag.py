"""Literature-search workflows as JSON DAGs of typed operators (PaperPilot's workflow
induction): the schema, the validator (with the errors a repair prompt shows the model), and
execution in topological order with node outputs memoised by (operator, parameters, input
hashes), so a workflow edited after feedback reruns only what changed.

A workflow:

    {"nodes": [{"id": "kw", "op": "keyword_search", "params": {"query": "...", "k": 50}},
               {"id": "sem", "op": "semantic_search", "params": {"query": "...", "k": 50}},
               {"id": "fused", "op": "fuse", "inputs": ["kw", "sem"]},
               {"id": "recent", "op": "filter_year", "inputs": ["fused"],
                "params": {"min": 1977}}],
     "output": "recent"}

Every node yields a ranked list of papers (`papers`), except `evidence`, which yields papers
with the sentence that supports each (`evidence`) and can only be the output.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, ValidationError

from workbench.records import StrictModel

Ranked = list[tuple[str, float]]  # (pmid, score), best first


@dataclass(frozen=True)
class OpSpec:
    name: str
    inputs: tuple[int, int | None]  # (min, max) inputs; max None = any number
    params: dict[str, Any]  # JSON schema of the parameters
    output: str = "papers"
    help: str = ""


def _obj(props: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required),
            "additionalProperties": False}


_K = {"type": "integer", "minimum": 1, "maximum": 200}
_Q = {"type": "string", "minLength": 2, "maxLength": 300}
_YEAR = {"type": "integer", "minimum": 1800, "maximum": 2100}
_TERMS = {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1,
          "maxItems": 10}

OPS: dict[str, OpSpec] = {o.name: o for o in [
    OpSpec("keyword_search", (0, 0), _obj({"query": _Q, "k": _K}, ["query"]),
           help="BM25 over titles, abstracts and MeSH headings"),
    OpSpec("semantic_search", (0, 0), _obj({"query": _Q, "k": _K}, ["query"]),
           help="embedding similarity (MiniLM)"),
    OpSpec("seed", (0, 0), _obj({"pmids": {"type": "array", "items": {"type": "string"},
                                           "minItems": 1, "maxItems": 50}}, ["pmids"]),
           help="given papers, e.g. the anchor or accepted ones"),
    OpSpec("cite_backward", (1, 1), _obj({"per_paper": _K}),
           help="the papers the input papers cite"),
    OpSpec("cite_forward", (1, 1), _obj({"per_paper": _K}),
           help="the papers that cite the input papers"),
    OpSpec("filter_year", (1, 1), _obj({"min": _YEAR, "max": _YEAR})),
    OpSpec("filter_venue", (1, 1), _obj({"journals": _TERMS, "mode": {
        "enum": ["include", "exclude"]}}, ["journals"])),
    OpSpec("filter_terms", (1, 1), _obj({"terms": _TERMS, "field": {
        "enum": ["mesh", "title", "any"]}, "mode": {"enum": ["include", "exclude"]}},
        ["terms"])),
    OpSpec("exclude", (1, 1), _obj({"pmids": {"type": "array", "items": {"type": "string"},
                                              "maxItems": 200}}, ["pmids"]),
           help="drop papers already judged"),
    OpSpec("filter_model", (1, 1), _obj({"criterion": _Q, "keep": {"type": "integer",
                                                                   "minimum": 1,
                                                                   "maximum": 100}},
                                        ["criterion"]),
           help="keep the papers a model judges to meet a criterion"),
    OpSpec("rerank", (1, 1), _obj({"query": _Q}, ["query"]),
           help="order by embedding similarity to the query"),
    OpSpec("fuse", (2, None), _obj({"k": {"type": "integer", "minimum": 1,
                                          "maximum": 1000}}),
           help="reciprocal-rank fusion of the inputs"),
    OpSpec("union", (2, None), _obj({}), help="all input papers, best rank kept"),
    OpSpec("dedup", (1, 1), _obj({}), help="drop papers whose titles repeat"),
    OpSpec("evidence", (1, 1), _obj({"query": _Q}, ["query"]), output="evidence",
           help="the abstract sentence that best supports each paper"),
]}
SOURCES = {n for n, o in OPS.items() if o.inputs == (0, 0)}


class Node(StrictModel):
    id: str = Field(min_length=1, max_length=40)
    op: str
    params: dict[str, Any] = Field(default_factory=dict)
    inputs: list[str] = Field(default_factory=list)


class Workflow(StrictModel):
    nodes: list[Node] = Field(min_length=1, max_length=30)
    output: str

    def node(self, nid: str) -> Node:
        return next(n for n in self.nodes if n.id == nid)


ERROR_KINDS = ("schema", "unknown_op", "bad_params", "dangling_input", "arity", "cycle",
               "edge_type", "no_output", "unreachable")


@dataclass
class Problem:
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


def parse(raw: str | dict[str, Any]) -> tuple[Workflow | None, list[Problem]]:
    """A workflow from JSON text or a dict, or the schema problems."""
    try:
        data = json.loads(raw) if isinstance(raw, str) else raw
        return Workflow.model_validate(data), []
    except ValueError as e:
        if isinstance(e, ValidationError):
            msgs = [f"{'.'.join(map(str, x['loc'])) or '(top)'}: {x['msg']}"
                    for x in e.errors()[:3]]
            return None, [Problem("schema", "; ".join(msgs))]
        return None, [Problem("schema", f"not JSON ({e})")]


def validate(wf: Workflow) -> list[Problem]:
    """Everything wrong with a parsed workflow, before anything runs."""
    from jsonschema import Draft202012Validator

    out: list[Problem] = []
    ids = [n.id for n in wf.nodes]
    if len(set(ids)) != len(ids):
        out.append(Problem("schema", "node ids repeat"))
    known = set(ids)
    for n in wf.nodes:
        spec = OPS.get(n.op)
        if spec is None:
            out.append(Problem("unknown_op", f"node {n.id}: no operator {n.op!r} (known: "
                                             f"{', '.join(OPS)})"))
            continue
        for err in list(Draft202012Validator(spec.params).iter_errors(n.params))[:2]:
            where = ".".join(map(str, err.path)) or "params"
            out.append(Problem("bad_params", f"node {n.id} ({n.op}).{where}: {err.message}"))
        for i in n.inputs:
            if i not in known:
                out.append(Problem("dangling_input", f"node {n.id}: input {i!r} is no node"))
        lo, hi = spec.inputs
        if len(n.inputs) < lo or (hi is not None and len(n.inputs) > hi):
            want = f"{lo}" if lo == hi else f"{lo} or more" if hi is None else f"{lo}-{hi}"
            out.append(Problem("arity", f"node {n.id} ({n.op}) takes {want} input(s), has "
                                        f"{len(n.inputs)}"))
        for i in n.inputs:
            if i in known and (src := OPS.get(wf.node(i).op)) and src.output != "papers":
                out.append(Problem("edge_type", f"node {n.id}: input {i} yields "
                                                f"{src.output}, not papers"))
    if topological(wf) is None:
        out.append(Problem("cycle", "the inputs form a cycle"))
    if wf.output not in known:
        out.append(Problem("no_output", f"output {wf.output!r} is no node"))
    elif not _reaches_source(wf):
        out.append(Problem("unreachable", f"output {wf.output} is not fed by any search or "
                                          "seed node"))
    return out


def topological(wf: Workflow) -> list[str] | None:
    known = {n.id for n in wf.nodes}
    indeg = {n.id: sum(i in known for i in n.inputs) for n in wf.nodes}
    users: dict[str, list[str]] = {n.id: [] for n in wf.nodes}
    for n in wf.nodes:
        for i in n.inputs:
            if i in users:
                users[i].append(n.id)
    ready = [n.id for n in wf.nodes if indeg[n.id] == 0]
    order = []
    while ready:
        nid = ready.pop(0)
        order.append(nid)
        for u in users[nid]:
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    return order if len(order) == len(wf.nodes) else None


def _reaches_source(wf: Workflow) -> bool:
    by_id = {n.id: n for n in wf.nodes}
    seen, stack = set(), [wf.output]
    while stack:
        nid = stack.pop()
        if nid in seen or nid not in by_id:
            continue
        seen.add(nid)
        if by_id[nid].op in SOURCES:
            return True
        stack.extend(by_id[nid].inputs)
    return False


# --- execution -------------------------------------------------------------------------------

@dataclass
class Memo:
    """Node outputs by (operator, parameters, input hashes); kept across a dialogue's turns."""

    values: dict[str, Any] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0


class ExecutionError(Exception):
    pass


def run(wf: Workflow, ops: dict[str, Callable[..., Any]], memo: Memo | None = None
        ) -> tuple[Any, dict[str, str]]:
    """Execute a valid workflow; returns (the output node's value, node id -> hash)."""
    memo = memo if memo is not None else Memo()
    order = topological(wf)
    if order is None:
        raise ExecutionError("cycle")
    hashes: dict[str, str] = {}
    values: dict[str, Any] = {}
    for nid in order:
        n = wf.node(nid)
        key = hashlib.sha256(json.dumps([n.op, n.params, [hashes[i] for i in n.inputs]],
                                        sort_keys=True).encode()).hexdigest()[:24]
        hashes[nid] = key
        if key in memo.values:
            memo.hits += 1
            values[nid] = memo.values[key]
            continue
        memo.misses += 1
        try:
            values[nid] = ops[n.op]([values[i] for i in n.inputs], **n.params)
        except Exception as e:  # noqa: BLE001 - any operator failure fails this workflow
            raise ExecutionError(f"node {nid} ({n.op}): {type(e).__name__}: {e}") from None
        memo.values[key] = values[nid]
    return values[wf.output], hashes
