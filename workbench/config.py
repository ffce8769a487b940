"""Experiment configs: one YAML format, `key=value` overrides, every error reported at once.

Precedence, highest first: command-line overrides > `WB_*` environment variables (nested keys
joined by `__`, e.g. `WB_MODELS__CHAT__SPEC`) > the YAML file > the defaults below.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workbench.errors import ConfigError
from workbench.distill.config import DistillConfig
from workbench.evaluate.config import EvalConfig
from workbench.models.base import GenerationParams
from workbench.rag.index import RagConfig
from workbench.train.config import TrainConfig


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(Section):
    spec: str = Field("default", description="Bundled name, local folder, .gguf file, hub id in "
                                             "the local HF cache, or an OpenAI-compatible URL "
                                             "(URL#model).")
    backend: str | None = Field(None, description="Force a backend (local, openai, fake).")
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="Backend options (device, dtype, batch_size, "
                                                "concurrency, api_key_env, ...).")


class EmbedderConfig(Section):
    spec: str = Field("minilm", description="Bundled 'minilm' or a sentence-transformers folder.")
    device: str = Field("auto", description="auto, cpu or cuda.")
    batch_size: int = Field(64, ge=1)


class ModelsConfig(Section):
    chat: ModelConfig = Field(default_factory=ModelConfig)
    embedder: EmbedderConfig = Field(default_factory=EmbedderConfig)


class CacheConfig(Section):
    enabled: bool = Field(True, description="Cache model calls (resume without re-calling).")
    path: str | None = Field(None, description="SQLite file; default <output_dir>/calls.sqlite.")


class SmokeConfig(Section):
    document: str = Field("datasets/rf/02_reflection_and_vswr.md",
                          description="A file to ask about.")
    question: str = Field("What VSWR corresponds to a reflection coefficient magnitude of 0.2?")
    max_tokens: int = Field(96, ge=1)


class PipelineConfig(Section):
    """The main job: distil -> index -> evaluate base (no RAG and three RAG kinds) -> LoRA SFT
    -> evaluate SFT (no RAG and the best RAG) -> report."""

    eval_items: int | None = Field(None, ge=1, description="Cap on benchmark items scored.")
    sft_conditions: str = Field("none+best", description="none+best: SFT without RAG and with"
                                                         " the base model's best RAG; all: "
                                                         "every condition.")


class ExperimentConfig(Section):
    name: str = Field("experiment", description="Run name; outputs go to <output_dir>/<name>.")
    seed: int = Field(0, description="Seed for every random choice of the run.")
    output_dir: str = Field("runs", description="Folder for runs and the call cache.")
    models: ModelsConfig = Field(default_factory=ModelsConfig)
    generation: GenerationParams = Field(default_factory=GenerationParams)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    smoke: SmokeConfig = Field(default_factory=SmokeConfig)
    rag: RagConfig = Field(default_factory=RagConfig)
    distill: DistillConfig = Field(default_factory=DistillConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    @property
    def cache_path(self) -> Path:
        return Path(self.cache.path) if self.cache.path else Path(self.output_dir) / "calls.sqlite"


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError([f"override {text!r} is not key=value (e.g. models.chat.spec=default)"])
    key, _, raw = text.partition("=")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return [k for k in key.strip().split(".") if k], value


def _set(tree: dict, keys: list[str], value: Any) -> None:
    for k in keys[:-1]:
        node = tree.get(k)
        if not isinstance(node, dict):
            node = tree[k] = {}
        tree = node
    tree[keys[-1]] = value


def env_overrides(model: type[BaseModel], environ: dict[str, str] | None = None
                  ) -> list[tuple[list[str], Any]]:
    environ = dict(os.environ if environ is None else environ)
    top = set(model.model_fields)
    out = []
    for name, raw in sorted(environ.items()):
        if not name.startswith("WB_"):
            continue
        keys = [k.lower() for k in name[3:].split("__")]
        if keys[0] not in top:
            continue  # WB_HOME and friends are not config keys
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        out.append((keys, value))
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, *,
                cls: type[BaseModel] = ExperimentConfig,
                environ: dict[str, str] | None = None) -> Any:
    """Load, merge and validate. Raises ConfigError listing every problem."""
    tree: dict[str, Any] = {}
    source = str(path) if path else "config"
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(["file not found"], source=source)
        try:
            loaded = yaml.safe_load(p.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
            raise ConfigError([f"{where}invalid YAML ({getattr(e, 'problem', e)})"],
                              source=source) from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(["top level must be a mapping of keys to values"], source=source)
        tree = loaded
    problems: list[str] = []
    for keys, value in env_overrides(cls, environ):
        _set(tree, keys, value)
    for text in overrides or []:
        try:
            keys, value = parse_override(text)
            _set(tree, keys, value)
        except ConfigError as e:
            problems.extend(e.problems)
    try:
        cfg = cls.model_validate(tree)
    except ValidationError as e:
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            elif err["type"] == "missing":
                msg = "required"
            else:
                msg = f"{msg} (got {err.get('input')!r})"
            problems.append(f"{loc}: {msg}")
        raise ConfigError(problems, source=source) from None
    if problems:
        raise ConfigError(problems, source=source)
    return cfg


def dump_config(cfg: BaseModel) -> dict[str, Any]:
    return cfg.model_dump(mode="json")
