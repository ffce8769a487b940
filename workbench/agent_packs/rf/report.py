"""The RF design report as a typed record: `rf_report.json` is an `RfReport` (schema version
1), built and written by `rf.api.rf_report`, read by `read_report`; `rf_report.md` is made
from the same record."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import StringConstraints

from workbench.agent_packs.grpo import TrainedAdapter, summary_line
from workbench.agent_packs.reports import (
    SCHEMA_VERSION,
    Interval,
    ReportPart,
    condition_file,
    read_report_file,
    report_file,
)
from workbench.agent_packs.spec import PIPELINE
from workbench.text import markdown_table, number, p_value, percent, percent_interval, points

# the file names are the agent spec's declared outputs
REPORT_JSON, REPORT_MD = (PIPELINE.artifact(n).path for n in ("rf_report", "rf_report_md"))
Fraction = Annotated[str, StringConstraints(pattern=r"^\d+/\d+$")]  # "right/items"


class RfCondition(ReportPart):
    """One condition (alone, rag, tools) on the design items."""

    omit_none = ("tool_chosen", "right_tool")

    n: int
    accuracy: float
    accuracy_ci95: Interval
    answered: int
    tool_calls_mean: float
    errors: int
    seconds_per_item: float
    by_family: dict[str, Fraction]
    # the tools condition only: the calculator each item's first good call used (None: no
    # call went through, written `null`), and the items where it was the right one
    tool_chosen: dict[str | None, int] | None = None
    right_tool: int | None = None


class RfPaired(ReportPart):
    """Exact McNemar test of two conditions on the same items."""

    p: float
    delta: float


RfTraining = TrainedAdapter  # how tools+grpo's adapter was made (agent_packs.grpo)


class RfReport(ReportPart):
    """rf_report.json of an RF design evaluation."""

    omit_none = ("training",)

    schema_version: int = SCHEMA_VERSION
    items: int
    model: str
    conditions: dict[str, RfCondition]
    paired: dict[str, RfPaired]
    training: dict[str, RfTraining] | None = None

    def accuracy(self) -> dict[str, float]:
        """Accuracy per condition (the figures the job returns)."""
        return {c: r.accuracy for c, r in self.conditions.items()}


def read_report(run) -> RfReport:
    """The report of an RF design evaluation: a run folder, its `RunLayout`, or the
    rf_report.json path. A broken or foreign file is a DataError of one line naming it."""
    return read_report_file(report_file(run, REPORT_JSON), RfReport, "RF design report")


def condition_rows(run, condition: str) -> Path:
    """The per-item rows of one condition (`rf_tools.jsonl`: the tools agent's runs)."""
    return condition_file(run, "rf", condition)


def report_markdown(report: RfReport, *, tolerance: float) -> str:
    conds = report.conditions
    lines = [f"# RF design: {report.items} numeric items, model `{report.model}`", "",
             f"Correct = within {percent(tolerance)} of the calculated answer; 95% "
             "Wilson intervals.", "",
             markdown_table(
                 ["condition", "accuracy", "answered", "tool calls / item", "s / item",
                  "by family"],
                 [[c, percent_interval(s.accuracy, s.accuracy_ci95.low, s.accuracy_ci95.high),
                   f"{s.answered}/{s.n}", number(s.tool_calls_mean, 2),
                   number(s.seconds_per_item, 2),
                   ", ".join(f"{f} {v}" for f, v in s.by_family.items())]
                  for c, s in conds.items()])]
    for c in (c for c in conds if conds[c].right_tool is not None):
        lines += ["", f"{c}: the right calculator chosen on {conds[c].right_tool}/"
                  f"{report.items} items ({conds[c].tool_chosen})."]
    for cond, t in (report.training or {}).items():
        lines += ["", summary_line(cond, t)]
    if report.paired:
        lines += ["", markdown_table(["paired (exact McNemar)", "Δ accuracy", "p"],
                                     [[k, points(v.delta), p_value(v.p)]
                                      for k, v in report.paired.items()])]
    return "\n".join(lines) + "\n"
