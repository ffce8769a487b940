"""Facts about a query: how its answer is shaped and compared (`answer_spec`), the tables,
columns and entities it uses, and how difficult it is."""

from __future__ import annotations

from workbench.dataenv.profile import EnvProfile
from workbench.datatasks.answers import AnswerSpec
from workbench.datatasks.queries import Cond, Query, need
from workbench.datatasks.questions import fmt_value, group_name


def _kind(profile: EnvProfile, table: str, column: str | None) -> str:
    if column is None:
        return "integer"
    try:
        return profile.table(table).column(column).kind
    except KeyError:
        return "text"


def answer_spec(q: Query, profile: EnvProfile) -> AnswerSpec:
    real = _kind(profile, q.table, q.column) == "real" or q.agg == "avg"
    if q.op in ("count", "count_distinct", "above_avg", "compare", "argmax"):
        return AnswerSpec(kind="scalar")
    if q.op == "agg":
        return AnswerSpec(kind="scalar", comparison="tolerance" if real else "exact")
    if q.op == "lookup":
        return AnswerSpec(kind="scalar", comparison="tolerance"
                          if _kind(profile, q.table, q.column) == "real" else "exact")
    if q.op == "select":
        return AnswerSpec(kind="set", comparison="set")
    if q.op == "top":
        return AnswerSpec(kind="scalar") if q.k == 1 else AnswerSpec(kind="set",
                                                                     comparison="set")
    if q.op == "group":
        g = group_name(q.group).removesuffix(" value")
        m = "count" if q.agg == "count" else f"{q.agg}_{q.column}"
        return AnswerSpec(kind="table", columns=[g, m],
                          comparison="tolerance" if real and q.agg != "count" else "exact")
    if q.op == "difference":
        return AnswerSpec(kind="scalar", comparison="tolerance"
                          if real and q.agg != "count" else "exact")
    if q.op == "share":
        return AnswerSpec(kind="scalar", comparison="tolerance")
    raise ValueError(q.op)


def _walk(conds: list[Cond], table: str):
    for c in conds:
        yield table, c
        if c.op in ("via", "ref"):
            yield from _walk(c.inner, need(c.table, "table"))


def tables_used(q: Query) -> list[str]:
    out = {q.table}
    for _, c in _walk([*q.conds, *q.extra], q.table):
        if c.table:
            out.add(c.table)
    if q.group is not None and q.group.table:
        out.add(q.group.table)
    return sorted(out)


def columns_used(q: Query) -> list[str]:
    """`Table.Column` names the query reads (the join keys included)."""
    out = set()
    for col in (q.column, q.target):
        if col:
            out.add(f"{q.table}.{col}")
    for t, c in _walk([*q.conds, *q.extra], q.table):
        out.add(f"{t}.{c.column}")
        if c.table and c.other:
            out.add(f"{c.table}.{c.other}")
    if q.group is not None:
        out.add(f"{q.table}.{q.group.column}")
        if q.group.table:
            out.add(f"{q.group.table}.{q.group.key}")
            out.add(f"{q.group.table}.{q.group.label}")
    return sorted(out)


def entities(q: Query) -> list[str]:
    """What a paraphrase must keep: every value and number the question states, and the table
    and column names it mentions (compared loosely: case, spaces and underscores ignored)."""
    out: list[str] = []

    def add(x) -> None:
        s = fmt_value(x).strip("'") if not isinstance(x, str) else x
        if s not in out:
            out.append(s)

    add(q.table)
    for col in (q.column, q.target):
        if col:
            add(col)
    for _, c in _walk([*q.conds, *q.extra], q.table):
        add(c.column) if c.op not in ("via", "ref") else add(c.table)
        if c.op in ("eq", "gt", "lt", "year"):
            add(int(c.value) if c.op == "year" else c.value)
    if q.group is not None:
        add(q.group.column if q.group.kind != "via" else q.group.label)
        if q.group.kind == "via":
            add(q.group.table)
    for v in q.values:
        add(v)
    if q.k and q.k > 1:
        add(q.k)
    return out


def cond_depth(conds: list[Cond]) -> int:
    """Joins a condition list goes through (nested via/ref count each hop)."""
    return max((1 + cond_depth(c.inner) if c.op in ("via", "ref") else 0 for c in conds),
               default=0)


def difficulty(q: Query) -> int:
    """1 (one lookup) .. 5 (nested, several conditions, joins)."""
    base = {"lookup": 1, "count": 1, "agg": 1, "count_distinct": 1, "select": 2, "top": 2,
            "group": 2, "compare": 2, "difference": 3, "argmax": 2, "above_avg": 3,
            "share": 3}[q.op]
    d = base + max(0, len(q.conds) + len(q.extra) - 1) + cond_depth([*q.conds, *q.extra])
    if q.group is not None and q.group.kind == "via":
        d += 1
    if q.op in ("top", "group") and q.k and q.k > 1:
        d += 1
    return max(1, min(5, d))
