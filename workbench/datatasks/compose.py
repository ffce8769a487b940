"""Recursive composition: operators that build a harder query from two verified tasks that
share a table (a filter inside an aggregate, an aggregate inside a filter, an argmax, a
share)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workbench.datatasks.queries import Cond, Query

_FILTER_TEMPLATES = ("filter.count_eq", "filter.count_range", "time_series.in_year",
                     "join.count_via")
_SCOPED_OPS = ("count", "agg", "count_distinct", "top", "group", "compare", "difference",
               "above_avg", "argmax", "share")


def _cond_columns(conds: list[Cond]) -> set[str]:
    return {c.column for c in conds}


def canonical_conds(conds: list[Cond]) -> list[Cond]:
    return sorted(conds, key=lambda c: c.model_dump_json())


@dataclass
class Verified:
    """What composition needs from a verified task."""

    id: str
    template_id: str
    query: Query
    difficulty: int
    depth: int = 0
    lineage: tuple[str, ...] = ()


def _filter_cond(t: Verified) -> Cond | None:
    q = t.query
    if t.template_id in _FILTER_TEMPLATES and q.op == "count" and len(q.conds) == 1:
        return q.conds[0]
    return None


def compose_filter_in_aggregate(a: Verified, b: Verified) -> Query | None:
    """A filter task's condition added to another task's scope (same table)."""
    cond = _filter_cond(a)
    q = b.query
    if cond is None or q.table != a.query.table or q.op not in _SCOPED_OPS or b.id == a.id:
        return None
    if len(q.conds) >= 3 or cond.column in _cond_columns(q.conds) | _cond_columns(q.extra):
        return None
    if q.group is not None and q.group.column == cond.column:
        return None
    if q.op in ("agg", "argmax", "above_avg") and cond.column == q.column and cond.op == "eq":
        return None
    return q.model_copy(update={"conds": canonical_conds([*q.conds, cond])})


def compose_above_average(a: Verified, b: Verified) -> Query | None:
    """An average (task a) used inside a filter on the same column (task b)."""
    qa, qb = a.query, b.query
    if qa.op != "agg" or qa.agg != "avg" or b.template_id != "filter.count_range":
        return None
    if qb.table != qa.table or qb.conds[0].column != qa.column:
        return None
    return Query(op="above_avg", table=qa.table, column=qa.column, conds=qa.conds)


def compose_argmax(a: Verified, b: Verified) -> Query | None:
    """A maximum/minimum (task a) turned into "which row has it" with a lookup's key (b)."""
    qa, qb = a.query, b.query
    if qa.op != "agg" or qa.agg not in ("max", "min") or qb.op != "lookup":
        return None
    if qb.table != qa.table or not b.template_id.startswith("lookup.") or len(qb.conds) != 1:
        return None
    return Query(op="argmax", table=qa.table, column=qa.column, conds=qa.conds,
                 target=qb.conds[0].column, descending=qa.agg == "max")


def compose_share(a: Verified, b: Verified) -> Query | None:
    """The share of another task's scope (b) that a filter task's condition (a) keeps."""
    cond = _filter_cond(a)
    qb = b.query
    if cond is None or qb.table != a.query.table or qb.op not in ("count", "agg") or \
            b.id == a.id or cond.column in _cond_columns(qb.conds) or len(qb.conds) > 2:
        return None
    return Query(op="share", table=qb.table, conds=qb.conds, extra=[cond])


COMPOSERS: dict[str, Callable[[Verified, Verified], Query | None]] = {
    "composed.filter_in_aggregate": compose_filter_in_aggregate,
    "composed.above_average": compose_above_average,
    "composed.argmax": compose_argmax,
    "composed.share": compose_share,
}
