"""The federated report's `report.json` as typed records (`schema_version` 1): `LoraReport`
(track A) or `KnowledgeReport` (track B), and the one reader, `read_report`. A federated
run's files are the `fed` spec's declared artifacts (`RunLayout.outputs("fed")`,
`runs.outputs_at("fed", folder)`, a federation's own folder with `under="federation"`).
The writers in `federated.report` build these records and dump them, so what is written is
what is read. Reports written before `schema_version`
existed hold the same keys and values, and read as version 1."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from workbench.errors import DataError
from workbench.io import read_json_object, read_regular_file, validate_versioned
from workbench.records import ReportPart, StrictModel
from workbench.runs import locate, outputs_at

SCHEMA_VERSION: Literal[1] = 1
MAX_REPORT_BYTES = 64 * 1024 * 1024  # a report is kilobytes; more is not a report


# --- the round log ------------------------------------------------------------------------------

class RoundRow(StrictModel):
    """One line of a federation's round log (`rounds.jsonl`) as the servers write it: a
    `federated.server.RoundLog` (track A: train and evaluate rounds) or a
    `federated.knowledge.server.KnowledgeRound` (track B). The app reads these, not keys."""

    round: int
    kind: str  # train | evaluate | knowledge
    status: str = "ok"  # ok | failed
    sent: int = 0
    used: int = 0
    failures: list[dict[str, Any]] = Field(default_factory=list)  # {node, code, reason}
    bytes_down: int = 0
    bytes_up: int = 0
    seconds: float = 0.0
    sites: dict[str, dict[str, float]] = Field(default_factory=dict)
    failed_streak: int = 0
    # track A
    replies: int = 0
    num_examples: float = 0.0
    wait_seconds: float = 0.0
    sha256: str = ""
    product_gap: float | None = None
    # track B
    ops: dict[str, int] = Field(default_factory=dict)
    active: int = 0
    candidates: int = 0


# --- report.json as typed records ---------------------------------------------------------------

class LoraCondition(ReportPart):
    """One condition of track A on every site's held-out rows and MC items."""

    omit_none: ClassVar[tuple[str, ...]] = ("mcnemar_p_vs_federated",)
    condition: Literal["initial", "local", "federated", "central"]
    label: str
    eval_loss: float | None = Field(description="Held-out loss per labelled token, pooled "
                                                "over the sites (weighted by rows).")
    eval_loss_by_site: dict[str, float | None]
    mc_correct: int
    mc_n: int
    mc_accuracy: float | None
    mc_ci95: tuple[float, float] | None = Field(description="Wilson 95% interval.")
    predictions: dict[str, int] = Field(description="How often each letter was picked.")
    mcnemar_p_vs_federated: float | None = Field(
        None, description="Exact McNemar p against the federated adapter on the same items "
                          "(absent for the federated condition itself).")


class LoraFigures(ReportPart):
    sites: int
    rounds: int
    eval_loss: dict[str, float | None] = Field(description="Pooled held-out loss by "
                                                           "condition, 4 decimals.")
    mc_accuracy: dict[str, float | None]
    bytes_per_round: float = Field(description="Adapter bytes down + up per training round.")
    round_seconds: float
    failed_rounds: int
    canary_leaks: int | None
    seconds: float


class LoraReport(ReportPart):
    """report.json of a federated LoRA run (track A)."""

    track: ClassVar[Literal["lora", "knowledge"]] = "lora"
    schema_version: Literal[1] = SCHEMA_VERSION
    figures: LoraFigures
    conditions: list[LoraCondition]
    headline: str


class KnowledgeCondition(ReportPart):
    """One condition of track B (no units, local-only units, federated units) on every
    site's eval slice."""

    omit_none: ClassVar[tuple[str, ...]] = ("mcnemar_p_vs_federated",)
    condition: Literal["none", "local", "federated"]
    label: str
    verified: int
    n: int
    rate: float | None
    ci95: tuple[float, float] | None = Field(description="Wilson 95% interval.")
    by_site: dict[str, tuple[int, int]] = Field(description="Per site: (verified, tasks).")
    iterations: int = Field(description="Search iterations (or model turns) spent in all.")
    mcnemar_p_vs_federated: float | None = Field(
        None, description="Exact McNemar p against the federated units on the same tasks "
                          "(absent for the federated condition itself).")


class Transfer(ReportPart):
    """The listener (a site that contributes nothing) with and without the federated
    units."""

    site: str
    scaffold: str
    none: tuple[int, int] = Field(description="(verified, tasks) without units.")
    federated: tuple[int, int] = Field(description="(verified, tasks) with federated units.")
    mcnemar_p: float


class KnowledgeFigures(ReportPart):
    sites: int
    rounds: int
    rate: dict[str, float | None] = Field(description="Share of eval tasks verified, by "
                                                      "condition.")
    active_units: int
    knowledge_bytes_per_round: float
    lora_bytes_per_round: int | None = Field(description="What a LoRA round of the same "
                                                         "sites would send (None: no model).")
    canary_leaks: int | None
    poison_active_rounds: int
    poison_sites_against: int
    transfer: Transfer | None
    seconds: float


class KnowledgeReport(ReportPart):
    """report.json of a federated knowledge-units run (track B)."""

    track: ClassVar[Literal["lora", "knowledge"]] = "knowledge"
    schema_version: Literal[1] = SCHEMA_VERSION
    figures: KnowledgeFigures
    conditions: list[KnowledgeCondition]
    headline: str


FedReport = LoraReport | KnowledgeReport


def read_report(run) -> tuple[LoraReport | KnowledgeReport, str]:
    """A finished federated run's typed report and its markdown. `run`: a run folder, its
    `RunLayout`, the `fed` folder or the report.json path. The track is told by the figures
    (track B's count knowledge bytes). Anything but a report of this version (missing,
    a link or device, bad JSON, another schema_version, a field that does not fit) is a
    DataError of one line naming the file; a report without schema_version reads as 1."""
    path = locate("fed", "report", run)
    rerun = "re-run the experiment"
    data = read_json_object(path, cap=MAX_REPORT_BYTES, what="federated report", rerun=rerun,
                            missing=MISSING)
    figures = data.get("figures")
    model: type[LoraReport | KnowledgeReport] = (
        KnowledgeReport if isinstance(figures, dict) and "knowledge_bytes_per_round" in figures
        else LoraReport)
    report = validate_versioned(data, model, path, what=f"federated {model.track} report",
                                rerun=rerun, version=SCHEMA_VERSION)
    md_path = outputs_at("fed", path.parent).path("report_md")
    try:
        md = read_regular_file(md_path, cap=MAX_REPORT_BYTES, what="report",
                               missing=MISSING).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"invalid UTF-8 byte at offset {e.start}; not a report",
                        path=str(md_path), code="bad_encoding") from None
    return report, md


MISSING = "no report here: the federated run has not finished (`workbench fed sim -c CONFIG`)"
