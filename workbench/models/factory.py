"""Build the models a config asks for, wrapped in the call cache when it is on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.models.base import ChatModel
from workbench.models.cache import CachedModel, CallCache
from workbench.models.backends import load_model

if TYPE_CHECKING:
    from workbench.config import ExperimentConfig, ModelConfig


def open_chat_model(mc: ModelConfig, cfg: ExperimentConfig | None = None) -> ChatModel:
    model = load_model(mc.spec, backend=mc.backend, **mc.options)
    if cfg is not None and cfg.cache.enabled:
        return CachedModel(model, CallCache(cfg.cache_path))
    return model
