"""A machine's yes/no decisions checked against a person: the part any pipeline can use.

A pipeline whose model decides item by item (a verifier accepting a sample, a judge calling
a criterion met) is only as good as those decisions. A person rates a sample of the same
items without seeing the machine's verdict; Cohen's kappa with its bootstrap interval and the
confusion table (`workbench.evaluate.stats`) say how far the machine can be trusted. Where the
machine's "no"s cannot be shown (a pipeline that keeps only what it accepted), the person's
ratings of its "yes"s give its precision with a Wilson interval instead.

The sample is half the machine's "yes"s and half its "no"s where there are enough (a machine
that says "no" to nearly everything would otherwise be rated only on its "no"s); which items
and their order follow from a seeded hash of each key, so the person sees the same items in
the same order after a reload, and a larger sample holds a smaller one. Ratings are an
append-only JSONL file: the last rating of an item counts; a skip is kept too (the person
could not tell), so the item is not offered again and the next one takes its place.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar, Literal, Protocol, TypeVar

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from workbench.errors import DataError, WorkbenchError
from workbench.evaluate.stats import Agreement, cohens_kappa, wilson_interval
from workbench.io import append_line, describe_validation_error, iter_jsonl_raw
from workbench.records import StrictModel
from workbench.text import percent

KAPPA_MIN = 0.2  # the lower end of kappa's interval at least "fair" agreement beyond chance
PRECISION_MIN = 0.8  # the lower end of precision's interval: at most 1 in 5 "yes"s wrong
MIN_RATED = 20  # ratings before either is read as trust or distrust


class Shown(StrictModel):
    """One labelled text the person sees (the question, the options, the source text...)."""

    label: str
    text: str


class Decision(StrictModel):
    """One yes/no decision a machine made that a person can check."""

    key: str = Field(min_length=1, description="Stable id: the same item has the same key "
                                               "in every reload.")
    shown: list[Shown] = Field(description="What the person sees to judge the item (never "
                                           "the machine's verdict).")
    machine: bool = Field(description="The machine's verdict: yes (accepted, met) or no.")
    decider: str = Field("", description="Who or what decided (a model identity).")


class Rating(StrictModel):
    """A person's verdict on one decision's item."""

    key: str = Field(min_length=1)
    # `met`: the rubric judge's ratings file (workbench/loop) names it so
    verdict: bool | None = Field(validation_alias=AliasChoices("verdict", "met"), description=(
        "The person's verdict; None: skipped (the person could not tell; not counted)."))
    by: str = Field(min_length=1)
    at: str


class Precision(StrictModel):
    """Of the machine's rated "yes"s, the share the person also said yes to."""

    n: int
    agreed: int
    share: float
    ci_low: float
    ci_high: float


class Reading(StrictModel):
    """What the ratings so far say, in one line: trusted (True), not (False), or not yet
    measured (None), and about how many more ratings a firmer reading needs."""

    trusted: bool | None
    more: int = 0
    text: str


