"""Run folders: one `RunLayout` owns every path in them, one `StageRunner` skips work whose
inputs did not change.

    <output_dir>/<name>/            the run folder (`RunLayout.root`)
        stages.json                 hashed inputs and timings of every finished stage
        .lock                       held by the job writing the run
        <pipeline folder>/...       each pipeline's outputs, as its spec declares them

Paths of outputs are data in the pipelines' specs (`Stage.outputs`); the CLI, the app and
the jobs ask `layout.artifact("distill", "benchmark")` instead of joining strings.
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

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workbench import registry
from workbench.errors import WorkbenchError
from workbench.io import atomic_write_json, sha256_file

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

    def artifact(self, pipeline: str, name: str) -> Path:
        return self.folder(pipeline) / registry.get(pipeline).artifact(name).path

    def has(self, pipeline: str, name: str) -> bool:
        try:
            return self.artifact(pipeline, name).exists()
        except WorkbenchError:
            return False

    def stages(self) -> StagesState:
        return read_stages(self.stages_file)


# --- stages -----------------------------------------------------------------------------------

STAGES_SCHEMA = 1


class StageRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hash: str
    seconds: float
    finished: float = Field(default_factory=time.time)
    info: dict[str, Any] = Field(default_factory=dict)


class StagesState(BaseModel):
    model_config = ConfigDict(extra="forbid")
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
        from workbench.progress import stage as in_progress

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
