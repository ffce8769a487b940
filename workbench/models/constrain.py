"""Constrained decoding: the model may only emit tokens that keep its output valid under a
JSON schema, a regex, a choice list or a Lark grammar.

The masks come from llguidance (the engine behind llama.cpp's and vLLM's structured output):
it needs no per-schema compilation, so a server can take a new schema on every request, and a
mask over SmolLM2's 49k-token vocabulary takes tens of microseconds. `GrammarProcessor` is a
transformers `LogitsProcessor`, one matcher per row of the batch: it runs before temperature,
top-k and top-p, so sampling only ever sees allowed tokens. When the grammar is complete only
the end-of-sequence tokens remain allowed, and generation stops there.

`tool_call_constraint` is what makes a forced `tool_choice` keep OpenAI's contract: after the
forced prefix of the model's tool-call syntax, the rest of the call (the name, for
`"required"`, and the arguments under the tool's JSON schema, then the closing marker) is
generated under the grammar, so it always parses and its arguments fit the schema, unless
`max_tokens` cuts it (finish_reason "length").
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from workbench.errors import WorkbenchError

# one space after ":" and ",", no free whitespace: small models otherwise fill objects with
# blank lines until max_tokens (a schema's own "x-guidance" options still win)
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

ConstraintKind = Literal["json_schema", "json_object", "regex", "choice", "lark"]


# Caller-supplied schemas (tool parameters, response_format's json_schema), regexes and
# grammars are held to these before anything renders or compiles them (a tool schema 450
# levels deep got a 500 from the server, and a RecursionError in an agent's forced call).
# OpenAI's structured outputs take at most 10 levels of nesting, 1,000 enum values and
# 120,000 characters of names and values; these are looser, for real use, and well inside
# what pydantic's serializer, the chat template and llguidance take.
MAX_SCHEMA_DEPTH = 64  # nested objects and arrays (a level of `properties` is two)
MAX_SCHEMA_CHARS = 100_000  # of its JSON text: a tenth of the default body, guided_grammar's cap
MAX_SCHEMA_ALTERNATIVES = 1_000  # anyOf + oneOf + enum members; `|` in a regex or grammar
# What a regex's counted repeats unroll to (an atom repeated at least m times is m copies,
# nested repeats multiply): `regex` (an agent's schema patterns) compiles each copy (~0.25 KB:
# `a{4294967294}` took 2.8 GB and 9 s to refuse), and llguidance gave up on `a{4294967294}` or
# `(a{1000}){1000}` after ~2 s and ~200 MB ("too many expressions constructed") while the
# server answered 200 with a reply that breaks the regex, cut at its 4th token; `a{100000}`
# takes it ~1 s.
MAX_PATTERN_UNITS = 100_000
# What a Lark grammar's repeats (`"a"~n`, through groups and the rules it names) expand to:
# llguidance's Earley parser refused `"a"~40000` and 50 copies of a rule of `"a"~1000`
# ("Too many items (limit 50000)") once generation began, which the server again answered
# 200 with a reply that breaks the grammar; `"a"~30000` was taken.
MAX_GRAMMAR_UNITS = 25_000
# Properties of one object that are not `required`: llguidance's parser refused an object of
# 500 ("Current row has 2007 items; max is 2000") at its first key, which the server answered
# 200 with `{"`; 490 were taken (required ones cost nothing: 900 were taken).
MAX_OPTIONAL_PROPERTIES = 400


def bounded_schema(schema: Any) -> str | None:
    """What is past the limits in a caller's JSON schema (None when nothing is), measured
    before anything renders or compiles it: nesting (walked without recursion, since it may
    be deep), alternatives, an object's optional properties, size, then its regexes."""
    deepest, alternatives, optional, stack = 0, 0, 0, [(schema, 1)]
    while stack:
        v, depth = stack.pop()
        if not isinstance(v, dict | list):
            continue
        deepest = max(deepest, depth)
        if isinstance(v, dict):
            alternatives += sum(len(v[k]) for k in ("anyOf", "oneOf", "enum")
                                if isinstance(v.get(k), list))
            if isinstance(props := v.get("properties"), dict):
                required = v.get("required")
                named = {str(r) for r in required} if isinstance(required, list) else set()
                optional = max(optional, len(set(props) - named))
        stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    if deepest > MAX_SCHEMA_DEPTH:
        return (f"the schema nests objects and arrays {deepest} levels deep, over the depth "
                f"limit of {MAX_SCHEMA_DEPTH}")
    if alternatives > MAX_SCHEMA_ALTERNATIVES:
        return (f"the schema has {alternatives} alternatives (anyOf, oneOf and enum members), "
                f"over the alternatives limit of {MAX_SCHEMA_ALTERNATIVES}")
    if optional > MAX_OPTIONAL_PROPERTIES:
        return (f"an object of the schema has {optional} properties that are not required, "
                f"over the limit of {MAX_OPTIONAL_PROPERTIES} (list them in `required`, or "
                "nest them)")
    if (size := len(json.dumps(schema, ensure_ascii=False))) > MAX_SCHEMA_CHARS:
        return (f"the schema is {size} characters of JSON, over the size limit of "
                f"{MAX_SCHEMA_CHARS}")
    for patrn in schema_patterns(schema):
        if problem := bounded_pattern(patrn, grammar=False):
            return f"its pattern {_short(patrn)}: {problem}"
    return _together("schema", schema_patterns(schema, unique=False))


