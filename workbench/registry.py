"""The pipeline registry: what a pipeline is, and where the workbench finds them.

A pipeline declares its name, the config model of its section in the experiment config, its
stages (each with the records it writes) and a `run(cfg, ctx)` entry. The experiment config,
`workbench jobs start KIND`, the CLI groups and the app's pages are all built from this
registry, so adding a pipeline touches no core file:

- built-in pipelines and installed plugins alike are entry points of the group
  `workbench.pipelines` (`workbench.plugins`: the built-ins' are in the workbench's own
  pyproject.toml), each naming a `Pipeline` or a list of them;
- `WB_PLUGINS=pkg.module,other.module` imports more modules (tests, local experiments);
- `register(pipeline)` adds one from code.

Entries name their functions as `"module:attribute"` strings and import them only when
used (`workbench.plugins.load`, the one loader), so building `--help` or the config schema
never imports torch. The pipelines are a `workbench.plugins.Registry`, the one registry type.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from workbench import plugins, records
from workbench.errors import WorkbenchError
from workbench.records import StrictModel

NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_")
CORE_KEYS = {"name", "seed", "output_dir", "domain", "corpus", "models", "generation",
             "cache", "smoke"}


ArtifactKind = Literal["jsonl", "json", "folder", "text", "binary"]
KINDS: tuple[str, ...] = ("jsonl", "json", "folder", "text", "binary")
_SUFFIX_KINDS = {".jsonl": "jsonl", ".json": "json", ".md": "text", ".txt": "text",
                 ".log": "text", ".yaml": "text", ".yml": "text", ".csv": "text",
                 ".html": "text", ".png": "binary", ".safetensors": "binary",
                 ".sqlite": "binary", ".pt": "binary", ".bin": "binary", ".gguf": "binary",
                 ".npy": "binary", ".faiss": "binary", ".pkl": "binary",
                 ".parquet": "binary"}


def kind_of(path: str) -> str:
    """The kind a path's suffix says: .jsonl, .json, text (.md, .txt, .log, .yaml, ...),
    binary (.png, .safetensors, .sqlite, ...); no suffix, or one not listed, is a folder."""
    return _SUFFIX_KINDS.get(os.path.splitext(path)[1].lower(), "folder")


@dataclass(frozen=True)
class Artifact:
    """A file or folder a stage writes, relative to the pipeline's folder in the run.

    `record` names the type of its rows (jsonl) or of its object (json): a name in
    `workbench.records` ("MCItem") or "module:Class"; `record_type()` resolves it (the one
    lookup). `kind` (jsonl, json, folder, text, binary) is told by the path's suffix when
    not given. `RunLayout.read` / `write` validate by them."""

    name: str
    path: str
    record: str | None = None  # the record type of its rows or object (e.g. "MCItem")
    help: str = ""
    required: bool = True  # a finished stage must have it (else the stage runs again)
    kind: str = ""  # one of KINDS; "" = told by the path's suffix

    def __post_init__(self):
        if not self.kind:
            object.__setattr__(self, "kind", kind_of(self.path))
        if self.kind not in KINDS:
            raise WorkbenchError(f"artifact {self.name!r}: kind {self.kind!r} is not one of "
                                 f"{', '.join(KINDS)}")
        if self.record is not None and self.kind not in ("jsonl", "json"):
            raise WorkbenchError(f"artifact {self.name!r}: a record type belongs to a jsonl "
                                 f"or json file, not a {self.kind}")

    def record_type(self) -> type[BaseModel] | None:
        """The record type `record` names, or None when it names none."""
        return record_type(self.record) if self.record else None


def record_type(ref: str) -> type[BaseModel]:
    """A record type by "module:Class" or by its name in `workbench.records`; anything else
    (unknown, not a pydantic model) is one WorkbenchError line naming it."""
    what = f"record type {ref!r}"
    if ":" in ref:
        obj = plugins.load(ref, what=what)
    else:
        obj = getattr(records, ref, None)
        if obj is None:
            raise WorkbenchError(f"{what} is not a name in workbench.records; name it as "
                                 "'module:Class'")
    if not (isinstance(obj, type) and issubclass(obj, BaseModel)):
        raise WorkbenchError(f"{what} is not a pydantic model")
    return obj


@dataclass(frozen=True)
class Stage:
    """A step of a pipeline that `StageRunner` skips when its inputs and outputs are
    unchanged. A stage with `per` runs once for each value of that name (e.g. per
    condition): it is recorded as `<name>_<value>` and its outputs' paths may hold
    `{value}`."""

    name: str
    help: str = ""
    outputs: tuple[Artifact, ...] = ()
    per: str | None = None  # e.g. "condition": one run of the stage for each value


@dataclass(frozen=True)
class Pipeline:
    """One registered pipeline (or experiment: a pipeline composed of others)."""

    name: str
    help: str
    run: str  # "module:function", called as function(cfg, ctx) -> a pydantic result
    config: str | None = None  # "module:Model" of the `config_key` section
    config_key: str | None = None  # defaults to `name`; None with config=None: no section
    stages: tuple[Stage, ...] = ()
    folder: str | None = None  # sub-folder of the run folder; "" = the run folder itself
    cli: str | None = None  # "module:function" that adds commands to the pipeline's group
    page: str | None = None  # the app page (a file under workbench/app/views, or a path)
    page_title: str | None = None
    page_icon: str = ":material/extension:"
    kind: Literal["pipeline", "experiment"] = "pipeline"
    order: int = 50  # position in menus

    def __post_init__(self):
        if not self.name or not set(self.name) <= NAME_CHARS:
            raise WorkbenchError(f"pipeline name {self.name!r}: use lower-case letters, digits"
                                 " and _")
        key = self.section
        if key in CORE_KEYS:
            raise WorkbenchError(f"pipeline {self.name!r}: config key {key!r} is a core key")
        if len({s.name for s in self.stages}) != len(self.stages):
            raise WorkbenchError(f"pipeline {self.name!r}: stage names repeat")
        for s in self.stages:
            for a in s.outputs:
                if ("{value}" in a.path) != (s.per is not None):
                    raise WorkbenchError(
                        f"pipeline {self.name!r}, stage {s.name!r}, output {a.name!r}: "
                        + ("a stage run per value names its outputs by {value}"
                           if s.per else "{value} belongs to stages declared with per="))

    @property
    def section(self) -> str | None:
        if self.config is None:
            return None
        return self.config_key or self.name

    @property
    def subfolder(self) -> str:
        return self.name if self.folder is None else self.folder

    def config_model(self) -> type[BaseModel] | None:
        return plugins.load(self.config, what=f"pipeline {self.name!r}'s config") \
            if self.config else None

    def runner(self) -> Callable[..., Any]:
        return plugins.load(self.run, what=f"pipeline {self.name!r}'s run")

    def artifact(self, name: str) -> Artifact:
        for s in self.stages:
            for a in s.outputs:
                if a.name == name:
                    return a
        raise WorkbenchError(f"pipeline {self.name!r} declares no output {name!r} (has: "
                             f"{', '.join(a.name for s in self.stages for a in s.outputs)})")


# the pipelines' entry points name a Pipeline or a list of them, so `_ensure_loaded`
# registers them from code, by their own names
_REGISTRY: plugins.Registry[Pipeline] = plugins.Registry(
    "pipeline", unknown="unknown pipeline {name!r} (registered: {known})")
_loaded = False
_generation = 0  # bumps on every change, so derived things (the config model) rebuild


def register(pipeline: Pipeline, *, replace: bool = False) -> Pipeline:
    global _generation
    old = _REGISTRY.registered(pipeline.name)
    if old is not None and old != pipeline and not replace:
        raise WorkbenchError(f"a pipeline named {pipeline.name!r} is already registered")
    sections = {p.section: p.name for _, p in _REGISTRY.items() if p.section
                and p.name != pipeline.name}
    if pipeline.section in sections:
        raise WorkbenchError(f"pipeline {pipeline.name!r}: config section "
                             f"{pipeline.section!r} belongs to {sections[pipeline.section]!r}")
    _REGISTRY.register(pipeline.name, pipeline)
    _generation += 1
    return pipeline


def unregister(name: str) -> None:
    global _generation
    if _REGISTRY.unregister(name):
        _generation += 1


def generation() -> int:
    _ensure_loaded()
    return _generation


def _register_module(module: str) -> None:
    mod = plugins.load(module, what="WB_PLUGINS: module")
    found = list(getattr(mod, "PIPELINES", ()))
    if getattr(mod, "PIPELINE", None) is not None:
        found.append(mod.PIPELINE)
    for p in found:
        register(p, replace=True)


def _ensure_loaded() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True  # before registering: `register` reads the registry
    try:
        found = plugins.entries(plugins.PIPELINES)
    except WorkbenchError:
        _loaded = False
        raise
    for name, ref in found.items():
        obj = plugins.load(ref, what=f"pipeline entry {name!r}")
        for p in obj if isinstance(obj, list | tuple) else [obj]:
            register(p, replace=True)
    for module in filter(None, (m.strip() for m in os.environ.get("WB_PLUGINS", "").split(
            ","))):
        _register_module(module)


def pipelines(kind: str | None = None) -> list[Pipeline]:
    """Registered pipelines in menu order."""
    _ensure_loaded()
    out = [p for _, p in _REGISTRY.items() if kind is None or p.kind == kind]
    return sorted(out, key=lambda p: (p.order, p.name))


def get(name: str) -> Pipeline:
    _ensure_loaded()
    return _REGISTRY.get(name, known=names())


def names() -> list[str]:
    return [p.name for p in pipelines()]


class PipelineResult(StrictModel):
    """What every pipeline run returns: where its outputs are, its key figures and one line
    for people. Jobs store it; the CLI prints `message`."""

    schema_version: int = 1
    pipeline: str
    run_dir: str
    outputs: dict[str, str] = Field(default_factory=dict)
    figures: dict[str, Any] = Field(default_factory=dict)
    message: str = ""
