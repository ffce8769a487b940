"""The rubric judge checked against people: judge-person agreement on the same decisions.

The judge decides, item by item, whether an open answer meets a rubric criterion; a rubric
delta is only as good as those decisions. A person rates a sample of the same (answer,
criterion) pairs without seeing the judge's verdict; Cohen's kappa with a bootstrap interval
and the confusion table say how far the judge can be trusted, and a guard says when it
cannot: the delta of the open questions is then not evidence.

The sample is drawn from every answer the loop's evaluations judged (all adapters, the open
suites), half from items the judge said were met and half from the others where there are
enough (a judge that says "no" to nearly everything would otherwise be rated only on its
"no"s), in a seeded order, so the person rates the same items in the same order after a
reload. Ratings live in `<loop run>/judge_ratings.jsonl` (the last rating of an item counts).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from workbench.errors import DataError, WorkbenchError
from workbench.evaluate.stats import Agreement, cohens_kappa
from workbench.loop.records import Guard, GuardResult

RATINGS = "judge_ratings.jsonl"
OPEN_SUITES = ("open", "open_dev")


class JudgedItem(BaseModel):
    """One judge decision a person can check: an answer, one criterion, the judge's verdict."""

    model_config = ConfigDict(extra="forbid")
    key: str = Field(description="Stable id: question, item and the answer's hash.")
    example_id: str
    item: int
    question: str
    answer: str
    criterion: str
    points: float
    judge_met: bool
    judge: str


