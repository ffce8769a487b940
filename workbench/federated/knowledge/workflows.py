"""A workflow: the transferable part of a verified plan, the vocabulary both a site's search
and its prompted agent speak. `abstract_step` keeps of a grammar move what transfers (the
operation, the aggregate, the grouping kind, the ranking direction, the shape of a literal
condition) and drops what identifies (tables, columns, values); `step_text` says a step in
the words the plans' descriptions use; `Outcome` is what working one task gave, whichever
agent worked it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from workbench.datatasks.grammar import OP_TEXT, Move


def abstract_step(m: Move) -> str | None:
    """The transferable part of a move, or None for what names the schema or the data."""
    k = m.key
    if m.slot == "op":
        return f"op={k}"
    if m.slot == "measure":
        return f"measure={k.split(':')[0]}"
    if m.slot == "group":
        return f"group={k.split(':')[0]}"
    if m.slot == "direction":
        return f"direction={k}"
    if m.slot == "lit":
        tokens = k.split(":")
        kind, i, hops = tokens[0], 1, 0
        while i + 1 < len(tokens) and tokens[i] == "via":
            hops, i = hops + 1, i + 2
        if kind in ("conds", "extra") and i < len(tokens):
            return f"lit={kind}:{tokens[i]}" + (f":via{hops}" if hops else "")
        return f"lit={kind}"
    return None  # table, column, target, values, k, submit: schema- or data-specific


def workflow_of(moves: Sequence[Move]) -> tuple[str, ...]:
    return tuple(s for s in (abstract_step(m) for m in moves) if s)


def workflow_text(family: str, steps: Sequence[str]) -> str:
    return f"{family}: " + " -> ".join(steps)


_MEASURE = {"count": "the number of rows", "sum": "the total of a column",
            "avg": "the average of a column", "min": "the minimum of a column",
            "max": "the maximum of a column"}
_GROUP = {"column": "grouped by a column", "via": "grouped by a column of a linked table",
          "year": "grouped by year", "month": "grouped by month"}
_COND = {"eq": "is <value>", "gt": "is greater than <value>", "lt": "is less than <value>",
         "year": "is in <year>"}


# words that are also common column names ("Total") would make a site's privacy filter drop
# an insight that carries them: on the wire the ops say "sum"
_WIRE_OP = {"agg": "the sum, average, minimum or maximum of a column",
            "group": "list the groups, each with its count or sum"}


def step_text(step: str, *, wire: bool = False) -> str:
    """A workflow step in the words the plans' descriptions use (so a model can match them);
    `wire`: the words of a text that leaves the site (an insight)."""
    slot, _, rest = step.partition("=")
    if slot == "op":
        return (_WIRE_OP.get(rest) if wire else None) or OP_TEXT.get(rest, rest)
    if slot == "measure":
        return _MEASURE.get(rest, rest)
    if slot == "group":
        return _GROUP.get(rest, rest)
    if slot == "direction":
        return "highest first" if rest == "desc" else "lowest first"
    if slot == "lit":
        parts = rest.split(":")
        if parts[0] == "skip":
            return "a stated value that is not a filter"
        kind = parts[1] if len(parts) > 1 else ""
        cmp = _COND.get(kind, "matches <value>")
        text = f"a filter: whose <column> {cmp}"
        if len(parts) > 2 and parts[2].startswith("via"):
            text = f"a filter on a linked table: linked to a <table> row whose <column> {cmp}"
        elif kind == "ref":
            text = "a filter on a child table: referenced by a <table> row that matches <value>"
        if parts[0] == "extra":
            text += " (in the numerator)"
        return text
    return step


@dataclass
class Outcome:
    task_id: str
    family: str
    verified: bool
    iterations: int
    executions: int
    workflow: tuple[str, ...] = ()
    guided: bool = False  # a workflow of its family was in the view
    tried: tuple[str, ...] = ()  # the workflow of the plan it answered with, right or wrong
    texts: list[str] = field(default_factory=list)  # question, program, SQL run (private)
