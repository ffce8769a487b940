"""A small query language for synthesised tasks, and its renderings.

A `Query` says what a task asks (count, aggregate, look up, list, rank groups, compare, ...)
over a scope (a table and conditions on it, possibly through joins). From one query come:

- `sql_a(q)`: the reference SQL (direct shape: JOINs, GROUP BY ... ORDER BY ... LIMIT);
- `sql_b(q)`: an independently shaped second SQL (IN-subqueries instead of joins, CASE sums,
  rank-by-counting instead of LIMIT, correlated subqueries, substr instead of strftime);
- `pandas_code(q)`: a pandas program for the Python sandbox (`tables` holds the DataFrames);
- `question(q)`: the template text of the question;
- `answer_spec(q, profile)`: how the answer is shaped and compared;
- `entities(q)`: the values, numbers and names a paraphrase must keep.

Compositions (a filter inside an aggregate, an aggregate inside a filter, ...) are new queries
built from the parents' queries, so every task, composed or not, renders the same way.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from workbench.trajsynth.answers import AnswerSpec
from workbench.trajsynth.profile import EnvProfile
from workbench.trajsynth.sandbox import quote_ident

Scalar = str | int | float | None
Op = Literal["count", "agg", "count_distinct", "lookup", "select", "top", "group", "compare",
             "difference", "argmax", "above_avg", "share"]
Agg = Literal["count", "sum", "avg", "min", "max"]

AGG_WORD = {"sum": "total", "avg": "average", "min": "minimum", "max": "maximum",
            "count": "number of"}


class Cond(BaseModel):
    """A condition on a scope's table.

    `eq`/`gt`/`lt`: `column` compared with `value`; `year`: the year of the date `column` is
    `value`; `via`: the row's foreign key `column` points at a `table` row (key `other`)
    meeting `inner`; `ref`: some `table` row whose foreign key `other` points at this row's
    key `column` meets `inner`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    op: Literal["eq", "gt", "lt", "year", "via", "ref"]
    column: str
    value: Scalar = None
    table: str | None = None
    other: str | None = None
    inner: list[Cond] = Field(default_factory=list)


