"""A scripted backend for unit tests of prompt logic; it goes through the same registry and
protocol as the real backends, so code under test cannot tell it apart.

Responses come from `responses` (a list used in order, cycling) or from `script`, a
`module:function` taking the conversation and returning a reply. A reply is text, or a dict
`{"content": ..., "tool_calls": [{"name": ..., "arguments": {...}}, ...]}` for a scripted
tool call. When the caller offers `tools`, text replies are parsed for tool calls with the
local backend's parser (`tool_syntax`, Hermes `<tool_call>` blocks by default), so a script
that writes what a model would write exercises the real parsing path. `die_after` makes the
process exit hard after that many calls: the resume tests use it to simulate a kill.
`seconds_per_token` makes it a slow engine: each reply takes that long per word, and a batch
reports its progress as a real one does (replies done, tokens made so far).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ConfigDict

from workbench.errors import WorkbenchError
from workbench.models.backends import register_backend
from workbench.models.base import (
    Capabilities,
    ChatModel,
    ContinuationScore,
    Conversation,
    Generation,
    GenerationParams,
    ScoreRequest,
    Tools,
)
from workbench.models.messages import NamedToolChoice, ToolCall, ToolChoice, plain_conversation
from workbench.models.tools import FAMILIES, parse_tool_calls
from workbench.plugins import load
from workbench.progress import progress, tally
from workbench.records import StrictModel

Reply = str | dict[str, Any]


class FakeOptions(StrictModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    responses: list[Reply] | None = None
    script: str | Callable[[Conversation], Reply] | None = None
    tool_syntax: str = "hermes"
    name: str = "fake"
    die_after: int | None = None
    fail_every: int | None = None  # every n-th call returns an error Generation
    batch_size: int = 8
    seconds_per_token: float = 0.0  # > 0: a slow engine, counting replies and tokens


@register_backend("fake")
class FakeChatModel(ChatModel):
    capabilities = Capabilities(score=True, tool_calls=True)

    def __init__(self, spec: str = "fake", **options: Any):
        self.opts = FakeOptions(**options)
        if self.opts.tool_syntax not in FAMILIES:
            raise WorkbenchError(f"fake backend: tool_syntax {self.opts.tool_syntax!r} is not "
                                 f"one of {', '.join(FAMILIES)}")
        self.calls = 0
        self.batches: list[int] = []
        self.seen: list[Conversation] = []
        self.seen_tools: list[list[str]] = []  # tool names offered with each conversation
        fn = self.opts.script
        if isinstance(fn, str):
            fn = load(fn, what="fake backend: script")
        self._script = fn

    @property
    def batch_size(self) -> int:
        return self.opts.batch_size

    @property
    def identity(self) -> str:
        return f"fake:{self.opts.name}"

    def _reply(self, conv: Conversation, params: GenerationParams) -> Reply:
        if self._script is not None:
            return self._script(conv)
        if self.opts.responses:
            return self.opts.responses[(self.calls - 1) % len(self.opts.responses)]
        return f"echo: {conv[-1].get('content') or ''}"

    def generate(self, conversations: Sequence[Conversation],
                 params: GenerationParams | None = None, tools: Tools | None = None,
                 tool_choice: ToolChoice | None = None) -> list[Generation]:
        params = params or GenerationParams()
        specs, choice = self._tool_request(tools, tool_choice)
        offered = [t.name for t in specs or ()] if choice != "none" else []
        self.batches.append(len(conversations))
        convs = list(map(plain_conversation, conversations))
        if self.opts.seconds_per_token <= 0:
            return [self._one(conv, params, offered, choice) for conv in convs]
        out = []
        with tally("tokens", "token") as tokens:
            for conv in progress(convs, desc="generating", unit="reply", delay=2):
                gen = self._one(conv, params, offered, choice)
                for _ in range(max(1, gen.completion_tokens or 0)):
                    time.sleep(self.opts.seconds_per_token)
                    tokens.add(1)
                out.append(gen)
        return out

    def _one(self, conv: Conversation, params: GenerationParams, offered: list[str],
             choice: ToolChoice) -> Generation:
        if self.opts.die_after is not None and self.calls >= self.opts.die_after:
            os._exit(137)  # like a SIGKILL: no cleanup, no flush
        self.calls += 1
        self.seen.append(conv)
        self.seen_tools.append(offered)
        if self.opts.fail_every and self.calls % self.opts.fail_every == 0:
            return Generation(text="", finish_reason="error", error="scripted failure")
        reply = self._reply(conv, params)
        if isinstance(reply, dict):
            return _check_choice(self._scripted_call(reply, offered), choice)
        text = reply
        for s in params.stop:
            text = text.split(s, 1)[0]
        words = text.split()
        if len(words) > params.max_tokens:
            text = " ".join(words[:params.max_tokens])
            finish = "length"
        else:
            finish = "stop"
        gen = Generation(text=text, finish_reason=finish,
                         prompt_tokens=_words(conv), completion_tokens=len(text.split()))
        if offered:
            content, calls = parse_tool_calls(text, self.opts.tool_syntax, offered)
            if calls:
                gen.text, gen.tool_calls, gen.finish_reason = content, calls, "tool_calls"
        return _check_choice(gen, choice)

    def _scripted_call(self, reply: dict[str, Any], offered: list[str]) -> Generation:
        calls = [ToolCall.make(c["name"], c.get("arguments"), id=c.get("id"))
                 for c in reply.get("tool_calls") or ()]
        unknown = [c.function.name for c in calls if c.function.name not in offered]
        if unknown:
            raise WorkbenchError(f"fake backend: scripted call to {', '.join(unknown)}, which "
                                 "the caller did not offer (tools: "
                                 f"{', '.join(offered) or 'none'})")
        text = reply.get("content") or ""
        return Generation(text=text, finish_reason="tool_calls" if calls else "stop",
                          completion_tokens=len(text.split()), tool_calls=calls)

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[ContinuationScore]]:
        # Deterministic: a continuation scores higher the more of its words the prompt holds.
        out = []
        for req in requests:
            prompt = req.prompt if isinstance(req.prompt, str) else " ".join(
                m.get("content") or "" for m in plain_conversation(req.prompt))
            words = set(prompt.lower().split())
            row = []
            for c in req.continuations:
                toks = c.lower().split() or [c]
                overlap = sum(t in words for t in toks)
                row.append(ContinuationScore(logprob=float(overlap - len(toks)),
                                             n_tokens=len(toks), n_chars=len(c)))
            out.append(row)
        return out


def _check_choice(gen: Generation, choice: ToolChoice) -> Generation:
    """A script that ignores a forcing tool_choice is a bug in the test, not a model's slip."""
    if choice == "required" and not gen.tool_calls:
        raise WorkbenchError("fake backend: tool_choice is 'required' but the scripted reply "
                             "calls no tool")
    if isinstance(choice, NamedToolChoice) and (not gen.tool_calls or any(
            c.function.name != choice.function.name for c in gen.tool_calls)):
        raise WorkbenchError(f"fake backend: tool_choice names {choice.function.name!r} but "
                             "the scripted reply calls "
                             f"{[c.function.name for c in gen.tool_calls] or 'no tool'}")
    return gen


def _words(conv: Conversation) -> int:
    return sum(len((m.get("content") or "").split()) for m in conv)
