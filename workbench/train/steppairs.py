"""Step-level preference pairs from expert trajectories (Agentic-DPO's recipe): at every
expert tool call, the state (the conversation so far) is the prompt, the expert's call is
chosen, and a plausible wrong call is rejected. No rollouts are needed.

Where the trajectory file carries its own alternatives (a step's `metadata.alternatives`: the
failed siblings or lower-scored candidates a search or a guided policy saw at that state,
as tool calls), those come first. Otherwise the wrong call is a perturbation of the expert's
that still fits the tool's JSON schema, so the pair teaches the choice, not the syntax:

- `sql_table`:    another table of the same data in a SQL argument (FROM/JOIN target)
- `sql_operator`: a comparison, aggregate or sort direction flipped (= / !=, < / >,
                  COUNT / SUM, MIN / MAX, ASC / DESC)
- `argument`:     a string argument replaced by the value the same argument had at another
                  step of the data
- `enum`:         another value of an argument's `enum`
- `number`:       a numeric argument moved within its bounds
- `boolean`:      a boolean argument negated
- `wrong_tool`:   another offered tool (non-final) with arguments that fit its schema, taken
                  from one of its calls elsewhere in the data

Every rejected call is validated against the tool's schema; one that does not fit is dropped.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import Any

from workbench.records import ChatExample, Message, PreferencePair, ToolCall

KINDS = ("alternative", "sql_table", "sql_operator", "argument", "enum", "number", "boolean",
         "wrong_tool")
_TABLE = re.compile(r"\b(FROM|JOIN)\s+([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)
_SWAPS = [(r"!=", "="), (r"(?<![<>!])=", "!="), (r"<=", ">="), (r">=", "<="),
          (r"(?<![<-])<(?![=>])", ">"), (r"(?<!-)>(?!=)", "<"), (r"\bCOUNT\(", "SUM("),
          (r"\bSUM\(", "COUNT("), (r"\bMIN\(", "MAX("), (r"\bMAX\(", "MIN("),
          (r"\bAVG\(", "SUM("), (r"\bASC\b", "DESC"), (r"\bDESC\b", "ASC")]


def _args(call: ToolCall) -> dict[str, Any] | None:
    try:
        a = json.loads(call.function.arguments or "{}")
    except ValueError:
        return None
    return a if isinstance(a, dict) else None


class _Pool:
    """What the data holds: tables named in SQL, each (tool, argument)'s values, each tool's
    argument objects, and the schemas of the tools offered."""

    def __init__(self, examples: list[ChatExample]):
        self.tables: set[str] = set()
        self.values: dict[tuple[str, str], list[Any]] = defaultdict(list)
        self.calls: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.schemas: dict[str, dict[str, Any]] = {}
        self._validators: dict[str, Any] = {}
        for ex in examples:
            for t in ex.tools or ():
                self.schemas.setdefault(t.name, t.function.parameters)
            for m in ex.messages:
                for c in m.tool_calls or ():
                    a = _args(c)
                    if a is None:
                        continue
                    self.calls[c.function.name].append(a)
                    for k, v in a.items():
                        if v not in self.values[(c.function.name, k)]:
                            self.values[(c.function.name, k)].append(v)
                        if isinstance(v, str):
                            self.tables.update(t for _, t in _TABLE.findall(v))

    def valid(self, name: str, args: dict[str, Any]) -> bool:
        if name not in self.schemas:
            return False
        if name not in self._validators:
            from jsonschema import Draft202012Validator

            self._validators[name] = Draft202012Validator(self.schemas[name])
        return self._validators[name].is_valid(args)


def perturbations(call: ToolCall, pool: _Pool, rng: random.Random,
                  final_tools: AbstractSet[str] = frozenset()) -> list[tuple[str, str, dict]]:
    """(kind, tool name, arguments) of schema-valid wrong calls for `call`, in KINDS order."""
    name, args = call.function.name, _args(call)
    if args is None:
        return []
    schema = (pool.schemas.get(name) or {}).get("properties") or {}
    out: list[tuple[str, str, dict]] = []

    def add(kind: str, tool: str, new: dict) -> None:
        if new != args and pool.valid(tool, new) and \
                all((t, a) != (tool, new) for _, t, a in out):
            out.append((kind, tool, new))

    for k, v in args.items():
        if not isinstance(v, str):
            continue
        tables = [t for _, t in _TABLE.findall(v)]
        others = sorted(pool.tables - set(tables))
        if tables and others:
            old = rng.choice(tables)
            new_t = rng.choice(others)
            add("sql_table", name, {**args, k: re.sub(rf"\b{re.escape(old)}\b", new_t, v,
                                                      count=1)})
        swaps = [(pat, rep) for pat, rep in _SWAPS if re.search(pat, v)]
        if tables and swaps:
            pat, rep = rng.choice(swaps)
            add("sql_operator", name, {**args, k: re.sub(pat, rep, v, count=1)})
    for k, v in args.items():
        spec = schema.get(k) or {}
        if "enum" in spec:
            choices = [e for e in spec["enum"] if e != v]
            if choices:
                add("enum", name, {**args, k: rng.choice(choices)})
        elif isinstance(v, bool):
            add("boolean", name, {**args, k: not v})
        elif isinstance(v, (int, float)):
            lo, hi = spec.get("minimum"), spec.get("maximum")
            cands = [v + d for d in (1, -1, 2, -2)] if isinstance(v, int) else \
                [v * 2, v / 2, v + 1]
            cands = [c for c in cands if (lo is None or c >= lo) and (hi is None or c <= hi)]
            if cands:
                add("number", name, {**args, k: rng.choice(cands)})
        elif isinstance(v, str):
            seen = [x for x in pool.values.get((name, k), []) if x != v and isinstance(x, str)]
            if seen:
                add("argument", name, {**args, k: rng.choice(seen)})
    others = sorted(t for t in pool.calls if t != name and t not in final_tools
                    and t in pool.schemas)
    if others:
        tool = rng.choice(others)
        add("wrong_tool", tool, rng.choice(pool.calls[tool]))
    return out


def step_pairs(examples: Iterable[ChatExample], *, per_step: int = 1, seed: int = 0,
               final_tools: Iterable[str] = ()) -> tuple[list[PreferencePair], dict[str, Any]]:
    """Pairs at every expert tool call of `examples`, and a report: steps seen, pairs per
    kind, steps without a wrong call that fits the schema."""
    examples = list(examples)
    pool = _Pool(examples)
    rng = random.Random(seed)
    finals = set(final_tools)
    pairs: list[PreferencePair] = []
    kinds: Counter = Counter()
    steps = no_pair = 0
    for n, ex in enumerate(examples):
        for i, m in enumerate(ex.messages):
            if m.role != "assistant" or not m.tool_calls or i == 0:
                continue
            steps += 1
            call = m.tool_calls[0]
            wrong: list[tuple[str, str, dict]] = []
            for alt in (ex.metadata or {}).get("alternatives", {}).get(str(i), []):
                try:
                    tc = ToolCall.model_validate(alt)
                except ValueError:
                    continue
                a = _args(tc)
                if a is not None and (tc.function.name, a) != (call.function.name,
                                                                _args(call)):
                    wrong.append(("alternative", tc.function.name, a))
            if len(wrong) < per_step:
                cands = perturbations(call, pool, rng, finals)
                rng.shuffle(cands)
                # one of each kind before a second of any
                cands.sort(key=lambda c: sum(w[0] == c[0] for w in wrong))
                wrong += cands
            made = 0
            for kind, tool, args in wrong[:per_step]:
                bad = Message(role="assistant", content=m.content or "", tool_calls=[
                    ToolCall.make(tool, args, id=call.id)])
                try:
                    pairs.append(PreferencePair(
                        id=f"{ex.id or f'ex{n}'}:m{i}:{kind}", kind=kind,
                        prompt=ex.messages[:i], chosen=[m], rejected=[bad], tools=ex.tools,
                        metadata={"source": "step_pairs", "example": ex.id, "message": i,
                                  "tool": call.function.name}))
                except ValueError:  # e.g. the state ends with an assistant turn
                    continue
                kinds[kind] += 1
                made += 1
            no_pair += made == 0
    report = {"examples": len(examples), "steps": steps, "pairs": len(pairs),
              "by_kind": dict(sorted(kinds.items())), "steps_without_pair": no_pair,
              "tables_seen": sorted(pool.tables)}
    return pairs, report
