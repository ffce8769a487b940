"""A knowledge graph as it comes (N-Triples, Turtle, or a TSV of triples) and claims about it
(triples, or free sentences), for the KGV agent.

    agent.data: mykg/        # a folder holding
        graph.nt | graph.ttl | graph.tsv     the KG (any one name with these suffixes)
        claims.tsv | claims.txt | claims.jsonl   what to verify
        documents/ | documents.jsonl         evidence (optional: without it, the KG's own
                                             facts, one entry per entity, are the evidence)

The graph (rdflib): entity labels from rdfs:label or skos:prefLabel, aliases from
skos:altLabel; an IRI without a label is named by its local name ("HeartFailure" -> "heart
failure"). In a TSV, rows `subject predicate object`; a header row is optional; predicates
`label`, `rdfs:label`, `alias` or `skos:altLabel` give names; two more columns (subject label,
object label) may name the entities instead. A predicate the pack has no wording for is said
"{s} <its label> {o}".

Claims:
- claims.tsv: `subject predicate object [label [part]]`, entities by id/IRI or by name;
- claims.txt: one sentence a line, optionally a tab and SUPPORTED or REFUTED;
- claims.jsonl: the pack's `KGClaim`s, or {"text": ..., "label": ...} for sentences, or
  FEVER's lines ({"claim": ..., "label": "SUPPORTS"}) as they come.
Labels as the field writes them (`claim_label`: FEVER's SUPPORTS/REFUTES, SciFact's
SUPPORT/CONTRADICT, TRUE/FALSE); NOT ENOUGH INFO is refused in one line. A claim's predicate
is matched as users write it (`Graph.predicate`: `subClassOf` for rdfs:subClassOf); one with
no wording is verified as a sentence. Names find their entity by exact spelling first
(`Graph.find`).
A sentence in one of the pack's (or the graph's) wordings is read as its triple ("wording");
any other is verified as a whole ("sentence": retrieval on the sentence, a verdict citing the
entries read). Claims with no part are split one in three to train.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.agent_packs.kgv.pack import KGClaim, Wording
from workbench.errors import DataError, WorkbenchError
from workbench.io import describe_validation_error, iter_jsonl_raw
from workbench.records import Section

GRAPH_SUFFIXES = {".nt": "nt", ".ttl": "turtle", ".tsv": "tsv"}
LABEL_PREDICATES = {"label", "rdfs:label", "skos:preflabel", "name",
                    "http://www.w3.org/2000/01/rdf-schema#label",
                    "http://www.w3.org/2004/02/skos/core#preflabel"}
ALIAS_PREDICATES = {"alias", "skos:altlabel", "http://www.w3.org/2004/02/skos/core#altlabel"}
MAX_MB = 512


@dataclass
class Graph:
    labels: dict[str, str] = field(default_factory=dict)        # entity id -> label
    aliases: dict[str, list[str]] = field(default_factory=dict)  # entity id -> aliases
    facts: list[tuple[str, str, str]] = field(default_factory=list)
    predicate_labels: dict[str, str] = field(default_factory=dict)
    source: str = ""

    def name(self, eid: str) -> str:
        return self.labels.get(eid) or local_name(eid)

    def entity(self, eid: str) -> dict[str, Any]:
        return {"id": eid, "label": self.name(eid), "aliases": self.aliases.get(eid, [])}

    def find(self, text: str) -> str | None:
        """The entity an id, IRI, label or alias names, or None: a name spelt exactly as
        given first (a label before an alias), then one that differs only in case where just
        one entity has it ("apple" never picks "Apple" when both exist)."""
        if text in self.labels or text in self.aliases:
            return text
        index = self.__dict__.get("_index")
        if index is None:
            exact: dict[str, str] = {}
            folded: dict[str, set[str]] = {}
            ids = sorted({*self.labels, *(s for s, _, _ in self.facts),
                          *(o for _, _, o in self.facts)})
            for rank in (0, 1):  # labels first, then aliases
                for eid in ids:
                    names = [self.name(eid)] if rank == 0 else self.aliases.get(eid, [])
                    for n in names:
                        exact.setdefault(n, eid)
                        folded.setdefault(n.casefold(), set()).add(eid)
            index = (exact, folded)
            self.__dict__["_index"] = index
        exact, folded = index
        key = text.strip()
        if key in exact:
            return exact[key]
        found = folded.get(key.casefold(), set())
        return next(iter(found)) if len(found) == 1 else None

    def predicate(self, text: str, known: AbstractSet[str] = frozenset()) -> str | None:
        """The graph's (or a known) predicate that `text` names, as users write it: its IRI,
        its label, its local name in any case or spelling (`subClassOf`, `rdfs:subClassOf`,
        `sub class of`, `subclass_of` for rdfs:subClassOf), the graph's before the others;
        None if none or several do."""
        if text in self.predicate_labels or text in known:
            return text
        want = {_squash(text), _squash(re.split(r"[#/:]", text.rstrip("/#"))[-1])} - {""}
        for cands in (self.predicate_labels, known):  # the graph's own first
            hits = {p for p in cands if want & {_squash(p), _squash(local_name(p)),
                                                _squash(self.predicate_labels.get(p, ""))}}
            if hits:
                return next(iter(hits)) if len(hits) == 1 else None
        return None


def _squash(text: str) -> str:
    """`subClassOf`, `sub_class_of`, `Sub class of` -> `subclassof`."""
    return re.sub(r"[^0-9a-z]", "", text.casefold())


def local_name(iri: str) -> str:
    """The readable end of an IRI: after the last '#' or '/', camelCase and _ split."""
    tail = re.split(r"[#/:]", iri.rstrip("/#"))[-1] or iri
    tail = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", tail).replace("_", " ")
    return " ".join(tail.split()).lower() if tail.isascii() else tail


def graph_file(folder: Path) -> Path | None:
    found = sorted(p for p in folder.iterdir() if p.is_file() and not p.is_symlink()
                   and p.suffix.lower() in GRAPH_SUFFIXES and p.stem.lower() != "claims")
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise WorkbenchError(f"{folder}: more than one graph file ({names}); keep one")
    return found[0] if found else None


def read_graph(path: Path) -> Graph:
    if path.stat().st_size > MAX_MB * 2**20:
        raise DataError(f"over the {MAX_MB} MB limit for a graph file", path=str(path),
                        code="too_large")
    fmt = GRAPH_SUFFIXES[path.suffix.lower()]
    g = _read_tsv(path) if fmt == "tsv" else _read_rdf(path, fmt)
    g.source = path.name
    if not g.facts:
        raise DataError("no triples between entities found", path=str(path), code="empty")
    return g


def _read_rdf(path: Path, fmt: str) -> Graph:
    import rdflib
    from rdflib.namespace import RDFS, SKOS

    rg = rdflib.Graph()
    try:
        rg.parse(str(path), format=fmt)
    except Exception as e:  # noqa: BLE001  rdflib's parsers raise many types
        line = getattr(e, "lines", None) or _line_of(str(e))
        raise DataError(f"not valid {'N-Triples' if fmt == 'nt' else 'Turtle'} "
                        f"({' '.join(str(e).split())[:160]})", path=str(path),
                        line=line if isinstance(line, int) else None,
                        code="bad_record") from None
    g = Graph()
    for s, p, o in rg:
        sid, pid = str(s), str(p)
        if p in (RDFS.label, SKOS.prefLabel) and isinstance(o, rdflib.Literal):
            if not g.labels.get(sid) or (o.language or "en").startswith("en"):
                g.labels[sid] = str(o)
        elif p == SKOS.altLabel and isinstance(o, rdflib.Literal):
            g.aliases.setdefault(sid, []).append(str(o))
        elif isinstance(o, rdflib.Literal):
            lit = str(o)
            g.labels.setdefault(lit, lit)
            g.facts.append((sid, pid, lit))
        else:
            g.facts.append((sid, pid, str(o)))
    for pid in {p for _, p, _ in g.facts}:
        label = rg.value(rdflib.URIRef(pid), RDFS.label)
        g.predicate_labels[pid] = str(label) if label else local_name(pid)
    for k in g.aliases:
        g.aliases[k] = sorted(set(g.aliases[k]) - {g.labels.get(k)})
    g.facts.sort()
    return g


def _line_of(msg: str) -> int | None:
    m = re.search(r"line (\d+)", msg)
    return int(m.group(1)) if m else None


def _read_tsv(path: Path) -> Graph:
    g = Graph()
    for n, cols in _tsv_rows(path):
        if len(cols) < 3:
            raise DataError(f"{len(cols)} columns; a triple row has subject, predicate, "
                            "object (then optionally their labels)", path=str(path), line=n,
                            code="bad_record")
        s, p, o = cols[:3]
        if p.lower() in LABEL_PREDICATES:
            g.labels[s] = o
            continue
        if p.lower() in ALIAS_PREDICATES:
            g.aliases.setdefault(s, []).append(o)
            continue
        if len(cols) >= 5:
            g.labels.setdefault(s, cols[3])
            g.labels.setdefault(o, cols[4])
        g.facts.append((s, p, o))
        g.predicate_labels.setdefault(p, local_name(p))
    return g


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"not UTF-8 (byte {e.start})", path=str(path),
                        code="bad_encoding") from None


def _tsv_rows(path: Path):
    for n, line in enumerate(_text(path).splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        cols = [c.strip() for c in line.split("\t")]
        if n == 1 and [c.lower() for c in cols[:3]] == ["subject", "predicate", "object"]:
            continue  # a header row
        yield n, cols


# --- evidence from the graph itself -------------------------------------------------------------

def entity_documents(g: Graph, wordings: dict[str, Any]) -> list[Any]:
    """One entry per subject entity: its name, aliases and facts said in words (the evidence
    when no documents are given)."""
    by_subject: dict[str, list[str]] = {}
    for s, p, o in g.facts:
        by_subject.setdefault(s, []).append(say(g, s, p, o, wordings))
    out = []
    for i, (s, facts) in enumerate(sorted(by_subject.items())):
        name = g.name(s)
        also = g.aliases.get(s, [])
        text = f"{name}" + (f" (also: {', '.join(also)})" if also else "") + ": " + \
            " ".join(facts)
        eid = "kg-" + hashlib.sha256(s.encode()).hexdigest()[:12]
        out.append(Section(id=eid, doc_id=eid, source=g.source, heading_path=[name],
                           text=text, content_hash=hashlib.sha256(text.encode()).hexdigest(),
                           order=i, metadata={"entity": s, "aliases": also}))
    return out


def _literal(text: str) -> str:
    """A label placed inside a wording template (its braces are text, not fields)."""
    return text.replace("{", "{{").replace("}", "}}")


def say(g: Graph, s: str, p: str, o: str, wordings: dict[str, Any]) -> str:
    w = wordings.get(p)
    tpl = w.verbal if w is not None else \
        "{s} " + _literal(g.predicate_labels.get(p, local_name(p))) + " {o}"
    text = tpl.format(s=g.name(s), o=g.name(o))
    return text[0].upper() + text[1:] + "."


def graph_wordings(g: Graph, pack_wordings: dict[str, Any]) -> dict[str, Any]:
    """Wordings for the graph's predicates the pack does not word: "{s} <label> {o}"."""
    return {p: Wording(verbal="{s} " + _literal(g.predicate_labels.get(p, local_name(p)))
                       + " {o}")
            for p in {p for _, p, _ in g.facts} if p not in pack_wordings}


