"""The task pool's records: a verified `Task`, the pool's settings (`PoolConfig`), its
`PoolSummary`, and the `TaskPool` itself."""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

from pydantic import ConfigDict, Field

from workbench.datatasks.answers import AnswerSpec, check_answer
from workbench.datatasks.queries import Query
from workbench.records import StrictModel

Category = Literal["lookup", "filter", "aggregation", "join", "group_rank", "time_series",
                   "comparison", "composed"]
Split = Literal["train", "held_out"]
POOL_VERSION = 2  # 2: aggregations chosen by column role

DROP_REASONS = {
    "error": "the reference program failed to run",
    "empty": "no rows, only NULLs, or a zero count",
    "too_large": "more rows than the answer cap",
    "type_mismatch": "the result does not have the spec's shape or type",
    "degenerate": "a filter that keeps every row, fewer groups than k, a share of 0 or 100 %",
    "tie_at_limit": "a tie at the top-k / argmax / comparison boundary makes the answer "
                    "ambiguous",
    "alt_error": "the second program failed to run",
    "disagree": "the two SQL programs gave different answers",
    "python_error": "the pandas cross-check failed to run",
    "disagree_python": "the pandas cross-check gave a different answer",
    "duplicate": "a near-duplicate of a kept task (question or program)",
    "over_target": "over the category / difficulty target when balancing",
}


class Program(StrictModel):
    model_config = ConfigDict(frozen=True)

    kind: Literal["sql", "python"]
    code: str
    shape: str = Field("", description="How it is built: direct, subquery, pandas.")


class Task(StrictModel):
    """One verified task of a pool."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="sha256 of environment hash, template and program (16 hex).")
    env_name: str
    env_hash: str = Field(description="The environment's content hash.")
    category: Category
    template_id: str
    question: str = Field(description="What the agent is asked (possibly paraphrased).")
    template_question: str = Field(description="The question as the template wrote it.")
    paraphrased: bool = False
    program: str = Field(description="The reference SQL; its result is the gold answer.")
    alt_programs: list[Program] = Field(
        default_factory=list, description="Independently built programs that agreed.")
    answer_spec: AnswerSpec
    gold: Any = Field(description="The answer in the spec's canonical form.")
    difficulty: int = Field(ge=1, le=5)
    tables: list[str]
    columns: list[str] = Field(default_factory=list, description="Table.Column names read.")
    entities: list[str] = Field(default_factory=list,
                                description="Values, numbers and names the question states.")
    parents: list[str] = Field(default_factory=list,
                               description="Ids of the tasks a composed task was built from.")
    depth: int = Field(0, description="Composition rounds behind the task (0: a seed).")
    lineage: list[str] = Field(default_factory=list, description=(
        "Its template and every ancestor's: a held-out template holds out all of them."))
    split: Split = "train"
    query: Query = Field(description="The structured query (provenance; an explorer must not "
                                     "read it, it is the answer's recipe).")

    def check(self, predicted: Any) -> bool:
        """The reward: is `predicted` this task's answer?"""
        return check_answer(self.answer_spec, self.gold, predicted)


class PoolConfig(StrictModel):
    model_config = ConfigDict(frozen=True)

    seed: int = 0
    variants: int = Field(4, ge=1, description="Queries each seed template tries.")
    compose_rounds: int = Field(2, ge=0, le=3, description="Rounds of recursive composition.")
    compose_per_op: int = Field(6, ge=0, description="Tasks each composer builds per round.")
    python_check: bool = Field(True, description="Cross-check every task in pandas (one "
                                                 "sandboxed run).")
    max_answer_rows: int = Field(25, ge=1, description="Larger set/table answers are dropped.")
    per_category: int = Field(12, ge=1, description="Target (at most) tasks per category.")
    per_difficulty: int | None = Field(None, ge=1, description="At most this many per level.")
    holdout: Literal["template", "table", "none"] = "template"
    holdout_fraction: float = Field(0.2, ge=0.0, lt=1.0)
    sql_timeout_s: float = Field(5.0, gt=0)


class PoolSummary(StrictModel):
    version: int = POOL_VERSION
    env_name: str
    env_hash: str
    seed: int
    config: PoolConfig
    candidates: int = 0
    composed_candidates: int = 0
    verified: int = 0
    kept: int = 0
    by_category: dict[str, int] = Field(default_factory=dict)
    by_difficulty: dict[str, int] = Field(default_factory=dict)
    by_split: dict[str, int] = Field(default_factory=dict)
    by_template: dict[str, int] = Field(default_factory=dict)
    drops: dict[str, int] = Field(default_factory=dict, description="Reason → count.")
    drops_by_template: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="Template → reason → count (verification drops).")
    held_out: list[str] = Field(default_factory=list, description="Held-out templates/tables.")
    removed_by_role: dict[str, int] = Field(
        default_factory=dict, description="Rule → candidate aggregations the column roles "
                                          "removed before verification (a sum of an intensive "
                                          "measurement, an average of a clock time...).")
    aggregated_by_role: dict[str, int] = Field(
        default_factory=dict, description="Kept tasks by the aggregation they ask and its "
                                          "column's role (\"avg of a measurement\": 12): no "
                                          "identifier, row index or angle is added, averaged "
                                          "or ranked.")
    python_check: str = "off"


class TaskPool(StrictModel):
    tasks: list[Task]
    summary: PoolSummary

    def split(self, name: Split) -> list[Task]:
        return [t for t in self.tasks if t.split == name]

    def by_id(self, task_id: str) -> Task:
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise KeyError(task_id)


def tally(items) -> dict[str, int]:
    """Counts by value, sorted (the summary's `by_*` figures)."""
    return dict(sorted(Counter(items).items()))
