"""The literature-search report as a typed record: `litsearch_report.json` is a
`LitsearchReport` (schema version 1), built and written by `litsearch.api.write_report`,
read by `read_report`.

Issue 27 added two keys, both left out of the JSON when there is nothing to say, so a report
written before them reads (and dumps) as it was: `paired` (each adapter condition against
the agent, and agent+sft_dpo against agent+sft, on the same intents) and `trained` (the
adapters the evaluation trained itself: agent+sft, agent+sft_dpo)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from workbench.agent_packs.reports import (
    SCHEMA_VERSION,
    Interval,
    ReportPart,
    condition_file,
    read_report_file,
    report_file,
)
from workbench.agent_packs.spec import PIPELINE

# the file names are the agent spec's declared outputs
REPORT_JSON, REPORT_MD = (PIPELINE.artifact(n).path
                          for n in ("litsearch_report", "litsearch_report_md"))
METRICS = ("hit5", "mrr", "ndcg10")


class LitsearchCondition(ReportPart):
    """One condition's dialogues on the dev intents: each ranking metric at the last turn
    and as the mean over turns, with 95% bootstrap intervals over intents."""

    dialogues: int
    hit5_final: float
    hit5_final_ci95: Interval
    hit5_avg: float
    hit5_avg_ci95: Interval
    mrr_final: float
    mrr_final_ci95: Interval
    mrr_avg: float
    mrr_avg_ci95: Interval
    ndcg10_final: float
    ndcg10_final_ci95: Interval
    ndcg10_avg: float
    ndcg10_avg_ci95: Interval
    execution_error_rate: float
    execution_error_ci95: Interval
    memo_hit_rate_after_turn1: float | None
    choices: dict[str, int]
    seconds_per_dialogue: float

    def final(self, metric: str) -> tuple[float, Interval]:
        """(value, interval) of a metric (hit5, mrr, ndcg10) at the dialogue's last turn."""
        return getattr(self, f"{metric}_final"), getattr(self, f"{metric}_final_ci95")


class LitsearchExports(ReportPart):
    """The training data made from the oracle teacher's dialogues on the training intents."""

    omit_none = ("sft", "preferences")

    sft: int | None = None
    preferences: int | None = None


class LitsearchPaired(ReportPart):
    """One condition against another on the same intents: the difference of final nDCG@10
    (condition minus against) with its 95% bootstrap interval over intents and the two-sided
    p of a paired sign-flip test over intents; the execution errors over turns with the exact
    McNemar test, turns of one intent flipped together (`clustered_sign_flip_p`)."""

    condition: str
    against: str
    intents: int
    ndcg10_final_diff: float
    ndcg10_final_diff_ci95: Interval
    ndcg10_final_p: float
    turns: int
    errors: int
    errors_against: int
    errors_p: float


class LitsearchTrained(ReportPart):
    """An adapter the evaluation trained: agent+sft by LoRA SFT on the teacher's dialogues,
    agent+sft_dpo by DPO on the corruption pairs from the SFT adapter (`init_adapter`, also
    DPO's reference). Folders are relative to the agent folder."""

    omit_none = ("init_adapter", "reward_accuracy", "reward_margin")

    method: Literal["sft", "dpo"]
    adapter: str
    init_adapter: str | None = None
    examples: int  # SFT dialogues or preference pairs
    steps: int
    first_loss: float | None
    last_loss: float | None
    reward_accuracy: float | None = None  # dpo: the last step's
    reward_margin: float | None = None


class LitsearchReport(ReportPart):
    """litsearch_report.json of a literature-search evaluation."""

    omit_none = ("paired", "trained")

    schema_version: int = SCHEMA_VERSION
    intents: int
    turns: int
    model: str
    citations: bool = True  # reports written before libraries without citations: on
    conditions: dict[str, LitsearchCondition]
    exports: LitsearchExports
    paired: list[LitsearchPaired] | None = None  # None: no adapter condition
    trained: dict[str, LitsearchTrained] | None = None  # None: none trained here

    def paired_with(self, condition: str, against: str) -> LitsearchPaired | None:
        """The paired comparison of `condition` against `against`, if the report has it."""
        return next((p for p in self.paired or () if (p.condition, p.against) ==
                     (condition, against)), None)

    def ndcg10(self) -> dict[str, float]:
        """Final nDCG@10 per condition (the figures the job returns)."""
        return {c: v.ndcg10_final for c, v in self.conditions.items()}


def read_report(run) -> LitsearchReport:
    """The report of a literature-search evaluation: a run folder, its `RunLayout`, or the
    litsearch_report.json path. A broken or foreign file is a DataError of one line naming
    it."""
    return read_report_file(report_file(run, REPORT_JSON), LitsearchReport,
                            "literature-search report")


def dialogues_file(run, condition: str) -> Path:
    """The dev dialogues of one condition (`litsearch_<condition>.jsonl`)."""
    return condition_file(run, "litsearch", condition)