def _together(what: str, patterns: list[str]) -> str | None:
    """The bound on all of a schema's or grammar's regexes together: llguidance builds each
    occurrence apart (20 properties of `^a{90000}$`: 19 s and +230 MB for one request)."""
    if (units := sum(pattern_units(p) for p in patterns)) > MAX_PATTERN_UNITS:
        return (f"the {what}'s {len(patterns)} regexes repeat too much together ({units:,} "
                f"atoms once their counted repeats are unrolled, over the repeat limit of "
                f"{MAX_PATTERN_UNITS:,})")
    return None


_NOT_SCHEMAS = ("enum", "const", "default", "examples")  # values, not schemas


def schema_patterns(schema: Any, unique: bool = True) -> list[str]:
    """Every regex of a schema: `pattern` values and `patternProperties` names (walked
    without recursion; literal values such as `enum` members are not walked), each once
    unless `unique` is False."""
    found: list[str] = []
    stack = [schema]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            if isinstance(v.get("pattern"), str):
                found.append(v["pattern"])
            if isinstance(v.get("patternProperties"), dict):
                found.extend(str(k) for k in v["patternProperties"])
            stack.extend(x for k, x in v.items() if k not in _NOT_SCHEMAS)
    return list(dict.fromkeys(found)) if unique else found


def _short(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else text[:n] + "…")


# what nests and what is an alternative in a regex (a character class neither) and in a Lark
# grammar (a quoted string neither; `{` nests a `%json` schema)
_REGEX_PARTS = re.compile(r"\\.|\[\^?\]?(?:\\.|[^\]\\])*\]|[()|]", re.DOTALL)
_GRAMMAR_PARTS = re.compile(r'\\.|"(?:\\.|[^"\\\n])*"|[(\[{}\])|]', re.DOTALL)


def bounded_pattern(text: str, grammar: bool) -> str | None:
    """What is past the limits in a caller's regex or Lark grammar (None when nothing is),
    counted before llguidance (or `regex`) compiles it: brackets nested, `|` alternatives,
    then what its repeats unroll to (`pattern_units`, `grammar_units`; each regex literal
    of a grammar as a regex, and the patterns of a `%json` schema in it)."""
    depth = deepest = bars = 0
    for m in (_GRAMMAR_PARTS if grammar else _REGEX_PARTS).finditer(text):
        c = m.group()
        if c in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in ")]}":
            depth = max(0, depth - 1)
        elif c == "|":
            bars += 1
    what = "grammar" if grammar else "regex"
    if deepest > MAX_SCHEMA_DEPTH:
        return (f"the {what} nests brackets {deepest} levels deep, over the depth limit of "
                f"{MAX_SCHEMA_DEPTH}")
    if bars + 1 > MAX_SCHEMA_ALTERNATIVES:
        return (f"the {what} has {bars + 1} alternatives (`|`), over the alternatives "
                f"limit of {MAX_SCHEMA_ALTERNATIVES}")
    if not grammar:
        if (units := pattern_units(text)) > MAX_PATTERN_UNITS:
            return (f"the regex repeats too much ({units:,} atoms once its counted repeats "
                    f"are unrolled, over the repeat limit of {MAX_PATTERN_UNITS:,}); a "
                    "repeat's minimum unrolls, its maximum does not: bound a length with "
                    "`{0,n}` or minLength/maxLength")
        return None
    units, literals, schemas = _grammar_parts(text)
    for literal in literals:
        if problem := bounded_pattern(literal, grammar=False):
            return f"its regex /{_short(literal)[1:-1]}/: {problem}"
    for schema in schemas:
        if problem := bounded_schema(schema):
            return f"its %json schema: {problem}"
    if problem := _together("grammar", literals + [
            p for schema in schemas for p in schema_patterns(schema, unique=False)]):
        return problem
    if units > MAX_GRAMMAR_UNITS:
        return (f"the grammar repeats too much ({units:,} items once its repeats (`~`) are "
                f"expanded through its groups and rules, over the repeat limit of "
                f"{MAX_GRAMMAR_UNITS:,})")
    return None


