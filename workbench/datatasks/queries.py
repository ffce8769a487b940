"""A small query language for synthesised tasks, and its renderings.

A `Query` says what a task asks (count, aggregate, look up, list, rank groups, compare, ...)
over a scope (a table and conditions on it, possibly through joins). From one query come:

- `sql_a(q)`: the reference SQL (direct shape: JOINs, GROUP BY ... ORDER BY ... LIMIT), here;
- `altsql.sql_b(q)`: an independently shaped second SQL (IN-subqueries instead of joins, CASE
  sums, rank-by-counting instead of LIMIT, correlated subqueries, substr instead of strftime);
- `pandascode.pandas_code(q)`: a pandas program for the Python sandbox (`tables` holds the
  DataFrames);
- `questions.question(q)`: the template text of the question;
- `queryfacts.answer_spec(q, profile)`: how the answer is shaped and compared;
- `queryfacts.entities(q)`: the values, numbers and names a paraphrase must keep.

Compositions (a filter inside an aggregate, an aggregate inside a filter, ...) are new queries
built from the parents' queries, so every task, composed or not, renders the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeVar

from pydantic import ConfigDict, Field

from workbench.dataenv.sqlsandbox import quote_ident
from workbench.records import StrictModel

Scalar = str | int | float | None
Op = Literal["count", "agg", "count_distinct", "lookup", "select", "top", "group", "compare",
             "difference", "argmax", "above_avg", "share"]
Agg = Literal["count", "sum", "avg", "min", "max"]

AGG_WORD = {"sum": "total", "avg": "average", "min": "minimum", "max": "maximum",
            "count": "number of"}


class Cond(StrictModel):
    """A condition on a scope's table.

    `eq`/`gt`/`lt`: `column` compared with `value`; `year`: the year of the date `column` is
    `value`; `via`: the row's foreign key `column` points at a `table` row (key `other`)
    meeting `inner`; `ref`: some `table` row whose foreign key `other` points at this row's
    key `column` meets `inner`.
    """

    model_config = ConfigDict(frozen=True)

    op: Literal["eq", "gt", "lt", "year", "via", "ref"]
    column: str
    value: Scalar = None
    table: str | None = None
    other: str | None = None
    inner: list[Cond] = Field(default_factory=list)


class Group(StrictModel):
    """What rows are grouped by: a column, the label of a joined parent, a year or a month."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["column", "via", "year", "month"]
    column: str
    table: str | None = None  # via: the parent table
    key: str | None = None  # via: the parent's key column
    label: str | None = None  # via: the parent's label column


class Query(StrictModel):
    model_config = ConfigDict(frozen=True)

    op: Op
    table: str
    conds: list[Cond] = Field(default_factory=list)
    column: str | None = Field(None, description="Measure, or the column looked up/listed.")
    agg: Agg = "count"
    group: Group | None = None
    k: int | None = None
    values: list[Scalar] = Field(default_factory=list, description="compare/difference.")
    target: str | None = Field(None, description="argmax: the label column returned.")
    extra: list[Cond] = Field(default_factory=list, description="share: the numerator's "
                                                                "extra conditions.")
    descending: bool = True


Cond.model_rebuild()

T = TypeVar("T")


def need(value: T | None, what: str) -> T:
    """A field the query's op needs (each op reads its own of the optional fields)."""
    if value is None:
        raise ValueError(f"the query has no {what}, which its op needs")
    return value


def year_of(value: Scalar) -> int:
    """The year a `year` condition names."""
    if value is None:
        raise ValueError("the query has no year, which its op needs")
    return int(value)


def qi(name: str | None) -> str:
    """A quoted identifier: a table or column the query names (one its op needs)."""
    return quote_ident(need(name, "table or column"))


def lit(v: Scalar) -> str:
    """An SQL literal."""
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    return "'" + str(v).replace("'", "''") + "'"


class Aliases:
    """Fresh table aliases (t1, j2, ...) for one statement."""

    def __init__(self) -> None:
        self.n = 0

    def new(self, prefix: str = "t") -> str:
        self.n += 1
        return f"{prefix}{self.n}"


# --- SQL, shape A (direct) ---------------------------------------------------------------------


def _simple_a(c: Cond, a: str) -> str:
    col = f"{a}.{qi(c.column)}"
    if c.op == "eq":
        return f"{col} = {lit(c.value)}"
    if c.op == "gt":
        return f"{col} > {lit(c.value)}"
    if c.op == "lt":
        return f"{col} < {lit(c.value)}"
    if c.op == "year":
        return f"CAST(strftime('%Y', {col}) AS INTEGER) = {year_of(c.value)}"
    raise ValueError(c.op)


def _conds_a(conds: list[Cond], a: str, al: Aliases) -> tuple[list[str], list[str]]:
    """(JOIN clauses, WHERE terms) for conditions on alias `a`."""
    joins: list[str] = []
    where: list[str] = []
    for c in conds:
        if c.op == "via":
            b = al.new("j")
            joins.append(f"JOIN {qi(c.table)} AS {b} ON {a}.{qi(c.column)} = {b}.{qi(c.other)}")
            j2, w2 = _conds_a(c.inner, b, al)
            joins += j2
            where += w2
        elif c.op == "ref":
            b = al.new("r")
            j2, w2 = _conds_a(c.inner, b, al)
            w = " AND ".join([f"{b}.{qi(c.other)} = {a}.{qi(c.column)}", *w2])
            where.append(f"EXISTS (SELECT 1 FROM {qi(c.table)} AS {b}"
                         f"{''.join(' ' + j for j in j2)} WHERE {w})")
        else:
            where.append(_simple_a(c, a))
    return joins, where


