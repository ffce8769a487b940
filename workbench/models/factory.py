"""Build the models a config asks for, wrapped in the call cache when it is on.

What is read of a config is named here (`ModelChoice`, `CacheChoice`), so this layer does not
know the config layer above it: `workbench.config.ModelConfig` and `ExperimentConfig` are
what callers pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from workbench.models.backends import load_model
from workbench.models.base import ChatModel
from workbench.models.cache import CachedModel, CallCache


class ModelChoice(Protocol):
    """A model as a config names it (`models.chat`, ...)."""

    @property
    def spec(self) -> str: ...

    @property
    def backend(self) -> str | None: ...

    @property
    def options(self) -> dict[str, Any]: ...


class _CacheSettings(Protocol):
    @property
    def enabled(self) -> bool: ...


class CacheChoice(Protocol):
    """Whether a run caches its model calls, and where (an experiment config)."""

    @property
    def cache(self) -> _CacheSettings: ...

    @property
    def cache_path(self) -> Path: ...


def open_chat_model(mc: ModelChoice, cfg: CacheChoice | None = None) -> ChatModel:
    model = load_model(mc.spec, backend=mc.backend, **mc.options)
    if cfg is not None and cfg.cache.enabled:
        return CachedModel(model, CallCache(cfg.cache_path))
    return model
