"""Run folders: one `RunLayout` owns every path in them, one `StageRunner` skips work whose
inputs did not change.

    <output_dir>/<name>/            the run folder (`RunLayout.root`)
        stages.json                 hashed inputs and timings of every finished stage
        .lock                       held by the job writing the run
        <pipeline folder>/...       each pipeline's outputs, as its spec declares them

Paths of outputs are data in the pipelines' specs (`Stage.outputs`); the CLI, the app and
the jobs ask `layout.artifact("distill", "benchmark")` instead of joining strings. The
declared artifact is the one, typed way to a run's files: `layout.read("distill",
"benchmark")` gives its rows as the declared record type (`MCItem`), `layout.write(...)`
validates rows by it and writes atomically, `layout.find(...)` lists a per-value artifact's
files (a loop's rounds) or finds a file from a run folder, its pipeline's folder or the file
itself. A folder that is not a run's (`workbench trajsynth ... -o OUT`, a federation's server
folder) is read the same way through `outputs_at(pipeline, folder)`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from workbench import registry
from workbench.errors import DataError, WorkbenchError
from workbench.io import (
    atomic_write_json,
    atomic_write_text,
    describe_validation_error,
    iter_jsonl_raw,
    read_json_object,
    read_jsonl,
    read_regular_file,
    sha256_file,
    validate_versioned,
    write_jsonl,
)
from workbench.progress import stage as in_progress
from workbench.records import StrictModel

RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def check_run_name(name: str) -> str:
    """A run name is one plain folder name: no separators, no `..`, not absolute."""
    if not isinstance(name, str) or not RUN_NAME.match(name) or ".." in name:
        raise WorkbenchError(f"run name {name!r}: use letters, digits, '.', '_' and '-' "
                             "(one folder name, at most 100 characters)")
    return name


@dataclass(frozen=True)
class RunLayout:
    root: Path

    @classmethod
    def of(cls, cfg) -> RunLayout:
        """The run folder of an experiment config: `<output_dir>/<name>`."""
        return cls(Path(cfg.output_dir) / check_run_name(cfg.name))

    @classmethod
    def at(cls, path: str | Path) -> RunLayout:
        return cls(Path(path))

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def stages_file(self) -> Path:
        return self.root / "stages.json"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    def folder(self, pipeline: str) -> Path:
        sub = registry.get(pipeline).subfolder
        return self.root / sub if sub else self.root

    def outputs(self, pipeline: str) -> Outputs:
        """The pipeline's declared artifacts in this run (paths, typed read and write)."""
        return Outputs(pipeline, self.folder(pipeline))

    def artifact(self, pipeline: str, name: str, value: str | None = None) -> Path:
        return self.outputs(pipeline).path(name, value)

    def has(self, pipeline: str, name: str, value: str | None = None) -> bool:
        try:
            return self.artifact(pipeline, name, value).exists()
        except WorkbenchError:
            return False

    def read(self, pipeline: str, name: str, value: str | None = None, *,
             appending: bool = False) -> Any:
        """A declared artifact's content, typed by its record (`Outputs.read`)."""
        return self.outputs(pipeline).read(name, value, appending=appending)

    def write(self, pipeline: str, name: str, data: Any, value: str | None = None) -> Path:
        """Write a declared artifact, validated by its record (`Outputs.write`)."""
        return self.outputs(pipeline).write(name, data, value)

    def find(self, pipeline: str, name: str) -> dict[str, Path]:
        """A per-value artifact's files that exist, by value (`Outputs.find`)."""
        return self.outputs(pipeline).find(name)

    def stages(self) -> StagesState:
        return read_stages(self.stages_file)


# --- declared artifacts: paths, typed read and write -----------------------------------------

MAX_JSON_BYTES = 256 * 1024 * 1024  # a declared JSON file is kilobytes to megabytes