# a regex's parts, as `pattern_units` counts them: an escape (\p{L}, \N{...}, \x{..}
# whole), a character class, a comment, a group's opening, its end, a counted repeat, `|`,
# anything else (one atom)
_PATTERN_PARTS = re.compile(
    r"\\[pPNx]\{[^}]*\}|\\.|\[\^?\]?(?:\\.|\[:\^?[a-z]+:\]|[^\]\\])*\]|\(\?#[^)]*\)"
    r"|\((?:\?(?:<[=!]|P?<[^>]*>|'[^']*'|[a-zA-Z^-]*[:=!>|]?))?|\)|\{(\d*)(?:,\d*)?\}"
    r"|[|*+?]|.", re.DOTALL)
_CAP = 10 ** 15  # counts stop growing here (a 5,000-digit repeat, repeats of repeats)


def _times(digits: str) -> int:
    return max(1, 1 if not digits else int(digits) if len(digits) <= 12 else 10 ** 12)


def pattern_units(pattern: str) -> int:
    """What a regex unrolls to, roughly: atoms, with a group or atom repeated at least m
    times (`{m}`, `{m,}`, `{m,n}`) counted m times, nested repeats multiplying (what `regex`
    compiles an atom's minimum repeats into, and what llguidance's lexer builds; `*`, `+`,
    `?` and the `n` of `{m,n}` add nothing). Counted in one pass, without recursion."""
    frames = [[0, 0]]  # per open group: units so far, units of the last atom or group
    for m in _PATTERN_PARTS.finditer(pattern):
        part = m.group()
        top = frames[-1]
        if m.group(1) is not None:  # a counted repeat of the last atom or group
            times = _times(m.group(1))
            top[0] = min(_CAP, top[0] + top[1] * (times - 1))
            top[1] = min(_CAP, top[1] * times)
        elif part in ("|", "*", "+", "?"):
            top[1] = 0 if part == "|" else top[1]
        elif part.startswith("(") and not part.startswith("(?#"):
            frames.append([0, 0])
        elif part == ")" and len(frames) > 1:
            units = frames.pop()[0]
            frames[-1][0] = min(_CAP, frames[-1][0] + units)
            frames[-1][1] = units
        else:
            top[0] += 1
            top[1] = 1
    while len(frames) > 1:  # a group never closed (regex refuses it when it compiles)
        units = frames.pop()[0]
        frames[-1][0] = min(_CAP, frames[-1][0] + units)
    return frames[0][0]


# a Lark grammar's parts: a comment, a string, a regex literal, `%json` (its schema read
# apart), another directive, an alias, a repeat `~ m` or `~ m..n`, a rule or terminal's
# definition (`name:`, `name.2:`), a name, a special token `<...>`, a bracket, `|`
_GRAMMAR_ITEMS = re.compile(
    r'(?P<skip>//[^\n]*|->\s*[?!]?\w+)|(?P<str>"(?:\\.|[^"\\\n])*"i?)'
    r"|(?P<re>/(?:\\.|[^/\\\n])+/[imslux]*)|(?P<json>%json\b)|(?P<dir>%\w+)"
    r"|~\s*(?P<rep>\d+)(?:\s*\.\.\s*\d+)?"
    r"|(?P<def>[?!]?[A-Za-z_]\w*)(?:\.-?\d+)?\s*:(?!:)|(?P<name>[?!]?[A-Za-z_]\w*)"
    r"|(?P<tok><[^<>\n]*>)|(?P<open>[(\[])|(?P<close>[)\]])|(?P<bar>\|)")


