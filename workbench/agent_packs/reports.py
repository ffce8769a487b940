"""What the packs' reports share: the typed-record base, a 95% interval written as
`[low, high]`, the JSON writer, and the one reader every pack's `read_report` goes through.

Each pack's report JSON is a pydantic record (`KgvReport`, `RfReport`, `LitsearchReport`)
with `schema_version` 1; the writers build the record and dump it with `report_json`, so what
is written is what the reader checks. Reports written before `schema_version` existed hold
the same keys and values, and read as version 1.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, RootModel

from workbench import registry
from workbench.io import read_json_object, validate_versioned
from workbench.records import ReportPart
from workbench.runs import RunLayout

SCHEMA_VERSION = 1
MAX_REPORT_BYTES = 64 * 1024 * 1024  # a report is kilobytes; more is not a report

R = TypeVar("R", bound="ReportPart")


class Interval(RootModel[tuple[float, float]]):
    """A 95% interval, written `[low, high]`."""

    @property
    def low(self) -> float:
        return self.root[0]

    @property
    def high(self) -> float:
        return self.root[1]


def report_json(report: BaseModel) -> str:
    """The report's JSON text as the packs write it (indent 1; a None key, e.g. "no tool
    chosen", written `null` as `json.dumps` writes it)."""
    return json.dumps(report.model_dump(), indent=1) + "\n"


def agent_folder(run) -> Path:
    """The agent pipeline's folder of a run (a run folder or a `RunLayout`)."""
    lay = run if isinstance(run, RunLayout) else RunLayout.at(run)
    return lay.folder("agent")


def report_file(run, name: str) -> Path:
    """The report file `name` of a run folder, `RunLayout` or the report's own path."""
    if isinstance(run, RunLayout) or Path(run).is_dir():
        return agent_folder(run) / name
    return Path(run)


def condition_file(run, artifact: str, condition: str) -> Path:
    """The layout's path of a per-condition output of the agent pipeline (artifact "rf" and
    condition "tools": `<run>/agent/rf_tools.jsonl`)."""
    path = registry.get("agent").artifact(artifact).path
    return agent_folder(run) / path.replace("{value}", condition)


def read_report_file(path: str | os.PathLike, model: type[R], what: str) -> R:
    """The report at `path` as a `model`; anything else (missing, a link or device, bad
    JSON, another schema_version, a field that does not fit) is a DataError of one line
    naming the file. A report without schema_version (written before it existed) reads as
    version 1."""
    data = read_json_object(path, cap=MAX_REPORT_BYTES, what=what, rerun="re-run the evaluation",
                            missing="no report here: run `workbench agent eval PACK CONFIG` "
                                    "first")
    return validate_versioned(data, model, path, what=what, rerun="re-run the evaluation",
                              version=SCHEMA_VERSION)
