"""A scripted backend for unit tests of prompt logic; it goes through the same registry and
protocol as the real backends, so code under test cannot tell it apart.

Responses come from `responses` (a list used in order, cycling) or from `script`, a
`module:function` taking the conversation and returning text. `die_after` makes the process
exit hard after that many calls: the resume tests use it to simulate a kill.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from workbench.models.base import (
    ChatModel,
    ContinuationScore,
    Conversation,
    Generation,
    GenerationParams,
    ScoreRequest,
)
from workbench.models.registry import register_backend


class FakeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    responses: list[str] | None = None
    script: str | Callable[[Conversation], str] | None = None
    name: str = "fake"
    die_after: int | None = None
    fail_every: int | None = None  # every n-th call returns an error Generation
    batch_size: int = 8


@register_backend("fake")
class FakeChatModel(ChatModel):
    def __init__(self, spec: str = "fake", **options: Any):
        self.opts = FakeOptions(**options)
        self.calls = 0
        self.batches: list[int] = []
        self.seen: list[Conversation] = []
        fn = self.opts.script
        if isinstance(fn, str):
            mod, _, attr = fn.partition(":")
            fn = getattr(importlib.import_module(mod), attr)
        self._script = fn

    @property
    def identity(self) -> str:
        return f"fake:{self.opts.name}"

    def _reply(self, conv: Conversation, params: GenerationParams) -> str:
        if self._script is not None:
            return self._script(conv)
        if self.opts.responses:
            return self.opts.responses[(self.calls - 1) % len(self.opts.responses)]
        return f"echo: {conv[-1]['content']}"

    def generate(self, conversations: Sequence[Conversation],
                 params: GenerationParams | None = None) -> list[Generation]:
        params = params or GenerationParams()
        self.batches.append(len(conversations))
        out = []
        for conv in conversations:
            if self.opts.die_after is not None and self.calls >= self.opts.die_after:
                os._exit(137)  # like a SIGKILL: no cleanup, no flush
            self.calls += 1
            self.seen.append(conv)
            if self.opts.fail_every and self.calls % self.opts.fail_every == 0:
                out.append(Generation(text="", finish_reason="error", error="scripted failure"))
                continue
            text = self._reply(conv, params)
            for s in params.stop:
                text = text.split(s, 1)[0]
            words = text.split()
            if len(words) > params.max_tokens:
                text = " ".join(words[:params.max_tokens])
                finish = "length"
            else:
                finish = "stop"
            out.append(Generation(text=text, finish_reason=finish,
                                  prompt_tokens=sum(len(m["content"].split()) for m in conv),
                                  completion_tokens=len(text.split())))
        return out

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[ContinuationScore]]:
        # Deterministic: a continuation scores higher the more of its words the prompt holds.
        out = []
        for req in requests:
            prompt = req.prompt if isinstance(req.prompt, str) else " ".join(
                m["content"] for m in req.prompt)
            words = set(prompt.lower().split())
            row = []
            for c in req.continuations:
                toks = c.lower().split() or [c]
                overlap = sum(t in words for t in toks)
                row.append(ContinuationScore(logprob=float(overlap - len(toks)),
                                             n_tokens=len(toks), n_chars=len(c)))
            out.append(row)
        return out
