"""Tools an agent can call: a JSON schema for the arguments and a Python function.

`Toolbox.call` separates the model's mistakes from ours: an unknown tool, arguments that are
not a JSON object or break the schema, or a `ToolError` the function raises (a chunk id that
does not exist, say) come back as an observation with `error` set, which the loop records
and shows the model; any other exception is a bug and propagates.

Schemas and arguments are bounded before anything recurses over them: a parameter schema is
held to constrained decoding's limits (`workbench.models.constrain`: nesting depth 64,
alternatives, size) when the toolbox is made, and arguments nested past that depth are the
model's error, never Python's RecursionError. A schema's `pattern`, `patternProperties` and
the names `unevaluatedProperties` and `additionalProperties` take from them are matched with
the `regex` module under a timeout (`PATTERN_TIMEOUT_S` a match, `PATTERN_BUDGET_S` a call),
since Python's `re`, which jsonschema uses, can backtrack on a pattern like `^(a|a)+$` for
ever; a match that runs out of time refuses the value, naming the field. Every pattern is
compiled by `regex` when the toolbox is made, after its size is bounded (`regex` unrolls a
counted repeat: `a{4294967294}` took 2.8 GB and 9 s to refuse): one that cannot be compiled,
or would unroll past `bounds.MAX_PATTERN_UNITS` (`bounds.bounded_pattern`, the check
the server makes of a caller's regexes too), is a WorkbenchError naming the tool and the
pattern.
"""

from __future__ import annotations

import contextvars
import json
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.errors import WorkbenchError
from workbench.models.bounds import (
    MAX_SCHEMA_DEPTH,
    bounded_pattern,
    bounded_schema,
    schema_patterns,
)
from workbench.records import ToolCall, ToolSpec

PATTERN_TIMEOUT_S = 0.5  # one match of a schema pattern against one value
PATTERN_BUDGET_S = 2.0  # all the pattern matches of one call's arguments
MAX_PATTERN_CHARS = 10_000  # one pattern of a parameter schema


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