class PersonRating(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str
    met: bool
    by: str = Field(min_length=1)
    at: str


class JudgeCheck(BaseModel):
    """Where the check stands: the sample, what is rated, and the agreement so far."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    sample: list[JudgedItem]
    rated: dict[str, PersonRating]
    agreement: Agreement | None
    judge: str

    @property
    def next(self) -> JudgedItem | None:
        return next((i for i in self.sample if i.key not in self.rated), None)


def judged_items(loop) -> list[JudgedItem]:
    """Every (answer, criterion) decision the judge made in the loop's evaluations."""
    from workbench.io import read_jsonl
    from workbench.records import EvalResult

    questions = _questions(loop)
    out: dict[str, JudgedItem] = {}
    evals = loop.root / "evals"
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


def _questions(loop) -> dict:
    return {q.id: q for suite in OPEN_SUITES for q in loop.suites.opens(suite)}


def sample_items(items: Sequence[JudgedItem], n: int, seed: int = 0) -> list[JudgedItem]:
    """`n` items in a seeded order, half judged met and half not where there are enough."""
    rng = random.Random(seed)
    met = [i for i in items if i.judge_met]
    unmet = [i for i in items if not i.judge_met]
    rng.shuffle(met)
    rng.shuffle(unmet)
    half = n // 2
    take_met = min(len(met), max(half, n - len(unmet)))
    chosen = met[:take_met] + unmet[:n - take_met]
    rng.shuffle(chosen)
    return chosen


def _ratings_path(loop) -> Path:
    return loop.root / RATINGS


def read_ratings(loop) -> dict[str, PersonRating]:
    """The person's ratings by item key (the last rating of an item counts)."""
    import os
    import stat

    from workbench.io import describe_validation_error, iter_jsonl_raw

    path = _ratings_path(loop)
    if not path.exists():
        return {}
    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise DataError("is not a regular file; not read", path=str(path), code="not_a_file")
    out = {}
    for lineno, obj in iter_jsonl_raw(path, torn_tail=lambda _e: None):
        try:
            r = PersonRating.model_validate(obj)
        except ValueError as e:
            raise DataError(describe_validation_error(e), path=str(path), line=lineno,
                            code="bad_rating") from None
        out[r.key] = r
    return out


def judge_check(loop, *, n: int | None = None, seed: int | None = None) -> JudgeCheck:
    """The sample to rate (`loop.guards.judge_sample` items), the ratings and the agreement
    of the rated ones."""
    g = loop.lc.guards
    items = judged_items(loop)
    sample = sample_items(items, n or g.judge_sample, loop.cfg.seed if seed is None else seed)
    rated = read_ratings(loop)
    by_key = {i.key: i for i in items}
    pairs = [(by_key[k].judge_met, r.met) for k, r in rated.items() if k in by_key]
    agreement = cohens_kappa(*zip(*pairs, strict=True), seed=loop.cfg.seed) if pairs else None
    judge = next((i.judge for i in items if i.judge), "")
    return JudgeCheck(sample=sample, rated={k: v for k, v in rated.items() if k in by_key},
                      agreement=agreement, judge=judge)


def rate_item(loop, key: str, met: bool, *, by: str) -> JudgeCheck:
    """Keep a person's verdict on one judged item; returns the check with it counted."""
    from workbench.io import atomic_write_text

    by = (by or "").strip()
    if not by:
        raise WorkbenchError("a rating needs the name of the person who gives it")
    if key not in {i.key for i in judged_items(loop)}:
        raise WorkbenchError(f"{key!r}: not an item the judge decided in this loop")
    rows = read_ratings(loop)
    rows[key] = PersonRating(key=key, met=bool(met), by=by,
                             at=datetime.now(UTC).isoformat(timespec="seconds"))
    atomic_write_text(_ratings_path(loop), "".join(r.model_dump_json() + "\n"
                                                   for r in rows.values()))
    return judge_check(loop)


def judge_guard(check: JudgeCheck, settings) -> GuardResult:
    """Whether the open questions' rubric delta can be trusted: the lower end of kappa's
    interval must reach `judge_kappa_min` once `judge_min_items` items are rated; before
    that the guard passes and says it was not measured."""
    guard = Guard(name="judge-person agreement", kind="judge_agreement",
                  limit=settings.judge_kappa_min)
    a = check.agreement
    n = a.n if a else 0
    if n < settings.judge_min_items:
        return GuardResult(guard=guard, value=0.0, passed=True, detail=(
            f"not measured: {n} of {settings.judge_min_items} judged items rated by a person "
            "(the app's Improvement loop page, or `workbench loop judge-check`)"))
    if a.kappa is None:
        return GuardResult(guard=guard, value=0.0, passed=False, detail=(
            f"agreement undefined over {n} items: judge and person gave one and the same "
            "answer to all; rate items of both kinds"))
    ok = a.ci_low >= settings.judge_kappa_min
    return GuardResult(guard=guard, value=round(a.ci_low, 4), passed=ok, detail=(
        f"kappa {a.kappa:.2f} [{a.ci_low:.2f}, {a.ci_high:.2f}] over {n} items; "
        + ("the rubric delta can be trusted" if ok else
           f"below {settings.judge_kappa_min:.2f}: the rubric delta is not evidence")))


def refresh_round_guard(loop) -> GuardResult | None:
    """Put the judge guard, as the ratings now stand, into the latest round that awaits a
    decision (and its recommendation); returns it, or None when no round awaits one."""
    from workbench.loop.guards import recommend

    rounds = [r for r in loop.rounds() if r.status == "awaiting_decision" and r.guards]
    if not rounds:
        return None
    r = rounds[-1]
    g = judge_guard(judge_check(loop), loop.lc.guards)
    guards = [x for x in r.guards if x.guard.kind != "judge_agreement"] + [g]
    choice, _ = recommend(guards, r.deltas, loop.lc.guards.min_gain)
    r = loop.save(r.model_copy(update={"guards": guards, "recommendation": choice}))
    from workbench.loop.report import write_round_report

    write_round_report(loop, r)
    return g


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
             f"{a.observed:.0%}, expected by chance {a.expected:.0%}."), "",
            "| | person: met | person: not met |", "|---|---|---|",
            f"| judge: met | {c['yes/yes']} | {c['yes/no']} |",
            f"| judge: not met | {c['no/yes']} | {c['no/no']} |"]