# --- claims -----------------------------------------------------------------------------------

def read_claims(path: Path, g: Graph | None, read_sentence,
                predicates: Iterable[str] = ()) -> list[Any]:
    """Claims from claims.tsv, claims.txt or claims.jsonl (see the module's docstring).
    `read_sentence(text)` is the pack's reader of a worded sentence -> (s, p, o) or None;
    `predicates` the predicates with a wording (the pack's and the graph's): a claim's
    predicate is matched to one of them as users write it (`subClassOf` for rdfs:subClassOf,
    `part of` for part_of)."""
    known = set(predicates)

    rows = _claim_rows(path)
    out = []
    for i, r in enumerate(rows):
        where = {"path": str(path), "line": r["line"]}
        if "claim" in r:
            try:
                claim = dict(r["claim"])
                if claim.get("label") is not None:
                    claim["label"] = claim_label(claim["label"], where)
                out.append(KGClaim.model_validate(claim))
            except ValueError as e:
                raise DataError(f"not a claim ({describe_validation_error(e)})", **where,
                                code="bad_record") from None
            continue
        label = claim_label(r.get("label"), where)
        part = r.get("part") or ("train" if i % 3 == 0 else "dev")
        if part not in ("train", "dev"):
            raise DataError(f"part {part!r}: train or dev", **where, code="bad_record")
        base = {"id": str(r.get("id") or f"claim-{i + 1:04d}"), "label": label,
                "part": part, "evidence": r.get("evidence", [])}
        if "triple" in r:
            s, p, o = r["triple"]
            fields = {**base, **_triple(g, s, p, o, known=known), "form": "triple"}
            if known and fields["predicate"] not in known and (
                    g is None or fields["predicate"] not in g.predicate_labels):
                # no wording for it: the claim is said plainly and verified as a sentence,
                # never a stop of the whole run
                subj, obj = fields["subject"]["label"], fields["object"]["label"]
                fields = {**base, "form": "sentence",
                          "text": f"{subj} {local_name(p)} {obj}"}
        elif (triple := read_sentence(r["text"])) is not None:
            s, p, o = triple
            fields = {**base, **_triple(g, s, p, o, worded=True), "form": "wording",
                      "text": r["text"]}
        else:
            fields = {**base, "text": r["text"], "form": "sentence"}
        try:
            out.append(KGClaim.model_validate(fields))
        except ValueError as e:
            raise DataError(f"not a claim ({describe_validation_error(e)})", **where,
                            code="bad_record") from None
    return out


