"""Tools an agent can call: a JSON schema for the arguments and a Python function.

`Toolbox.call` separates the model's mistakes from ours: an unknown tool, arguments that are
not a JSON object or break the schema, or a `ToolError` the function raises (a chunk id that
does not exist, say) come back as an observation with `error` set, which the loop records
and shows the model; any other exception is a bug and propagates.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.errors import WorkbenchError
from workbench.records import ToolCall, ToolSpec


class ToolError(Exception):
    """Raised by a tool function when the call's arguments are valid JSON but unusable; the
    message goes back to the model."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    final: bool = False  # calling it ends the run; its arguments are the answer

    def spec(self) -> ToolSpec:
        return ToolSpec.model_validate({"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": self.parameters}})


@dataclass
class Observation:
    text: str
    error: str | None = None
    value: Any = None
    arguments: dict[str, Any] | None = None


def _validator(schema: dict[str, Any]):
    from jsonschema import Draft202012Validator, SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        raise WorkbenchError(f"tool schema is not valid JSON Schema: {e}") from None
    return Draft202012Validator(schema)


class Toolbox:
    def __init__(self, tools: Sequence[Tool]):
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise WorkbenchError(f"toolbox: tool names repeat ({', '.join(names)})")
        if not any(t.final for t in tools):
            raise WorkbenchError("toolbox: no final tool (the one whose call is the answer)")
        self.tools = {t.name: t for t in tools}
        self._validators = {t.name: _validator(t.parameters) for t in tools}

    def specs(self, names: Sequence[str] | None = None) -> list[ToolSpec]:
        return [t.spec() for n, t in self.tools.items() if names is None or n in names]

    @property
    def final_names(self) -> list[str]:
        return [n for n, t in self.tools.items() if t.final]

    def is_final(self, name: str) -> bool:
        return name in self.tools and self.tools[name].final

    def check(self, call: ToolCall) -> tuple[dict[str, Any] | None, str | None]:
        """(arguments, None) when the call is well formed, else (None, the model's error)."""
        name = call.function.name
        if name not in self.tools:
            return None, f"unknown tool {name!r} (tools: {', '.join(self.tools)})"
        args: Any = call.function.arguments
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as e:
                return None, f"{name}: arguments are not valid JSON ({e.msg} at char {e.pos})"
        if not isinstance(args, dict):
            return None, f"{name}: arguments must be a JSON object"
        props = self.tools[name].parameters.get("properties") or {}
        for k, v in list(args.items()):  # JSON Schema calls 3.0 an integer; Python does not
            if isinstance(v, float) and v.is_integer() and \
                    (props.get(k) or {}).get("type") == "integer":
                args[k] = int(v)
        errors = sorted(self._validators[name].iter_errors(args), key=lambda e: list(e.path))
        if errors:
            return None, "; ".join(
                f"{name}.{'.'.join(map(str, e.path)) or '(arguments)'}: {e.message}"
                for e in errors[:3])
        return args, None

    def call(self, call: ToolCall) -> Observation:
        args, error = self.check(call)
        if error is not None:
            return Observation(text=f"Error: {error}", error=error)
        tool = self.tools[call.function.name]
        try:
            value = tool.fn(**args)
        except ToolError as e:
            return Observation(text=f"Error: {e}", error=str(e), arguments=args)
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return Observation(text=text, value=value, arguments=args)