def _grammar_parts(text: str) -> tuple[int, list[str], list[Any]]:
    """A Lark grammar's size once its repeats are expanded (`grammar_units`), its regex
    literals' bodies and its `%json` schemas."""
    rules: dict[str, list[tuple[str, Any]]] = {}
    literals: list[str] = []
    schemas: list[Any] = []
    body: list[tuple[str, Any]] = rules.setdefault("", [])
    pos = 0
    decoder = json.JSONDecoder()
    while (m := _GRAMMAR_ITEMS.search(text, pos)) is not None:
        pos = m.end()
        kind = m.lastgroup
        if kind == "json":
            start = len(text) - len(text[pos:].lstrip())
            try:
                schema, pos = decoder.raw_decode(text, start)
                schemas.append(schema)
            except ValueError:
                pass
            body.append(("atom", 1))
        elif kind == "dir":
            body = rules.setdefault("%", [])  # %ignore, %import: no rule's body
        elif kind == "def":
            body = rules.setdefault(m.group("def").lstrip("?!"), [])
            body.clear()
        elif kind == "re":
            literals.append(m.group("re")[1:m.group("re").rindex("/")])
            body.append(("atom", 1))
        elif kind in ("str", "tok"):
            body.append(("atom", 1))
        elif kind == "name":
            body.append(("name", m.group("name").lstrip("?!")))
        elif kind == "rep":
            body.append(("rep", _times(m.group("rep"))))
        elif kind in ("open", "close", "bar"):
            body.append((kind, None))
    return _expanded(rules), literals, schemas


def _expanded(rules: dict[str, list[tuple[str, Any]]]) -> int:
    """Items of the `start` rule (or of all, without one) with every repeat expanded and
    every rule it names counted as that rule's items (a rule named while being counted, a
    recursion, counts as one); depth-first with a stack of its own, not Python's."""
    done: dict[str, int] = {}
    busy: set[str] = set()
    roots = ["start"] if "start" in rules else [r for r in rules if r not in ("", "%")]
    for root in roots:
        stack = [root]
        while stack:
            rule = stack[-1]
            if rule in done:
                stack.pop()
                continue
            busy.add(rule)
            waiting = [x for k, x in rules[rule] if k == "name" and x in rules
                       and x not in done and x not in busy]
            if waiting:
                stack.extend(dict.fromkeys(waiting))
                continue
            frames = [[0, 0]]  # as in pattern_units: per group, items so far and the last
            for kind, x in rules[rule]:
                top = frames[-1]
                if kind in ("atom", "name"):
                    w = x if kind == "atom" else done.get(x, 1)
                    top[0] = min(_CAP, top[0] + w)
                    top[1] = w
                elif kind == "rep":
                    top[0] = min(_CAP, top[0] + top[1] * (x - 1))
                    top[1] = min(_CAP, top[1] * x)
                elif kind == "bar":
                    top[1] = 0
                elif kind == "open":
                    frames.append([0, 0])
                elif kind == "close" and len(frames) > 1:
                    units = frames.pop()[0]
                    frames[-1][0] = min(_CAP, frames[-1][0] + units)
                    frames[-1][1] = units
            while len(frames) > 1:
                units = frames.pop()[0]
                frames[-1][0] = min(_CAP, frames[-1][0] + units)
            done[rule] = frames[0][0]
            busy.discard(rule)
            stack.pop()
    return min(_CAP, sum(done[r] for r in roots))


def _within_bounds(what: str, problem: str | None) -> None:
    if problem:
        raise WorkbenchError(f"the {what} constraint is refused: {problem}")


