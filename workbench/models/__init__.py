"""Model access for every pipeline: one protocol, a registry of backends, a call cache.

Heavy libraries (torch, transformers, httpx) are imported by the backends only when a model
is loaded, so importing this package stays cheap.
"""

from workbench.models.base import (
    ChatModel,
    ContinuationScore,
    Generation,
    GenerationParams,
    ScoreRequest,
)
from workbench.models.registry import available_backends, load_model, register_backend

__all__ = [
    "ChatModel", "ContinuationScore", "Generation", "GenerationParams", "ScoreRequest",
    "available_backends", "load_model", "register_backend",
]
