"""Bounds on caller-supplied schemas, regexes and grammars, checked before anything renders
or compiles them: the server's request validation, an agent's forced tool call and tool
schemas, and `constrain.Constraint` itself go through `bounded_schema` and `bounded_pattern`
(one check for every caller). Each returns None when the text is within the bounds, else one
line naming the bound it breaks."""

from __future__ import annotations

import json
import re
from typing import Any

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
