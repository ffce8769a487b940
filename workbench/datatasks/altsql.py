"""The second SQL of a task (shape B): built from the same query independently of the
reference SQL, with IN-subqueries instead of joins, CASE sums, rank-by-counting instead of
LIMIT, correlated subqueries, and substr instead of strftime."""

from __future__ import annotations

from collections.abc import Sequence

from workbench.datatasks.queries import Aliases, Cond, Group, Query, Scalar, lit, need, qi, year_of


def _conds_b(conds: list[Cond], a: str, al: Aliases) -> list[str]:
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
            y = year_of(c.value)
            out.append(f"{col} >= '{y:04d}-01-01' AND {col} < '{y + 1:04d}-01-01'")
        else:  # via: our key in their keys; ref: our key in their foreign keys
            b = al.new("s")
            inner = _conds_b(c.inner, b, al)
            where = " WHERE " + " AND ".join(inner) if inner else ""
            out.append(f"{col} IN (SELECT {b}.{qi(c.other)} FROM {qi(c.table)} AS {b}{where})")
    return out


def _where_b(conds: list[Cond], a: str, al: Aliases, extra: Sequence[str] = ()) -> str:
    terms = [*_conds_b(conds, a, al), *extra]
    return " WHERE " + " AND ".join(terms) if terms else ""


def _measure_b(q: Query, a: str) -> str:
    x = f"{a}.{qi(q.column)}" if q.column else ""
    return {"count": "SUM(1)", "sum": f"TOTAL({x})", "avg": f"(SUM({x}) * 1.0 / COUNT({x}))",
            "min": f"MIN({x})", "max": f"MAX({x})"}[q.agg]


def _group_b(group: Group | None, a: str, al: Aliases) -> str:
    g = need(group, "group")
    col = f"{a}.{qi(g.column)}"
    if g.kind == "column":
        return col
    if g.kind == "year":
        return f"CAST(substr({col}, 1, 4) AS INTEGER)"
    if g.kind == "month":
        return f"CAST(substr({col}, 6, 2) AS INTEGER)"
    b = al.new("p")
    return f"(SELECT {b}.{qi(g.label)} FROM {qi(g.table)} AS {b} WHERE {b}.{qi(g.key)} = {col})"


def _grouped_b(q: Query, al: Aliases) -> str:
    """`WITH grp(g, m) AS (...)`: one row per group with its measure."""
    a = al.new()
    key = _group_b(q.group, a, al)
    m = _measure_b(q, a)
    where = _where_b(q.conds, a, al)
    having = f" HAVING {m} IS NOT NULL" if q.agg != "count" else ""
    inner = (f"SELECT g, m FROM (SELECT {key} AS g, {m} AS m FROM {qi(q.table)} AS {a}{where} "
             f"GROUP BY 1{having}) WHERE g IS NOT NULL")
    return f"WITH grp(g, m) AS ({inner}) "


def _group_measure_b(q: Query, value: Scalar, al: Aliases) -> str:
    """A scalar subquery: the measure of the group whose key is `value`."""
    a = al.new()
    return (f"(SELECT {_measure_b(q, a)} FROM {qi(q.table)} AS {a}"
            f"{_where_b(q.conds, a, al, [f'{_group_b(q.group, a, al)} = {lit(value)}'])})")


def _agg_b(q: Query, al: Aliases) -> str:
    """An aggregate over a subquery of the values (min/max by ordering, not MIN/MAX)."""
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


def _every_group_b(q: Query, al: Aliases) -> str:
    """Every group, each with its measure from a correlated subquery per distinct key."""
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


def sql_b(q: Query) -> str:
    """A second SQL of a different shape, built independently from the same query."""
    al = Aliases()
    if q.op == "count":
        a = al.new()
        terms = _conds_b(q.conds, a, al)
        cond = " AND ".join(terms) if terms else "1"
        return f"SELECT SUM(CASE WHEN {cond} THEN 1 ELSE 0 END) FROM {qi(q.table)} AS {a}"
    if q.op == "agg":
        return _agg_b(q, al)
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
        return _every_group_b(q, al)
    if q.op == "compare":
        va, vb = q.values
        ma, mb = _group_measure_b(q, va, al), _group_measure_b(q, vb, al)
        return f"SELECT CASE WHEN {ma} > {mb} THEN {lit(va)} ELSE {lit(vb)} END"
    if q.op == "difference":
        va, vb = q.values
        return f"SELECT {_group_measure_b(q, va, al)} - {_group_measure_b(q, vb, al)}"
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
