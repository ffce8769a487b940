"""Messages of the models protocol in OpenAI's shape: tool specs, tool calls, tool choice.

`ToolCall` and `ToolSpec` are records (`workbench.records`, the lowest layer, so data files
can hold them); they are re-exported here with the helpers backends use.

A conversation stays a list of plain dicts (`{"role", "content"}`, plus `tool_calls` on an
assistant turn, `tool_call_id` and `name` on a `tool` turn), exactly what OpenAI's API takes;
typed `workbench.records.Message` objects are accepted too and turned into those dicts by
`plain_conversation`. Tool call arguments are a JSON *string*, as OpenAI sends them: a model
may write invalid JSON, and that must reach the caller as written, not crash a parser here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, StrictStr, ValidationError

from workbench.errors import WorkbenchError
from workbench.records import (
    FunctionCall,
    FunctionSpec,
    StrictModel,
    ToolCall,
    ToolSpec,
    new_call_id,
)

__all__ = ["FunctionCall", "FunctionSpec", "NamedToolChoice", "ToolCall", "ToolChoice",
           "ToolSpec", "as_tool_choice", "as_tool_specs", "new_call_id", "plain_conversation",
           "plain_message"]

MESSAGE_KEYS = ("role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name")


class _FunctionName(StrictModel):
    name: StrictStr


class NamedToolChoice(StrictModel):
    """`{"type": "function", "function": {"name": ...}}`: the model must call that tool."""

    type: Literal["function"] = "function"
    function: _FunctionName


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


def _validation_message(where: str, e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in (where, *err["loc"]) if x != "")
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def as_tool_specs(tools: Sequence[ToolSpec | dict[str, Any]] | None) -> list[ToolSpec] | None:
    """Validate a `tools` list (ToolSpec objects or OpenAI dicts); None or [] gives None."""
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        try:
            out.append(t if isinstance(t, ToolSpec) else ToolSpec.model_validate(t))
        except ValidationError as e:
            raise WorkbenchError(_validation_message(f"tools.{i}", e)) from None
    names = [t.name for t in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise WorkbenchError(f"tools: duplicate function name(s) {', '.join(dupes)}")
    return out


def as_tool_choice(choice: ToolChoice | dict[str, Any] | str | None,
                   tools: Sequence[ToolSpec] | None) -> ToolChoice:
    """Check `tool_choice` against the tools; None means "auto" (OpenAI's default with tools)."""
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise WorkbenchError(f"tool_choice: {choice!r} is not auto, none, required or "
                                 '{"type": "function", "function": {"name": ...}}')
        value: ToolChoice = choice  # type: ignore[assignment]
    else:
        try:
            value = choice if isinstance(choice, NamedToolChoice) else \
                NamedToolChoice.model_validate(choice)
        except ValidationError as e:
            raise WorkbenchError(_validation_message("tool_choice", e)) from None
    if value != "none" and not tools:
        raise WorkbenchError("tool_choice: needs `tools`")
    if isinstance(value, NamedToolChoice) and value.function.name not in {
            t.name for t in tools or ()}:
        raise WorkbenchError(f"tool_choice: no tool named {value.function.name!r} in tools")
    return value


def plain_message(m: Any) -> dict[str, Any]:
    """A message as an OpenAI dict without None fields; accepts dicts and pydantic models."""
    d = m.model_dump(mode="json", exclude_none=True) if isinstance(m, BaseModel) else m
    if not isinstance(d, dict):
        raise WorkbenchError(f"a message must be a dict or a Message, got {type(m).__name__}")
    out = {k: d[k] for k in MESSAGE_KEYS if d.get(k) is not None}
    if "tool_calls" in out:
        out["tool_calls"] = [tc.model_dump(mode="json") if isinstance(tc, BaseModel) else tc
                             for tc in out["tool_calls"]]
        if not out["tool_calls"]:
            del out["tool_calls"]
    return out


def plain_conversation(conv: Sequence[Any]) -> list[dict[str, Any]]:
    return [plain_message(m) for m in conv]
