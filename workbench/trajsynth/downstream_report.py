"""The downstream check's report as a typed record: `downstream.json` is a `DownstreamReport`
(schema version 1), built by `downstream.run_downstream`, read by `read_downstream`, shown by
`format_downstream`.

Reports written before the record existed read as version 1: the first ones (zero_shot, icl,
sft) have no `notes`, those of the first sft_dpo no `schema_version`; neither has `adapters`
(what the check trained: the SFT adapter and the DPO adapter started from it)."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, StrictStr

from workbench.io import read_json_object, validate_versioned
from workbench.records import ReportPart
from workbench.runs import outputs_at

SCHEMA_VERSION = 1
MAX_REPORT_BYTES = 64 * 1024 * 1024


class DownstreamRow(ReportPart):
    """One held-out task under one condition: the statement run and its outcome."""

    task: StrictStr
    sql: str | None
    verified: bool
    outcome: Literal["verified", "wrong", "error", "no_sql"]


class DownstreamCondition(ReportPart):
    """One condition on the held-out tasks: the verified rate with its 95% Wilson interval,
    the outcomes behind it, and exact McNemar tests on the same tasks against zero-shot and
    (sft_dpo) against sft."""

    omit_none = ("mcnemar_p_vs_zero_shot", "mcnemar_p_vs_sft")

    n: int
    verified: int
    accuracy: float
    ci95: tuple[float, float]
    outcomes: dict[str, int]
    mcnemar_p_vs_zero_shot: float | None = None
    mcnemar_p_vs_sft: float | None = None
    rows: list[DownstreamRow]


class DownstreamAdapter(ReportPart):
    """An adapter the check trained: sft on the exported trajectories, sft_dpo by DPO from
    the SFT adapter (`init_adapter`, also the reference) on `source`'s pairs. Folders are
    relative to the trajsynth folder."""

    omit_none = ("init_adapter", "source", "reward_accuracy", "reward_margin")

    method: Literal["sft", "dpo"]
    adapter: StrictStr
    init_adapter: str | None = None
    source: Literal["preferences", "steps"] | None = None  # dpo: where the pairs came from
    examples: int  # trajectories (sft) or pairs (dpo)
    steps: int
    first_loss: float | None
    last_loss: float | None
    reward_accuracy: float | None = None  # dpo: the last step's
    reward_margin: float | None = None


class DownstreamReport(ReportPart):
    """downstream.json of a trajectory-search run's downstream check."""

    omit_none = ("adapters",)

    schema_version: int = SCHEMA_VERSION
    tasks: int
    conditions: dict[str, DownstreamCondition]
    notes: dict[str, str] = Field(default_factory=dict)  # a condition not run, and why
    adapters: dict[str, DownstreamAdapter] | None = None  # None: none trained


def read_downstream(path: str | os.PathLike) -> DownstreamReport:
    """downstream.json (a file, or the trajsynth folder holding it) as a `DownstreamReport`;
    a missing, broken or foreign file, or another schema_version, is a DataError of one line
    naming it."""
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        p = outputs_at("trajsynth", p).path("downstream_report")
    rerun = "re-run `workbench trajsynth report`"
    data = read_json_object(p, cap=MAX_REPORT_BYTES, what="downstream report", rerun=rerun,
                            missing="no downstream report here: run `workbench trajsynth "
                                    "report ENV -o FOLDER` first")
    return validate_versioned(data, DownstreamReport, p, what="downstream report",
                              rerun=rerun, version=SCHEMA_VERSION)
