"""The KG fact-verification agent (AgentKGV's loop on our runtime): claims, the search and
answer tools over our retrievers, query rewriting, and the calls a guided policy chooses
among.

Routing is the first choice the agent makes: answering at once (the parametric route) or
searching. Rewriting proposes, in order, the verbalised triple, the subject alone (an
entity-centric query), the triple under the subject's or object's aliases (alias expansion),
the object alone, and the predicate's paraphrases; each query is offered once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, StrictStr, model_validator

from workbench.agents.runner import AgentState, AgentTask
from workbench.agents.tools import Tool, Toolbox, ToolError
from workbench.domain_packs import DomainPack
from workbench.errors import ConfigError
from workbench.io import read_jsonl
from workbench.records import Record, StrictModel, ToolCall

LABELS = ("SUPPORTED", "REFUTED")


class Entity(StrictModel):
    id: StrictStr
    label: StrictStr
    aliases: list[StrictStr] = Field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [self.label, *self.aliases]


class KGClaim(Record):
    """One claim to verify, with its gold verdict (None: unknown) and where the deciding fact
    is stated. A triple, or a free sentence (`text`). `form` says how it was read: given as a
    triple, a sentence in one of the wordings (read as its triple), or a sentence verified as
    a whole."""

    id: StrictStr
    subject: Entity | None = None
    predicate: StrictStr | None = None
    object: Entity | None = None
    text: StrictStr | None = None
    form: Literal["triple", "wording", "sentence"] = "triple"
    label: Literal["SUPPORTED", "REFUTED"] | None = None
    split: Literal["seen", "longtail"] = "seen"
    part: Literal["train", "dev"] = "dev"
    evidence: list[StrictStr] = Field(default_factory=list)

    @model_validator(mode="after")
    def _triple_or_sentence(self) -> KGClaim:
        triple = (self.subject, self.predicate, self.object)
        if self.form == "sentence":
            if not (self.text or "").strip():
                raise ValueError("a sentence claim needs its text")
        elif any(x is None for x in triple):
            raise ValueError("a claim needs subject, predicate and object, or a text with "
                             "form 'sentence'")
        return self

    def sides(self) -> tuple[Entity, Entity]:
        """(subject, object) of a triple (validation gives every claim but a sentence both)."""
        if self.subject is None or self.object is None:
            raise ValueError(f"claim {self.id}: a sentence claim has no subject and object")
        return self.subject, self.object

    @property
    def sentence(self) -> str:
        """The text of a sentence claim (validation gives it one)."""
        if self.text is None:
            raise ValueError(f"claim {self.id} has no text")
        return self.text


class Wording(StrictModel):
    verbal: str
    paraphrases: list[str] = Field(default_factory=list)


class KgvSettings(StrictModel):
    claim_prompt: str = "Is this statement true? {claim}"
    predicates: dict[str, Wording]


def settings(pack: DomainPack) -> KgvSettings:
    try:
        return KgvSettings.model_validate(pack.agent.settings)
    except ValueError as e:
        raise ConfigError([f"agent.settings: {str(e).splitlines()[0]}"],
                          source=f"domain pack {pack.name}") from None


def load_claims(path: str | Path) -> list[KGClaim]:
    return read_jsonl(path, KGClaim.model_validate)


def verbalise(claim: KGClaim, wording: Wording, s: str | None = None, o: str | None = None,
              template: str | None = None) -> str:
    subject, object_ = claim.sides()
    text = (template or wording.verbal).format(s=s or subject.label, o=o or object_.label)
    return text[0].upper() + text[1:] + "."


_STOP = frozenset("a an the of to in on at by for with and or is are was were be been it its "
                  "this that these those as from not no".split())


def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOP and len(w) > 1}


def _mentions(text: str, names: list[str]) -> bool:
    low = text.lower()
    return any(re.search(r"(?<![a-z])" + re.escape(n.lower()) + r"(?![a-z])", low)
               for n in names if n)


class KgvAgent:
    """Tools, tasks and proposals for one pack over one searcher (`retrieval.search.Searcher`,
    or a prebuilt index through `open_index`: `searcher(queries, k) -> hits`).

    `cites`: what a verdict cites, the entries' ids ("entry": a hit's document) or an index's
    passages ("passage": a hit's chunk id, shown with its source document). Every passage a
    search returned is kept (`passages`), so a verdict's citations carry their source and
    text into the trajectory (`annotate`); `source` names the evidence in every task."""

    def __init__(self, pack: DomainPack, searcher: Callable[..., list[list[Any]]], *,
                 k: int = 3, snippet_chars: int = 260, proposals: int = 2,
                 entry_ids: set[str] | None = None, wordings: dict[str, Wording] | None = None,
                 cites: Literal["entry", "passage"] = "entry", source: str = ""):
        self.pack, self.searcher, self.k = pack, searcher, k
        self.entry_ids = entry_ids  # evidence must cite these (None: what searches showed)
        self.settings = settings(pack)
        # the pack's wordings, then those of a graph's own predicates ("{s} <label> {o}")
        self.wordings = {**(wordings or {}), **self.settings.predicates}
        self.snippet_chars, self.proposals = snippet_chars, proposals
        self.cites, self.source = cites, source
        self.passages: dict[str, dict[str, str]] = {}
        self.searches = 0

    # --- tools ------------------------------------------------------------------------------

    def _search(self, query: str, k: int | None = None) -> dict[str, Any]:
        self.searches += 1
        hits = self.searcher([query], min(k or self.k, 5))[0]
        out = []
        for h in hits:
            hid = h.chunk_id if self.cites == "passage" else h.doc_id
            where = " > ".join(x for x in (h.source, *h.heading_path) if x)
            seen = self.passages.setdefault(hid, {"id": hid, "doc": h.doc_id,
                                                  "source": where, "text": ""})
            if h.text not in seen["text"]:  # an entry's other chunks join its text
                seen["text"] = " ... ".join(x for x in (seen["text"], h.text) if x)
            out.append({"id": hid, "text": h.text, "source": where})
        return {"hits": out}

    def format_hits(self, value: dict[str, Any]) -> str:
        lines = [f"[{h['id']}] " + (f"({h['source']}) " if self.cites == "passage"
                                    and h.get("source") else "")
                 + " ".join(h["text"].split())[:self.snippet_chars] for h in value["hits"]]
        return "\n".join(lines) or "(no entries found)"

    def known(self, ids) -> list[str]:
        """The ids a verdict may cite among `ids`: the entries', or (an index) the passages
        searches have shown."""
        allowed = self.entry_ids if self.entry_ids is not None else (
            set(self.passages) if self.cites == "passage" else None)
        return [i for i in ids if allowed is None or i in allowed]

    def annotate(self, t: Any) -> Any:
        """The trajectory with its cited passages (id, document, source, text) and the
        evidence searched in its metadata."""
        ids = (t.final or {}).get("evidence") or []
        cited = [self.passages[i] for i in ids if isinstance(i, str) and i in self.passages]
        meta = {**t.metadata, "cited": cited}
        if self.source:
            meta["evidence_source"] = self.source
        return t.model_copy(update={"metadata": meta})

    def toolbox(self) -> Toolbox:
        decl = self.pack.agent

        def search(query: str, k: int | None = None) -> _Hits:
            if not query.strip():
                raise ToolError("the query is empty")
            return _Hits(self._search(query, k), self)

        def answer(label: str, evidence: list[str] | None = None) -> dict[str, Any]:
            ok = set(self.known(evidence or ()))
            unknown = [e for e in evidence or () if e not in ok]
            if unknown:  # output validation: only real entry ids leave the agent
                raise ToolError(f"unknown entry id(s) {', '.join(map(repr, unknown[:3]))}; "
                                "cite ids shown in search results")
            return {"label": label, "evidence": evidence or []}

        s, a = decl.tool("search"), decl.tool("answer")
        return Toolbox([Tool(s.name, s.description, s.parameters, search),
                        Tool(a.name, a.description, a.parameters, answer, final=True)])

    # --- tasks ------------------------------------------------------------------------------

    def wording(self, claim: KGClaim) -> Wording:
        if claim.predicate not in self.wordings:
            raise ConfigError([(f"agent.settings.predicates: no wording for predicate "
                                f"{claim.predicate!r} (claim {claim.id})")],
                              source=f"domain pack {self.pack.name}")
        return self.wordings[claim.predicate]

    def statement(self, claim: KGClaim) -> str:
        """The claim as the model reads it: the sentence as given, or the triple said."""
        if claim.form == "sentence":
            text = " ".join(claim.sentence.split())
            return text if text.endswith((".", "?", "!")) else text + "."
        return verbalise(claim, self.wording(claim))

    def task(self, claim: KGClaim) -> AgentTask:
        text = self.statement(claim)
        meta = {"claim": claim.model_dump(mode="json"), "verbal": text, "form": claim.form}
        if self.source:
            meta["evidence_source"] = self.source
        return AgentTask(id=claim.id, prompt=self.settings.claim_prompt.format(claim=text),
                         metadata=meta)

    def queries(self, claim: KGClaim) -> list[str]:
        """The rewrites in the order they are offered. A sentence claim: the sentence, then
        its content words alone."""
        if claim.form == "sentence":
            words = [w for w in re.findall(r"[\w'-]+", claim.sentence)
                     if w.lower() not in _STOP]
            out = [self.statement(claim), " ".join(words)]
            return list(dict.fromkeys(q for q in out if q.strip()))
        w = self.wording(claim)
        subject, object_ = claim.sides()
        out = [verbalise(claim, w), subject.label]
        out += [verbalise(claim, w, s=a) for a in subject.aliases[:2]]
        out += [verbalise(claim, w, o=a) for a in object_.aliases[:1]]
        out.append(object_.label)
        out += [verbalise(claim, w, template=p) for p in w.paraphrases]
        seen, uniq = set(), []
        for q in out:
            if q.lower() not in seen:
                seen.add(q.lower())
                uniq.append(q)
        return uniq

    @staticmethod
    def claim_of(state: AgentState) -> KGClaim:
        return KGClaim.model_validate(state.task.metadata["claim"])

    def evidence(self, state: AgentState, claim: KGClaim) -> list[str]:
        """Entries seen so far that name the subject (or else the object), best first; for a
        sentence claim, those sharing the most content words with it (at least two)."""
        found: list[str] = []
        if claim.form == "sentence":
            want = content_words(claim.sentence)
            scored: dict[str, int] = {}
            for _, _, value in state.observations:
                for h in value.data["hits"]:
                    shared = len(want & content_words(h["text"]))
                    if shared >= min(2, len(want)):
                        scored[h["id"]] = max(scored.get(h["id"], 0), shared)
            return sorted(scored, key=lambda k: -scored[k])[:2]
        for names in (e.names for e in claim.sides()):
            for _, _, value in state.observations:
                for h in value.data["hits"]:
                    if h["id"] not in found and _mentions(h["text"], names):
                        found.append(h["id"])
            if found:
                break
        return found[:2]

    def answers(self, state: AgentState, claim: KGClaim) -> list[ToolCall]:
        ev = self.evidence(state, claim)
        return [ToolCall.make("answer", {"label": lab, "evidence": ev}) for lab in LABELS]

    def propose(self, state: AgentState, allowed: list[str]) -> list[ToolCall]:
        """The agent: answer now (with what it has read) or run one of the next rewrites."""
        claim = self.claim_of(state)
        out = self.answers(state, claim)
        if "search" in allowed:
            tried = {a["query"].lower() for a in state.calls_made("search")}
            todo = [q for q in self.queries(claim) if q.lower() not in tried]
            out += [ToolCall.make("search", {"query": q}) for q in todo[:self.proposals]]
        return out

    def propose_rag(self, state: AgentState, allowed: list[str]) -> list[ToolCall]:
        """Single-turn RAG: one search for the verbalised triple, then the verdict."""
        claim = self.claim_of(state)
        if not state.calls_made("search") and "search" in allowed:
            return [ToolCall.make("search", {"query": self.queries(claim)[0]})]
        return self.answers(state, claim)

    def propose_closed_book(self, state: AgentState, allowed: list[str]) -> list[ToolCall]:
        return self.answers(state, self.claim_of(state))

    def parse_final(self, text: str) -> dict[str, Any] | None:
        """A verdict written as text (free policy): exactly one of the labels, and the entry
        ids it names."""
        found = {lab for lab in LABELS if re.search(rf"\b{lab}\b", text.upper())}
        if len(found) == 1:
            ids = re.findall(r"\b(?:wn-[nv]\d{8}|kg-[0-9a-f]{12}|sec-[0-9a-f]{16}|"
                             r"doc-[0-9a-f]{12}|chk-[0-9a-f]{16})\b", text)
            return {"label": found.pop(), "evidence": self.known(ids)[:3]}
        return None


class _Hits(str):
    """A search result: the text the model reads, with the hits kept alongside."""

    data: dict[str, Any]

    def __new__(cls, data: dict[str, Any], agent: KgvAgent):
        obj = super().__new__(cls, agent.format_hits(data))
        obj.data = data
        return obj
