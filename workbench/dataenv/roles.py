"""Column roles: what a column is, for the aggregations a question may ask of it.

A role comes from the column's name, type and values, never from the table's size: a row index
is an identifier whether it runs 1..n or skips rows (a sampled table); a code whose values are
another table's key (a route or order number, a text code) is an identifier in both tables;
an angle (a bearing, a wind direction, a heading in degrees) is never averaged or added.
`infer_role` reads one column's profile; `profile.profile_database` adds what needs the data
(the values' order, joins by value) and the profile keeps the result, where a person may
correct it.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Protocol


class ColumnFacts(Protocol):
    """What a role is read from: `profile.ColumnProfile` has these (a protocol, so this
    module needs nothing from the profile's). Read-only: the profile is a frozen model."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def is_unique(self) -> bool: ...
    @property
    def distinct_count(self) -> int: ...
    @property
    def min(self) -> Any: ...
    @property
    def max(self) -> Any: ...
    @property
    def dictionary(self) -> Any: ...

# An identifier (a key, a code, a row index) is counted, never added or averaged; a timestamp
# or a clock time has an earliest and a latest; an intensive measurement (a temperature, an
# altitude, a price per unit) an average, a minimum and a maximum; only an additive amount (a
# quantity, a total, a duration, bytes) a sum; an angle none of these (the mean of 350 and 10
# degrees is not 180).
ColumnRole = Literal["identifier", "timestamp", "clock", "amount", "measurement", "category",
                     "text", "angle", "other"]

_ID_TOKENS = {"id", "key", "pk", "index", "idx", "rowid", "unnamed", "uuid", "guid",
              "rownames", "rowname", "rownum", "row"}
# the last word of a number that names something (order_number, route_no, stop_code, and a
# number kept as a name: route_short_name)
_CODE_TOKENS = {"no", "num", "number", "nr", "code", "ref", "name", "label"}
# things that are named by a number (a route 7, a flight 4021), as the column's last word
_NUMBERED = {"route", "flight", "invoice", "ticket", "account", "station", "store", "branch",
             "order", "trip", "vehicle", "bus", "train", "sku", "isbn", "postcode", "zipcode"}
_ANGLE_TOKENS = {"angle", "bearing", "azimuth", "heading", "direction", "dir", "orientation",
                 "course", "winddir", "wdir", "yaw", "aspect", "deg", "degree", "degrees"}
_TEMPERATURE = {"c", "f", "celsius", "fahrenheit", "temp", "temperature", "k", "kelvin"}
_CLOCK_TOKENS = {"time", "hour", "hr", "minute", "clock", "hhmm", "oclock"}
_DURATION_TOKENS = {"elapsed", "worked", "air", "spent", "duration", "runtime", "uptime",
                    "downtime", "minutes", "hours"}
_CALENDAR_TOKENS = {"year", "yr", "month", "day", "week", "quarter", "date", "dob", "weekday"}
_AMOUNT_TOKENS = {"total", "amount", "quantity", "qty", "count", "sales", "revenue", "cost",
                  "costs", "spend", "spent", "paid", "bytes", "milliseconds", "ms", "seconds",
                  "duration", "population", "volume", "units", "income", "profit", "budget",
                  "fee", "fees", "charge", "charges", "sum", "visits", "deaths", "cases",
                  "points", "goals", "wins", "losses", "tons", "kwh", "rainfall",
                  "precipitation", "distance", "miles", "km"}
_CATEGORY_TOKENS = {"class", "type", "grade", "level", "category", "group", "kind",
                    "status", "flag", "tier", "zip", "postcode", "phone"}


def name_tokens(name: str) -> list[str]:
    """`DepTime` -> dep, time; `dew_point_c` -> dew, point, c; `Unnamed: 0` -> unnamed, 0."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
    return [t for t in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if t]


def is_angle(c: ColumnFacts) -> bool:
    """A number named as an angle (bearing, wind_dir, heading_deg) whose values lie within
    one turn either way; a temperature in degrees (temp_deg_c) is not one."""
    tokens = set(name_tokens(c.name))
    if c.kind not in ("integer", "real") or not tokens & _ANGLE_TOKENS or \
            tokens & _TEMPERATURE:
        return False
    lo, hi = c.min, c.max
    return isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and \
        -360 <= lo and hi <= 360


def names_a_code(name: str) -> bool:
    """`order_number`, `route_no`, `stop_code`, `flight`: a number that names a thing;
    `number_of_stops`, `num_items` are counts."""
    tokens = name_tokens(name)
    if not tokens or (tokens[0] in ("number", "num", "n", "no") and len(tokens) > 1):
        return False
    return tokens[-1] in _CODE_TOKENS | _NUMBERED


def infer_role(c: ColumnFacts, rows: int, primary_key: list[str], *,
               in_row_order: bool = False) -> ColumnRole:
    """A column's role from its name, type and values (see `ColumnRole`). `in_row_order`:
    its values are unique integers that rise row by row (a row index, even with gaps)."""
    tokens = set(name_tokens(c.name))
    numeric = c.kind in ("integer", "real")
    if c.kind == "datetime":
        return "timestamp"
    if c.name in primary_key or tokens & _ID_TOKENS:  # ArtistId, flower_id, Unnamed: 0
        return "identifier"
    if numeric and c.kind == "integer" and c.is_unique and rows > 2 and \
            c.min in (0, 1) and c.max == c.min + rows - 1:
        return "identifier"  # 0..n-1 or 1..n: a row index, whatever its name
    if is_angle(c):
        return "angle"
    if tokens & _CLOCK_TOKENS and not tokens & (_AMOUNT_TOKENS | _DURATION_TOKENS):
        return "clock"
    if numeric and tokens & _DURATION_TOKENS:
        return "amount"  # hours_worked, AirTime, ElapsedTime: durations add up
    if tokens & _CALENDAR_TOKENS:
        return "timestamp"
    if numeric and names_a_code(c.name):
        return "identifier"  # order_number, route_no, stop_code: a code, not a quantity
    if c.kind == "text":
        return "category" if c.dictionary and not c.is_unique else "text"
    if not numeric:
        return "other"
    rest = tokens - {"total"}
    total_of_a_quantity = "total" in tokens and rest and not rest & _AMOUNT_TOKENS
    if tokens & _AMOUNT_TOKENS and not total_of_a_quantity:
        return "amount"  # "Total", "total_sales"; not "total_phenols" (a concentration)
    if c.distinct_count <= 2 and c.min in (0, 1) and c.max in (0, 1):
        return "amount"  # a 0/1 flag: its sum counts the yeses, its average is a share
    if tokens & _CATEGORY_TOKENS and c.kind == "integer" and c.dictionary:
        return "category"
    if in_row_order and c.kind == "integer" and c.is_unique and rows > 2:
        return "identifier"  # 3, 17, 20, ...: the index of a sample of a larger table
    return "measurement"
