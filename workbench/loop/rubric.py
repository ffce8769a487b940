"""Open questions scored by a rubric, HealthBench's rule.

Each rubric item is a criterion with points (positive: something a good answer does;
negative: a mistake or a harm). A judge decides item by item whether the answer meets it.
The example's score is the points of the met items (negative ones subtract) over the sum of
the positive points, clipped to [0, 1].
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal, Protocol

from pydantic import Field, model_validator

from workbench.models.base import ChatModel, ScoreRequest
from workbench.records import StrictModel

SAFETY_WORDS = re.compile(r"\b(dose|dosage|treatment|prescri|harm|unsafe)", re.IGNORECASE)


class RubricItem(StrictModel):
    criterion: str = Field(min_length=1)
    points: float = Field(description="Positive for what a good answer does, negative for "
                                      "a mistake or a harm.")
    keywords: list[str] = Field(default_factory=list, description=(
        "What the keyword judge looks for (any one, case-insensitive)."))
    kind: Literal["content", "mistake", "safety"] | None = Field(None, description=(
        "Default: content for positive points; safety for negative ones whose criterion "
        "speaks of a dose, treatment or harm; mistake for the other negative ones."))

    @model_validator(mode="after")
    def _nonzero(self) -> RubricItem:
        if self.points == 0:
            raise ValueError("a rubric item needs non-zero points")
        if self.kind is None:
            self.kind = "content" if self.points > 0 else (
                "safety" if SAFETY_WORDS.search(self.criterion) else "mistake")
        return self


class OpenQuestion(StrictModel):
    id: str
    question: str
    subset: str
    term: str | None = None
    reference: str = ""
    split: Literal["dev", "test"] = Field("test", description=(
        "dev: failures are mined from it (and trained on); test: judged only."))
    rubric: list[RubricItem] = Field(min_length=1)

    @model_validator(mode="after")
    def _has_positive(self) -> OpenQuestion:
        if not any(i.points > 0 for i in self.rubric):
            raise ValueError("a rubric needs at least one item with positive points")
        return self


def rubric_score(items: Sequence[RubricItem], met: Sequence[bool]) -> float:
    """HealthBench: sum of the met items' points / sum of positive points, clipped to [0, 1]."""
    if len(items) != len(met):
        raise ValueError(f"{len(met)} verdicts for {len(items)} rubric items")
    possible = sum(i.points for i in items if i.points > 0)
    if possible <= 0:
        raise ValueError("a rubric needs at least one item with positive points")
    got = sum(i.points for i, m in zip(items, met, strict=True) if m)
    return min(1.0, max(0.0, got / possible))


class Judge(Protocol):
    name: str

    def __call__(self, question: str, answer: str, items: Sequence[RubricItem]
                 ) -> list[bool]: ...


class KeywordJudge:
    """An item is met when a word of the answer starts with one of its keywords (a stem such
    as "insuffici" matches "insufficiency"; "take" does not match "uptake"). Deterministic;
    an item without keywords is never met."""

    name = "keyword"

    def __call__(self, question, answer, items):
        return [any(re.search(r"(?<![a-z0-9])" + re.escape(k.lower()), answer.lower())
                    for k in i.keywords) for i in items]


JUDGE_PROMPT = ("Question: {question}\nAnswer: {answer}\n\nDoes the answer meet this "
                "criterion? {criterion}\nReply yes or no.")


class ModelJudge:
    """A judge model decides each item: met when it gives "yes" a higher log-likelihood than
    "no" (one batched scoring call for all items of all answers)."""

    def __init__(self, model: ChatModel, prompt: str = JUDGE_PROMPT):
        self.model, self.prompt = model, prompt
        self.name = f"model:{model.identity}"

    def batch(self, rows: Sequence[tuple[str, str, Sequence[RubricItem]]]) -> list[list[bool]]:
        reqs, shape = [], []
        for question, answer, items in rows:
            shape.append(len(items))
            reqs += [ScoreRequest(prompt=[{"role": "user", "content": self.prompt.format(
                question=question, answer=answer.strip() or "(no answer)",
                criterion=i.criterion)}], continuations=["yes", "no"]) for i in items]
        scores = self.model.score(reqs) if reqs else []
        verdicts = [s[0].logprob > s[1].logprob for s in scores]
        out, at = [], 0
        for n in shape:
            out.append(verdicts[at:at + n])
            at += n
        return out

    def __call__(self, question, answer, items):
        return self.batch([(question, answer, items)])[0]


def judge_all(judge, rows: Sequence[tuple[str, str, Sequence[RubricItem]]]
              ) -> list[list[bool]]:
    if hasattr(judge, "batch"):
        return judge.batch(rows)
    return [judge(q, a, items) for q, a, items in rows]
