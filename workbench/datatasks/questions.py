"""The template text of the question a query answers."""

from __future__ import annotations

from workbench.datatasks.queries import AGG_WORD, Cond, Group, Query, Scalar, need, year_of


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
        return f"whose {c.column} is in {year_of(c.value)}"
    verb = "linked to" if c.op == "via" else "referenced by"
    inner = " and ".join(_phrase(i) for i in c.inner)
    table = need(c.table, "table")
    return f"{verb} {_article(table)} {table} row" + (f" {inner}" if inner else "")


def _predicate(c: Cond) -> str:
    if c.op == "eq":
        return f"have {c.column} {fmt_value(c.value)}"
    if c.op == "gt":
        return f"have {c.column} greater than {fmt_value(c.value)}"
    if c.op == "lt":
        return f"have {c.column} less than {fmt_value(c.value)}"
    if c.op == "year":
        return f"have {c.column} in {year_of(c.value)}"
    return "are " + _phrase(c)


def scope_text(table: str, conds: list[Cond], *, singular: bool = False) -> str:
    head = f"{table} row" if singular else f"{table} rows"
    return head + ("" if not conds else " " + " and ".join(_phrase(c) for c in conds))


def group_name(group: Group | None, plural: bool = False) -> str:
    g = need(group, "group")
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
            return f"Which {group_name(q.group)} has {_superlative(q, scope)}?"
        return f"Which {q.k} {group_name(q.group, True)} have {_superlative(q, scope)}?"
    if q.op == "group":
        if q.k:
            what = "number of rows" if q.agg == "count" else f"{AGG_WORD[q.agg]} {q.column}"
            return (f"List the {q.k} {group_name(q.group, True)} with {_superlative(q, scope)},"
                    f" each with its {what}.")
        g = group_name(q.group).removesuffix(" value")
        if q.agg == "count":
            return f"How many {scope} are there for each {g}?"
        return f"What is the {AGG_WORD[q.agg]} {q.column} of {scope} for each {g}?"
    if q.op == "compare":
        a, b = (fmt_value(v) for v in q.values)
        g = group_name(q.group)
        if q.agg == "count":
            return f"Which {g} has more {scope}: {a} or {b}?"
        return f"Which {g} has the higher {AGG_WORD[q.agg]} {q.column} over {scope}: {a} or {b}?"
    if q.op == "difference":
        a, b = (fmt_value(v) for v in q.values)
        g = group_name(q.group)
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
