"""The literature-search report as a typed record: `litsearch_report.json` is a
`LitsearchReport` (schema version 1), built and written by `litsearch.api.write_report`,
read by `read_report`."""

from __future__ import annotations

from pathlib import Path

from workbench.domain_agents.reports import (
    SCHEMA_VERSION,
    Interval,
    ReportPart,
    condition_file,
    read_report_file,
    report_file,
)

REPORT_JSON, REPORT_MD = "litsearch_report.json", "litsearch_report.md"
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


class LitsearchReport(ReportPart):
    """litsearch_report.json of a literature-search evaluation."""

    schema_version: int = SCHEMA_VERSION
    intents: int
    turns: int
    model: str
    citations: bool = True  # reports written before libraries without citations: on
    conditions: dict[str, LitsearchCondition]
    exports: LitsearchExports

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