class Check(BaseModel):
    """Where a check stands: the sample, what is rated, kappa and precision so far."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    mode: Literal["kappa", "precision"] = Field(description="kappa when the machine's "
                                                            "decisions include both verdicts; "
                                                            "precision when only its yeses "
                                                            "can be rated.")
    sample: list[Decision]
    rated: dict[str, Rating] = Field(description="Ratings (skips included) of items among "
                                                 "the decisions, by key.")
    agreement: Agreement | None
    precision: Precision | None

    @property
    def next(self) -> Decision | None:
        return next((d for d in self.sample if d.key not in self.rated), None)

    @property
    def n_rated(self) -> int:
        """Rated items that count (skips do not)."""
        return sum(r.verdict is not None for r in self.rated.values())

    @property
    def progress(self) -> tuple[int, int]:
        """(sampled items rated, sampled items not skipped): "3 of 30 rated"."""
        said = [self.rated[d.key].verdict for d in self.sample if d.key in self.rated]
        return (sum(v is not None for v in said),
                len(self.sample) - sum(v is None for v in said))


def _rank(seed: int, salt: str, key: str) -> str:
    return hashlib.sha256(f"{seed}\x1f{salt}\x1f{key}".encode()).hexdigest()


def stratified_sample(items: Sequence[Decision], n: int, seed: int = 0) -> list[Decision]:
    """`n` items, half the machine said yes to and half no where there are enough, in a
    seeded order that does not depend on the order of `items` (nor on the verdicts: a
    person must not guess them from the position)."""
    yes = sorted((i for i in items if i.machine), key=lambda i: _rank(seed, "pick", i.key))
    no = sorted((i for i in items if not i.machine), key=lambda i: _rank(seed, "pick", i.key))
    n = max(0, min(n, len(yes) + len(no)))
    take_yes = min(len(yes), max(n // 2, n - len(no)))
    chosen = yes[:take_yes] + no[:n - take_yes]
    return sorted(chosen, key=lambda i: _rank(seed, "show", i.key))


def read_ratings(path: str | os.PathLike) -> dict[str, Rating]:
    """The ratings by item key, the last of each key counting ({} when there is no file).

    A link or anything but a regular file is refused; a bad line is a DataError naming
    file:line; a last line cut short by a crash (no newline) is skipped."""
    path = Path(path)
    if not os.path.lexists(path):
        return {}
    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise DataError("is not a regular file; not read", path=str(path), code="not_a_file")
    out: dict[str, Rating] = {}
    for lineno, obj in iter_jsonl_raw(path, torn_tail=lambda _e: None):
        try:
            r = Rating.model_validate(obj)
        except ValueError as e:
            raise DataError(describe_validation_error(e), path=str(path), line=lineno,
                            code="bad_rating") from None
        out[r.key] = r
    return out


def append_rating(path: str | os.PathLike, key: str, verdict: bool | None, *, by: str
                  ) -> Rating:
    """Keep one rating (None: a skip) at the end of the ratings file, in one append."""
    by = (by or "").strip()
    if not by:
        raise WorkbenchError("a rating needs the name of the person who gives it")
    path = Path(path)
    if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
        raise DataError("is not a regular file; nothing written", path=str(path),
                        code="not_a_file")
    r = Rating(key=key, verdict=verdict, by=by,
               at=datetime.now(UTC).isoformat(timespec="seconds"))
    append_line(path, r.model_dump_json())
    return r


def agreement(items: Sequence[Decision], ratings: dict[str, Rating], *, seed: int = 0
              ) -> Agreement | None:
    """Cohen's kappa of machine and person over the rated items (first rater: the machine);
    None before any rating counts."""
    pairs = [(i.machine, ratings[i.key].verdict) for i in items
             if i.key in ratings and ratings[i.key].verdict is not None]
    return cohens_kappa(*zip(*pairs, strict=True), seed=seed) if pairs else None


def precision(items: Sequence[Decision], ratings: dict[str, Rating]) -> Precision | None:
    """The share of the machine's rated yeses the person said yes to, with its Wilson
    interval; None before any of them is rated."""
    said = [ratings[i.key].verdict for i in items
            if i.machine and i.key in ratings and ratings[i.key].verdict is not None]
    if not said:
        return None
    k = sum(bool(v) for v in said)
    lo, hi = wilson_interval(k, len(said))
    return Precision(n=len(said), agreed=k, share=k / len(said), ci_low=lo, ci_high=hi)


def check(items: Sequence[Decision], ratings: dict[str, Rating], n: int, *, seed: int = 0
          ) -> Check:
    """The sample to rate (`n` items besides the skipped ones, which others replace), the
    ratings of the decisions, and the agreement of the rated ones."""
    size = n
    while True:
        sample = stratified_sample(items, size, seed)
        skipped = sum(ratings[i.key].verdict is None for i in sample if i.key in ratings)
        if size >= n + skipped or size >= len(items):
            break
        size = n + skipped
    keys = {i.key for i in items}
    mode = "kappa" if any(not i.machine for i in items) else "precision"
    return Check(mode=mode, sample=sample,
                 rated={k: r for k, r in ratings.items() if k in keys},
                 agreement=agreement(items, ratings, seed=seed),
                 precision=precision(items, ratings))


class Decisions(StrictModel):
    """A machine's decisions in one run folder that a person can be shown, and where that
    person's ratings are kept (`folder / RATINGS`): the part every check has in common.
    A pipeline's subclass adds what its report says of the machine and names its file."""
    RATINGS: ClassVar[str] = "ratings.jsonl"
    SAMPLE: ClassVar[int] = 30
    folder: Path
    items: list[Decision]
    seed: int = 0

    @property
    def ratings_path(self) -> Path:
        return self.folder / self.RATINGS

    def whose(self) -> str:
        """Whose items these are, for the refusal of a key that is not one of them."""
        return f"an item decided in {self.folder}"

    def check(self, n: int | None = None) -> Check:
        return check(self.items, read_ratings(self.ratings_path),
                     self.SAMPLE if n is None else n, seed=self.seed)

    def rate(self, key: str, verdict: bool | None, *, by: str) -> Rating:
        """Keep a person's verdict (None: skipped) on one of the items."""
        if key not in {i.key for i in self.items}:
            raise WorkbenchError(f"{key!r}: not {self.whose()}")
        return append_rating(self.ratings_path, key, verdict, by=by)


def _more(n: int, point: float, low: float, limit: float) -> int:
    """Ratings to add before an interval around `point` (lower end `low`) would clear
    `limit`, were the estimate to stay: an interval's half-width shrinks as 1/sqrt(n)."""
    if point <= limit:
        return 0
    return max(1, math.ceil(n * ((point - low) / (point - limit)) ** 2) - n)