def _claim_rows(path: Path) -> list[dict[str, Any]]:
    """A claims file's rows as read, before any is made a claim: {line, triple | text |
    claim, label, part, id, evidence}."""
    rows: list[dict[str, Any]] = []
    suffix = path.suffix.lower()
    if suffix == ".tsv":
        for n, cols in _tsv_rows(path):
            if len(cols) < 3:
                raise DataError(f"{len(cols)} columns; a claim row has subject, predicate, "
                                "object, then optionally label and part", path=str(path),
                                line=n, code="bad_record")
            rows.append({"line": n, "triple": cols[:3], "label": _col(cols, 3),
                         "part": _col(cols, 4)})
    elif suffix == ".txt":
        for n, line in enumerate(_text(path).splitlines(), start=1):
            if line.strip() and not line.startswith("#"):
                text, _, label = line.partition("\t")
                rows.append({"line": n, "text": text.strip(), "label": label.strip() or None})
    elif suffix == ".jsonl":
        for n, r in iter_jsonl_raw(path):  # a line nested too deeply: one DataError
            if isinstance(r, dict) and "subject" in r:
                rows.append({"line": n, "claim": r})
            elif isinstance(r, dict) and isinstance(r.get("text", r.get("claim")), str):
                # {"text": ...} or FEVER's {"claim": ..., "label": "SUPPORTS"}; evidence ids
                # are kept where they are strings (FEVER's [[ann, ev, page, line]] are not)
                ev = r.get("evidence", [])
                rows.append({"line": n, "text": r.get("text", r.get("claim")),
                             "label": r.get("label"), "part": r.get("part"), "id": r.get("id"),
                             "evidence": [e for e in ev if isinstance(e, str)]
                             if isinstance(ev, list) else []})
            else:
                raise DataError("a claim is a KGClaim (subject, predicate, object, label), "
                                '{"text": ..., "label": ...} or FEVER\'s {"claim": ..., '
                                '"label": ...}', path=str(path), line=n, code="bad_record")
    else:
        raise DataError("claims are .tsv, .txt or .jsonl", path=str(path), code="unsupported")
    return rows


