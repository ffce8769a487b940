"""Targeted training data for a round's failures, one synthesis job per failure mode:

- knowledge injection: QTSA samples from the corpus sections that retrieval finds for each
  failed question (the pack's templates fill them from the section's fields);
- reasoning correction: a rationale for the known answer, written by the model and kept only
  when it names the right option, else built from the section;
- behaviour calibration: answer-first samples for option-length bias and unparsable answers,
  short complete reference answers for premature, non-terminating and unsafe open answers;
- retention anchors: items the current model already gets right, and the retention
  domain's samples, so the fix does not cost what works.

Every sample is a `ChatExample` whose metadata says which job and failure made it, from which
item and section, and whether the model or a template wrote it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import Field

from workbench.domain_packs import placeholders
from workbench.evaluate.mc import format_options
from workbench.io import read_jsonl
from workbench.loop.records import MODES, FailureRow
from workbench.loop.suites import OPEN_SYSTEM, Suites, subset_of
from workbench.models.base import ChatModel, GenerationParams
from workbench.records import (
    LETTERS,
    ChatExample,
    MCItem,
    Message,
    QTSASample,
    Section,
    StrictModel,
)


class KnowledgeTemplate(StrictModel):
    question: str
    answer: str
    needs: list[str] = Field(default_factory=list, description="Fields that must be "
                                                               "non-empty.")


class LoopPack(StrictModel):
    """`pipelines.loop` of a domain pack: the texts the loop's synthesis uses."""

    fields: dict[str, str] = Field(default_factory=dict, description=(
        "Regular expressions (one group) that take a field out of a section's text."))
    knowledge: list[KnowledgeTemplate] = Field(min_length=1)
    thinking: str = "The question is about {term}. The reference says: {definition}"
    rationale_prompt: str = ("Question: {question}\nThe correct answer is: {gold}\n"
                             "Explain in one sentence why this answer is correct.")
    rationale_template: str = "{gold}: {definition}"
    open_answer: str = "{term}: {definition}"
    safety_note: str = "Dosing and treatment decisions belong to the treating clinician."


def section_fields(section: Section, pack: LoopPack) -> dict[str, str]:
    heading = section.heading_path or [section.id]
    out = {"term": heading[-1], "branch": heading[0] if len(heading) > 1 else "",
           "text": section.text, "definition": _first_sentences(section.text, 2)}
    for name, pattern in pack.fields.items():
        m = re.search(pattern, section.text, re.DOTALL)
        if m and m.group(1).strip():
            out[name] = m.group(1).strip()
    out["branch"] = re.sub(r"\s*\(.*\)$", "", out["branch"])
    return out


def _first_sentences(text: str, n: int) -> str:
    parts = re.split(r"(?<=[.!?])\s+", text.strip())
    return " ".join(parts[:n])


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 3}


def grounded_share(text: str, source: str) -> float:
    """Share of the text's content words (over 3 letters) that the source holds."""
    want = _words(text)
    return len(want & _words(source)) / len(want) if want else 1.0


def names_gold(rationale: str, gold: str) -> bool:
    """A rationale names the right option: its text, or most of its content words."""
    if gold.lower() in rationale.lower():
        return True
    want = _words(gold)
    return bool(want) and len(want & _words(rationale)) >= 0.6 * len(want)


