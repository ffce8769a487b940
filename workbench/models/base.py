"""The models protocol: chat generation (with tool calls) and log-likelihood scoring.

A conversation is a list of OpenAI-form message dicts: `{"role", "content"}`, an assistant
turn may carry `tool_calls`, a `tool` turn answers one with `tool_call_id` (see
`workbench.models.messages`). Backends take batches; callers never need to know whether the
batch runs on a local GPU, on this CPU, or as concurrent HTTP calls to a vLLM server. What a
backend can do beyond generation is declared in its `capabilities`, never probed for.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ConfigDict, Field, field_validator

from workbench.errors import BackendError
from workbench.models.constrain import CONSTRAINT_ERROR, Constraint, ConstraintNotKept
from workbench.models.messages import ToolCall, ToolChoice, ToolSpec, as_tool_choice, as_tool_specs
from workbench.records import StrictModel

Conversation = list[dict[str, Any]]
Tools = Sequence[ToolSpec | dict[str, Any]]

_CANCEL: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "workbench_cancel", default=None)


class Cancelled(Exception):
    """Work that checks `cancel_event()` between steps and cannot return a partial result
    (scoring) raises this once the event is set; its caller has already gone."""


@contextlib.contextmanager
def cancel_on(event: threading.Event) -> Iterator[threading.Event]:
    """Generation started inside this block stops soon after `event` is set (local backends
    check it between tokens; the rest of the batch is cut short, its text is kept). Threads
    see it when they run in a copy of this context (`contextvars.copy_context`)."""
    token = _CANCEL.set(event)
    try:
        yield event
    finally:
        _CANCEL.reset(token)


def cancel_context(event: threading.Event) -> contextvars.Context:
    """A copy of the current context in which `cancel_event()` is `event`: work run in it
    with `context.run(fn, ...)`, from any thread, stops soon after `event` is set."""
    context = contextvars.copy_context()
    context.run(_CANCEL.set, event)
    return context


def cancel_event() -> threading.Event | None:
    """The event of the innermost `cancel_on` block, if any."""
    return _CANCEL.get()


@dataclass(frozen=True)
class Capabilities:
    """What a backend offers besides `generate`; callers check these instead of probing."""

    generate: bool = True
    score: bool = False  # `score`: log-likelihood of continuations
    tool_calls: bool = False  # `generate(tools=...)` returns structured `Generation.tool_calls`
    token_logprobs: bool = False  # `token_logprobs`: per-token logprobs of a text
    stream: bool = False  # `stream` yields pieces as they come (otherwise all at once)
    complete: bool = False  # `complete`: raw-text continuation, no chat template
    tokenize: bool = False  # `tokenize` / `detokenize` with the model's own tokenizer
    constrained: bool = False  # honours `GenerationParams.constraint` (and forced tool calls
    # always parse: the call is generated under the tool's schema)
    concurrent: bool = False  # concurrent `generate` calls are batched by the engine itself
    # (continuous batching): callers need not gather them into one call


class GenerationParams(StrictModel):
    """Sampling settings. Part of the call-cache key (batch size and concurrency are not)."""

    model_config = ConfigDict(frozen=True)

    max_tokens: int = Field(256, ge=1, description="Most new tokens to generate.")
    temperature: float = Field(0.0, ge=0.0, description="0 means greedy decoding.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int | None = Field(None, ge=1, description="Keep only the k most likely tokens.")
    stop: tuple[str, ...] = Field((), description="Strings that end generation (not returned).")
    seed: int | None = Field(None, description="Seed for sampling; same seed, same sample.")
    repetition_penalty: float | None = Field(None, gt=0.0)
    constraint: Constraint | None = Field(None, description="Output must match this JSON "
                                          "schema, regex, choice or grammar (backends with "
                                          "`capabilities.constrained`).")

    @field_validator("stop")
    @classmethod
    def _no_empty_stops(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(s for s in v if s)  # "" would stop everywhere; clients mean "none"

    @property
    def greedy(self) -> bool:
        """Temperatures under 1e-5 decode greedily (as vLLM does): sampling at such a
        temperature overflows the softmax and is greedy decoding anyway."""
        return self.temperature < 1e-5


@dataclass
class Generation:
    text: str
    finish_reason: str = "stop"  # "stop" | "length" | "tool_calls" | "error"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    cached: bool = False
    tool_calls: list[ToolCall] = field(default_factory=list)
    # what kind of failure `error` is, when a caller may act on it: "constraint" (the
    # output constraint could not be kept: the caller's constraint, a 400 from the server)
    error_type: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def not_kept(self, message: str) -> Generation:
        """This reply as a failed one: its constraint could not be kept (`message` says
        why). The text, which would break it, is dropped; the token counts stay."""
        return replace(self, text="", tool_calls=[], finish_reason="error", error=message,
                       error_type=CONSTRAINT_ERROR)

    def message(self) -> dict[str, Any]:
        """The assistant turn to append to the conversation (OpenAI form)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            msg["tool_calls"] = [tc.model_dump(mode="json") for tc in self.tool_calls]
        return msg

    def to_json(self) -> dict[str, Any]:
        out = {"text": self.text, "finish_reason": self.finish_reason,
               "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
               "error": self.error}
        if self.error_type:
            out["error_type"] = self.error_type
        if self.tool_calls:
            out["tool_calls"] = [tc.model_dump(mode="json") for tc in self.tool_calls]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any], cached: bool = False) -> Generation:
        return cls(text=d["text"], finish_reason=d["finish_reason"],
                   prompt_tokens=d["prompt_tokens"], completion_tokens=d["completion_tokens"],
                   error=d.get("error"), cached=cached, error_type=d.get("error_type"),
                   tool_calls=[ToolCall.model_validate(t) for t in d.get("tool_calls") or ()])


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
class TokenLogprobs:
    """A text's tokens with their logprobs (OpenAI's `logprobs` object of a completion)."""

    tokens: list[str]
    offsets: list[int]  # character offset of each token in the text
    logprobs: list[float | None]  # the first token has none
    top: list[dict[str, float] | None] | None = None  # the likeliest tokens per position