@dataclass(frozen=True)
class Outputs:
    """A pipeline's declared artifacts in one folder: a run's pipeline folder
    (`RunLayout.outputs`) or a folder the pipeline writes outside a run (`outputs_at`).
    With `under`, `root` is that artifact's own folder (a federation's server folder is
    the `fed` spec's `federation`) and paths are taken relative to it. With `value`, a
    per-value artifact named without its value takes this one (`for_value`: one round's
    files of a loop)."""

    pipeline: str
    root: Path
    under: str | None = None
    value: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    def declared(self, name: str) -> registry.Artifact:
        return registry.get(self.pipeline).artifact(name)

    def for_value(self, value: str) -> Outputs:
        """The same folder, its per-value artifacts taken for `value`."""
        return Outputs(self.pipeline, self.root, self.under, value)

    def path(self, name: str, value: str | None = None) -> Path:
        """Where artifact `name` is (for `value`, when it is declared per value). A name the
        spec does not declare, or a per-value artifact without its value, is refused."""
        a = self.declared(name)
        rel = a.path
        if value is None and "{value}" in rel:
            value = self.value
        if ("{value}" in rel) != (value is not None):
            raise WorkbenchError(f"{self.pipeline}/{name}: " + (
                "is declared per value; name the value" if value is None
                else f"is not declared per value, got {value!r}"))
        if value is not None:
            if not value or "/" in value or value in (".", ".."):
                raise WorkbenchError(f"{self.pipeline}/{name}: value {value!r} is not one "
                                     "plain name")
            rel = rel.replace("{value}", value)
        if self.under is None:
            return self.root / rel
        base = self.declared(self.under).path
        if rel == base:
            return self.root
        if not rel.startswith(base + "/"):
            raise WorkbenchError(f"{self.pipeline}/{name} ({rel}) is not inside "
                                 f"{self.pipeline}/{self.under} ({base})")
        return self.root / rel[len(base) + 1:]

    def read(self, name: str, value: str | None = None, *, appending: bool = False) -> Any:
        """A declared file's content: a jsonl's rows (records of its type, else dicts), a
        json's object (its record, checked against the record's `schema_version` where it
        has one, else a dict), a text's str. A row or object that does not fit is one
        DataError line naming the file (and the line); a folder or binary is not read.
        `appending`: a log a job may be appending to, whose torn last line is skipped."""
        a = self.declared(name)
        path = self.path(name, value)
        model = a.record_type()
        if a.kind == "jsonl" and appending:
            rows = []
            for line, obj in iter_jsonl_raw(path, torn_tail=lambda _e: None):
                try:
                    rows.append(model.model_validate(obj) if model else obj)
                except ValueError as e:
                    raise DataError(_one_line(e), path=str(path), line=line,
                                    code="bad_record") from None
            return rows
        if a.kind == "jsonl":
            return read_jsonl(path, model.model_validate if model else None)
        if a.kind == "json":
            data = read_json_object(path, cap=MAX_JSON_BYTES, what=f"{self.pipeline} {name}",
                                    missing="no such file", rerun="run the stage again")
            if model is None:
                return data
            version = _schema_version(model)
            if version is None:
                try:
                    return model.model_validate(data)
                except ValueError as e:
                    raise DataError(f"not a {model.__name__} ({_one_line(e)}); run the stage "
                                    "again", path=str(path), code="bad_record") from None
            return validate_versioned(data, model, path, what=f"{self.pipeline} {name}",
                                      rerun="run the stage again", version=version)
        if a.kind == "text":
            return read_regular_file(path, cap=MAX_JSON_BYTES, what=f"{self.pipeline} {name}"
                                     ).decode("utf-8")
        raise WorkbenchError(f"{self.pipeline}/{name} is a {a.kind}; take its path")

    def write(self, name: str, data: Any, value: str | None = None) -> Path:
        """Write a declared file atomically (workbench.io's writers): a jsonl's rows (records
        or dicts, each validated by the record type first, so bad input writes nothing and
        says which row), a json's object (a record as `model_dump_json(indent=2)`, a dict as
        `atomic_write_json`), a text's str. Returns the path."""
        a = self.declared(name)
        path = self.path(name, value)
        model = a.record_type()
        where = f"{self.pipeline}/{name}"
        if a.kind == "jsonl":
            rows = list(data)
            if model is not None:
                for i, row in enumerate(rows, 1):
                    _check(model, row, f"{where} row {i}", path)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_jsonl(path, rows)
        elif a.kind == "json":
            if model is not None:
                _check(model, data, where, path)
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(data, BaseModel):
                atomic_write_text(path, data.model_dump_json(indent=2) + "\n")
            else:
                atomic_write_json(path, data)
        elif a.kind == "text":
            if not isinstance(data, str):
                raise WorkbenchError(f"{where} is text; got {type(data).__name__}")
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, data)
        else:
            raise WorkbenchError(f"{where} is a {a.kind}; its writer takes its path")
        return path

    def find(self, name: str) -> dict[str, Path]:
        """The files of a per-value artifact that exist, by value in sorted order (a loop's
        rounds: {"01": .../rounds/01/round.json, ...}); a plain artifact gives {"": path}
        when it exists, else {}."""
        a = self.declared(name)
        if "{value}" not in a.path:
            p = self.path(name)
            return {"": p} if p.exists() else {}
        pattern = self.path(name, "\0").relative_to(self.root).as_posix()
        head, _, tail = pattern.partition("\0")
        found = {}
        for p in sorted(self.root.glob(head + "*" + tail)):
            rel = p.relative_to(self.root).as_posix()
            v = rel[len(head):len(rel) - len(tail)]
            if v and "/" not in v:
                found[v] = p
        return found


