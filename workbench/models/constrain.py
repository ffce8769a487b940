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

When llguidance gives up on a reply mid-generation (a parser or lexer limit that the bounds of
`models.bounds` did not foresee: "Current row has 2398 items; max is 2000"), the reply cannot
keep its constraint. The transformers backend sees it in its matcher (`GrammarProcessor`:
the row ends there); llama.cpp's server only logs a warning and goes on *unconstrained*, so
its replies are followed token by token by a matcher of ours (`ReplyCheck`); an OpenAI-
compatible server's replies are checked as text (`check_text`). Either way the reply comes
back as a failed generation (`error_type` "constraint", text dropped) or, streamed,
`ConstraintNotKept` is raised, never as a reply that breaks the constraint: a user of
structured outputs relies on the reply matching or on an error. A reply cut by `max_tokens`
(or a stop string) only has to be a valid beginning.
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict

from workbench.errors import BackendError, WorkbenchError
from workbench.models.bounds import (
    MAX_SCHEMA_ALTERNATIVES,
    MAX_SCHEMA_CHARS,
    bounded_pattern,
    bounded_schema,
)
from workbench.records import StrictModel

# one space after ":" and ",", no free whitespace: small models otherwise fill objects with
# blank lines until max_tokens (a schema's own "x-guidance" options still win)
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

ConstraintKind = Literal["json_schema", "json_object", "regex", "choice", "lark"]
CONSTRAINT_ERROR = "constraint"  # `Generation.error_type` of a reply that could not keep it


class ConstraintNotKept(BackendError):
    """A reply could not keep its constraint (llguidance gave up on it mid-generation, or a
    reply made where the matcher cannot be seen breaks it). The constraint is the caller's,
    so `workbench serve` answers 400 naming the field that asked for it."""


def not_kept(constraint: Constraint, reason: str, token: int | None = None) -> str:
    """One line saying which constraint could not be kept, at which token of the reply, and
    why (llguidance's first line: the parser state it adds after it is dropped)."""
    why = (reason.strip().splitlines() or ["no reason given"])[0][:400]
    at = "" if token is None else f" at token {token} of the reply"
    return (f"the {constraint.kind} constraint could not be kept{at}: {why} (the reply "
            "would break it, so none is returned)")


def _within_bounds(what: str, problem: str | None) -> None:
    if problem:
        raise WorkbenchError(f"the {what} constraint is refused: {problem}")


