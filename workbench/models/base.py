"""The models protocol: chat generation and log-likelihood scoring.

A conversation is a list of `{"role", "content"}` dicts (OpenAI form). Backends take batches;
callers never need to know whether the batch runs on a local GPU, on this CPU, or as
concurrent HTTP calls to a vLLM server.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

Conversation = list[dict[str, Any]]


class GenerationParams(BaseModel):
    """Sampling settings. Part of the call-cache key (batch size and concurrency are not)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(256, ge=1, description="Most new tokens to generate.")
    temperature: float = Field(0.0, ge=0.0, description="0 means greedy decoding.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int | None = Field(None, ge=1, description="Keep only the k most likely tokens.")
    stop: tuple[str, ...] = Field((), description="Strings that end generation (not returned).")
    seed: int | None = Field(None, description="Seed for sampling; same seed, same sample.")
    repetition_penalty: float | None = Field(None, gt=0.0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Generation:
    text: str
    finish_reason: str = "stop"  # "stop" | "length" | "error"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "finish_reason": self.finish_reason,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "error": self.error}

    @classmethod
    def from_json(cls, d: dict[str, Any], cached: bool = False) -> Generation:
        return cls(text=d["text"], finish_reason=d["finish_reason"],
                   prompt_tokens=d["prompt_tokens"], completion_tokens=d["completion_tokens"],
                   error=d.get("error"), cached=cached)


@dataclass
class ScoreRequest:
    """Score each continuation after the prompt (a raw string, or a conversation that the
    chat template turns into a prompt ending with the assistant header)."""

    prompt: str | Conversation
    continuations: Sequence[str]


@dataclass
class ContinuationScore:
    logprob: float  # sum of the continuation tokens' log-probabilities
    n_tokens: int
    n_chars: int
    is_greedy: bool = False  # every continuation token was the argmax

    @property
    def mean_logprob(self) -> float:
        return self.logprob / max(self.n_tokens, 1)


@dataclass
class ModelInfo:
    identity: str  # stable id for cache keys and provenance
    backend: str
    details: dict[str, Any] = field(default_factory=dict)


class ChatModel(abc.ABC):
    """A backend. Subclasses register with `@register_backend(name)`."""

    backend_name = "abstract"

    @property
    @abc.abstractmethod
    def identity(self) -> str:
        """A stable string naming the exact model (and adapter): the call-cache key uses it."""

    @abc.abstractmethod
    def generate(self, conversations: Sequence[Conversation],
                 params: GenerationParams | None = None) -> list[Generation]:
        """One Generation per conversation, in order. Per-item failures come back as
        Generations with `error` set; a backend that cannot work at all raises BackendError."""

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[ContinuationScore]]:
        from workbench.errors import BackendError

        raise BackendError(f"backend {self.backend_name!r} cannot score continuations")

    def stream(self, conversation: Conversation,
               params: GenerationParams | None = None) -> Iterator[str]:
        """Yield text pieces as they are generated; backends without streaming yield once."""
        gen = self.generate([conversation], params)[0]
        if gen.error:
            from workbench.errors import BackendError

            raise BackendError(gen.error)
        yield gen.text

    def info(self) -> ModelInfo:
        return ModelInfo(identity=self.identity, backend=self.backend_name)

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.identity}>"