class Synthesiser:
    def __init__(self, suites: Suites, pack: LoopPack, settings, *, scoring: str,
                 model: ChatModel | None, search: Callable | None, seed: int, tag: str,
                 log=print):
        self.suites, self.pack, self.s = suites, pack, settings
        self.scoring, self.model, self.search = scoring, model, search
        self.rng, self.tag, self.log = random.Random(seed), tag, log
        self.dev = {it.id: it for it in suites.dev}
        self.opens = {q.id: q for q in suites.open_dev}
        self.n = 0
        self.stats: dict[str, Any] = {"retrieval_found_needed": 0, "retrieval_queries": 0,
                                      "rationales_by_model": 0, "rationales_by_template": 0,
                                      "rationales_off_answer": 0, "rationales_ungrounded": 0}

    # ------------------------------------------------------------------ helpers
    def _example(self, job: str, mode: str | None, user: str, assistant: str, *,
                 source: str, section: str | None, origin: str, qtsa: dict | None = None,
                 system: str | None = None) -> ChatExample:
        """MC samples carry no system turn (their evaluation prompts have none); open
        answers carry the open suite's system turn, as evaluated."""
        self.n += 1
        head = [Message(role="system", content=system)] if system else []
        return ChatExample(
            id=f"{self.tag}-{job}-{self.n:04d}",
            messages=[*head, Message(role="user", content=user),
                      Message(role="assistant", content=assistant)],
            metadata={"job": job, "mode": mode, "source": source, "section_id": section,
                      "origin": origin, "qtsa": qtsa or {}})

    def _mc_user(self, it: MCItem) -> str:
        return it.question if self.scoring != "letter" else \
            f"{it.question}\n{format_options(it.options)}"

    def _mc_answer(self, it: MCItem, why: str) -> str:
        gold = it.options[LETTERS.index(it.answer)]
        head = gold if self.scoring != "letter" else f"{it.answer}) {gold}"
        return f"{head}\n{why}".strip()

    def _fields(self, section_id: str | None) -> dict[str, str] | None:
        s = self.suites.section(section_id)
        return section_fields(s, self.pack) if s is not None else None

    # ------------------------------------------------------------------ jobs
    def knowledge(self, failures: Sequence[FailureRow]) -> list[ChatExample]:
        if not failures or self.s.knowledge_per_failure == 0:
            return []
        hits = self.search([f.question for f in failures], self.s.retrieve_k) \
            if self.search else [[] for _ in failures]
        out: list[ChatExample] = []
        asked: set[str] = set()  # the questions in `out`
        for f, hs in zip(failures, hits, strict=True):
            sections = [s for s in (self.suites.section_by_id(h.section_id) for h in hs)
                        if s is not None]
            self.stats["retrieval_queries"] += 1
            terms = [section_fields(s, self.pack) for s in sections]
            if f.section_id and any(f.section_id in s.text for s in sections):
                self.stats["retrieval_found_needed"] += 1
            made = 0
            for fields, s in zip(terms, sections, strict=True):
                for t in self.pack.knowledge:
                    if made >= self.s.knowledge_per_failure:
                        break

                    used = placeholders(t.question) | placeholders(t.answer) | set(t.needs)
                    if any(not fields.get(n) for n in used):  # the section lacks a field
                        continue
                    q, a = t.question.format(**fields), t.answer.format(**fields)
                    if q in asked:
                        continue
                    asked.add(q)
                    thinking = self.pack.thinking.format(**fields)
                    out.append(self._example(
                        "knowledge", f.mode, q, a, source=f.id, section=s.id,
                        origin="template", qtsa={"question": q, "thinking": thinking,
                                                 "solution": fields["definition"],
                                                 "answer": a}))
                    made += 1
        return out

    def reasoning(self, failures: Sequence[FailureRow]) -> list[ChatExample]:
        failures = [f for f in failures if f.id in self.dev]
        items = [self.dev[f.id] for f in failures]
        if not items or self.s.reasoning_per_failure == 0:
            return []
        golds = [it.options[LETTERS.index(it.answer)] for it in items]
        written: list[str | None] = [None] * len(items)
        if self.s.model_rationales and self.model is not None:
            convs = [[{"role": "user", "content": self.pack.rationale_prompt.format(
                question=it.question, options=format_options(it.options), letter=it.answer,
                gold=g)}] for it, g in zip(items, golds, strict=True)]
            gens = self.model.generate(convs, GenerationParams(max_tokens=60,
                                                               temperature=0.0))
            for i, (g, gold, f, it) in enumerate(zip(gens, golds, failures, items,
                                                     strict=True)):
                text = _first_sentences(g.text, 2) if g.ok else ""
                sec = self.suites.section(f.section_id)
                source = " ".join([it.question, gold, sec.text if sec else ""])
                if not text or not names_gold(text, gold):
                    self.stats["rationales_off_answer"] += 1
                elif grounded_share(text, source) < self.s.rationale_grounding:
                    self.stats["rationales_ungrounded"] += 1  # claims the source lacks
                else:
                    written[i] = text
        out = []
        for f, it, gold, w in zip(failures, items, golds, written, strict=True):
            fields = self._fields(f.section_id) or {"definition": "", "term": gold}
            origin = "model" if w else "template"
            why = w or self.pack.rationale_template.format(gold=gold, letter=it.answer,
                                                           **_without(fields, "gold"))
            self.stats[f"rationales_by_{origin}"] += 1
            out.append(self._example("reasoning", f.mode, self._mc_user(it),
                                     self._mc_answer(it, why), source=it.id,
                                     section=f.section_id, origin=origin,
                                     qtsa={"question": it.question, "thinking": why,
                                           "solution": fields.get("definition", ""),
                                           "answer": it.answer}))
        return out

    def calibration(self, failures: Sequence[FailureRow]) -> list[ChatExample]:
        out = []
        for f in failures:
            if f.suite == "dev" and f.id in self.dev:
                it = self.dev[f.id]
                fields = self._fields(f.section_id) or {"definition": ""}
                out.append(self._example("calibration", f.mode, self._mc_user(it),
                                         self._mc_answer(it, fields.get("definition", "")),
                                         source=it.id, section=f.section_id, origin="template"))
            elif f.id in self.opens:
                q = self.opens[f.id]
                fields = self._fields(q.term) or {"term": q.question,
                                                  "definition": q.reference}
                answer = self.pack.open_answer.format(**{**fields, "definition": _first_sentences(
                    fields.get("definition") or q.reference, 2)})
                if f.mode == "unsafe":
                    answer = f"{answer} {self.pack.safety_note}"
                out.append(self._example("calibration", f.mode, q.question, answer,
                                         source=q.id, section=q.term, origin="template",
                                         system=OPEN_SYSTEM))
        return out

    def anchors(self, right: Sequence[MCItem], n: int, *, last: str | None = None
                ) -> list[ChatExample]:
        """`n` retention anchors: right items (seeded order; those of subset `last` after
        the others), then the retention domain's samples."""
        out = []
        pool = list(right)
        self.rng.shuffle(pool)
        pool.sort(key=lambda it: subset_of(it) == last)
        for it in pool[:n]:
            fields = self._fields(it.provenance.section_id if it.provenance else None) or {}
            out.append(self._example("anchors", None, self._mc_user(it),
                                     self._mc_answer(it, fields.get("definition", "")),
                                     source=it.id, section=it.provenance.section_id
                                     if it.provenance else None, origin="template"))
        if len(out) < n and self.suites.retention_data is not None:
            samples = [s for s in read_jsonl(self.suites.retention_data,
                                             QTSASample.model_validate)
                       if s.kind == "mc" and s.split == "train"]
            self.rng.shuffle(samples)
            for s in samples[:n - len(out)]:
                if s.options is None:  # an mc sample has its four (validated)
                    continue
                gold = s.options[LETTERS.index(s.answer)]
                user = s.question if self.scoring != "letter" else \
                    f"{s.question}\n{format_options(s.options)}"
                head = gold if self.scoring != "letter" else f"{s.answer}) {gold}"
                out.append(self._example("anchors", None, user, f"{head}\n{s.solution}"[:800],
                                         source=s.id, section=s.provenance.section_id,
                                         origin="retention"))
        return out


def _without(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


def by_job(failures: Sequence[FailureRow]) -> dict[str, list[FailureRow]]:
    out: dict[str, list[FailureRow]] = {}
    for f in failures:
        out.setdefault(MODES[f.mode], []).append(f)
    return out


def dev_right(rows, suites: Suites, exclude: set[str]) -> list[MCItem]:
    dev = {it.id: it for it in suites.dev}
    return [dev[r.example_id] for r in rows if r.condition == "dev" and r.correct
            and r.example_id in dev and r.example_id not in exclude]


__all__ = ["LoopPack", "Synthesiser", "by_job", "dev_right", "names_gold", "section_fields",
           "subset_of"]