def reading(c: Check, *, what: str = "the machine", kappa_min: float = KAPPA_MIN,
            precision_min: float = PRECISION_MIN, min_rated: int = MIN_RATED) -> Reading:
    """Whether `what` can be trusted: the lower end of kappa's interval (of precision's,
    when only yeses can be rated) must reach its limit once `min_rated` items are rated."""
    n = c.n_rated
    if n < min_rated:
        return Reading(trusted=None, more=min_rated - n, text=(
            f"not yet measured: {n} of {min_rated} items rated; rate {min_rated - n} more"))
    if c.mode == "precision":
        p = c.precision
        if p is None or p.n < min_rated:
            m = min_rated - (p.n if p else 0)
            return Reading(trusted=None, more=m, text=f"not yet measured: rate {m} more")
        if p.ci_low >= precision_min:
            return Reading(trusted=True, text=(
                f"{what}'s yeses can be trusted: at least {percent(p.ci_low)} of them are "
                f"right (limit {percent(precision_min)})"))
        more = _more(p.n, p.share, p.ci_low, precision_min)
        if more:
            return Reading(trusted=False, more=more, text=(
                f"{what}'s yeses cannot be trusted yet: the interval reaches down to "
                f"{percent(p.ci_low)} (limit {percent(precision_min)}); rate about {more} more"))
        return Reading(trusted=False, text=(
            f"{what}'s yeses cannot be trusted: {percent(p.share)} of them are right (limit "
            f"{percent(precision_min)})"))
    a = c.agreement
    if a is None or a.kappa is None or a.ci_low is None:  # all three, or none
        return Reading(trusted=None, text=(
            f"agreement undefined over {n} items: {what} and the person gave one and the same "
            "answer to all; rate items of both kinds"))
    if a.ci_low >= kappa_min:
        return Reading(trusted=True, text=(
            f"{what} can be trusted: kappa's interval starts at {a.ci_low:.2f} (limit "
            f"{kappa_min:.2f})"))
    more = _more(a.n, a.kappa, a.ci_low, kappa_min)
    if more:
        return Reading(trusted=False, more=more, text=(
            f"{what} cannot be trusted yet: kappa's interval reaches down to {a.ci_low:.2f} "
            f"(limit {kappa_min:.2f}); rate about {more} more"))
    return Reading(trusted=False, text=(
        f"{what} cannot be trusted: kappa {a.kappa:.2f} is below {kappa_min:.2f}, little "
        "agreement with the person beyond chance"))


# --- for a terminal ------------------------------------------------------------------------------

def agreement_lines(a: Agreement, *, machine: tuple[str, str],
                    person: tuple[str, str]) -> list[str]:
    """Kappa with its 95% bootstrap interval, observed and chance agreement, and the
    confusion table, as a terminal shows them. `machine`: its row labels for yes and no
    ("verifier yes", "verifier no"); `person`: the column labels ("person yes", ...)."""
    k = ("undefined" if a.kappa is None
         else f"{a.kappa:.2f} [{a.ci_low:.2f}, {a.ci_high:.2f}] (95% bootstrap)")
    cf, width = a.confusion, max(map(len, machine)) + 3
    w0, w1 = len(person[0]), len(person[1])
    return [f"kappa {k}; observed agreement {percent(a.observed)}, by chance "
            f"{percent(a.expected)}",
            " " * width + f"{person[0]}   {person[1]}",
            f"{machine[0]:<{width}}{cf['yes/yes']:>{w0}}   {cf['yes/no']:>{w1}}",
            f"{machine[1]:<{width}}{cf['no/yes']:>{w0}}   {cf['no/no']:>{w1}}"]


class _Keyed(Protocol):
    @property
    def key(self) -> str: ...


class Pending(Protocol):
    """What `ask_in_terminal` reads of a check: its next unrated item (a `Check`, or a
    pipeline's own check of the same shape such as the loop's `JudgeCheck`)."""

    @property
    def next(self) -> _Keyed | None: ...


P = TypeVar("P", bound=Pending)


def ask_in_terminal(check: P, rate: Callable[[str, bool | None], P], *, question: str, show,
                    prompt, stop_on: tuple[type[BaseException], ...] = (EOFError,)) -> P:
    """Ask a person about the check's next items until none is left or they stop: y (yes),
    n (no), s (skip: kept, so another item takes its place), q (stop); anything else asks
    again. `show(item, check)` prints the item (the machine's verdict never); `prompt(text)`
    reads the answer (an exception in `stop_on`, the input ending, stops);
    `rate(key, verdict)` keeps it and returns the check as it then stands."""
    while (item := check.next) is not None:
        show(item, check)
        try:
            got = prompt(f"{question} [y/n/s/q]").strip().lower()
        except stop_on:
            break
        if got.startswith("q"):
            break
        if got.startswith(("y", "n", "s")):
            check = rate(item.key, None if got.startswith("s") else got.startswith("y"))
    return check