def outputs_at(pipeline: str, folder: str | Path, under: str | None = None) -> Outputs:
    """A pipeline's declared artifacts in a folder outside a run (its `-o OUT`), or, with
    `under`, in the folder of that artifact (`outputs_at("fed", server_dir,
    under="federation")`)."""
    return Outputs(pipeline, Path(folder), under)


def locate(pipeline: str, name: str, where: str | Path | RunLayout) -> Path:
    """Artifact `name` of `pipeline` from what a person points at: a `RunLayout`, a run
    folder, the pipeline's folder in it, or the file itself (the one finder)."""
    if isinstance(where, RunLayout):
        return where.artifact(pipeline, name)
    p = Path(where)
    if not p.is_dir() and (p.exists() or p.name == Path(registry.get(pipeline).artifact(
            name).path).name):
        return p  # the file itself (a missing one is said missing by its reader)
    run = RunLayout.at(p)
    return run.artifact(pipeline, name) if run.folder(pipeline).is_dir() \
        else outputs_at(pipeline, p).path(name)


def _schema_version(model: type[BaseModel]) -> int | None:
    field = model.model_fields.get("schema_version")
    return field.default if field is not None and isinstance(field.default, int) else None


def _one_line(e: Exception) -> str:
    return " ".join(describe_validation_error(e).split())[:300]


def _check(model: type[BaseModel], obj: Any, where: str, path: Path) -> None:
    if isinstance(obj, model):
        return
    data = obj.model_dump(mode="json") if isinstance(obj, BaseModel) else obj
    try:
        model.model_validate(data)
    except ValueError as e:
        raise DataError(f"{where} is not a {model.__name__} ({_one_line(e)}); nothing "
                        "written", path=str(path), code="bad_record") from None


# --- stages -----------------------------------------------------------------------------------

STAGES_SCHEMA = 1


class StageRecord(StrictModel):
    hash: str
    seconds: float
    finished: float = Field(default_factory=time.time)
    info: dict[str, Any] = Field(default_factory=dict)


class StagesState(StrictModel):
    schema_version: int = STAGES_SCHEMA
    stages: dict[str, StageRecord] = Field(default_factory=dict)


def read_stages(path: Path) -> StagesState:
    """The stage state of a run; a missing, older or unreadable file means "nothing done"
    (stages then run again, and the call cache makes model calls free)."""
    if not path.exists():
        return StagesState()
    try:
        return StagesState.model_validate_json(path.read_bytes())
    except (ValidationError, ValueError, OSError):
        return StagesState()