class Constraint(StrictModel):
    """What the output must match. `value`: the JSON schema (as JSON text), the regex, the
    choices (a JSON list) or the Lark grammar; empty for `json_object`."""

    model_config = ConfigDict(frozen=True)

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
        self.constraint = constraint
        self.gave_up: list[tuple[str, int] | None] = [None] * batch  # (reason, tokens)
        # a row ends at its end-of-sequence token, or is padded once a stop string or the
        # cancel event ends it: its matcher is not fed after that, nor is its give-up counted
        self.ends = {*self.eos, *([tokenizer.pad_token_id] if getattr(
            tokenizer, "pad_token_id", None) is not None else [])}
        self.done = [False] * batch

    def __call__(self, input_ids, scores):
        import time

        import torch
        from llguidance.torch import fill_next_token_bitmask

        t0 = time.perf_counter()
        if self.start is None:
            self.start = input_ids.shape[1]
        elif input_ids.shape[1] > self.start:
            last = input_ids[:, -1].tolist()
            for i, (m, t) in enumerate(zip(self.matchers, last, strict=True)):
                self.done[i] = self.done[i] or t in self.ends
                if not self.done[i] and not m.is_stopped() and not m.is_error():
                    m.consume_token(t)
        for i, m in enumerate(self.matchers):
            if not m.is_error() and not self.done[i]:
                fill_next_token_bitmask(m, self.bitmask, i)
            if self.done[i] or m.is_error():  # only the end token is left: the row is over,
                # or llguidance gave up on it (a parser or lexer limit, on consuming a token
                # the mask allowed or computing the next mask): then it ends here and is
                # reported as failed (`failure`), never as a reply
                if not self.done[i] and self.gave_up[i] is None:
                    self.gave_up[i] = (m.get_error(), input_ids.shape[1] - self.start)
                self.bitmask[i].zero_()
                for e in self.eos:
                    self.bitmask[i, e // 32] |= 1 << (e % 32)
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

    def failure(self, row: int) -> str | None:
        """Why row `row` could not keep the constraint, or None when it did."""
        if (gave_up := self.gave_up[row]) is None:
            return None
        return not_kept(self.constraint, gave_up[0], gave_up[1])


class ReplyCheck:
    """Follows a reply's tokens with a matcher of its constraint, where the matcher that
    masked them cannot be seen: llama.cpp's server, whose llguidance sampler, when it gives up
    on a reply, logs a warning and samples the rest *unconstrained* (a tiny model's reply to
    a schema llguidance gave up on at its first key ran on to max_tokens as `{"{"{"…`).
    `feed` the tokens as they come, then `finish`. `ends`: the tokens that end a reply
    (llama.cpp ends the bundled model's on `<|endoftext|>` as well as its `<|im_end|>`):
    they are not text, and the reply must be complete where one comes."""

    def __init__(self, constraint: Constraint, tokenizer: Any, vocab_size: int,
                 eos_ids: Iterable[int], ends: Iterable[int] = ()):
        ll = _llguidance()
        self.constraint = constraint
        self.matcher = ll.LLMatcher(ll_tokenizer(tokenizer, vocab_size, eos_ids),
                                    constraint.grammar(), log_level=0)
        self.ends = {*eos_ids, *ends}
        self.ended = False  # an end token came
        self.fed = self.tokens = 0  # tokens fed; those of them that are text
        self.problem: str | None = None if not self.matcher.is_error() else \
            not_kept(constraint, self.matcher.get_error())

    def feed(self, tokens: Iterable[int]) -> str | None:
        """The problem once a token breaks the constraint (or llguidance gives up on it)."""
        for t in tokens:
            if self.problem is not None:
                break
            self.fed += 1
            if t in self.ends:
                self.ended = True
                continue
            self.tokens += 1
            if self.ended:
                self.problem = not_kept(self.constraint, "the reply goes on after its end",
                                        self.tokens)
            elif not self.matcher.consume_token(t):  # llguidance's reason: a parser limit,
                # or (where the engine gave up before it) a token it would not have allowed
                self.problem = not_kept(self.constraint, self.matcher.get_error() or
                                        "a token the constraint does not allow", self.tokens)
        return self.problem

    @classmethod
    def of(cls, constraint: Constraint | None, tokenizer: Any, eos_ids: Iterable[int],
           ends: Iterable[int] = ()) -> ReplyCheck | None:
        """A check of `constraint` (None when there is none) for a Hugging Face tokenizer."""
        return None if constraint is None else cls(constraint, tokenizer, len(tokenizer),
                                                   eos_ids, ends)

    def take(self, tokens: Iterable[int], ended: bool) -> str | None:
        """`feed`, then `finish` (`ended`: the reply ended by itself)."""
        return self.feed(tokens) or self.finish(ended)

    def finish(self, complete: bool) -> str | None:
        """The problem, if any; with `complete` (the reply ended by itself: not cut by
        max_tokens or a stop string), a reply the constraint would take further is one."""
        complete = complete or self.ended
        if self.problem is None and complete and not (self.matcher.is_accepting()
                                                      or self.matcher.is_stopped()):
            self.problem = not_kept(self.constraint, f"the reply ended after {self.tokens} "
                                    f"token{'s' * (self.tokens != 1)}, before the constraint "
                                    "was complete")
        return self.problem


def check_text(constraint: Constraint, text: str) -> str | None:
    """Why a finished reply's text breaks `constraint`, or None: the check where neither the
    matcher nor the tokens can be seen (an OpenAI-compatible server). JSON is parsed and
    validated against the schema (as the server may space it: no grammar of ours), choices
    looked up, a regex fully matched by the `regex` module under a timeout; a pattern it
    cannot take, a match out of time, and Lark grammars are not judged here."""
    kind = constraint.kind
    if kind == "choice":
        return None if text in json.loads(constraint.value) else \
            not_kept(constraint, f"the reply {_shown(text)} is not one of the choices")
    if kind == "regex":
        import regex

        try:
            ok = regex.fullmatch(constraint.value, text, timeout=PATTERN_TIMEOUT_S)
        except (regex.error, TimeoutError, ValueError, OverflowError, RecursionError):
            return None
        return None if ok else not_kept(constraint, f"the reply {_shown(text)} does not "
                                        "match the regex")
    if kind not in ("json_object", "json_schema"):
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        return not_kept(constraint, f"the reply {_shown(text)} is not JSON ({e})")
    if kind == "json_object":
        return None if isinstance(value, dict) else \
            not_kept(constraint, f"the reply {_shown(text)} is not a JSON object")
    return _schema_problem(constraint, value)


PATTERN_TIMEOUT_S = 0.5  # one schema `pattern` or regex match in `check_text`


def _schema_problem(constraint: Constraint, value: Any) -> str | None:
    from jsonschema import Draft202012Validator, validators
    from jsonschema.exceptions import ValidationError

    def pattern(validator, patrn, instance, schema):  # `regex`, under a timeout: the
        import regex  # caller's pattern, never Python's backtracking `re` without bound

        if not validator.is_type(instance, "string"):
            return
        try:
            found = regex.search(patrn, instance, timeout=PATTERN_TIMEOUT_S)
        except (regex.error, TimeoutError, ValueError, OverflowError, RecursionError):
            return
        if found is None:
            yield ValidationError(f"{instance!r} does not match {patrn!r}")

    # (`patternProperties` stays jsonschema's, with `re`: a caller's own schema, in process)
    checker = validators.extend(Draft202012Validator, {"pattern": pattern})
    try:
        error = next(checker(json.loads(constraint.value)).iter_errors(value), None)
    except Exception:  # noqa: BLE001 - a schema jsonschema cannot read or resolve: the
        return None  # server judged it, not us
    if error is None:
        return None
    where = "".join(f"[{p!r}]" for p in error.absolute_path) or "the reply"
    return not_kept(constraint, f"{where}: {error.message[:200]}")


def _shown(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")