def _col(cols: list[str], i: int) -> str | None:
    return cols[i] if len(cols) > i and cols[i] else None


def _triple(g: Graph | None, s: str, p: str, o: str, worded: bool = False,
            known: AbstractSet[str] = frozenset()) -> dict[str, Any]:
    """Entities found in the graph by id or name; a predicate named by its label becomes the
    graph's (a worded sentence's predicate is already a wording's key)."""
    def entity(x: str) -> dict[str, Any]:
        if g is not None and (eid := g.find(x)):
            return g.entity(eid)
        return {"id": x, "label": x}

    pred = p
    if g is not None and not worded and p not in g.predicate_labels:
        pred = g.predicate(p, known) or p
    elif g is None and not worded and p not in known:
        pred = Graph().predicate(p, known) or p
    return {"subject": entity(s), "predicate": pred, "object": entity(o)}


SUPPORTED = {"SUPPORTED", "SUPPORTS", "SUPPORT", "TRUE", "T", "YES"}
REFUTED = {"REFUTED", "REFUTES", "REFUTE", "CONTRADICT", "CONTRADICTS", "FALSE", "F", "NO"}
UNDECIDED = {"NOT ENOUGH INFO", "NOT_ENOUGH_INFO", "NEI", "NOINFO", "NOT ENOUGH INFORMATION",
             "UNVERIFIABLE"}


def claim_label(raw: Any, where: dict[str, Any]) -> str | None:
    """A gold label as the field writes it: SUPPORTED/REFUTED, FEVER's SUPPORTS/REFUTES,
    SciFact's SUPPORT/CONTRADICT, TRUE/FALSE (any case); empty is no label. FEVER's NOT ENOUGH
    INFO is refused with one line: the pack decides between two labels only."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    key = " ".join(raw.split()).upper() if isinstance(raw, str) else None
    if key in SUPPORTED:
        return "SUPPORTED"
    if key in REFUTED:
        return "REFUTED"
    if key in UNDECIDED:
        raise DataError(f"label {raw!r}: this pack decides SUPPORTED or REFUTED only; leave "
                        "claims without enough evidence out of the file", **where,
                        code="bad_record")
    raise DataError(f"label {raw!r}: SUPPORTED or REFUTED (SUPPORTS/REFUTES, "
                    "SUPPORT/CONTRADICT and TRUE/FALSE are read too)", **where,
                    code="bad_record")
