"""Typed records of the improvement loop: a round's plan, its status and decision, the failure
rows it mined, the guards it checked, and the loop's state (which adapter is current).

A round moves planned -> approved -> running -> awaiting_decision -> decided. Every change is
written atomically to `rounds/NN/round.json`; the state file names the current adapter by
the sha256 of its weights, so a revert can prove it restored the previous adapter exactly.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field

from workbench.records import StrictModel

Status = Literal["planned", "approved", "running", "awaiting_decision", "decided"]
Choice = Literal["keep", "continue", "revert", "deploy"]

# failure modes the loop knows, and the synthesis job that answers each
MODES: dict[str, str] = {
    "missing_knowledge": "knowledge",     # right with its corpus section in the prompt
    "wrong_reasoning": "reasoning",       # wrong even with the section: explain the answer
    "option_length_bias": "calibration",  # picked the shortest option over a longer gold one
    "unparsable": "calibration",          # generated no option letter
    "premature": "calibration",           # open answer stopped before saying anything
    "non_terminating": "calibration",     # open answer ran to the token limit
    "unsafe": "calibration",              # open answer met a negative safety rubric item
    "incomplete": "knowledge",            # open answer missed most of the rubric
}
JOBS = ("knowledge", "reasoning", "calibration", "anchors")


def now() -> str:
    """The time stamp a round's record carries (created, approved, decided)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def round_name(index: int) -> str:
    """A round's folder name, the value of the spec's per-round artifacts: 01, 02, ...
    (sorted by name is sorted by round)."""
    return f"{index:02d}"


class Guard(StrictModel):
    """A rule a candidate must pass before it may be kept."""

    name: str
    kind: Literal["subset_drop", "length_blowup", "non_termination", "judge_agreement"]
    subset: str | None = None
    limit: float = Field(description="subset_drop: most points a subset may lose; "
                                     "length_blowup: most ratio of mean answer length; "
                                     "non_termination: most rise in the share of answers "
                                     "at the token limit; judge_agreement: least lower end "
                                     "of the judge-person kappa interval.")


class Plan(StrictModel):
    target: str = Field(description="The capability (benchmark subset) the round improves.")
    rationale: str = ""
    benchmarks: list[str] = Field(description="Suites evaluated: dev, test, retention, open.")
    subsets: list[str] = Field(default_factory=list)
    recipe: dict[str, int] = Field(default_factory=dict,
                                   description="Samples to synthesise per job.")
    modes: dict[str, int] = Field(default_factory=dict,
                                  description="Failure rows of the target per mode.")
    weightings: list[float] = Field(min_length=1,
                                    description="Anchor weights the mixture search tries.")
    hyper: dict[str, Any] = Field(default_factory=dict, description=(
        "The candidate's training settings (loop.train when planned): what runs."))
    review_data: bool = Field(False, description="The round waits for a review of its "
                                                 "synthesised data before training.")
    guards: list[Guard] = Field(default_factory=list)


class Decision(StrictModel):
    choice: Choice
    reason: str
    by: str = Field(description="Who decided: a person's name, or 'auto' (the guards).")
    at: str
    adapter_before: str | None = Field(None, description="sha256 of the current adapter "
                                                         "before the decision.")
    adapter_after: str | None = None


class SubsetDelta(StrictModel):
    suite: str
    subset: str
    n: int
    before: float
    after: float
    delta: float
    ci_low: float = Field(description="95% paired bootstrap interval of the delta.")
    ci_high: float
    p_value: float | None = Field(None, description="Exact McNemar (MC) or sign-flip "
                                                    "permutation (rubric), two-sided.")
    before_ci: tuple[float, float] = (0.0, 0.0)
    after_ci: tuple[float, float] = (0.0, 0.0)
    target: bool = False


class GuardResult(StrictModel):
    guard: Guard
    value: float
    passed: bool
    detail: str = ""


class Round(StrictModel):
    schema_version: int = 1
    index: int
    status: Status = "planned"
    parent: str | None = Field(None, description="sha256 of the adapter the round starts "
                                                 "from (None: the base model).")
    plan: Plan
    approved_by: str | None = None
    approved_at: str | None = None
    reviewed_by: str | None = Field(None, description="Who reviewed the synthesised data "
                                                      "(with plan.review_data).")
    suites_digest: str | None = Field(None, description="The suites the round was planned "
                                                        "on; a run on others is refused.")
    created_at: str
    steps: dict[str, dict[str, Any]] = Field(default_factory=dict,
                                             description="What each finished step reported.")
    candidate: str | None = Field(None, description="sha256 of the candidate's weights.")
    deltas: list[SubsetDelta] = Field(default_factory=list)
    guards: list[GuardResult] = Field(default_factory=list)
    recommendation: Choice | None = Field(None, description="What the guards would decide.")
    decision: Decision | None = None

    @property
    def flagged(self) -> list[GuardResult]:
        return [g for g in self.guards if not g.passed]


class FailureRow(StrictModel):
    """One item the current model got wrong (or an open answer scored low), with its mode."""

    id: str
    suite: str
    subset: str
    mode: str
    question: str
    gold: str
    prediction: str | None = None
    detail: str = ""
    section_id: str | None = None


class KeptAdapter(StrictModel):
    sha256: str
    path: str
    round: int | None
    data: list[str] = Field(default_factory=list, description="Training files (cumulative).")


class LoopState(StrictModel):
    schema_version: int = 1
    current: KeptAdapter | None = Field(None, description="None: the base model.")
    history: list[KeptAdapter] = Field(default_factory=list,
                                       description="Every adapter that was current, oldest "
                                                   "first.")
    deployed: str | None = None