def _depth(value: Any) -> int:
    """How deep objects and arrays nest in `value` (walked without recursion: it may be
    deeper than Python's recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, depth)
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


# the current call's matching: the end of its pattern budget (monotonic seconds) and the
# matches made so far (additionalProperties matches the names patternProperties did)
_call_matching: contextvars.ContextVar[tuple[float, dict] | None] = contextvars.ContextVar(
    "wb_tool_call_matching", default=None)


def _search(pattern: str, text: str) -> bool | None:
    """Whether `pattern` matches somewhere in `text`, with the `regex` module under
    PATTERN_TIMEOUT_S (and what is left of the call's PATTERN_BUDGET_S); None when it ran
    out of time."""
    import regex

    state = _call_matching.get()
    if state is not None and (pattern, text) in state[1]:
        return state[1][pattern, text]
    left = PATTERN_TIMEOUT_S if state is None else min(PATTERN_TIMEOUT_S,
                                                       state[0] - time.monotonic())
    try:
        found = None if left <= 0 else regex.search(pattern, text, timeout=left) is not None
    except TimeoutError:
        found = None
    # regex.error is not caught: every pattern of a toolbox's schemas compiled when it was
    # made (`_check_patterns`), so one that does not is our bug, not the model's
    if state is not None:
        state[1][pattern, text] = found
    return found


def _slow(pattern: str) -> str:
    return (f"could not be matched against the pattern {pattern!r} in time (the pattern "
            "backtracks on it), so it is refused")


def _pattern(validator, patrn, instance, schema):
    from jsonschema import ValidationError

    if not validator.is_type(instance, "string"):
        return
    found = _search(patrn, instance)
    if found is None:
        yield ValidationError(f"the value {_short(instance)} {_slow(patrn)}")
    elif not found:
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(validator, pattern_properties, instance, schema):
    from jsonschema import ValidationError

    if not validator.is_type(instance, "object"):
        return
    for patrn, subschema in pattern_properties.items():
        for k, v in instance.items():
            found = _search(patrn, k)
            if found is None:
                yield ValidationError(f"the property name {_short(k)} {_slow(patrn)}",
                                      path=[k])
            elif found:
                yield from validator.descend(v, subschema, path=k, schema_path=patrn)


def _additional_properties(validator, ap, instance, schema):
    """jsonschema's `additionalProperties` with the property names matched by `_search`."""
    from jsonschema import ValidationError

    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = []
    for k in instance:
        if k in properties:
            continue
        hits = [_search(p, k) for p in patterns]
        if None in hits:
            continue  # reported by patternProperties, which matches the same names
        if not any(hits):
            extras.append(k)
    if validator.is_type(ap, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], ap, path=extra)
    elif not ap and extras:
        names = ", ".join(repr(k) for k in sorted(extras, key=str))
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            yield ValidationError(f"{names} {verb} not match any of the regexes: "
                                  f"{', '.join(repr(p) for p in sorted(patterns))}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(f"Additional properties are not allowed ({names} {verb} "
                                  "unexpected)")


def _evaluated_keys(validator, instance: dict, schema: Any) -> set[str]:
    """The property names of `instance` that `schema`'s keywords evaluate (what
    `unevaluatedProperties` leaves alone): jsonschema's own walk (`_utils.
    find_evaluated_property_keys_by_schema`, 4.x), with patternProperties' names matched by
    `_search`. A name a pattern could not be matched against in time counts as evaluated:
    patternProperties refuses it, naming it, in the same schema."""
    if not isinstance(schema, dict):
        return set()
    keys: set[str] = set()
    for ref in ("$ref", "$dynamicRef"):
        if (target := schema.get(ref)) is not None:
            resolved = validator._resolver.lookup(target)
            keys |= _evaluated_keys(validator.evolve(schema=resolved.contents,
                                                     _resolver=resolved.resolver),
                                    instance, resolved.contents)
    properties = schema.get("properties")
    if isinstance(properties, dict):
        keys |= properties.keys() & instance.keys()
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        if (sub := schema.get(keyword)) is not None:
            keys |= {k for k, v in instance.items() if _valid(validator.descend(v, sub))}
    for patrn in schema.get("patternProperties", {}):
        keys |= {k for k in instance if _search(patrn, k) is not False}
    for name, sub in schema.get("dependentSchemas", {}).items():
        if name in instance:
            keys |= _evaluated_keys(validator, instance, sub)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for sub in schema.get(keyword, []):
            if _valid(validator.descend(instance, sub)):
                keys |= _evaluated_keys(validator, instance, sub)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys |= _evaluated_keys(validator, instance, schema["if"])
            if "then" in schema:
                keys |= _evaluated_keys(validator, instance, schema["then"])
        elif "else" in schema:
            keys |= _evaluated_keys(validator, instance, schema["else"])
    return keys


def _valid(errors) -> bool:
    return next(errors, None) is None


def _unevaluated_properties(validator, uneval, instance, schema):
    """jsonschema's `unevaluatedProperties` (same messages) with the names the schema's
    patternProperties evaluate matched by `_search`, under the call's time budget."""
    from jsonschema import ValidationError

    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema)
    bad = [k for k in instance if k not in evaluated and not _valid(
        validator.descend(instance[k], uneval, path=k, schema_path=k))]
    if not bad:
        return
    names = ", ".join(repr(k) for k in (sorted(bad, key=str) if uneval is False else bad))
    verb = "was" if len(bad) == 1 else "were"
    if uneval is False:
        yield ValidationError(f"Unevaluated properties are not allowed ({names} {verb} "
                              "unexpected)")
    else:
        yield ValidationError("Unevaluated properties are not valid under the given schema "
                              f"({names} {verb} unevaluated and invalid)")


def _short(text: str, n: int = 60) -> str:
    return repr(text) if len(text) <= n else f"{text[:n]!r}... ({len(text)} characters)"


_BOUNDED_VALIDATOR: list[Any] = []


def _validator_class():
    """Draft 2020-12 with the pattern keywords matched under a timeout (made once)."""
    if not _BOUNDED_VALIDATOR:
        from jsonschema import Draft202012Validator, validators

        _BOUNDED_VALIDATOR.append(validators.extend(Draft202012Validator, {
            "pattern": _pattern, "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties,
            "unevaluatedProperties": _unevaluated_properties}))
    return _BOUNDED_VALIDATOR[0]


def _bound_patterns(name: str, schema: dict[str, Any]) -> None:
    """Every regex of the tool's schema within its size and the regex bounds of
    `models.constrain` (brackets, alternatives, what its counted repeats unroll to: the
    server's check, one function); one WorkbenchError naming the tool and the pattern."""
    for patrn in schema_patterns(schema):
        shown = _short(patrn)
        if len(patrn) > MAX_PATTERN_CHARS:
            raise WorkbenchError(f"tool {name}: parameter schema pattern {shown} is over the "
                                 f"limit of {MAX_PATTERN_CHARS} characters")
        if problem := bounded_pattern(patrn, grammar=False):
            raise WorkbenchError(f"tool {name}: parameter schema pattern {shown} refused: "
                                 f"{problem}")


