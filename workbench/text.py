"""Numbers and tables as every report writes them, so one value reads the same everywhere.

Reports used to format their own numbers and disagreed (one wrote an interval `[18.8, 70.4]`,
another `[19, 70]` for the same value). The one precision rule, for every report, summary,
log line and page:

- a proportion (accuracy, yield, share, rate) is a percentage with one decimal: `18.8%`;
- its interval is in the same unit at the same precision, without the sign: `[18.8, 70.4]`;
- a difference of proportions is in percentage points, signed, one decimal: `+6.0`, and its
  interval likewise: `[-1.2, +13.4]`;
- a p-value has two significant digits: `0.0013`, `0.046`, `1` (`2.4e-07` when tiny);
- other quantities (losses, MRR, nDCG, seconds) have fixed decimals, 3 unless a table
  says otherwise, and their intervals the same decimals as the value;
- a missing value is `-`.

Markdown tables are a header and rows of cells; a `|` inside a cell is escaped so it cannot
split the cell.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Protocol

PERCENT_DECIMALS = 1  # the one precision of percentages, their intervals and point differences
P_DIGITS = 2  # significant digits of a p-value
MISSING = "-"


def _scaled(x: float, signed: bool) -> str:
    return f"{100 * x:{'+' if signed else ''}.{PERCENT_DECIMALS}f}"


def percent(x: float | None) -> str:
    """A proportion in [0, 1] as a percentage: 0.1875 -> `18.8%`; None -> `-`."""
    return MISSING if x is None else _scaled(x, False) + "%"


def points(x: float | None, *, signed: bool = True) -> str:
    """A difference of two proportions in percentage points: 0.06 -> `+6.0` (`6.0` unsigned,
    for a margin or limit that has no direction)."""
    return MISSING if x is None else _scaled(x, signed)


def interval(low: float | None, high: float | None, *, signed: bool = False) -> str:
    """An interval of proportions on the percent scale: (0.188, 0.704) -> `[18.8, 70.4]`;
    `signed` for an interval of a difference in points: `[-1.2, +13.4]`."""
    if low is None or high is None:
        return MISSING
    return f"[{_scaled(low, signed)}, {_scaled(high, signed)}]"


def percent_interval(value: float | None, low: float | None, high: float | None) -> str:
    """A proportion with its interval: `42.0% [30.1, 54.8]` (an accuracy and its 95% CI)."""
    if value is None:
        return MISSING
    return f"{percent(value)} {interval(low, high)}" if low is not None else percent(value)


class Estimate(Protocol):
    """A proportion with its interval, as an evaluation's `Accuracy` holds it."""

    @property
    def value(self) -> float: ...
    @property
    def ci_low(self) -> float: ...
    @property
    def ci_high(self) -> float: ...


def accuracy(a: Estimate | None) -> str:
    """An accuracy record with its interval: `42.0% [30.1, 54.8]`; None -> `-`."""
    return MISSING if a is None else percent_interval(a.value, a.ci_low, a.ci_high)


def points_interval(delta: float | None, low: float | None, high: float | None) -> str:
    """A difference in points with its interval: `+6.0 [-1.2, +13.4]`."""
    if delta is None:
        return MISSING
    return f"{points(delta)} {interval(low, high, signed=True)}" if low is not None \
        else points(delta)


def number(x: float | None, places: int = 3) -> str:
    """A quantity that is not a proportion (a loss, MRR, seconds) at fixed decimals; None
    and NaN (a loss not evaluated) -> `-`."""
    return MISSING if x is None or math.isnan(x) else f"{x:.{places}f}"


def number_interval(value: float | None, low: float | None, high: float | None, *,
                    places: int = 3, signed: bool = False) -> str:
    """A quantity with its interval at the value's own precision: `0.412 [0.301, 0.520]`
    (`signed` for a difference: `+0.052 [-0.010, +0.113]`)."""
    if value is None:
        return MISSING
    sign = "+" if signed else ""
    text = f"{value:{sign}.{places}f}"
    return text if low is None or high is None else \
        f"{text} [{low:{sign}.{places}f}, {high:{sign}.{places}f}]"


def p_value(p: float | None) -> str:
    """A p-value at two significant digits: 0.001284 -> `0.0013`; None -> `-`."""
    return MISSING if p is None else f"{p:.{P_DIGITS}g}"


def _cell(value: object) -> str:
    text = MISSING if value is None else str(value)
    return " ".join(text.split("\n")).replace("|", "\\|")


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table: the header, the `|---|` rule and one line per row (None -> `-`, a
    `|` in a cell escaped, a newline made a space). No trailing newline."""
    head = [_cell(h) for h in header]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