def hash_inputs(*parts: Any) -> str:
    """A short, stable hash of JSON-able inputs (paths and other objects by their str)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()
                          ).hexdigest()[:16]


def file_hash(path: str | Path | None) -> str | None:
    """sha256 of a file, None when it does not exist (a missing input is an input too)."""
    return sha256_file(path) if path is not None and Path(path).is_file() else None


class StageRunner:
    """Runs a pipeline's stages, skipping those whose input hash and outputs are unchanged.
    Every pipeline uses this one runner, so `stages.json` means the same for all of them."""

    def __init__(self, layout: RunLayout, pipeline: str, *, log: Callable[[str], None] = print,
                 fresh: bool = False, records: bool = True):
        self.layout, self.pipeline, self.log, self.fresh = layout, pipeline, log, fresh
        self.records = records  # False: run the stages, leave stages.json to another process

    def declared(self, stage: str, part: str | None = None) -> registry.Stage:
        """The pipeline's declaration of `stage`; a stage the spec does not declare, or a
        per-value stage run without its value (or the reverse), is our bug and refused."""
        spec = registry.get(self.pipeline)
        found = next((s for s in spec.stages if s.name == stage), None)
        if found is None:
            raise WorkbenchError(f"pipeline {self.pipeline!r} declares no stage {stage!r} "
                                 f"(declared: {', '.join(s.name for s in spec.stages)})")
        if (found.per is None) != (part is None):
            raise WorkbenchError(f"stage {self.pipeline}/{stage}: " + (
                f"runs once per {found.per}; name the {found.per}" if part is None else
                f"is not declared per value, got {part!r}"))
        if part is not None and any(s.name == f"{stage}_{part}" for s in spec.stages):
            # both would be recorded as `<pipeline>/<stage>_<part>` in stages.json
            raise WorkbenchError(f"stage {self.pipeline}/{stage} for {found.per} {part!r} "
                                 f"would share its record with the stage {stage}_{part}")
        return found

    def key(self, stage: str, part: str | None = None) -> str:
        return f"{self.pipeline}/{stage}" + (f"_{part}" if part is not None else "")

    def _outputs(self, stage: str, part: str | None = None) -> list[Path]:
        folder = self.layout.folder(self.pipeline)
        return [folder / a.path.replace("{value}", part or "")
                for a in self.declared(stage, part).outputs if a.required]

    def done(self, stage: str, h: str, part: str | None = None) -> StageRecord | None:
        rec = self.layout.stages().stages.get(self.key(stage, part))
        if (self.fresh or rec is None or rec.hash != h
                or not all(p.exists() for p in self._outputs(stage, part))):
            return None
        return rec

    def run(self, stage: str, inputs: Any, fn: Callable[[], dict[str, Any] | None], *,
            part: str | None = None) -> tuple[StageRecord, bool]:
        """Run `fn` unless the stage (for `part`, when it is declared per value) is up to
        date; returns (record, ran)."""
        self.declared(stage, part)
        h = hash_inputs(inputs)
        key = self.key(stage, part)
        if (rec := self.done(stage, h, part)) is not None:
            self.log(f"== {key}: up to date")
            return rec, False
        self.log(f"== {key}")

        t0 = time.perf_counter()
        with in_progress(key):
            info = fn() or {}
        seconds = time.perf_counter() - t0
        if seconds >= 60:
            self.log(f"== {key}: done in {seconds:.0f} s")
        return self.mark(stage, h, seconds, info, part=part), True

    def mark(self, stage: str, h: str, seconds: float, info: dict[str, Any] | None = None,
             *, part: str | None = None) -> StageRecord:
        self.declared(stage, part)
        rec = StageRecord(hash=h, seconds=round(seconds, 1), info=info or {})
        if not self.records:
            return rec
        self.layout.root.mkdir(parents=True, exist_ok=True)
        state = self.layout.stages()
        state.stages[self.key(stage, part)] = rec
        atomic_write_json(self.layout.stages_file, state.model_dump(mode="json"))
        return rec


# --- running a pipeline ---------------------------------------------------------------------

@dataclass
class RunContext:
    """What a pipeline's `run` gets besides its config: where to write, how to report,
    whether to stop, and the shared stage runner."""

    layout: RunLayout
    log: Callable[[str], None] = print
    should_stop: Callable[[], bool] = lambda: False
    fresh: bool = False  # ignore finished stages and checkpoints: start over
    records: bool = True  # False on a distributed launch's other ranks: rank 0 keeps them

    def stages(self, pipeline: str) -> StageRunner:
        return StageRunner(self.layout, pipeline, log=self.log, fresh=self.fresh,
                           records=self.records)


def launch_rank() -> int:
    """This process's rank in a distributed launch (torchrun, `accelerate launch`); 0 in a
    process launched alone."""
    def env(name: str, default: int) -> int:
        value = os.environ.get(name, "").strip()
        return int(value) if value.isdigit() else default

    return env("RANK", 0) if env("WORLD_SIZE", 1) > 1 else 0


def run_pipeline(name: str, cfg, ctx: RunContext | None = None) -> registry.PipelineResult:
    """Run one registered pipeline on an experiment config; returns its result record."""
    pipeline = registry.get(name)
    ctx = ctx or RunContext(layout=RunLayout.of(cfg))
    return pipeline.runner()(cfg, ctx)
