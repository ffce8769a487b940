"""A schema-grounded grammar of queries, decided one slot at a time (the explorer's moves).

A plan is filled in a fixed order of slots: the operation (count, aggregate, look up, list,
rank, group, compare, ...), the table, the measure or column, the grouping, k and direction,
then one slot per literal the question states (a quoted value or a number), each either a
filter on a column of the table, of a parent along a join key (one or two hops) or of a
child, or left out. The last move submits the plan: it is rendered to SQL by the same query
language the task pool uses (`queries.sql_a`) and run in the sandbox.

Options come from the schema and the question only, never from the task's reference program:
tables and columns the question names are preferred (all of them when it names none), string
literals become equality filters on the columns whose value dictionary holds them (or, for
columns without a dictionary, where a read-only probe finds them), numbers become comparisons
on numeric columns, years on date columns, or k. Every slot has finitely many options and
the slots are finite, so every path ends.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from workbench.dataenv.profile import ColumnProfile, EnvProfile
from workbench.datatasks.queries import AGG_WORD, Cond, Group, Query, need, sql_a
from workbench.datatasks.questions import fmt_value
from workbench.datatasks.slices import Slices, is_keylike

OPS = ("count", "agg", "count_distinct", "lookup", "select", "top", "group", "argmax",
       "compare", "difference", "above_avg", "share")
OP_TEXT = {
    "count": "count the rows",
    "agg": "the total, average, minimum or maximum of a column",
    "count_distinct": "count the distinct values of a column",
    "lookup": "look up a value of one row",
    "select": "list the distinct values of a column",
    "top": "find which group has the most or the highest value",
    "group": "list the groups, each with its count or total",
    "argmax": "find the row with the highest or lowest value",
    "compare": "compare two groups and say which has more",
    "difference": "how much more one group has than another",
    "above_avg": "count the rows above the average",
    "share": "the percentage of rows that meet a condition",
}
_FIELD = {"op": "op", "table": "table", "column": "column", "target": "target",
          "group": "group", "direction": "descending"}  # slots that set one plan field
_NEEDS_MEASURE = ("agg", "top", "group", "compare", "difference")
_RANKED = ("top", "argmax")
MAX_K = 50

Probe = Callable[[str, str, Any], bool]  # (table, column, value) -> the value occurs there


@dataclass(frozen=True)
class Lit:
    """A value the question states."""

    text: str
    value: Any
    quoted: bool


@dataclass(frozen=True)
class Move:
    """One decision: the slot it fills, what it puts there, and a short text (scored by the
    prior model and shown in the tree browser)."""

    slot: str
    key: str
    text: str
    value: Any = None

    def to_json(self) -> dict[str, Any]:
        v = self.value
        if hasattr(v, "model_dump"):
            v = v.model_dump(mode="json")
        elif isinstance(v, tuple):
            v = [x.model_dump(mode="json") if hasattr(x, "model_dump") else x for x in v]
        return {"slot": self.slot, "key": self.key, "text": self.text, "value": v}


_QUOTED = re.compile(r"(?<![\w])'")
_NUMBER = re.compile(r"(?<![\w.'])[-+]?\d+(?:\.\d+)?(?![\w.]*\w)")


def _number(s: str) -> int | float:
    f = float(s)
    return int(f) if re.fullmatch(r"[-+]?\d+", s) else f


def literals(question: str) -> list[Lit]:
    """Quoted values ('...', closed by a quote before a space, punctuation or the end; a value
    with an apostrophe inside also yields its longer reading) and bare numbers, in order."""
    out: list[Lit] = []
    spans: list[tuple[int, int]] = []
    for m in _QUOTED.finditer(question):
        start = m.end()
        ends = [e.start() for e in re.finditer("'", question[start:])]
        closes = [start + e for e in ends
                  if start + e + 1 >= len(question) or not question[start + e + 1].isalnum()]
        if not closes or any(a <= m.start() < b for a, b in spans):
            continue
        for end in dict.fromkeys([closes[0], closes[-1]] if len(closes) > 1 else closes):
            text = question[start:end]
            if text and all(lit.text != text for lit in out):
                out.append(Lit(text=text, value=text, quoted=True))
        spans.append((m.start(), closes[0] + 1))
    masked = list(question)
    for a, b in spans:
        masked[a:b] = " " * (b - a)
    for m in _NUMBER.finditer("".join(masked)):
        out.append(Lit(text=m.group(), value=_number(m.group()), quoted=False))
    order = {lit.text: question.find(lit.text) for lit in out}
    return sorted(out, key=lambda lit: order[lit.text])


def _loose(s: str) -> str:
    return re.sub(r"[\s_]+", "", s).casefold()


def _spaced(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name).replace("_", " ").casefold()


def mentions(question: str, name: str) -> bool:
    """Does the question name `name` (case, spaces, underscores and camel case ignored)?"""
    q = question.casefold()
    for form in {name.casefold(), _spaced(name), _loose(name)}:
        if re.search(r"(?<!\w)" + re.escape(form) + r"s?(?!\w)", q):
            return True
    return False


@dataclass(frozen=True)
class Plan:
    """The slots filled so far (immutable: every tree node holds its own)."""

    op: str | None = None
    table: str | None = None
    agg: str = "count"
    column: str | None = None
    target: str | None = None
    group: Group | None = None
    k: int | None = None
    descending: bool = True
    values: tuple = ()
    conds: tuple = ()
    extra: tuple = ()
    used: frozenset = frozenset()  # literal texts consumed by k / values
    filled: tuple = ()  # slot names filled, in order
    lit_done: int = 0  # literal slots decided
    submitted: bool = False

    def query(self) -> Query:
        return Query(op=self.op, table=self.table, conds=list(self.conds), column=self.column,
                     agg=self.agg, group=self.group, k=self.k, values=list(self.values),
                     target=self.target, extra=list(self.extra), descending=self.descending)

    def sql(self) -> str:
        return sql_a(self.query())


@dataclass
class Grammar:
    """The slot options for one question over one environment's profile."""

    profile: EnvProfile
    question: str
    probe: Probe | None = None
    max_hops: int = 2
    slices: Slices = field(init=False)
    lits: list[Lit] = field(init=False)

    def __post_init__(self) -> None:
        self.slices = Slices(self.profile)
        self.lits = literals(self.question)
        self._mentioned_tables = [t.name for t in self.profile.tables
                                  if mentions(self.question, t.name)]
        self._probe_cache: dict[tuple, bool] = {}

    # --- helpers ----------------------------------------------------------------------------

    def columns(self, table: str) -> list[ColumnProfile]:
        return list(self.profile.table(table).columns)

    def _named(self, cols: list[str]) -> list[str]:
        """The columns the question names, or all of them when it names none."""
        named = [c for c in cols if mentions(self.question, c)]
        return named or cols

    def _numeric(self, table: str) -> list[str]:
        return [c.name for c in self.columns(table) if c.kind in ("integer", "real")
                and not is_keylike(c.name) and c.distinct_count >= 2]

    def _occurs(self, table: str, col: ColumnProfile, value: Any) -> bool:
        if col.dictionary is not None:
            return any(v.value == value for v in col.dictionary)
        if self.probe is None:
            return False
        key = (table, col.name, value)
        if key not in self._probe_cache:
            self._probe_cache[key] = bool(self.probe(table, col.name, value))
        return self._probe_cache[key]

    def _pending(self, plan: Plan) -> list[Lit]:
        return [lit for lit in self.lits if lit.text not in plan.used]

    # --- slots -----------------------------------------------------------------------------

    def slots(self, plan: Plan) -> list[str]:
        """The slot order for the plan's operation."""
        if plan.op is None:
            return ["op"]
        s = ["op", "table"]
        if plan.op in _NEEDS_MEASURE and plan.op != "agg":
            s.append("group")
        if plan.op in _NEEDS_MEASURE:
            s.append("measure")
        if plan.op in ("count_distinct", "lookup", "select", "above_avg", "argmax"):
            s.append("column")
        if plan.op == "argmax":
            s.append("target")
        if plan.op in ("top", "group"):
            s.append("k")
        if plan.op in ("compare", "difference"):
            s.append("values")
        if plan.op in _RANKED or (plan.op == "group" and plan.k):
            s.append("direction")
        return s

    def next_slot(self, plan: Plan) -> str | None:
        """The next slot to fill; "lit" for a literal's filter, "submit" at the end; None once
        submitted."""
        if plan.submitted:
            return None
        for s in self.slots(plan):
            if s not in plan.filled:
                return s
        if plan.lit_done < len(self._pending(plan)):
            return "lit"
        return "submit"

    def options(self, plan: Plan) -> list[Move]:
        slot = self.next_slot(plan)
        if slot is None:
            return []
        return getattr(self, f"_opt_{slot}")(plan)

    def apply(self, plan: Plan, move: Move) -> Plan:
        """The plan with `move` made (moves come from `options(plan)`)."""
        if move.slot == "submit":
            return replace(plan, submitted=True)
        if move.slot == "lit":
            _text, cond, part = move.value
            p = replace(plan, lit_done=plan.lit_done + 1)
            if cond is None:
                return p
            if part == "extra":
                return replace(p, extra=(*p.extra, cond))
            return replace(p, conds=(*p.conds, cond))
        p = replace(plan, filled=(*plan.filled, move.slot))
        if move.slot in _FIELD:
            return replace(p, **{_FIELD[move.slot]: move.value})
        if move.slot == "measure":
            agg, col = move.value
            return replace(p, agg=agg, column=col)
        if move.slot == "k":
            k, text = move.value
            return replace(p, k=k, used=p.used | ({text} if text else set()))
        if move.slot == "values":
            values, texts = move.value
            return replace(p, values=tuple(values), used=p.used | set(texts))
        raise ValueError(move.slot)

    # --- options per slot --------------------------------------------------------------------

    def _opt_op(self, plan: Plan) -> list[Move]:
        out = []
        for op in OPS:
            if op in ("compare", "difference") and len(self.lits) < 2:
                continue
            if op == "share" and not self.lits:
                continue
            out.append(Move("op", op, OP_TEXT[op], op))
        return out

    def _opt_table(self, plan: Plan) -> list[Move]:
        names = self._mentioned_tables or [t.name for t in self.profile.tables]
        return [Move("table", t, f"from the {t} table", t) for t in names
                if self.profile.table(t).row_count > 0 and self._fits(need(plan.op, "op"), t)]

    def _fits(self, op: str, table: str) -> bool:
        """Can the rest of the plan be filled on this table (no dead ends later)?"""
        if op in ("agg", "argmax", "above_avg"):
            return bool(self._numeric(table))
        if op in ("top", "group", "compare", "difference"):
            return bool(self.slices.group_options(table) or self.slices.dates.get(table))
        return True

    def _opt_measure(self, plan: Plan) -> list[Move]:
        out = []
        if plan.op != "agg":
            out.append(Move("measure", "count", "the number of rows", ("count", None)))
        for col in self._named(self._numeric(need(plan.table, "table"))):
            for agg in ("sum", "avg", "min", "max"):
                out.append(Move("measure", f"{agg}:{col}", f"the {AGG_WORD[agg]} {col}",
                                (agg, col)))
        return out

    def _opt_column(self, plan: Plan) -> list[Move]:
        table = need(plan.table, "table")
        cols = [c.name for c in self.columns(table)]
        if plan.op in ("above_avg", "argmax"):
            cols = self._numeric(table)
        elif plan.op in ("count_distinct", "select"):
            cols = [c for c in cols if not is_keylike(c)] or cols
        return [Move("column", c, f"the {c} column", c) for c in self._named(cols)]

    def _opt_target(self, plan: Plan) -> list[Move]:
        cols = [c.name for c in self.columns(need(plan.table, "table"))
                if c.name != plan.column]
        return [Move("target", c, f"report its {c}", c) for c in self._named(cols)]

    def _opt_group(self, plan: Plan) -> list[Move]:
        t = need(plan.table, "table")
        opts: list[tuple[Group, str]] = [(g, g.column if g.kind == "column"
                                          else f"{g.table} {g.label}")
                                         for g, _ in self.slices.group_options(t)]
        for c in self.slices.dates.get(t, []):
            opts += [(Group(kind="year", column=c), f"year of {c}"),
                     (Group(kind="month", column=c), f"month of {c}")]
        named = [(g, text) for g, text in opts
                 if mentions(self.question, need(g.label, "label") if g.kind == "via"
                             else g.column)
                 and (g.kind != "via" or mentions(self.question, need(g.table, "table")))]
        return [Move("group", f"{g.kind}:{g.column}:{g.table or ''}", f"grouped by {text}", g)
                for g, text in (named or opts)]

    def _opt_k(self, plan: Plan) -> list[Move]:
        out = []
        if plan.op == "top":
            out.append(Move("k", "1", "the single top group", (1, None)))
        else:
            out.append(Move("k", "all", "every group", (None, None)))
        for lit_ in self.lits:
            if not lit_.quoted and isinstance(lit_.value, int) and 1 < lit_.value <= MAX_K:
                out.append(Move("k", str(lit_.value), f"the top {lit_.value}",
                                (lit_.value, lit_.text)))
        return out

    def _opt_direction(self, plan: Plan) -> list[Move]:
        return [Move("direction", "desc", "highest first", True),
                Move("direction", "asc", "lowest first", False)]

    def _opt_values(self, plan: Plan) -> list[Move]:
        out = []
        for i, a in enumerate(self.lits):
            for b in self.lits[i + 1:]:
                pairs = [(a, b)] if plan.op == "compare" else [(a, b), (b, a)]
                for x, y in pairs:
                    if self._group_holds(plan, (x.value, y.value)):
                        out.append(Move("values", f"{x.text}|{y.text}",
                                        f"{fmt_value(x.value)} against {fmt_value(y.value)}",
                                        ((x.value, y.value), (x.text, y.text))))
        return out

    def _group_holds(self, plan: Plan, values: tuple) -> bool:
        g = plan.group
        if g is None or g.kind in ("year", "month"):
            return False
        table, col = (need(plan.table, "table"), g.column) if g.kind == "column" else \
            (need(g.table, "table"), need(g.label, "label"))
        cp = self.profile.table(table).column(col)
        return all(self._occurs(table, cp, v) for v in values)

    def _opt_lit(self, plan: Plan) -> list[Move]:
        lit_ = self._pending(plan)[plan.lit_done]
        parts = ("conds", "extra") if plan.op == "share" else ("conds",)
        out = []
        for cond in self.conditions(need(plan.table, "table"), lit_):
            for part in parts:
                where = " (in the numerator)" if part == "extra" else ""
                out.append(Move("lit", f"{part}:{_cond_key(cond)}",
                                _cond_text(cond) + where, (lit_.text, cond, part)))
        out.append(Move("lit", f"skip:{lit_.text}", f"{fmt_value(lit_.value)} is not a filter",
                        (lit_.text, None, "conds")))
        return out

    def conditions(self, table: str, lit_: Lit, hops: int | None = None) -> list[Cond]:
        """Filters on `table` (or a parent up to `max_hops` away, or a child) that use the
        literal."""
        hops = self.max_hops if hops is None else hops
        out = self._local(table, lit_)
        if hops > 0:
            for j in self.slices.joins:
                if j.from_table == table:
                    for inner in self.conditions(j.to_table, lit_, hops - 1):
                        out.append(Cond(op="via", column=j.from_columns[0], table=j.to_table,
                                        other=j.to_columns[0], inner=[inner]))
            if hops == self.max_hops:
                for j in self.slices.joins:
                    if j.to_table == table and j.from_table != table:
                        for inner in self._local(j.from_table, lit_):
                            out.append(Cond(op="ref", column=j.to_columns[0],
                                            table=j.from_table, other=j.from_columns[0],
                                            inner=[inner]))
        return out

    def _local(self, table: str, lit_: Lit) -> list[Cond]:
        cols = self.columns(table)
        named = {c.name for c in cols if mentions(self.question, c.name)}
        out: list[Cond] = []
        if lit_.quoted:
            text_cols = [c for c in cols if c.kind in ("text", "datetime")]
            for c in sorted(text_cols, key=lambda c: c.name not in named):
                if self._occurs(table, c, lit_.value):
                    out.append(Cond(op="eq", column=c.name, value=lit_.value))
            return out
        v = lit_.value
        numeric = [c for c in cols if c.kind in ("integer", "real")]
        pool = [c for c in numeric if c.name in named] or numeric
        for c in pool:
            if is_keylike(c.name) or c.name in self.profile.table(table).primary_key:
                if isinstance(v, int) and c.name in named:
                    out.append(Cond(op="eq", column=c.name, value=v))
                continue
            for op in ("gt", "lt", "eq"):
                out.append(Cond(op=op, column=c.name, value=v))
        if isinstance(v, int) and 1000 <= v <= 2999:
            dates = [c for c in cols if c.kind == "datetime"]
            for c in [c for c in dates if c.name in named] or dates:
                out.append(Cond(op="year", column=c.name, value=v))
        return out

    def _opt_submit(self, plan: Plan) -> list[Move]:
        return [Move("submit", "submit", "run the query", None)]


def _cond_key(c: Cond) -> str:
    if c.op in ("via", "ref"):
        return f"{c.op}:{c.table}.{c.other}:" + ",".join(_cond_key(i) for i in c.inner)
    return f"{c.op}:{c.column}={c.value!r}"


def _cond_text(c: Cond) -> str:
    words = {"eq": "is", "gt": "is greater than", "lt": "is less than", "year": "is in"}
    if c.op in ("via", "ref"):
        verb = "linked to" if c.op == "via" else "referenced by"
        return f"{verb} a {c.table} row " + " and ".join(_cond_text(i) for i in c.inner)
    return f"whose {c.column} {words[c.op]} {fmt_value(c.value)}"
