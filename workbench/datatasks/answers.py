"""Answer specs, gold answers and the answer check (the verifier and the MCTS reward).

A gold answer is plain JSON in a canonical form fixed by its `AnswerSpec`:

- `scalar`: one value (`42`, `3.14`, `"Rock"`);
- `set`: a sorted list of distinct values (`["AC/DC", "Accept"]`);
- `table`: a list of rows, sorted unless `ordered` (`[[2009, 83], [2010, 83]]`).

`check_answer(spec, gold, predicted)` accepts what an agent is likely to hand back: a value,
a list, a list of rows or records, a dict of columns, `{"columns", "rows"}`, a `SqlResult`,
a `PythonResult`, an `Observation`, a pandas DataFrame/Series or numpy values. Numbers compare
with the spec's tolerance (ints exactly, `"2009"` equals `2009`), strings case- and
whitespace-insensitively, null-likes (None, NaN, "", "null") equal each other, sets ignore order
and repeats, tables are multisets of rows (column order ignored unless the spec says
otherwise), and a scalar equals a 1x1 table. Predictions that admit several readings (a dict
may be one record or a mapping of group to value) pass when any reading matches.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any, Literal

from pydantic import ConfigDict, Field

from workbench.records import StrictModel

AnswerKind = Literal["scalar", "set", "table"]
Comparison = Literal["exact", "tolerance", "set"]

_NULLS = {"", "null", "none", "nan", "n/a", "na", "<na>", "nat"}
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")
_ZERO_TIME = re.compile(r"[ t]00:00:00(\.0+)?$")
_MAX_PERMUTED_COLUMNS = 6


class AnswerSpec(StrictModel):
    """How a task's answer is shaped and compared."""

    model_config = ConfigDict(frozen=True)

    kind: AnswerKind
    comparison: Comparison = "exact"
    rel_tol: float = Field(1e-4, ge=0, description="Relative tolerance (comparison=tolerance).")
    abs_tol: float = Field(1e-6, ge=0, description="Absolute tolerance (comparison=tolerance).")
    columns: list[str] = Field(default_factory=list, description="A table's gold header.")
    ordered: bool = Field(False, description="Table rows compared in order.")
    ignore_column_order: bool = Field(True, description="Table columns matched in any order.")


# --- values ----------------------------------------------------------------------------------


def _plain(v: Any) -> Any:
    """numpy/pandas scalars → Python; bool → int; NaN and null-like strings → None."""
    if v is None:
        return None
    if hasattr(v, "item") and not isinstance(v, (str, bytes, list, tuple, dict)):
        try:
            v = v.item()
        except (TypeError, ValueError):
            pass
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, str):
        s = v.strip()
        return None if s.lower() in _NULLS else s
    if type(v).__name__ in ("NaTType", "NAType"):
        return None
    return v


def as_number(v: Any) -> int | float | None:
    """A number, or a string that spells one ("1,234.5", " 42 "); None otherwise."""
    v = _plain(v)
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, str):
        s = v.replace(" ", "")
        if _THOUSANDS.match(s):
            s = s.replace(",", "")
        if _NUMBER.match(s):
            try:
                return int(s) if re.fullmatch(r"[+-]?\d+", s) else float(s)
            except (ValueError, OverflowError):
                return None
    return None


def normalise_text(s: str) -> str:
    """Casefolded, whitespace collapsed, outer quotes and a zero time of day removed."""
    s = " ".join(str(s).split()).casefold()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"`":
        s = s[1:-1].strip()
    return _ZERO_TIME.sub("", s)


