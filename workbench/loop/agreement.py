"""The rubric judge checked against people: judge-person agreement on the same decisions.

The judge decides, item by item, whether an open answer meets a rubric criterion; a rubric
delta is only as good as those decisions. A person rates a sample of the same (answer,
criterion) pairs without seeing the judge's verdict; Cohen's kappa with a bootstrap interval
and the confusion table say how far the judge can be trusted, and a guard says when it
cannot: the delta of the open questions is then not evidence.

The judge's decisions are drawn from every answer the loop's evaluations judged (all
adapters, the open suites); the sample, the ratings file and the agreement are the generic
ones of `workbench.evaluate.agreement` (half the judge's "met"s and half its others where
there are enough, in a seeded order that survives a reload; a skip is kept and another item
takes its place). Ratings live in `<loop run>/judge_ratings.jsonl`, append-only (the last
rating of an item counts); a file written before, whose rows name the verdict `met`, reads
the same.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from workbench.errors import WorkbenchError
from workbench.evaluate import agreement as generic
from workbench.evaluate.agreement import Check, Decision, Rating, Reading, Shown
from workbench.evaluate.stats import Agreement
from workbench.io import read_jsonl
from workbench.loop.records import Guard, GuardResult
from workbench.loop.suites import Suites
from workbench.records import EvalResult, StrictModel
from workbench.runs import Outputs
from workbench.text import markdown_table, percent

OPEN_SUITES = ("open", "open_dev")
QUESTION = "Does the answer meet the criterion?"
WHAT = "the judge"

PersonRating = Rating  # the name this module gave a rating; a row's `met` is its `verdict`


class JudgedItem(StrictModel):
    """One judge decision a person can check: an answer, one criterion, the judge's verdict."""

    key: str = Field(description="Stable id: question, item and the answer's hash.")
    example_id: str
    item: int
    question: str
    answer: str
    criterion: str
    points: float
    judge_met: bool
    judge: str

    def decision(self) -> Decision:
        """The same decision as `workbench.evaluate.agreement` rates it (what a person sees:
        the question, the answer and the criterion; never the judge's verdict)."""
        return Decision(key=self.key, machine=self.judge_met, decider=self.judge, shown=[
            Shown(label="question", text=self.question),
            Shown(label="answer", text=self.answer),
            Shown(label=f"criterion ({self.points:+g} points)", text=self.criterion)])


class JudgeCheck(BaseModel):
    """Where the check stands: the sample, what is rated, and the agreement so far."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    sample: list[JudgedItem] = Field(description="The items to rate, in order: the seeded "
                                                 "sample less the ones the person skipped "
                                                 "(others take their place).")
    rated: dict[str, Rating] = Field(description="Ratings (skips included) of the judge's "
                                                 "decisions, by key.")
    agreement: Agreement | None
    judge: str
    decisions: Check = Field(description="The same check in workbench.evaluate.agreement's "
                                         "terms (its sample keeps the skipped items).")

    @property
    def next(self) -> JudgedItem | None:
        return next((i for i in self.sample if i.key not in self.rated), None)

    @property
    def n_rated(self) -> int:
        """Rated items that count (skips do not)."""
        return self.decisions.n_rated

    def reading(self, settings) -> Reading:
        """What the ratings say of the judge, in one line, by the guard's limits
        (`loop.guards.judge_kappa_min`, `judge_min_items`)."""
        return generic.reading(self.decisions, what=WHAT, kappa_min=settings.judge_kappa_min,
                              min_rated=settings.judge_min_items)


class Judged(Protocol):
    """What the check reads of a loop: its files (the evaluations, the ratings), its suites
    (the open questions) and its settings; a `Loop` or its `Evaluator`."""

    @property
    def files(self) -> Outputs: ...

    @property
    def suites(self) -> Suites: ...

    @property
    def lc(self) -> Any: ...

    @property
    def cfg(self) -> Any: ...


def judged_items(loop: Judged) -> list[JudgedItem]:
    """Every (answer, criterion) decision the judge made in the loop's evaluations."""
    questions = _questions(loop)
    out: dict[str, JudgedItem] = {}
    evals = loop.files.path("evals")
    for f in sorted(evals.glob("*/open*.jsonl")) if evals.is_dir() else ():
        if f.stem not in OPEN_SUITES:
            continue
        for r in read_jsonl(f, EvalResult.model_validate):
            q = questions.get(r.example_id)
            met = r.extra.get("met")
            if q is None or not isinstance(met, list) or len(met) != len(q.rubric):
                continue
            answer = r.prediction or ""
            digest = hashlib.sha256(answer.encode()).hexdigest()[:10]
            for n, (item, m) in enumerate(zip(q.rubric, met, strict=True)):
                key = f"{q.id}#{n}#{digest}"
                out.setdefault(key, JudgedItem(
                    key=key, example_id=q.id, item=n, question=q.question, answer=answer,
                    criterion=item.criterion, points=item.points, judge_met=bool(m),
                    judge=str(r.extra.get("judge", ""))))
    return [out[k] for k in sorted(out)]


