"""Experiment configs: one YAML format, `key=value` overrides, every error reported at once.

Precedence, highest first: command-line overrides > `WB_*` environment variables (nested keys
joined by `__`, e.g. `WB_MODELS__CHAT__SPEC`) > the YAML file > the defaults below.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError, create_model, field_validator

from workbench import registry
from workbench.errors import ConfigError, WorkbenchError
from workbench.models.base import GenerationParams
from workbench.records import StrictModel
from workbench.runs import RunLayout, check_run_name


class ConfigSection(StrictModel):
    """The base of every section of the experiment config: unknown keys are errors."""


class ModelConfig(ConfigSection):
    spec: str = Field("default", description="Bundled name, local folder, .gguf file, hub id in "
                                             "the local HF cache, or an OpenAI-compatible URL "
                                             "(URL#model).")
    backend: str | None = Field(None, description=(
        "Force a backend: transformers (alias local), ctranslate2 (alias ct2), openai, fake. "
        "ctranslate2 generates with int8 weights on CPU and scores on transformers unless "
        "its float32 parity applies (`workbench models list -s models.chat.backend=...` "
        "shows which backend serves each use)."))
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="Backend options (device, dtype, batch_size, "
                                                "concurrency, api_key_env, ...).")


class EmbedderConfig(ConfigSection):
    spec: str = Field("minilm", description="Bundled 'minilm' or a sentence-transformers folder.")
    device: str = Field("auto", description="auto, cpu or cuda.")
    batch_size: int = Field(64, ge=1)


class ModelsConfig(ConfigSection):
    chat: ModelConfig = Field(default_factory=ModelConfig)
    embedder: EmbedderConfig = Field(default_factory=EmbedderConfig)


class CacheConfig(ConfigSection):
    enabled: bool = Field(True, description="Cache model calls (resume without re-calling).")
    path: str | None = Field(None, description="SQLite file; default <output_dir>/calls.sqlite.")


class SmokeConfig(ConfigSection):
    document: str | None = Field(None, description="A file to ask about (default: the domain "
                                                   "pack's smoke.document).")
    question: str | None = Field(None, description="Default: the domain pack's smoke.question.")
    max_tokens: int = Field(96, ge=1)


class CoreConfig(ConfigSection):
    """The keys every experiment has; each registered pipeline adds its own section."""

    name: str = Field("experiment", description="Run name (one folder name); outputs go to "
                                                "<output_dir>/<name>.")
    seed: int = Field(0, ge=0, lt=2**32, description="Seed for every random choice of the "
                                                    "run (0 to 2**32-1).")
    output_dir: str = Field("runs", description="Folder for runs and the call cache.")
    domain: str = Field("rf", description="Domain pack (bundled name or YAML path): prompts "
                                          "and settings of every pipeline.")
    corpus: str = Field("datasets/rf", description="The domain's documents: a folder or file "
                                                   "(md, txt, html, pdf) or Section JSONL.")
    models: ModelsConfig = Field(default_factory=ModelsConfig)
    generation: GenerationParams = Field(default_factory=GenerationParams)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    smoke: SmokeConfig = Field(default_factory=SmokeConfig)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        try:
            return check_run_name(v)
        except WorkbenchError as e:
            raise ValueError(str(e)) from None

    @property
    def layout(self):
        return RunLayout.of(self)

    @property
    def run_dir(self) -> Path:
        return self.layout.root

    @property
    def cache_path(self) -> Path:
        return Path(self.cache.path) if self.cache.path else Path(self.output_dir) / "calls.sqlite"


_MODELS: dict[tuple, type[CoreConfig]] = {}


def experiment_config_model() -> type[CoreConfig]:
    """The experiment config: the core keys plus one section per registered pipeline (the
    same class for as long as the registered sections are the same)."""
    sections = tuple((p.section, p.config, p.help) for p in registry.pipelines() if p.section)
    if sections not in _MODELS:
        fields: dict[str, Any] = {}
        for p in registry.pipelines():
            if p.section and (model := p.config_model()) is not None:  # a section has a model
                fields[p.section] = (model, Field(default_factory=model, description=p.help))
        _MODELS[sections] = create_model("ExperimentConfig", __base__=CoreConfig, **fields)
    return _MODELS[sections]


def __getattr__(name: str):
    if name == "ExperimentConfig":  # always the model of the current registry
        return experiment_config_model()
    raise AttributeError(name)


def config_schema() -> dict[str, Any]:
    """JSON schema of the experiment config (every registered pipeline's section)."""
    return experiment_config_model().model_json_schema()


MAX_CONFIG_BYTES = 1 << 20  # a config is kilobytes; a bigger file is not one
MAX_YAML_NODES = 100_000  # values a config may hold once its aliases are expanded


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping and a document whose
    aliases expand to more than MAX_YAML_NODES values (an "alias bomb": a few hundred bytes
    that expand to billions of values)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: the base class reports it
                break
            if first != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {first})",
                    key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _check_expanded_size(node)
        return node