def values_equal(gold: Any, predicted: Any, *, tolerance: bool = False, rel_tol: float = 1e-4,
                 abs_tol: float = 1e-6) -> bool:
    """One cell against another (see the module docstring for the rules)."""
    g, p = _plain(gold), _plain(predicted)
    if g is None or p is None:
        return g is None and p is None
    gn, pn = as_number(g), as_number(p)
    if gn is not None and pn is not None:
        if isinstance(gn, int) and isinstance(pn, int):
            return gn == pn
        if math.isinf(gn) or math.isinf(pn):
            return gn == pn
        if tolerance:
            return math.isclose(gn, pn, rel_tol=rel_tol, abs_tol=abs_tol)
        return math.isclose(gn, pn, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(g, (int, float)) or isinstance(p, (int, float)):
        return False  # a number against a word
    return normalise_text(str(g)) == normalise_text(str(p))


# --- shapes ----------------------------------------------------------------------------------


def _is_scalar(v: Any) -> bool:
    return not isinstance(v, (list, tuple, dict, set, frozenset)) and not _is_frame(v) \
        and not _is_array(v)


def _is_frame(v: Any) -> bool:
    return type(v).__name__ == "DataFrame" and hasattr(v, "to_numpy")


def _is_series(v: Any) -> bool:
    return type(v).__name__ == "Series" and hasattr(v, "tolist")


def _is_array(v: Any) -> bool:
    return type(v).__name__ == "ndarray" and hasattr(v, "tolist")


def _unwrap(x: Any) -> Any:
    """SqlResult / PythonResult / Observation → their data."""
    name = type(x).__name__
    if name == "Observation":
        inner = getattr(x, "sql", None) or getattr(x, "python", None)
        return _unwrap(inner) if inner is not None else getattr(x, "text", None)
    if name == "SqlResult":
        return {"columns": list(x.columns), "rows": [list(r) for r in x.rows]}
    if name == "PythonResult":
        return x.result
    return x


def readings(predicted: Any, kind: AnswerKind | None = None) -> list[list[list[Any]]]:
    """Every plausible reading of a prediction as a list of rows (lists of cells)."""
    x = _unwrap(predicted)
    if _is_frame(x):
        return [[list(r) for r in x.to_numpy().tolist()]]
    if _is_series(x) or _is_array(x):
        x = x.tolist()
    if isinstance(x, (set, frozenset)):
        x = sorted(x, key=sort_key)
    if isinstance(x, dict):
        return _dict_readings(x)
    if isinstance(x, (list, tuple)):
        items = list(x)
        if not items:
            return [[]]
        if all(isinstance(r, (list, tuple)) for r in items):
            return [[list(r) for r in items]]
        if all(isinstance(r, dict) for r in items):
            return [[list(r.values()) for r in items]]
        if all(_is_scalar(r) for r in items):
            return [[[v] for v in items], [items]]  # a column, or one row
        return [[[v] if _is_scalar(v) else list(v) if isinstance(v, (list, tuple)) else [v]
                 for v in items]]
    out = [[[x]]]
    if isinstance(x, str) and kind in ("set", "table"):
        for sep in ("\n", ";", ","):
            parts = [p.strip() for p in x.split(sep)]
            if len(parts) > 1 and all(parts):
                out.append([[p] for p in parts])
                break
    return out


def _dict_readings(d: dict) -> list[list[list[Any]]]:
    if "rows" in d and isinstance(d["rows"], (list, tuple)):
        return readings(d["rows"])
    if not d:
        return [[]]
    vals = list(d.values())
    if all(isinstance(v, (list, tuple)) for v in vals) and len({len(v) for v in vals}) == 1:
        return [[list(r) for r in zip(*vals, strict=True)]]  # columns → rows
    if all(isinstance(v, dict) for v in vals):  # pandas to_dict(): {column: {index: value}}
        index = list(vals[0])
        if all(list(v) == index for v in vals):
            return [[[v[i] for v in vals] for i in index]]
    if all(_is_scalar(v) for v in vals):
        return [[vals], [[k, v] for k, v in d.items()]]  # one record, or group → value
    return [[vals]]


# --- canonical gold ----------------------------------------------------------------------------


def sort_key(v: Any) -> tuple:
    v = _plain(v)
    if v is None:
        return (0, 0, "")
    n = as_number(v) if not isinstance(v, str) else None
    if n is not None:
        return (1, n, "")
    return (2, 0, str(v))


def _row_key(r: list) -> tuple:
    return tuple(sort_key(v) for v in r)


def canonical_gold(spec: AnswerSpec, rows: list[list[Any]]) -> Any:
    """The gold answer in its canonical form, from a program's result rows (already checked
    to have the spec's shape)."""
    clean = [[_plain(v) for v in r] for r in rows]
    if spec.kind == "scalar":
        return clean[0][0]
    if spec.kind == "set":
        out: list[Any] = []
        for (v,) in sorted(clean, key=_row_key):
            if not any(values_equal(v, o) for o in out):
                out.append(v)
        return out
    return clean if spec.ordered else sorted(clean, key=_row_key)


def shape_problem(spec: AnswerSpec, rows: list[list[Any]]) -> str | None:
    """Why result rows cannot be the answer of `spec` (None when they can)."""
    if spec.kind == "scalar":
        if len(rows) != 1 or len(rows[0]) != 1:
            return f"a scalar needs one row of one column, got {len(rows)} rows"
        return None
    if any(len(r) != len(rows[0]) for r in rows):
        return "ragged rows"
    want = 1 if spec.kind == "set" else len(spec.columns) or None
    if rows and want is not None and len(rows[0]) != want:
        return f"expected {want} columns, got {len(rows[0])}"
    return None


def answer_key(spec: AnswerSpec, gold: Any) -> str:
    """A stable text for an answer (numbers to 9 significant digits, text normalised)."""
    def norm(v: Any) -> Any:
        if isinstance(v, list):
            return [norm(x) for x in v]
        n = as_number(v)
        if n is not None and not isinstance(v, str):
            return float(f"{n:.9g}")
        return normalise_text(v) if isinstance(v, str) else v
    return json.dumps([spec.kind, norm(gold)], ensure_ascii=False, sort_keys=True)


# --- the check -------------------------------------------------------------------------------


def check_answer(spec: AnswerSpec, gold: Any, predicted: Any) -> bool:
    """True when `predicted` is the gold answer under `spec`. Never raises."""
    try:
        return any(_match(spec, gold, rows) for rows in readings(predicted, spec.kind))
    except Exception:  # noqa: BLE001 - a malformed prediction is a wrong answer
        return False


def _eq(spec: AnswerSpec):
    tol = spec.comparison == "tolerance"

    def eq(a: Any, b: Any) -> bool:
        return values_equal(a, b, tolerance=tol, rel_tol=spec.rel_tol, abs_tol=spec.abs_tol)
    return eq


def _match(spec: AnswerSpec, gold: Any, rows: list[list[Any]]) -> bool:
    eq = _eq(spec)
    if spec.kind == "scalar":
        return len(rows) == 1 and len(rows[0]) == 1 and eq(gold, rows[0][0])
    if spec.kind == "set":
        if any(len(r) != 1 for r in rows):
            return False
        return _same_set(list(gold), [r[0] for r in rows], eq)
    gold_rows = [list(r) if isinstance(r, (list, tuple)) else [r] for r in gold]
    return _same_table(spec, gold_rows, rows, eq)


def _distinct(values: list[Any], eq) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if not any(eq(o, v) for o in out):
            out.append(v)
    return out


def _same_set(gold: list[Any], pred: list[Any], eq) -> bool:
    g, p = _distinct(gold, eq), _distinct(pred, eq)
    if len(g) != len(p):
        return False
    left = list(p)
    for v in g:
        for i, w in enumerate(left):
            if eq(v, w):
                del left[i]
                break
        else:
            return False
    return True


def _rows_match(gold: list[list[Any]], pred: list[list[Any]], eq, ordered: bool) -> bool:
    if len(gold) != len(pred):
        return False
    if ordered:
        return all(all(eq(a, b) for a, b in zip(g, p, strict=True))
                   for g, p in zip(gold, pred, strict=True))
    left = list(pred)
    for g in gold:
        for i, p in enumerate(left):
            if all(eq(a, b) for a, b in zip(g, p, strict=True)):
                del left[i]
                break
        else:
            return False
    return True


def _same_table(spec: AnswerSpec, gold: list[list[Any]], pred: list[list[Any]], eq) -> bool:
    if len(gold) != len(pred):
        return False
    if not gold:
        return True
    width = len(gold[0])
    if any(len(r) != width for r in pred):
        return False
    if width == 1:
        return _rows_match(gold, pred, eq, spec.ordered)
    if not spec.ignore_column_order or width > _MAX_PERMUTED_COLUMNS:
        return _rows_match(gold, pred, eq, spec.ordered)
    # columns whose value multisets match are the only candidates for each gold column
    gcols = [[r[j] for r in gold] for j in range(width)]
    pcols = [[r[i] for r in pred] for i in range(width)]
    fits = [[i for i in range(width)
             if _rows_match([[v] for v in gcols[j]], [[v] for v in pcols[i]], eq, spec.ordered)]
            for j in range(width)]
    if any(not f for f in fits):
        return False
    for perm in itertools.product(*fits):
        if len(set(perm)) != width:
            continue
        permuted = [[r[i] for i in perm] for r in pred]
        if _rows_match(gold, permuted, eq, spec.ordered):
            return True
    return False