def _questions(loop: Judged) -> dict:
    return {q.id: q for suite in OPEN_SUITES for q in loop.suites.opens(suite)}


def sample_items(items: Sequence[JudgedItem], n: int, seed: int = 0) -> list[JudgedItem]:
    """`n` items in a seeded order, half judged met and half not where there are enough
    (`workbench.evaluate.agreement.stratified_sample`)."""
    by_key = {i.key: i for i in items}
    chosen = generic.stratified_sample([i.decision() for i in items], n, seed)
    return [by_key[d.key] for d in chosen]


def _ratings_path(loop: Judged) -> Path:
    return loop.files.path("judge_ratings")


def read_ratings(loop: Judged) -> dict[str, Rating]:
    """The person's ratings by item key (the last rating of an item counts; a skip is a
    rating whose verdict is None)."""
    return generic.read_ratings(_ratings_path(loop))


def judge_check(loop: Judged, *, n: int | None = None, seed: int | None = None) -> JudgeCheck:
    """The sample to rate (`loop.guards.judge_sample` items besides the skipped ones), the
    ratings and the agreement of the rated ones."""
    items = judged_items(loop)
    by_key = {i.key: i for i in items}
    c = generic.check([i.decision() for i in items], read_ratings(loop),
                      n or loop.lc.guards.judge_sample,
                      seed=loop.cfg.seed if seed is None else seed)
    if c.mode != "kappa":  # every decision of the judge can be shown: kappa, never precision
        c = c.model_copy(update={"mode": "kappa"})
    sample = [by_key[d.key] for d in c.sample
              if d.key not in c.rated or c.rated[d.key].verdict is not None]
    judge = next((i.judge for i in items if i.judge), "")
    return JudgeCheck(sample=sample, rated=c.rated, agreement=c.agreement, judge=judge,
                      decisions=c)


def rate_item(loop: Judged, key: str, met: bool | None, *, by: str) -> JudgeCheck:
    """Keep a person's verdict on one judged item (None: skipped, the person could not
    tell), appended to the ratings file; returns the check with it counted."""
    if not (by or "").strip():
        raise WorkbenchError("a rating needs the name of the person who gives it")
    if key not in {i.key for i in judged_items(loop)}:
        raise WorkbenchError(f"{key!r}: not an item the judge decided in this loop")
    generic.append_rating(_ratings_path(loop), key, None if met is None else bool(met), by=by)
    return judge_check(loop)


def judge_guard(check: JudgeCheck, settings) -> GuardResult:
    """Whether the open questions' rubric delta can be trusted: the lower end of kappa's
    interval must reach `judge_kappa_min` once `judge_min_items` items are rated; before
    that the guard passes and says it was not measured."""
    guard = Guard(name="judge-person agreement", kind="judge_agreement",
                  limit=settings.judge_kappa_min)
    a = check.agreement
    n = a.n if a else 0
    if a is None or n < settings.judge_min_items:
        return GuardResult(guard=guard, value=0.0, passed=True, detail=(
            f"not measured: {n} of {settings.judge_min_items} judged items rated by a person "
            "(the app's Improvement loop page, or `workbench loop judge-check`)"))
    if a.kappa is None or a.ci_low is None or a.ci_high is None:  # all three, or none
        return GuardResult(guard=guard, value=0.0, passed=False, detail=(
            f"agreement undefined over {n} items: judge and person gave one and the same "
            "answer to all; rate items of both kinds"))
    ok = a.ci_low >= settings.judge_kappa_min
    return GuardResult(guard=guard, value=round(a.ci_low, 4), passed=ok, detail=(
        f"kappa {a.kappa:.2f} [{a.ci_low:.2f}, {a.ci_high:.2f}] over {n} items; "
        + ("the rubric delta can be trusted" if ok else
           f"below {settings.judge_kappa_min:.2f}: the rubric delta is not evidence")))


def agreement_markdown(check: JudgeCheck) -> list[str]:
    """The agreement and its confusion table, for a round's report ([] before any rating)."""
    a = check.agreement
    if a is None:
        return []
    c = a.confusion
    k = ("undefined (no variation)" if a.kappa is None
         else f"{a.kappa:.2f} [{a.ci_low:.2f}, {a.ci_high:.2f}]")
    return ["", f"## The judge checked against a person ({check.judge or 'judge'})", "",
            (f"{a.n} of the judge's rubric decisions rated by a person without seeing the "
             f"judge's: Cohen's kappa {k} (95% bootstrap interval), observed agreement "
             f"{percent(a.observed)}, expected by chance {percent(a.expected)}."), "",
            markdown_table(["", "person: met", "person: not met"],
                           [["judge: met", c["yes/yes"], c["yes/no"]],
                            ["judge: not met", c["no/yes"], c["no/no"]]])]