class Group(BaseModel):
    """What rows are grouped by: a column, the label of a joined parent, a year or a month."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["column", "via", "year", "month"]
    column: str
    table: str | None = None  # via: the parent table
    key: str | None = None  # via: the parent's key column
    label: str | None = None  # via: the parent's label column


class Query(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

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


def qi(name: str) -> str:
    return quote_ident(name)


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


class _Aliases:
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
        return f"CAST(strftime('%Y', {col}) AS INTEGER) = {int(c.value)}"
    raise ValueError(c.op)


def _conds_a(conds: list[Cond], a: str, al: _Aliases) -> tuple[list[str], list[str]]:
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


def _scope_a(table: str, conds: list[Cond], a: str, al: _Aliases,
             extra_joins: list[str] = (), extra_where: list[str] = ()) -> str:
    joins, where = _conds_a(conds, a, al)
    joins = [*joins, *extra_joins]
    where = [*where, *extra_where]
    s = f"FROM {qi(table)} AS {a}" + "".join(" " + j for j in joins)
    return s + (" WHERE " + " AND ".join(where) if where else "")


def _measure_a(q: Query, a: str) -> str:
    if q.agg == "count":
        return "COUNT(*)"
    return f"{q.agg.upper()}({a}.{qi(q.column)})"


def _group_a(g: Group, a: str, al: _Aliases) -> tuple[str, list[str]]:
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


def _grouped_a(q: Query, al: _Aliases, only: list[Scalar] | None = None
               ) -> tuple[str, str, str]:
    """(key expr, measure expr, FROM ... WHERE ... GROUP BY ... clause); `only`: keep just
    the groups with these keys."""
    a = al.new()
    key, joins = _group_a(q.group, a, al)
    m = _measure_a(q, a)
    where = [f"{key} IS NOT NULL"]
    if only:
        where.append(f"{key} IN ({', '.join(lit(v) for v in only)})")
    body = _scope_a(q.table, q.conds, a, al, joins, where)
    having = f" HAVING {m} IS NOT NULL" if q.agg != "count" else ""
    return key, m, f"{body} GROUP BY {key}{having}"


def sql_a(q: Query) -> str:
    """The reference SQL: the direct formulation."""
    al = _Aliases()
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


# --- SQL, shape B (subqueries, no joins) ---------------------------------------------------------


def _conds_b(conds: list[Cond], a: str, al: _Aliases) -> list[str]:
    out = []
    for c in conds:
        col = f"{a}.{qi(c.column)}"
        if c.op == "eq":
            out.append(f"{col} IN ({lit(c.value)})")
        elif c.op == "gt":
            out.append(f"{lit(c.value)} < {col}")
        elif c.op == "lt":
            out.append(f"{lit(c.value)} > {col}")
        elif c.op == "year":
            y = int(c.value)
            out.append(f"{col} >= '{y:04d}-01-01' AND {col} < '{y + 1:04d}-01-01'")
        else:  # via: our key in their keys; ref: our key in their foreign keys
            b = al.new("s")
            inner = _conds_b(c.inner, b, al)
            where = " WHERE " + " AND ".join(inner) if inner else ""
            out.append(f"{col} IN (SELECT {b}.{qi(c.other)} FROM {qi(c.table)} AS {b}{where})")
    return out


def _where_b(conds: list[Cond], a: str, al: _Aliases, extra: list[str] = ()) -> str:
    terms = [*_conds_b(conds, a, al), *extra]
    return " WHERE " + " AND ".join(terms) if terms else ""


def _measure_b(q: Query, a: str) -> str:
    x = f"{a}.{qi(q.column)}" if q.column else ""
    return {"count": "SUM(1)", "sum": f"TOTAL({x})", "avg": f"(SUM({x}) * 1.0 / COUNT({x}))",
            "min": f"MIN({x})", "max": f"MAX({x})"}[q.agg]


def _group_b(g: Group, a: str, al: _Aliases) -> str:
    col = f"{a}.{qi(g.column)}"
    if g.kind == "column":
        return col
    if g.kind == "year":
        return f"CAST(substr({col}, 1, 4) AS INTEGER)"
    if g.kind == "month":
        return f"CAST(substr({col}, 6, 2) AS INTEGER)"
    b = al.new("p")
    return f"(SELECT {b}.{qi(g.label)} FROM {qi(g.table)} AS {b} WHERE {b}.{qi(g.key)} = {col})"


def _grouped_b(q: Query, al: _Aliases) -> str:
    """`WITH grp(g, m) AS (...)`: one row per group with its measure."""
    a = al.new()
    key = _group_b(q.group, a, al)
    m = _measure_b(q, a)
    where = _where_b(q.conds, a, al)
    having = f" HAVING {m} IS NOT NULL" if q.agg != "count" else ""
    inner = (f"SELECT g, m FROM (SELECT {key} AS g, {m} AS m FROM {qi(q.table)} AS {a}{where} "
             f"GROUP BY 1{having}) WHERE g IS NOT NULL")
    return f"WITH grp(g, m) AS ({inner}) "


def _group_measure_b(q: Query, value: Scalar, al: _Aliases) -> str:
    """A scalar subquery: the measure of the group whose key is `value`."""
    a = al.new()
    return (f"(SELECT {_measure_b(q, a)} FROM {qi(q.table)} AS {a}"
            f"{_where_b(q.conds, a, al, [f'{_group_b(q.group, a, al)} = {lit(value)}'])})")


def sql_b(q: Query) -> str:
    """A second SQL of a different shape, built independently from the same query."""
    al = _Aliases()
    if q.op == "count":
        a = al.new()
        terms = _conds_b(q.conds, a, al)
        cond = " AND ".join(terms) if terms else "1"
        return f"SELECT SUM(CASE WHEN {cond} THEN 1 ELSE 0 END) FROM {qi(q.table)} AS {a}"
    if q.op == "agg":
        a = al.new()
        x = f"{a}.{qi(q.column)}"
        sub = f"(SELECT {x} AS x FROM {qi(q.table)} AS {a}{_where_b(q.conds, a, al)})"
        if q.agg == "avg":
            return f"SELECT SUM(x) * 1.0 / COUNT(x) FROM {sub}"
        if q.agg == "sum":
            return f"SELECT SUM(x) FROM {sub}"
        if q.agg == "count":
            return f"SELECT COUNT(x) FROM {sub}"
        order = "ASC" if q.agg == "min" else "DESC"
        return f"SELECT x FROM {sub} WHERE x IS NOT NULL ORDER BY x {order} LIMIT 1"
    if q.op == "count_distinct":
        a = al.new()
        x = f"{a}.{qi(q.column)}"
        return (f"SELECT COUNT(*) FROM (SELECT {x} FROM {qi(q.table)} AS {a}"
                f"{_where_b(q.conds, a, al, [f'{x} IS NOT NULL'])} GROUP BY {x})")
    if q.op == "lookup" and q.conds and all(c.op == "eq" for c in q.conds):
        a, c = al.new(), al.new("k")  # the key values joined in as a one-row table
        keys = ", ".join(f"{lit(x.value)} AS v{i}" for i, x in enumerate(q.conds))
        on = " AND ".join(f"{a}.{qi(x.column)} = {c}.v{i}" for i, x in enumerate(q.conds))
        return f"SELECT {a}.{qi(q.column)} FROM {qi(q.table)} AS {a} JOIN (SELECT {keys}) AS {c} " \
               f"ON {on}"
    if q.op in ("lookup", "select"):
        a = al.new()
        x = f"{a}.{qi(q.column)}"
        extra = [f"{x} IS NOT NULL"] if q.op == "select" else []
        return f"SELECT {x} FROM {qi(q.table)} AS {a}{_where_b(q.conds, a, al, extra)}" + \
            (f" GROUP BY {x}" if q.op == "select" else "")
    if q.op in ("top", "group") and q.k:
        cmp = ">" if q.descending else "<"
        sel = "a.g" if q.op == "top" else "a.g, a.m"
        return (_grouped_b(q, al) + f"SELECT {sel} FROM grp AS a WHERE "
                f"(SELECT COUNT(*) FROM grp AS b WHERE b.m {cmp} a.m) < {q.k}")
    if q.op == "group":  # every group: correlated measure per distinct key
        a = al.new()
        key = _group_b(q.group, a, al)
        where = _where_b(q.conds, a, al, [f"{key} IS NOT NULL"])
        d = al.new("d")
        c = al.new()
        m = (f"(SELECT {_measure_b(q, c)} FROM {qi(q.table)} AS {c}"
             f"{_where_b(q.conds, c, al, [f'{_group_b(q.group, c, al)} = {d}.g'])})")
        out = (f"SELECT {d}.g, {m} FROM (SELECT DISTINCT {key} AS g FROM {qi(q.table)} AS {a}"
               f"{where}) AS {d}")
        return out if q.agg == "count" else \
            f"SELECT g, m FROM (SELECT {d}.g AS g, {m} AS m FROM (SELECT DISTINCT {key} AS g " \
            f"FROM {qi(q.table)} AS {a}{where}) AS {d}) WHERE m IS NOT NULL"
    if q.op == "compare":
        a, b = q.values
        ma, mb = _group_measure_b(q, a, al), _group_measure_b(q, b, al)
        return f"SELECT CASE WHEN {ma} > {mb} THEN {lit(a)} ELSE {lit(b)} END"
    if q.op == "difference":
        a, b = q.values
        return f"SELECT {_group_measure_b(q, a, al)} - {_group_measure_b(q, b, al)}"
    if q.op == "argmax":
        a, b = al.new(), al.new()
        f = "MAX" if q.descending else "MIN"
        best = (f"(SELECT {f}({b}.{qi(q.column)}) FROM {qi(q.table)} AS {b}"
                f"{_where_b(q.conds, b, al)})")
        return (f"SELECT {a}.{qi(q.target)} FROM {qi(q.table)} AS {a}"
                f"{_where_b(q.conds, a, al, [f'{a}.{qi(q.column)} = {best}'])}")
    if q.op == "above_avg":
        a, b = al.new(), al.new()
        x = qi(q.column)
        avg = (f"(SELECT SUM({b}.{x}) * 1.0 / COUNT({b}.{x}) AS v FROM {qi(q.table)} AS {b}"
               f"{_where_b(q.conds, b, al)}) AS s")
        return (f"SELECT SUM(CASE WHEN {a}.{x} > s.v THEN 1 ELSE 0 END) "
                f"FROM {qi(q.table)} AS {a}, {avg}{_where_b(q.conds, a, al)}")
    if q.op == "share":
        a = al.new()
        num = " AND ".join(_conds_b(q.extra, a, al))
        return (f"SELECT AVG(CASE WHEN {num} THEN 100.0 ELSE 0.0 END) FROM {qi(q.table)} AS {a}"
                f"{_where_b(q.conds, a, al)}")
    raise ValueError(q.op)


def sql_group_measures(q: Query) -> str:
    """Every group with its measure, best first (for the tie check of top/compare)."""
    al = _Aliases()
    key, m, body = _grouped_a(q, al)
    return f"SELECT {key}, {m} {body} ORDER BY {m} {'DESC' if q.descending else 'ASC'}"


def sql_argmax_ties(q: Query) -> str:
    """How many rows share the extreme value (more than one: the argmax is ambiguous)."""
    al = _Aliases()
    a, b = al.new(), al.new()
    f = "MAX" if q.descending else "MIN"
    best = f"(SELECT {f}({b}.{qi(q.column)}) {_scope_a(q.table, q.conds, b, al)})"
    return "SELECT COUNT(*) " + _scope_a(q.table, q.conds, a, al, (),
                                         [f"{a}.{qi(q.column)} = {best}"])


# --- pandas ----------------------------------------------------------------------------------


def _t(name: str) -> str:
    return f"tables[{name!r}]"


def _mask_pd(conds: list[Cond], d: str) -> str:
    terms = []
    for c in conds:
        col = f"{d}[{c.column!r}]"
        if c.op == "eq":
            terms.append(f"({col} == {c.value!r})")
        elif c.op == "gt":
            terms.append(f"({col} > {c.value!r})")
        elif c.op == "lt":
            terms.append(f"({col} < {c.value!r})")
        elif c.op == "year":
            terms.append(f"(pd.to_datetime({col}, errors='coerce').dt.year == {int(c.value)})")
        else:
            other = _t(c.table)
            inner = _mask_pd(c.inner, other)
            keys = f"{other}.loc[{inner}, {c.other!r}]" if c.inner else f"{other}[{c.other!r}]"
            terms.append(f"{col}.isin({keys})")
    return " & ".join(terms) if terms else f"pd.Series(True, index={d}.index)"


def _group_pd(g: Group, d: str) -> str:
    col = f"{d}[{g.column!r}]"
    if g.kind == "column":
        return col
    if g.kind == "year":
        return f"pd.to_datetime({col}, errors='coerce').dt.year"
    if g.kind == "month":
        return f"pd.to_datetime({col}, errors='coerce').dt.month"
    return f"{col}.map({_t(g.table)}.set_index({g.key!r})[{g.label!r}])"


def pandas_code(q: Query) -> str:
    """A pandas program that sets `result` to the answer (a value, a list or a list of rows)."""
    lines = [f"d = {_t(q.table)}", f"m = {_mask_pd(q.conds, 'd')}"]
    col = repr(q.column)
    if q.op == "count":
        lines.append("result = int(m.sum())")
    elif q.op == "agg":
        fn = {"sum": "sum", "avg": "mean", "min": "min", "max": "max", "count": "count"}[q.agg]
        lines += [f"s = d.loc[m, {col}].dropna()", f"result = s.{fn}() if len(s) else None"]
    elif q.op == "count_distinct":
        lines.append(f"result = int(d.loc[m, {col}].nunique())")
    elif q.op == "lookup":
        lines.append(f"result = d.loc[m, {col}].tolist()")
    elif q.op == "select":
        lines.append(f"result = sorted(set(d.loc[m, {col}].dropna().tolist()), key=str)")
    elif q.op in ("top", "group", "compare", "difference"):
        lines += [f"k = {_group_pd(q.group, 'd')}", "dd, kk = d[m], k[m]"]
        if q.agg == "count":
            lines.append("s = dd.groupby(kk).size()")
        else:
            fn = {"sum": "sum(min_count=1)", "avg": "mean()", "min": "min()", "max": "max()"}
            lines.append(f"s = dd.groupby(kk)[{col}].{fn[q.agg]}")
        lines.append("s = s.dropna()")
        asc = not q.descending
        if q.op == "top":
            lines.append(f"result = s.sort_values(ascending={asc}, kind='mergesort')"
                         f".index[:{q.k}].tolist()")
        elif q.op == "group":
            head = f".sort_values(ascending={asc}, kind='mergesort').iloc[:{q.k}]" if q.k else ""
            lines.append(f"result = [[g, v] for g, v in s{head}.items()]")
        elif q.op == "compare":
            a, b = q.values
            lines.append(f"result = {a!r} if s.get({a!r}) > s.get({b!r}) else {b!r}")
        else:
            a, b = q.values
            lines.append(f"result = s.get({a!r}) - s.get({b!r})")
    elif q.op == "argmax":
        fn = "idxmax" if q.descending else "idxmin"
        lines += [f"dd = d[m].dropna(subset=[{col}])",
                  f"result = dd.loc[dd[{col}].{fn}(), {q.target!r}]"]
    elif q.op == "above_avg":
        lines += [f"s = d.loc[m, {col}]", "result = int((s > s.mean()).sum())"]
    elif q.op == "share":
        lines += [f"n = {_mask_pd(q.extra, 'd')}",
                  "result = 100.0 * float((m & n).sum()) / float(m.sum())"]
    else:
        raise ValueError(q.op)
    return "\n".join(lines)


# --- question text ---------------------------------------------------------------------------


def fmt_value(v: Scalar) -> str:
    if isinstance(v, str):
        return f"'{v}'"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def _phrase(c: Cond) -> str:
    if c.op == "eq":
        return f"whose {c.column} is {fmt_value(c.value)}"
    if c.op == "gt":
        return f"whose {c.column} is greater than {fmt_value(c.value)}"
    if c.op == "lt":
        return f"whose {c.column} is less than {fmt_value(c.value)}"
    if c.op == "year":
        return f"whose {c.column} is in {int(c.value)}"
    verb = "linked to" if c.op == "via" else "referenced by"
    inner = " and ".join(_phrase(i) for i in c.inner)
    return f"{verb} {_article(c.table)} {c.table} row" + (f" {inner}" if inner else "")


def _predicate(c: Cond) -> str:
    if c.op == "eq":
        return f"have {c.column} {fmt_value(c.value)}"
    if c.op == "gt":
        return f"have {c.column} greater than {fmt_value(c.value)}"
    if c.op == "lt":
        return f"have {c.column} less than {fmt_value(c.value)}"
    if c.op == "year":
        return f"have {c.column} in {int(c.value)}"
    return "are " + _phrase(c)


def scope_text(table: str, conds: list[Cond], *, singular: bool = False) -> str:
    head = f"{table} row" if singular else f"{table} rows"
    return head + ("" if not conds else " " + " and ".join(_phrase(c) for c in conds))


def _group_name(g: Group, plural: bool = False) -> str:
    if g.kind == "year":
        return f"years of {g.column}" if plural else f"year of {g.column}"
    if g.kind == "month":
        return f"months of {g.column}" if plural else f"month of {g.column}"
    name = g.column if g.kind == "column" else f"{g.table} {g.label}"
    return f"{name} values" if plural else f"{name} value"


def _superlative(q: Query, scope: str) -> str:
    if q.agg == "count":
        return f"the {'most' if q.descending else 'fewest'} {scope}"
    word = "highest" if q.descending else "lowest"
    return f"the {word} {AGG_WORD[q.agg]} {q.column} over {scope}"


def question(q: Query) -> str:
    """The template text of the question a query answers."""
    scope = scope_text(q.table, q.conds)
    if q.op == "count":
        if not q.conds:
            return f"How many {q.table} rows are there?"
        return f"How many {q.table} rows {' and '.join(_predicate(c) for c in q.conds)}?"
    if q.op == "agg":
        return f"What is the {AGG_WORD[q.agg]} {q.column} of {scope}?"
    if q.op == "count_distinct":
        return f"How many distinct {q.column} values do {scope} have?"
    if q.op == "lookup":
        return f"What is the {q.column} of the {scope_text(q.table, q.conds, singular=True)}?"
    if q.op == "select":
        return f"Which distinct {q.column} values do {scope} have?"
    if q.op == "top":
        if q.k == 1:
            return f"Which {_group_name(q.group)} has {_superlative(q, scope)}?"
        return f"Which {q.k} {_group_name(q.group, True)} have {_superlative(q, scope)}?"
    if q.op == "group":
        if q.k:
            what = "number of rows" if q.agg == "count" else f"{AGG_WORD[q.agg]} {q.column}"
            return (f"List the {q.k} {_group_name(q.group, True)} with {_superlative(q, scope)},"
                    f" each with its {what}.")
        g = _group_name(q.group).removesuffix(" value")
        if q.agg == "count":
            return f"How many {scope} are there for each {g}?"
        return f"What is the {AGG_WORD[q.agg]} {q.column} of {scope} for each {g}?"
    if q.op == "compare":
        a, b = (fmt_value(v) for v in q.values)
        g = _group_name(q.group)
        if q.agg == "count":
            return f"Which {g} has more {scope}: {a} or {b}?"
        return f"Which {g} has the higher {AGG_WORD[q.agg]} {q.column} over {scope}: {a} or {b}?"
    if q.op == "difference":
        a, b = (fmt_value(v) for v in q.values)
        g = _group_name(q.group)
        if q.agg == "count":
            return f"How many more {scope} does the {g} {a} have than {b}?"
        return (f"By how much does the {AGG_WORD[q.agg]} {q.column} of {scope} for the {g} {a} "
                f"exceed that for {b}?")
    if q.op == "argmax":
        word = "highest" if q.descending else "lowest"
        return (f"What is the {q.target} of the {scope_text(q.table, q.conds, singular=True)} "
                f"with the {word} {q.column}?")
    if q.op == "above_avg":
        return (f"How many {scope} have a {q.column} greater than the average {q.column} of "
                f"those rows?")
    if q.op == "share":
        pred = " and ".join(_predicate(c) for c in q.extra)
        return f"What percentage of {scope} {pred}?"
    raise ValueError(q.op)


# --- spec, entities, shape facts -----------------------------------------------------------------


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
        g = _group_name(q.group).removesuffix(" value")
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
            yield from _walk(c.inner, c.table)


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
