"""Model access for every pipeline: one protocol, a registry of backends, a call cache.

Heavy libraries (torch, transformers, httpx) are imported by the backends only when a model
is loaded, so importing this package stays cheap.
"""

from workbench.models.backends import available_backends, load_model, register_backend
from workbench.models.base import (
    Capabilities,
    ChatModel,
    ContinuationScore,
    Generation,
    GenerationParams,
    ScoreRequest,
    TokenLogprobs,
)
from workbench.models.messages import ToolCall, ToolChoice, ToolSpec

__all__ = [
    "Capabilities", "ChatModel", "ContinuationScore", "Generation", "GenerationParams",
    "ScoreRequest", "TokenLogprobs", "ToolCall", "ToolChoice", "ToolSpec",
    "available_backends", "load_model", "register_backend",
]