def _check_patterns(name: str, schema: dict[str, Any]) -> None:
    """Compile every regex of the tool's schema with `regex`, the module that matches them,
    once bounded (`_bound_patterns`); one WorkbenchError naming the tool and the pattern
    otherwise. (A pattern `regex` cannot compile used to be matched with Python's `re`:
    unbounded in time, and not the engine the schema was checked against.)"""
    import regex

    for patrn in schema_patterns(schema):
        shown = _short(patrn)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # regex's FutureWarning on `[[`: no output
                regex.compile(patrn)
        except (regex.error, ValueError, OverflowError, RecursionError, MemoryError) as e:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise WorkbenchError(f"tool {name}: parameter schema pattern {shown} cannot be "
                                 f"compiled by the regex module that matches it ({why})"
                                 ) from None


def _validator(name: str, schema: dict[str, Any]):
    from jsonschema import Draft202012Validator, SchemaError

    if (depth := _depth(schema)) > MAX_SCHEMA_DEPTH:
        raise WorkbenchError(f"tool {name}: parameter schema nested too deeply ({depth} "
                             f"levels of objects and arrays, over the limit of "
                             f"{MAX_SCHEMA_DEPTH})")
    _bound_patterns(name, schema)  # before bounded_schema, which would name them less well
    if problem := bounded_schema(schema):
        raise WorkbenchError(f"tool {name}: parameter schema refused: {problem}")
    # the patterns first: check_schema compiles them with `re`, which raised ValueError on a
    # repeat count of over 4,300 digits (`a{999...}`)
    _check_patterns(name, schema)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        raise WorkbenchError(f"tool {name}: tool schema is not valid JSON Schema: "
                             f"{e.message}") from None
    return _validator_class()(schema)


class Toolbox:
    def __init__(self, tools: Sequence[Tool]):
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise WorkbenchError(f"toolbox: tool names repeat ({', '.join(names)})")
        if not any(t.final for t in tools):
            raise WorkbenchError("toolbox: no final tool (the one whose call is the answer)")
        self.tools = {t.name: t for t in tools}
        self._validators = {t.name: _validator(t.name, t.parameters) for t in tools}

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
            except json.JSONDecodeError as e:
                return None, f"{name}: arguments are not valid JSON ({e.msg} at char {e.pos})"
            except RecursionError:
                return None, (f"{name}: arguments nested too deeply to read (over "
                              f"{MAX_SCHEMA_DEPTH} levels of objects and arrays)")
        if not isinstance(args, dict):
            return None, f"{name}: arguments must be a JSON object"
        if (depth := _depth(args)) > MAX_SCHEMA_DEPTH:
            return None, (f"{name}: arguments nested too deeply ({depth} levels of objects "
                          f"and arrays, over the limit of {MAX_SCHEMA_DEPTH})")
        props = self.tools[name].parameters.get("properties") or {}
        for k, v in list(args.items()):  # JSON Schema calls 3.0 an integer; Python does not
            if isinstance(v, float) and v.is_integer() and \
                    (props.get(k) or {}).get("type") == "integer":
                args[k] = int(v)
        token = _call_matching.set((time.monotonic() + PATTERN_BUDGET_S, {}))
        try:
            errors = sorted(self._validators[name].iter_errors(args), key=lambda e: list(e.path))
        except RecursionError:  # a schema whose $ref recurses, over deep arguments
            return None, f"{name}: arguments nested too deeply to check against the schema"
        finally:
            _call_matching.reset(token)
        if errors:
            return None, "; ".join(
                f"{name}.{'.'.join(map(str, e.path)) or '(arguments)'}: {e.message}"
                for e in errors[:3])
        return args, None

    def call(self, call: ToolCall) -> Observation:
        args, error = self.check(call)
        if error is not None or args is None:
            return Observation(text=f"Error: {error}", error=error)
        tool = self.tools[call.function.name]
        try:
            value = tool.fn(**args)
        except ToolError as e:
            return Observation(text=f"Error: {e}", error=str(e), arguments=args)
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return Observation(text=text, value=value, arguments=args)