def _check_expanded_size(root) -> None:
    """Count the values of the document with every alias expanded (memoised per node, so
    the count itself is linear in the file); refuse more than MAX_YAML_NODES, and refuse a
    value that contains itself (a recursive alias)."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        kids = [] if isinstance(node, yaml.ScalarNode) else [
            x for pair in node.value for x in (pair if isinstance(pair, tuple) else (pair,))]
        if children_done or not kids:
            open_.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(k)] for k in kids)
            if sizes[id(node)] > MAX_YAML_NODES:
                raise yaml.constructor.ConstructorError(
                    None, None, f"aliases expand to more than {MAX_YAML_NODES:,} values",
                    node.start_mark)
            continue
        if id(node) in open_:  # reached again while its own children are being counted
            raise yaml.constructor.ConstructorError(
                None, None, "a value that contains itself (recursive alias)", node.start_mark)
        open_.add(id(node))
        stack.append((node, True))
        for k in kids:
            if id(k) in open_:
                raise yaml.constructor.ConstructorError(
                    None, None, "a value that contains itself (recursive alias)",
                    k.start_mark)
            if id(k) not in sizes:
                stack.append((k, False))


def load_yaml_text(text: str) -> Any:
    """YAML with duplicate keys and alias bombs refused (ConstructorError, with a mark)."""
    return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: safe


def _yaml_value(raw: str, what: str) -> Any:
    """A scalar or collection written in YAML; text that is not YAML stays text."""
    try:
        return load_yaml_text(raw)
    except yaml.constructor.ConstructorError as e:
        if e.problem and any(w in e.problem for w in ("aliases expand", "duplicate key",
                                                      "contains itself")):
            raise ConfigError([f"{what}: {e.problem}"]) from None
        return raw
    except yaml.YAMLError:
        return raw
    except RecursionError:
        raise ConfigError([f"{what}: value nested too deeply to read"]) from None


def _one_line(text: str) -> str:
    """`text` with line breaks and other unprintable characters escaped, so an error made of
    user input stays on one line (keys and values may hold any character)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def _shown(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError([f"override {text!r} is not key=value (e.g. models.chat.spec=default)"])
    key, _, raw = text.partition("=")
    keys = key.strip().split(".")
    if not key.strip() or any(not k.strip() for k in keys):
        hint = "e.g. train.max_steps=8"
        raise ConfigError([f"override {text!r}: {key.strip()!r} is not a key path ({hint})"])
    value = _yaml_value(raw, f"override {key.strip()!r}") if raw.strip() else ""
    return [k.strip() for k in keys], value


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
        out.append((keys, _yaml_value(raw, name)))
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, *,
                cls: type[BaseModel] | None = None,
                environ: dict[str, str] | None = None) -> Any:
    """Load, merge and validate. Raises ConfigError listing every problem."""
    cls = cls or experiment_config_model()
    tree: dict[str, Any] = {}
    source = _one_line(str(path)) if path else "config"
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(["file not found"], source=source)
        if not p.is_file():
            raise ConfigError(["not a file (pass a YAML config file)"], source=source)
        try:
            size = p.stat().st_size
            if size > MAX_CONFIG_BYTES:
                raise ConfigError([f"{size:,} bytes: too large for a config (at most "
                                   f"{MAX_CONFIG_BYTES:,}); not read"], source=source)
            loaded = load_yaml_text(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise ConfigError([f"not UTF-8 text (byte {e.start}: {e.reason})"],
                              source=source) from None
        except OSError as e:
            raise ConfigError([f"cannot read ({e.strerror})"], source=source) from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
            raise ConfigError([f"{where}invalid YAML ({getattr(e, 'problem', e)})"],
                              source=source) from None
        except RecursionError:
            raise ConfigError(["YAML nested too deeply to read"], source=source) from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(["top level must be a mapping of keys to values"], source=source)
        tree = loaded
    problems: list[str] = []
    try:
        env = env_overrides(cls, environ)
    except ConfigError as e:
        problems.extend(e.problems)
        env = []
    for keys, value in env:
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
                msg = f"{msg} (got {_shown(err.get('input'))})"
            problems.append(f"{loc}: {msg}")
        raise ConfigError([_one_line(p) for p in problems], source=source) from None
    problems += _out_of_range(cfg.model_dump(mode="python"))
    if problems:
        raise ConfigError([_one_line(p) for p in problems], source=source)
    return cfg


def _out_of_range(tree: Any, path: str = "") -> list[str]:
    """Every number of a validated config that no setting can mean: a float that is not
    finite (inf, nan), an integer beyond 64 bits. Named by key path."""
    import math

    if isinstance(tree, dict):
        return [p for k, v in tree.items() for p in _out_of_range(v, f"{path}.{k}" if path
                                                                   else str(k))]
    if isinstance(tree, (list, tuple)):
        return [p for i, v in enumerate(tree) for p in _out_of_range(v, f"{path}[{i}]")]
    if isinstance(tree, float) and not math.isfinite(tree):
        return [f"{path}: must be a finite number (got {tree})"]
    if isinstance(tree, int) and not isinstance(tree, bool) and abs(tree) >= 2**63:
        return [f"{path}: out of range (got an integer of {len(str(abs(tree)))} digits)"]
    return []


def dump_config(cfg: BaseModel) -> dict[str, Any]:
    return cfg.model_dump(mode="json")