class Constraint(BaseModel):
    """What the output must match. `value`: the JSON schema (as JSON text), the regex, the
    choices (a JSON list) or the Lark grammar; empty for `json_object`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: ConstraintKind
    value: str = ""

    @classmethod
    def json_schema(cls, schema: dict[str, Any]) -> Constraint:
        _within_bounds("json_schema", bounded_schema(schema))
        return cls(kind="json_schema", value=json.dumps(schema, sort_keys=True))

    @classmethod
    def json_object(cls) -> Constraint:
        return cls(kind="json_object")

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        _within_bounds("regex", bounded_pattern(pattern, False))
        return cls(kind="regex", value=pattern)

    @classmethod
    def choice(cls, options: Sequence[str]) -> Constraint:
        if not options:
            raise WorkbenchError("a choice constraint needs at least one option")
        if len(options) > MAX_SCHEMA_ALTERNATIVES or sum(map(len, options)) > MAX_SCHEMA_CHARS:
            _within_bounds("choice", f"{len(options)} choices of {sum(map(len, options))} "
                           f"characters, over the limits of {MAX_SCHEMA_ALTERNATIVES} and "
                           f"{MAX_SCHEMA_CHARS}")
        return cls(kind="choice", value=json.dumps(list(options)))

    @classmethod
    def lark(cls, grammar: str) -> Constraint:
        if len(grammar) > MAX_SCHEMA_CHARS:
            _within_bounds("lark", f"the grammar is {len(grammar)} characters, over the size "
                           f"limit of {MAX_SCHEMA_CHARS}")
        _within_bounds("lark", bounded_pattern(grammar, True))
        return cls(kind="lark", value=grammar)

    def grammar(self) -> str:
        """The llguidance grammar (its JSON form) of this constraint."""
        ll = _llguidance()
        if self.kind == "regex":
            return ll.LLMatcher.grammar_from_regex(self.value)
        if self.kind == "json_schema":
            return ll.LLMatcher.grammar_from_json_schema(self.value, defaults=JSON_STYLE)
        if self.kind == "json_object":
            return ll.LLMatcher.grammar_from_json_schema({"type": "object"},
                                                         defaults=JSON_STYLE)
        if self.kind == "choice":
            options = json.loads(self.value)
            return ll.LLMatcher.grammar_from_lark(
                "start: " + " | ".join(_lark_string(o) for o in options) + "\n")
        return ll.LLMatcher.grammar_from_lark(self.value)

    def lark_text(self) -> str:
        """This constraint as Lark text in llguidance's dialect (`%json` for a schema): the
        form engines that take a grammar as text (llama.cpp) are given."""
        if self.kind == "lark":
            return self.value
        if self.kind == "choice":
            return "start: " + " | ".join(_lark_string(o) for o in json.loads(self.value)) + "\n"
        if self.kind == "regex":
            return f"start: /{_lark_regex_body(self.value)}/\n"
        schema = {"type": "object"} if self.kind == "json_object" else json.loads(self.value)
        return f"start: %json {json.dumps({'x-guidance': JSON_STYLE, **schema})}\n"

    def llama_grammar(self) -> str:
        """llama.cpp's `grammar` field for this constraint: Lark text behind the directive
        that sends it to llguidance instead of llama.cpp's own GBNF engine."""
        return "%llguidance {}\n" + self.lark_text()