def _scope_a(table: str, conds: list[Cond], a: str, al: Aliases,
             extra_joins: Sequence[str] = (), extra_where: Sequence[str] = ()) -> str:
    joins, where = _conds_a(conds, a, al)
    joins = [*joins, *extra_joins]
    where = [*where, *extra_where]
    s = f"FROM {qi(table)} AS {a}" + "".join(" " + j for j in joins)
    return s + (" WHERE " + " AND ".join(where) if where else "")


def _measure_a(q: Query, a: str) -> str:
    if q.agg == "count":
        return "COUNT(*)"
    return f"{q.agg.upper()}({a}.{qi(q.column)})"


def _group_a(g: Group, a: str, al: Aliases) -> tuple[str, list[str]]:
    """(key expression, extra JOINs) of a grouping."""
    col = f"{a}.{qi(g.column)}"
    if g.kind == "column":
        return col, []
    if g.kind == "year":
        return f"CAST(strftime('%Y', {col}) AS INTEGER)", []
    if g.kind == "month":
        return f"CAST(strftime('%m', {col}) AS INTEGER)", []
    b = al.new("g")
    return f"{b}.{qi(g.label)}", [f"JOIN {qi(g.table)} AS {b} ON {col} = {b}.{qi(g.key)}"]


def _grouped_a(q: Query, al: Aliases, only: list[Scalar] | None = None
               ) -> tuple[str, str, str]:
    """(key expr, measure expr, FROM ... WHERE ... GROUP BY ... clause); `only`: keep just
    the groups with these keys."""
    a = al.new()
    key, joins = _group_a(need(q.group, "group"), a, al)
    m = _measure_a(q, a)
    where = [f"{key} IS NOT NULL"]
    if only:
        where.append(f"{key} IN ({', '.join(lit(v) for v in only)})")
    body = _scope_a(q.table, q.conds, a, al, joins, where)
    having = f" HAVING {m} IS NOT NULL" if q.agg != "count" else ""
    return key, m, f"{body} GROUP BY {key}{having}"


def sql_a(q: Query) -> str:
    """The reference SQL: the direct formulation."""
    al = Aliases()
    if q.op == "count":
        return f"SELECT COUNT(*) {_scope_a(q.table, q.conds, al.new(), al)}"
    if q.op == "agg":
        a = al.new()
        return f"SELECT {_measure_a(q, a)} {_scope_a(q.table, q.conds, a, al)}"
    if q.op == "count_distinct":
        a = al.new()
        return f"SELECT COUNT(DISTINCT {a}.{qi(q.column)}) {_scope_a(q.table, q.conds, a, al)}"
    if q.op == "lookup":
        a = al.new()
        return f"SELECT {a}.{qi(q.column)} {_scope_a(q.table, q.conds, a, al)}"
    if q.op == "select":
        a = al.new()
        col = f"{a}.{qi(q.column)}"
        return f"SELECT DISTINCT {col} " + _scope_a(q.table, q.conds, a, al, (),
                                                    [f"{col} IS NOT NULL"])
    if q.op in ("top", "group"):
        key, m, body = _grouped_a(q, al)
        order = "DESC" if q.descending else "ASC"
        sel = key if q.op == "top" else f"{key}, {m}"
        tail = f" ORDER BY {m} {order} LIMIT {q.k}" if q.k else ""
        return f"SELECT {sel} {body}{tail}"
    if q.op == "compare":
        key, m, body = _grouped_a(q, al, q.values)
        return f"SELECT {key} {body} ORDER BY {m} DESC LIMIT 1"
    if q.op == "difference":
        key, m, body = _grouped_a(q, al)
        a, b = (lit(v) for v in q.values)
        return (f"SELECT MAX(CASE WHEN g = {a} THEN m END) - MAX(CASE WHEN g = {b} THEN m END) "
                f"FROM (SELECT {key} AS g, {m} AS m {body})")
    if q.op == "argmax":
        a = al.new()
        col = f"{a}.{qi(q.column)}"
        order = "DESC" if q.descending else "ASC"
        return (f"SELECT {a}.{qi(q.target)} " + _scope_a(q.table, q.conds, a, al, (),
                                                         [f"{col} IS NOT NULL"])
                + f" ORDER BY {col} {order} LIMIT 1")
    if q.op == "above_avg":
        a = al.new()
        b = al.new()
        inner = f"(SELECT AVG({b}.{qi(q.column)}) {_scope_a(q.table, q.conds, b, al)})"
        return "SELECT COUNT(*) " + _scope_a(q.table, q.conds, a, al, (),
                                              [f"{a}.{qi(q.column)} > {inner}"])
    if q.op == "share":
        num = f"(SELECT COUNT(*) {_scope_a(q.table, [*q.conds, *q.extra], al.new(), al)})"
        den = f"(SELECT COUNT(*) {_scope_a(q.table, q.conds, al.new(), al)})"
        return f"SELECT 100.0 * {num} / {den}"
    raise ValueError(q.op)


def sql_group_measures(q: Query) -> str:
    """Every group with its measure, best first (for the tie check of top/compare)."""
    al = Aliases()
    key, m, body = _grouped_a(q, al)
    return f"SELECT {key}, {m} {body} ORDER BY {m} {'DESC' if q.descending else 'ASC'}"


def sql_argmax_ties(q: Query) -> str:
    """How many rows share the extreme value (more than one: the argmax is ambiguous)."""
    al = Aliases()
    a, b = al.new(), al.new()
    f = "MAX" if q.descending else "MIN"
    best = f"(SELECT {f}({b}.{qi(q.column)}) {_scope_a(q.table, q.conds, b, al)})"
    return "SELECT COUNT(*) " + _scope_a(q.table, q.conds, a, al, (),
                                         [f"{a}.{qi(q.column)} = {best}"])
