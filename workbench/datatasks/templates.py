"""Seed templates (taxonomy × schema slices of a profile) and recursive composition.

`Slices` (in `slices`) reads a profile once: per table a key column, a label column (unique
or nearly unique text), measures (numeric, not keys), categories (low-cardinality columns
with a value dictionary), dates, lookup targets, and the usable many-to-one joins. Each seed
template turns slices into `Candidate` queries; values come from the profile's dictionaries
or from seeded samples of the data (`Sampler`, read-only SQL, ORDER BY + OFFSET, so the same
seed gives the same values). Composition operators (in `compose`) build harder queries from
two verified tasks that share a table (a filter inside an aggregate, an aggregate inside a
filter, an argmax, a share).

Every template has its own random stream (seeded from the pool seed and the template id), so
adding a template does not change what the others produce.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from workbench.dataenv.profile import EnvProfile, JoinKey
from workbench.dataenv.sandboxlimits import SandboxLimits
from workbench.dataenv.sqlsandbox import run_sql
from workbench.datatasks.queries import Cond, Group, Query, qi, sql_group_measures
from workbench.datatasks.slices import (  # noqa: F401  (AGGS_BY_ROLE: read by tests)
    AGGS_BY_ROLE,
    MAX_VALUE_CHARS,
    Slices,
)
from workbench.plugins import Registry

CATEGORIES = ("lookup", "filter", "aggregation", "join", "group_rank", "time_series",
              "comparison", "composed")


def stream(seed: int, name: str) -> random.Random:
    """A random stream of its own for one template or operator."""
    h = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return random.Random(int.from_bytes(h[:8], "big"))


@dataclass
class Candidate:
    """A task before verification: its query, where it came from, and the two programs."""

    template_id: str
    category: str
    query: Query
    parents: list[str] = field(default_factory=list)
    parent_difficulty: int = 0
    lineage: list[str] = field(default_factory=list)  # the parents' templates and theirs
    program: str | None = None  # None: rendered from the query (shape A)
    alt_program: str | None = None  # None: rendered from the query (shape B)


class Sampler:
    """Seeded, read-only samples of values from the data."""

    def __init__(self, db_path: str, limits: SandboxLimits | None = None) -> None:
        self.db_path = db_path
        self.limits = limits or SandboxLimits(sql_max_rows=1000)
        self.queries = 0

    def rows(self, sql: str) -> list[list[Any]]:
        self.queries += 1
        r = run_sql(self.db_path, sql, self.limits)
        return r.rows if r.ok else []

    def scalar(self, sql: str) -> Any:
        rows = self.rows(sql)
        return rows[0][0] if rows and rows[0] else None

    def pick(self, select_sql: str, rng: random.Random, n: int = 1) -> list[Any]:
        """Up to `n` distinct values of the first column of `select_sql`, chosen by `rng`."""
        total = self.scalar(f"SELECT COUNT(*) FROM ({select_sql})") or 0
        if not total:
            return []
        out = []
        for off in sorted(rng.sample(range(total), min(n, total))):
            rows = self.rows(f"{select_sql} ORDER BY 1 LIMIT 1 OFFSET {off}")
            if rows:
                out.append(rows[0][0])
        return out

    def quantile(self, table: str, column: str, q: float) -> Any:
        n = self.scalar(f"SELECT COUNT({qi(column)}) FROM {qi(table)}") or 0
        if not n:
            return None
        return self.scalar(f"SELECT {qi(column)} FROM {qi(table)} WHERE {qi(column)} IS NOT NULL "
                           f"ORDER BY {qi(column)} LIMIT 1 OFFSET {min(n - 1, int(n * q))}")

    def years(self, table: str, column: str) -> list[int]:
        return [r[0] for r in self.rows(
            f"SELECT DISTINCT CAST(strftime('%Y', {qi(column)}) AS INTEGER) FROM {qi(table)} "
            f"WHERE {qi(column)} IS NOT NULL ORDER BY 1") if r[0] is not None]


def _text_ok(expr: str) -> str:
    return (f"(typeof({expr}) <> 'text' OR (length({expr}) BETWEEN 1 AND {MAX_VALUE_CHARS} "
            f"AND instr({expr}, char(10)) = 0 AND {expr} = trim({expr})))")


@dataclass
class Context:
    slices: Slices
    sampler: Sampler
    variants: int

    @property
    def profile(self) -> EnvProfile:
        return self.slices.profile


def _shuffled(rng: random.Random, items: Iterable) -> list:
    out = list(items)
    rng.shuffle(out)
    return out


def _spread(rng: random.Random, combos: Iterable, n: int,
            key: Callable[[Any], Any] | None = None) -> list:
    """`n` of `combos` in a seeded order that visits every table (`key`) before any twice."""
    key = key or (lambda c: c[0])
    seen: dict[Any, int] = {}
    ranked = []
    for i, c in enumerate(_shuffled(rng, combos)):
        k = key(c)
        ranked.append((seen.get(k, 0), i, c))
        seen[k] = seen.get(k, 0) + 1
    ranked.sort(key=lambda x: (x[0], x[1]))
    return [c for _, _, c in ranked[:n]]


def _join_key(j: JoinKey) -> tuple[str, str]:
    return j.from_table, j.to_table


def _fk(j: JoinKey) -> tuple[str, str, str, str]:
    return j.from_table, j.from_columns[0], j.to_table, j.to_columns[0]


# --- parent conditions (for joins) -------------------------------------------------------------


def _parent_conds(ctx: Context, j: JoinKey, rng: random.Random, *, min_children: int = 1,
                  max_children: int | None = None) -> list[Cond]:
    """A condition on the parent of join `j` that some child rows meet: its label equals a
    sampled value, a category equals a dictionary value, or a measure is above a quantile."""
    child, fk, parent, pk = _fk(j)
    s = ctx.slices
    n_children = (f"(SELECT COUNT(*) FROM {qi(child)} AS c WHERE c.{qi(fk)} = p.{qi(pk)})")
    hi = f" AND {n_children} <= {max_children}" if max_children else ""
    options = []
    if parent in s.labels:
        options.append("label")
    if s.categories.get(parent):
        options.append("category")
    if s.measures.get(parent) and max_children is None:
        options.append("measure")
    if not options:
        return []
    kind = rng.choice(options)
    if kind == "label":
        lab = qi(s.labels[parent])
        vals = ctx.sampler.pick(
            f"SELECT p.{lab} FROM {qi(parent)} AS p WHERE {n_children} >= {min_children}{hi} "
            f"AND {_text_ok('p.' + lab)} GROUP BY p.{lab} HAVING COUNT(*) = 1", rng)
        return [Cond(op="eq", column=s.labels[parent], value=vals[0])] if vals else []
    if kind == "category":
        col = rng.choice(s.categories[parent])
        vals = ctx.sampler.pick(
            f"SELECT DISTINCT p.{qi(col)} FROM {qi(parent)} AS p WHERE {n_children} >= "
            f"{min_children}{hi} AND p.{qi(col)} IS NOT NULL AND {_text_ok('p.' + qi(col))}",
            rng)
        return [Cond(op="eq", column=col, value=vals[0])] if vals else []
    col = rng.choice(s.measures[parent])
    x = ctx.sampler.quantile(parent, col, rng.choice((0.25, 0.5, 0.75)))
    return [Cond(op="gt", column=col, value=x)] if x is not None else []


def _via(j: JoinKey, inner: list[Cond]) -> Cond:
    return Cond(op="via", column=j.from_columns[0], table=j.to_table, other=j.to_columns[0],
                inner=inner)


# --- seed templates -------------------------------------------------------------------------------

Template = Callable[[Context, random.Random], list[Query]]
# template id -> its function (`workbench.plugins.Registry`; `@template(id)` registers one)
TEMPLATES: Registry[Template] = Registry("seed template")


def template(tid: str) -> Callable[[Template], Template]:
    return TEMPLATES.add(tid)


def category_of(template_id: str) -> str:
    return template_id.split(".", 1)[0]


@template("lookup.by_label")
def _lookup_by_label(ctx: Context, rng: random.Random) -> list[Query]:
    s, out = ctx.slices, []
    combos = [(t, s.labels[t], c) for t in sorted(s.labels) for c in s.targets.get(t, [])]
    for t, lab, col in _spread(rng, combos, ctx.variants):
        vals = ctx.sampler.pick(f"SELECT {qi(lab)} FROM {qi(t)} GROUP BY {qi(lab)} HAVING "
                                f"COUNT(*) = 1 AND MAX({qi(col)}) IS NOT NULL AND "
                                f"{_text_ok(qi(lab))}", rng)
        if vals:
            out.append(Query(op="lookup", table=t, column=col,
                             conds=[Cond(op="eq", column=lab, value=vals[0])]))
    return out


@template("lookup.by_key")
def _lookup_by_key(ctx: Context, rng: random.Random) -> list[Query]:
    s, out = ctx.slices, []
    combos = [(t, s.keys[t], c) for t in sorted(s.keys) if t not in s.labels
              for c in s.targets.get(t, [])]
    for t, key, col in _spread(rng, combos, ctx.variants):
        vals = ctx.sampler.pick(f"SELECT {qi(key)} FROM {qi(t)} WHERE {qi(col)} IS NOT NULL", rng)
        if vals:
            out.append(Query(op="lookup", table=t, column=col,
                             conds=[Cond(op="eq", column=key, value=vals[0])]))
    return out


@template("filter.count_eq")
def _count_eq(ctx: Context, rng: random.Random) -> list[Query]:
    s, out = ctx.slices, []
    combos = [(t, c) for t in sorted(s.categories) for c in s.categories[t]]
    for t, col in _spread(rng, combos, ctx.variants):
        value, _ = rng.choice(s.dictionary(t, col))
        out.append(Query(op="count", table=t, conds=[Cond(op="eq", column=col, value=value)]))
    return out


@template("filter.count_range")
def _count_range(ctx: Context, rng: random.Random) -> list[Query]:
    s, out = ctx.slices, []
    combos = [(t, c) for t in sorted(s.measures) for c in s.measures[t]]
    for t, col in _spread(rng, combos, ctx.variants):
        x = ctx.sampler.quantile(t, col, rng.choice((0.2, 0.4, 0.6, 0.8)))
        if x is not None:
            out.append(Query(op="count", table=t,
                             conds=[Cond(op=rng.choice(("gt", "lt")), column=col, value=x)]))
    return out


@template("filter.list_eq")
def _list_eq(ctx: Context, rng: random.Random) -> list[Query]:
    s, out = ctx.slices, []
    combos = [(t, c) for t in sorted(s.categories) if t in s.labels for c in s.categories[t]]
    for t, col in _spread(rng, combos, ctx.variants):
        values = [v for v, n in s.dictionary(t, col) if 2 <= n <= 15]
        if values:
            out.append(Query(op="select", table=t, column=s.labels[t],
                             conds=[Cond(op="eq", column=col, value=rng.choice(values))]))
    return out


@template("aggregation.stat")
def _stat(ctx: Context, rng: random.Random) -> list[Query]:
    s = ctx.slices
    combos = [(t, c, a) for t in sorted(s.measures) for c in s.measures[t]
              for a in ("sum", "avg", "min", "max") if s.allows(t, c, a)]
    return [Query(op="agg", table=t, column=c, agg=a)
            for t, c, a in _spread(rng, combos, ctx.variants + 2)]


@template("aggregation.count_distinct")
def _count_distinct(ctx: Context, rng: random.Random) -> list[Query]:
    s = ctx.slices
    combos = [(t, c) for t in sorted(s.categories) for c in s.categories[t]]
    return [Query(op="count_distinct", table=t, column=c)
            for t, c in _spread(rng, combos, ctx.variants)]


@template("join.count_via")
def _count_via(ctx: Context, rng: random.Random) -> list[Query]:
    out = []
    for j in _spread(rng, ctx.slices.joins * 2, ctx.variants + 1, _join_key):
        inner = _parent_conds(ctx, j, rng)
        if inner:
            out.append(Query(op="count", table=j.from_table, conds=[_via(j, inner)]))
    return out


@template("join.agg_via")
def _agg_via(ctx: Context, rng: random.Random) -> list[Query]:
    s, out = ctx.slices, []
    combos = [(j, m, a) for j in s.joins for m in s.measures.get(j.from_table, [])
              for a in ("sum", "avg", "max") if s.allows(j.from_table, m, a)]
    for j, m, a in _spread(rng, combos, ctx.variants, lambda c: _join_key(c[0])):
        inner = _parent_conds(ctx, j, rng)
        if inner:
            out.append(Query(op="agg", table=j.from_table, column=m, agg=a,
                             conds=[_via(j, inner)]))
    return out


@template("join.list_via")
def _list_via(ctx: Context, rng: random.Random) -> list[Query]:
    s, out = ctx.slices, []
    for j in _spread(rng, [j for j in s.joins if j.from_table in s.labels], ctx.variants,
                     _join_key):
        inner = _parent_conds(ctx, j, rng, min_children=2, max_children=15)
        if inner:
            out.append(Query(op="select", table=j.from_table, column=s.labels[j.from_table],
                             conds=[_via(j, inner)]))
    return out


@template("join.parent_lookup")
def _parent_lookup(ctx: Context, rng: random.Random) -> list[Query]:
    s, out = ctx.slices, []
    combos = [j for j in s.joins if j.from_table in s.labels and j.to_table in s.labels]
    for j in _spread(rng, combos, ctx.variants, _join_key):
        child, fk, parent, pk = _fk(j)
        lab = qi(s.labels[child])
        vals = ctx.sampler.pick(f"SELECT {lab} FROM {qi(child)} GROUP BY {lab} HAVING COUNT(*) "
                                f"= 1 AND MAX({qi(fk)}) IS NOT NULL AND {_text_ok(lab)}", rng)
        if vals:
            out.append(Query(op="lookup", table=parent, column=s.labels[parent], conds=[
                Cond(op="ref", column=pk, table=child, other=fk,
                     inner=[Cond(op="eq", column=s.labels[child], value=vals[0])])]))
    return out


@template("join.two_hop")
def _two_hop(ctx: Context, rng: random.Random) -> list[Query]:
    s, out = ctx.slices, []
    chains = [(a, b) for a in s.joins for b in s.joins
              if a.to_table == b.from_table and b.to_table != a.from_table]
    for a, b in _spread(rng, chains, ctx.variants, lambda c: _join_key(c[0])):
        inner = _parent_conds(ctx, b, rng)
        if inner:
            out.append(Query(op="count", table=a.from_table, conds=[_via(a, [_via(b, inner)])]))
    return out


def _measure_options(ctx: Context, table: str, group: Group | None = None
                     ) -> list[tuple[str, str | None]]:
    """count, or the sum/average of a measure its role allows (never of the column the rows
    are grouped by)."""
    skip = group.column if group is not None and group.kind == "column" else None
    return [("count", None)] + [(a, m) for m in ctx.slices.measures.get(table, [])
                                if m != skip for a in ("sum", "avg")
                                if ctx.slices.allows(table, m, a)]


@template("group_rank.top")
def _top(ctx: Context, rng: random.Random) -> list[Query]:
    out = []
    combos = [(t, g, n) for t in sorted(ctx.slices.measures) for g, n in
              ctx.slices.group_options(t) if n >= 3]
    for t, g, n in _spread(rng, combos, ctx.variants + 1):
        agg, col = rng.choice(_measure_options(ctx, t, g))
        k = 1 if n < 6 else rng.choice((1, 3))
        desc = agg != "count" or rng.random() < 0.75
        out.append(Query(op="top", table=t, group=g, agg=agg, column=col, k=k, descending=desc))
    return out


@template("group_rank.top_table")
def _top_table(ctx: Context, rng: random.Random) -> list[Query]:
    out = []
    combos = [(t, g) for t in sorted(ctx.slices.measures)
              for g, n in ctx.slices.group_options(t) if n >= 7]
    for t, g in _spread(rng, combos, ctx.variants):
        agg, col = rng.choice(_measure_options(ctx, t, g))
        out.append(Query(op="group", table=t, group=g, agg=agg, column=col, k=5))
    return out


def _date_combos(ctx: Context, min_rows: int = 2) -> list[tuple[str, str]]:
    """(table, date column) pairs; series (per year/month) need `min_rows` rows."""
    return [(t, d) for t in sorted(ctx.slices.dates) for d in ctx.slices.dates[t]
            if ctx.profile.table(t).row_count >= min_rows]


@template("time_series.per_year")
def _per_year(ctx: Context, rng: random.Random) -> list[Query]:
    out = []
    for t, d in _spread(rng, _date_combos(ctx, 20) * 2, ctx.variants):
        agg, col = rng.choice(_measure_options(ctx, t))
        out.append(Query(op="group", table=t, group=Group(kind="year", column=d), agg=agg,
                         column=col))
    return out


@template("time_series.per_month")
def _per_month(ctx: Context, rng: random.Random) -> list[Query]:
    out = []
    for t, d in _spread(rng, _date_combos(ctx, 20) * 2, ctx.variants):
        years = ctx.sampler.years(t, d)
        if years:
            agg, col = rng.choice(_measure_options(ctx, t))
            out.append(Query(op="group", table=t, group=Group(kind="month", column=d), agg=agg,
                             column=col, conds=[Cond(op="year", column=d,
                                                     value=rng.choice(years))]))
    return out


@template("time_series.in_year")
def _in_year(ctx: Context, rng: random.Random) -> list[Query]:
    out = []
    for t, d in _spread(rng, _date_combos(ctx) * 2, ctx.variants):
        years = ctx.sampler.years(t, d)
        if years:
            agg, col = rng.choice(_measure_options(ctx, t))
            cond = Cond(op="year", column=d, value=rng.choice(years))
            out.append(Query(op="count", table=t, conds=[cond]) if agg == "count" else
                       Query(op="agg", table=t, agg=agg, column=col, conds=[cond]))
    return out


@template("time_series.peak")
def _peak(ctx: Context, rng: random.Random) -> list[Query]:
    out = []
    for t, d in _spread(rng, _date_combos(ctx, 20) * 2, ctx.variants):
        agg, col = rng.choice(_measure_options(ctx, t))
        if rng.random() < 0.5:
            out.append(Query(op="top", table=t, group=Group(kind="year", column=d), agg=agg,
                             column=col, k=1))
        else:
            years = ctx.sampler.years(t, d)
            if years:
                out.append(Query(op="top", table=t, group=Group(kind="month", column=d),
                                 agg=agg, column=col, k=1,
                                 conds=[Cond(op="year", column=d, value=rng.choice(years))]))
    return out


def _two_groups(ctx: Context, t: str, g: Group, rng: random.Random) -> list[Any]:
    if g.kind == "column":
        values = [v for v, _ in ctx.slices.dictionary(t, g.column)[:8]]
        values = [v for v in values if v is not None]
        return sorted(rng.sample(values, 2), key=str) if len(values) >= 2 else []
    vals = ctx.sampler.pick(
        f"SELECT DISTINCT p.{qi(g.label)} FROM {qi(g.table)} AS p WHERE p.{qi(g.key)} IN "
        f"(SELECT {qi(g.column)} FROM {qi(t)}) AND {_text_ok('p.' + qi(g.label))}", rng, 2)
    return vals if len(vals) == 2 else []


@template("comparison.compare")
def _compare(ctx: Context, rng: random.Random) -> list[Query]:
    out = []
    combos = [(t, g) for t in sorted(ctx.slices.measures) for g, _ in
              ctx.slices.group_options(t)]
    for t, g in _spread(rng, combos, ctx.variants + 1):
        values = _two_groups(ctx, t, g, rng)
        if values:
            agg, col = rng.choice(_measure_options(ctx, t, g))
            out.append(Query(op="compare", table=t, group=g, agg=agg, column=col, values=values))
    return out


@template("comparison.difference")
def _difference(ctx: Context, rng: random.Random) -> list[Query]:
    out = []
    combos = [(t, g) for t in sorted(ctx.slices.measures) for g, _ in
              ctx.slices.group_options(t)]
    for t, g in _spread(rng, combos, ctx.variants):
        values = _two_groups(ctx, t, g, rng)
        if not values:
            continue
        agg, col = rng.choice(_measure_options(ctx, t, g))
        q = Query(op="difference", table=t, group=g, agg=agg, column=col, values=values)
        # the larger first, so the question asks for a positive difference
        measures = {str(r[0]): r[1] for r in ctx.sampler.rows(sql_group_measures(q))}
        a, b = (measures.get(str(v)) for v in values)
        if a is None or b is None or a == b:
            continue
        if a < b:
            q = q.model_copy(update={"values": values[::-1]})
        out.append(q)
    return out