def _lark_regex_body(pattern: str) -> str:
    """`pattern` as the body of a Lark regex literal: its slashes and line breaks escaped,
    escapes it already has kept as they are."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(pattern[i:i + 2])
            i += 2
            continue
        out.append({"/": "\\/", "\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c, c))
        i += 1
    return "".join(out)


def _lark_string(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _schema(tool: Any) -> dict[str, Any]:
    params = tool.function.parameters if hasattr(tool, "function") else tool.get(
        "function", {}).get("parameters")
    return params or {"type": "object"}


def tool_call_constraint(family: str, template: str | None, tools: Sequence[Any],
                         name: str | None) -> Constraint:
    """The rest of a forced tool call after `forced_prefix` (workbench.models.tools): the
    named tool's arguments under its schema, or (`name` None, tool_choice "required") any
    offered tool's name and arguments; then the family's closing syntax."""
    by_name = {t.name if hasattr(t, "name") else t["function"]["name"]: _schema(t)
               for t in tools}
    for tool, schema in by_name.items():  # a hostile schema: one line, before any JSON text
        _within_bounds(f"tool {tool!r} parameters", bounded_schema(schema))
    if name is not None and name not in by_name:
        raise WorkbenchError(f"tool_choice names {name!r}, which is not among the tools")
    mistral_args = family == "mistral" and "[ARGS]" in (template or "")
    rules, alts = [], []
    for i, (tool, schema) in enumerate(by_name.items()):
        if name is not None and tool != name:
            continue
        rules.append(f"args{i}: %json {json.dumps({'x-guidance': JSON_STYLE, **schema})}")
        q = _lark_string
        if name is not None:  # the prefix already holds the name
            head = ""
        elif family == "llama3_json":  # prefix '{"name": "'
            head = q(f'{tool}", "parameters": ')
        elif mistral_args:  # prefix '[TOOL_CALLS]'
            head = q(f"{tool}[ARGS]")
        else:  # hermes '<tool_call>\n', mistral '[TOOL_CALLS]['
            head = q(f'{{"name": "{tool}", "arguments": ')
        alts.append(f"{head} args{i}".strip())
    if family == "llama3_json":
        tail = q("}")
    elif family == "mistral":
        tail = "" if mistral_args else q("}]")
    else:
        tail = q("}\n</tool_call>")
    start = "start: (" + " | ".join(alts) + ")" + (f" {tail}" if tail else "")
    return Constraint(kind="lark", value="\n".join([start, *rules]) + "\n")  # schemas checked


class CallSplitter:
    """Turns the streamed text of a forced tool call (what follows `forced_prefix`, made
    under `tool_call_constraint`) into OpenAI's stream events: ("name", tool) once known,
    ("arguments", piece) as the arguments are written, ("finish", "tool_calls" | "length").
    The grammar fixes the text's shape, so the name is read from a fixed head and the
    family's closing syntax is held back until the end."""

    HEADS: ClassVar[dict[str, str]] = {
        "hermes": r'\{"name": "([^"]+)", "arguments": ',
        "llama3_json": r'([^"]+)", "parameters": ',
        "mistral": r'\{"name": "([^"]+)", "arguments": ',
        "mistral_args": r"([A-Za-z0-9_.\-]+)\[ARGS\]"}
    TAILS: ClassVar[dict[str, tuple[str, str]]] = {
        "hermes": ("}\n</tool_call>", "}"), "llama3_json": ("}", "}"),
        "mistral": ("}]", "}]"), "mistral_args": ("", "")}

    def __init__(self, family: str, template: str | None, name: str | None):
        import re

        key = "mistral_args" if family == "mistral" and "[ARGS]" in (template or "") else \
            family if family in self.HEADS else "hermes"
        self.head = re.compile(self.HEADS[key])
        self.tail, self.bare_tail = self.TAILS[key]  # bare: markers dropped as special tokens
        self.name, self.sent, self.buf = name, False, ""

    def feed(self, piece: str) -> list[tuple[str, str]]:
        self.buf += piece
        out: list[tuple[str, str]] = []
        if self.name is None:
            m = self.head.match(self.buf)
            if m is None:
                return out
            self.name, self.buf = m.group(1), self.buf[m.end():]
        if not self.sent:
            out.append(("name", self.name))
            self.sent = True
        keep = len(self.tail)
        if len(self.buf) > keep:
            cut = len(self.buf) - keep
            out.append(("arguments", self.buf[:cut]))
            self.buf = self.buf[cut:]
        return out

    def finish(self) -> list[tuple[str, str]]:
        if self.name is None:
            return [("finish", "length")]
        out = [] if self.sent else [("name", self.name)]
        text, done = self.buf, False
        for tail in (self.tail, self.bare_tail):
            if tail and text.rstrip().endswith(tail.rstrip()):
                text, done = text.rstrip()[:len(text.rstrip()) - len(tail.rstrip())], True
                break
        if not self.tail:  # nothing closes the call: it ended where the grammar did
            done = True
        if text:
            out.append(("arguments", text))
        return [*out, ("finish", "tool_calls" if done else "length")]


def wire_fields(constraint: Constraint | None) -> dict[str, Any]:
    """The request fields an OpenAI-compatible server takes for `constraint`: OpenAI's
    `response_format` for JSON, vLLM's `guided_regex` / `guided_choice` / `guided_grammar`
    for the rest (`workbench serve` takes both)."""
    if constraint is None:
        return {}
    if constraint.kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if constraint.kind == "json_schema":
        return {"response_format": {"type": "json_schema", "json_schema": {
            "name": "output", "schema": json.loads(constraint.value), "strict": True}}}
    if constraint.kind == "regex":
        return {"guided_regex": constraint.value}
    if constraint.kind == "choice":
        return {"guided_choice": json.loads(constraint.value)}
    return {"guided_grammar": constraint.value}


