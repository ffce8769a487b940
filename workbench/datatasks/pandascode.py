"""A query as a pandas program for the Python sandbox (`tables` holds the DataFrames): the
third, independent way a task's answer is computed."""

from __future__ import annotations

from workbench.datatasks.queries import Cond, Group, Query, need, year_of


def _t(name: str | None) -> str:
    return f"tables[{need(name, 'table')!r}]"


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
            terms.append(f"(pd.to_datetime({col}, errors='coerce').dt.year == {year_of(c.value)})")
        else:
            other = _t(c.table)
            inner = _mask_pd(c.inner, other)
            keys = f"{other}.loc[{inner}, {c.other!r}]" if c.inner else f"{other}[{c.other!r}]"
            terms.append(f"{col}.isin({keys})")
    return " & ".join(terms) if terms else f"pd.Series(True, index={d}.index)"


def _group_pd(group: Group | None, d: str) -> str:
    g = need(group, "group")
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
            call = {"sum": "sum(min_count=1)", "avg": "mean()", "min": "min()",
                    "max": "max()"}[q.agg]
            lines.append(f"s = dd.groupby(kk)[{col}].{call}")
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