@dataclass
class ModelInfo:
    identity: str  # stable id for cache keys and provenance
    backend: str
    details: dict[str, Any] = field(default_factory=dict)


class ChatModel(abc.ABC):
    """A backend. Subclasses register with `@register_backend(name)` and declare what they
    offer in `capabilities`; a method whose capability is off raises BackendError."""

    backend_name = "abstract"
    capabilities = Capabilities()

    @property
    @abc.abstractmethod
    def identity(self) -> str:
        """A stable string naming the exact model (and adapter): the call-cache key uses it."""

    @property
    def score_identity(self) -> str:
        """The identity scores are cached under: the model's own, or, where a backend
        scores on another engine than it generates on, that engine's (so scores are shared
        with it and generations never are)."""
        return self.identity

    @abc.abstractmethod
    def generate(self, conversations: Sequence[Conversation],
                 params: GenerationParams | None = None, tools: Tools | None = None,
                 tool_choice: ToolChoice | None = None) -> list[Generation]:
        """One Generation per conversation, in order. Per-item failures come back as
        Generations with `error` set; a backend that cannot work at all raises BackendError.

        With `tools` (OpenAI `tools` entries), a reply that calls tools comes back with
        `tool_calls` set and finish_reason "tool_calls"; `tool_choice` is "auto" (default),
        "none", "required" or `{"type": "function", "function": {"name": ...}}`."""

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[ContinuationScore]]:
        raise self._unsupported("score continuations")

    def check_constraint(self, constraint: Constraint) -> None:
        """Raise WorkbenchError naming the problem when `constraint` cannot be honoured."""
        raise self._unsupported("constrain its output")

    def token_logprobs(self, text: str, top: int = 0) -> TokenLogprobs:
        """Logprobs of every token of `text`, tokenised as a prompt (special tokens added
        as usual); with `top`, also the `top` likeliest tokens at each position."""
        raise self._unsupported("return token logprobs")

    def complete(self, prompts: Sequence[str],
                 params: GenerationParams | None = None) -> list[Generation]:
        """Continue raw text prompts (no chat template)."""
        raise self._unsupported("complete raw text")

    def tokenize(self, prompt: str | Conversation, *, add_special_tokens: bool | None = None,
                 add_generation_prompt: bool = True,
                 tools: Tools | None = None) -> list[int]:
        """Token ids of a text, or of a conversation rendered by the chat template.
        `add_special_tokens` defaults to True for text and False for a conversation (the
        template writes its own), as in vLLM's `/tokenize`."""
        raise self._unsupported("tokenize")

    def detokenize(self, ids: Sequence[int]) -> str:
        raise self._unsupported("detokenize")

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model takes, when known."""
        return None

    @property
    def chat_template(self) -> str | None:
        """The Jinja chat template prompts are rendered with here (None: the server's)."""
        return None

    @property
    def batch_size(self) -> int:
        """Conversations the backend takes per call to good effect (the call cache stores
        results after each such chunk)."""
        return 8

    def _tool_request(self, tools: Tools | None, tool_choice: ToolChoice | None
                      ) -> tuple[list[ToolSpec] | None, ToolChoice]:
        """Validated (tools or None, tool_choice); raises when this backend has no tool calls."""
        specs = as_tool_specs(tools)
        if specs and not self.capabilities.tool_calls:
            raise self._unsupported("call tools")
        return specs, as_tool_choice(tool_choice, specs)

    def _unsupported(self, what: str):
        return BackendError(f"backend {self.backend_name!r} cannot {what}")

    def stream(self, conversation: Conversation,
               params: GenerationParams | None = None) -> Iterator[str]:
        """Yield text pieces as they are generated; backends without streaming yield once."""
        gen = self.generate([conversation], params)[0]
        if gen.error:
            raise gen_error(gen)
        yield gen.text

    def stream_tool_call(self, conversation: Conversation, params: GenerationParams | None,
                         tools: Tools, tool_choice: ToolChoice) -> Iterator[tuple[str, str]]:
        """A forced tool call as stream events: ("name", tool), ("arguments", piece)...,
        ("finish", reason). Backends that cannot stream it yield it whole."""
        gen = self.generate([conversation], params, tools=tools, tool_choice=tool_choice)[0]
        if gen.error:
            raise gen_error(gen)
        if gen.tool_calls:
            yield "name", gen.tool_calls[0].function.name
            yield "arguments", gen.tool_calls[0].function.arguments
        yield "finish", gen.finish_reason

    def info(self) -> ModelInfo:
        return ModelInfo(identity=self.identity, backend=self.backend_name)

    def close(self) -> None:  # an optional hook: nothing to close by default
        pass

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.identity}>"


def gen_error(gen: Generation) -> Exception:
    """The exception a failed generation raises where a stream cannot return it:
    `ConstraintNotKept` for a constraint that could not be kept, else BackendError."""
    if gen.error_type == CONSTRAINT_ERROR:
        return ConstraintNotKept(gen.error or "")
    return BackendError(gen.error or "generation failed")