# --- the logits processor ---------------------------------------------------------------------

def _llguidance():
    try:
        import llguidance
        import llguidance.hf  # the tokenizer bridge
    except ImportError:
        raise WorkbenchError("constrained decoding needs llguidance (pip install "
                             "llguidance; it is in the workbench's dependencies)") from None
    return llguidance


_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TOKENIZERS_LOCK = threading.Lock()


def ll_tokenizer(tokenizer: Any, vocab_size: int, eos_ids: Iterable[int]):
    """llguidance's view of a fast Hugging Face tokenizer (~0.8 s to build: cached per
    tokenizer, vocabulary size and end tokens)."""
    ll = _llguidance()
    key = (vocab_size, tuple(sorted(eos_ids)))
    with _TOKENIZERS_LOCK:
        per = _TOKENIZERS.setdefault(tokenizer, {})
        if key not in per:
            per[key] = ll.hf.from_tokenizer(tokenizer, n_vocab=vocab_size,
                                            eos_token=list(key[1]))
        return per[key]


def check_constraint(constraint: Constraint, tokenizer: Any, vocab_size: int,
                     eos_ids: Iterable[int]) -> None:
    """Raise WorkbenchError (naming the problem) when the grammar cannot be built."""
    ll = _llguidance()
    try:
        grammar = constraint.grammar()
    except (ValueError, TypeError) as e:
        raise WorkbenchError(f"the {constraint.kind} constraint is invalid: {e}") from None
    problem = ll.LLMatcher.validate_grammar(grammar, ll_tokenizer(tokenizer, vocab_size,
                                                                  eos_ids))
    if problem and not problem.startswith("WARNING"):
        raise WorkbenchError(f"the {constraint.kind} constraint is invalid: {problem}")


class GrammarProcessor:
    """A transformers LogitsProcessor: one llguidance matcher per row; each step it feeds the
    row's last token to its matcher and masks every token the grammar does not allow.
    `seconds` adds up the time spent computing and applying masks (for the cost figure)."""

    def __init__(self, constraint: Constraint, tokenizer: Any, vocab_size: int,
                 eos_ids: Iterable[int], batch: int):
        ll = _llguidance()
        import torch

        self.eos = sorted(eos_ids)
        self.tok = ll_tokenizer(tokenizer, vocab_size, self.eos)
        grammar = constraint.grammar()
        self.matchers = [ll.LLMatcher(self.tok, grammar, log_level=0) for _ in range(batch)]
        if self.matchers and self.matchers[0].is_error():
            raise WorkbenchError(f"the {constraint.kind} constraint is invalid: "
                                 f"{self.matchers[0].get_error()}")
        self.vocab = vocab_size
        self.bitmask = torch.zeros((batch, (vocab_size + 31) // 32), dtype=torch.int32)
        self.shifts = torch.arange(32, dtype=torch.int32)
        self.start: int | None = None
        self.seconds = 0.0
        self.steps = 0

    def __call__(self, input_ids, scores):
        import time

        import torch
        from llguidance.torch import fill_next_token_bitmask

        t0 = time.perf_counter()
        if self.start is None:
            self.start = input_ids.shape[1]
        elif input_ids.shape[1] > self.start:
            last = input_ids[:, -1].tolist()
            for m, t in zip(self.matchers, last, strict=True):
                if not m.is_stopped() and not m.is_error():
                    m.consume_token(t)
        for i, m in enumerate(self.matchers):
            if m.is_error():  # cannot happen through the mask; end the row cleanly
                self.bitmask[i].zero_()
                for e in self.eos:
                    self.bitmask[i, e // 32] |= 1 << (e % 32)
            else:
                fill_next_token_bitmask(m, self.bitmask, i)
        allowed = ((self.bitmask.unsqueeze(-1) >> self.shifts) & 1).view(
            self.bitmask.shape[0], -1)[:, :scores.shape[1]].bool()
        if allowed.shape[1] < scores.shape[1]:  # logits wider than the tokenizer
            pad = torch.zeros((allowed.shape[0], scores.shape[1] - allowed.shape[1]),
                              dtype=torch.bool)
            allowed = torch.cat([allowed, pad], dim=1)
        scores = scores.masked_fill(~allowed.to(scores.device), float("-inf"))
        self.seconds += time.perf_counter() - t0
        self.steps += 1
        return scores
