"""Read-only SQL against a data environment, in this process.

A connection is opened `mode=ro` with an authorizer that allows only reads (SELECT, READ,
functions other than `load_extension`, recursive CTEs, and a few introspection pragmas such as
`table_info`); `ATTACH`, `DETACH`, `VACUUM` (and `VACUUM INTO`, which SQLite authorises as an
ATTACH), every write, DDL, transactions and any pragma that sets a value are denied.
`SQLITE_LIMIT_ATTACHED` is 0, a progress handler enforces a deadline, and at most
`sql_max_rows` rows come back. `mode=ro` alone is not enough: it still allows `ATTACH` +
`CREATE` and `VACUUM INTO`.

Errors never raise to the caller: they come back in the result's `error` field, which is what
the agent sees as its observation.
"""

from __future__ import annotations

import math
import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field

from workbench.dataenv.sandboxlimits import TRUNCATION_MARKER, SandboxLimits
from workbench.records import StrictModel

_A = sqlite3
_ALLOWED_ACTIONS = {_A.SQLITE_SELECT, _A.SQLITE_READ, _A.SQLITE_RECURSIVE}
_DENIED_FUNCTIONS = {"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit",
                     "zipfile", "sqlar_compress", "sqlar_uncompress"}
# pragmas that only read; the ones in the first set take a table or index name
_PRAGMAS_WITH_ARG = {"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo",
                     "foreign_key_list"}
_PRAGMAS_NO_ARG = {"table_list", "database_list", "collation_list", "function_list",
                   "module_list", "pragma_list"}
_ACTION_NAMES = {getattr(_A, f"SQLITE_{n}"): n.replace("_", " ") for n in (
    "CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE",
    "CREATE_TEMP_TRIGGER", "CREATE_TEMP_VIEW", "CREATE_TRIGGER", "CREATE_VIEW", "DELETE",
    "DROP_INDEX", "DROP_TABLE", "DROP_TEMP_INDEX", "DROP_TEMP_TABLE", "DROP_TEMP_TRIGGER",
    "DROP_TEMP_VIEW", "DROP_TRIGGER", "DROP_VIEW", "INSERT", "TRANSACTION", "UPDATE", "ATTACH",
    "DETACH", "ALTER_TABLE", "REINDEX", "ANALYZE", "CREATE_VTABLE", "DROP_VTABLE", "SAVEPOINT")
    if hasattr(_A, f"SQLITE_{n}")}
_READ_KEYWORDS = ("select", "with", "values", "explain", "pragma")


def quote_ident(name: str) -> str:
    """An SQL identifier in double quotes (embedded quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


def _authorizer(denied: list[str]):
    def check(action: int, arg1, arg2, db, trigger) -> int:
        if action in _ALLOWED_ACTIONS:
            return _A.SQLITE_OK
        if action == _A.SQLITE_FUNCTION:
            if (arg2 or "").lower() in _DENIED_FUNCTIONS:
                denied.append(f"function {arg2}()")
                return _A.SQLITE_DENY
            return _A.SQLITE_OK
        if action == _A.SQLITE_PRAGMA:
            name = (arg1 or "").lower()
            if name in _PRAGMAS_WITH_ARG or (name in _PRAGMAS_NO_ARG and arg2 is None):
                return _A.SQLITE_OK
            denied.append(f"PRAGMA {arg1}" + (f"={arg2}" if arg2 is not None else ""))
            return _A.SQLITE_DENY
        what = _ACTION_NAMES.get(action, str(action))
        target = arg1 if action in (_A.SQLITE_ATTACH, _A.SQLITE_DETACH) else (arg1 or arg2)
        denied.append(what + (f" {target}" if target else ""))
        return _A.SQLITE_DENY
    return check


def open_readonly(db_path: str | os.PathLike, *, deadline: float | None = None,
                  denied: list[str] | None = None, max_value_bytes: int = 50_000_000,
                  cache_kib: int | None = None) -> sqlite3.Connection:
    """A read-only connection: `mode=ro`, `query_only`, the authorizer, no ATTACH, no
    extensions, and (with `deadline`, a `time.monotonic()` value) a progress-handler deadline.

    Raises sqlite3.Error when the file cannot be opened (callers turn it into an observation).
    """
    path = Path(db_path).resolve()
    if not path.is_file():
        raise sqlite3.OperationalError(f"no such database file: {db_path}")
    from urllib.parse import quote

    con = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, isolation_level=None,
                          check_same_thread=False)
    try:
        con.enable_load_extension(False)
    except AttributeError:  # Python built without extension support: nothing to disable
        pass
    con.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_value_bytes)
    con.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 1000)
    denied = denied if denied is not None else []
    _guard_printf(con, max_value_bytes, denied)
    con.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, 1_000_000)
    con.execute("PRAGMA query_only = ON")
    con.execute("PRAGMA trusted_schema = OFF")
    if cache_kib is not None:  # sorts and materialised subqueries spill to temp files
        con.execute(f"PRAGMA cache_size = -{int(cache_kib)}")
        con.execute("PRAGMA temp_store = FILE")
    con.set_authorizer(_authorizer(denied))
    if deadline is not None:
        con.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 1000)
    return con


_PRINTF_SPEC = re.compile(r"%[-+ 0#!,]*(\*|\d+)?(?:\.(\*|\d+))?(?:ll|l)?([a-zA-Z%])")


def _guard_printf(con: sqlite3.Connection, max_value_bytes: int, denied: list[str]) -> None:
    """Replace printf()/format() with a checked one: SQLite pads to a width or precision
    one character at a time inside a single step, where neither the length limit nor the
    deadline reach it (printf('%.*c', 2000000000, 'x') runs ~12 s per call). A width or
    precision over the length limit is an error; the rest is SQLite's own printf, run by a
    private in-memory connection."""
    helper = sqlite3.connect(":memory:", check_same_thread=False)
    helper.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_value_bytes)

    def checked(fmt, *args):
        if fmt is None:
            return None
        if not isinstance(fmt, str):
            fmt = str(fmt)
        i = 0
        for m in _PRINTF_SPEC.finditer(fmt):
            for part in m.group(1, 2):
                if part == "*":
                    n = args[i] if i < len(args) else 0
                    i += 1
                else:
                    n = part
                try:
                    if part is not None and abs(int(n)) > max_value_bytes:
                        denied.append(f"printf width or precision {int(n):,} is over the "
                                      f"{max_value_bytes:,}-byte limit of a value")
                        raise ValueError(denied[-1])
                except (TypeError, ValueError) as e:
                    if "limit" in str(e):
                        raise
            if m.group(3) != "%":
                i += 1
        marks = ", ".join("?" * (len(args) + 1))
        return helper.execute(f"SELECT printf({marks})", (fmt, *args)).fetchone()[0]

    for name in ("printf", "format"):
        con.create_function(name, -1, checked, deterministic=True)


class SqlResult(StrictModel):
    """What one SQL statement returned, or why it failed (`error`, for the agent to read)."""

    model_config = ConfigDict(frozen=True)

    sql: str
    columns: list[str] = Field(default_factory=list)
    rows: list[list[Any]] = Field(default_factory=list)
    truncated: bool = False
    error: str | None = None
    error_kind: Literal["denied", "timeout", "sql", "open"] | None = None
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_observation(self, max_rows: int = 20, max_chars: int = 4000) -> str:
        """The text an agent sees: a small table, or the error."""
        if self.error:
            return f"Error: {self.error}"
        if not self.columns:
            return "(statement returned no columns)"
        lines = [" | ".join(self.columns)]
        for r in self.rows[:max_rows]:
            lines.append(" | ".join("NULL" if v is None else str(v) for v in r))
        shown = min(len(self.rows), max_rows)
        more = "+" if self.truncated else ""
        lines.append(f"({len(self.rows)}{more} rows" + (f", first {shown} shown)"
                                                        if shown < len(self.rows) or more
                                                        else ")"))
        text = "\n".join(lines)
        return text if len(text) <= max_chars else \
            text[:max_chars] + TRUNCATION_MARKER.format(n=len(text) - max_chars)


def _cell(v: Any, max_chars: int) -> Any:
    if isinstance(v, bytes):
        return f"<blob {len(v)} bytes>"
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, str) and len(v) > max_chars:
        return v[:max_chars] + TRUNCATION_MARKER.format(n=len(v) - max_chars)
    return v


def _first_keyword(sql: str) -> str:
    s = sql
    while True:
        s = s.lstrip()
        if s.startswith("--"):
            s = s.split("\n", 1)[1] if "\n" in s else ""
        elif s.startswith("/*"):
            s = s.split("*/", 1)[1] if "*/" in s else ""
        else:
            break
    m = re.match(r"[A-Za-z]+", s)
    return m.group(0).lower() if m else ""


def run_sql(db_path: str | os.PathLike, sql: str,
            limits: SandboxLimits | None = None) -> SqlResult:
    """Run one read-only statement. Never raises: failures come back in `error`."""
    limits = limits or SandboxLimits()
    t0 = time.monotonic()
    deadline = t0 + limits.sql_timeout_s

    def fail(msg: str, kind: str) -> SqlResult:
        return SqlResult(sql=sql, error=msg, error_kind=kind,
                         elapsed_s=round(time.monotonic() - t0, 4))

    keyword = _first_keyword(sql)
    if keyword not in _READ_KEYWORDS:
        return fail(f"only read-only statements are allowed (SELECT/WITH/VALUES/EXPLAIN/"
                    f"PRAGMA), not {keyword.upper() or 'an empty statement'}", "denied")
    denied: list[str] = []
    try:
        con = open_readonly(db_path, deadline=deadline, denied=denied,
                            max_value_bytes=limits.sql_max_value_bytes,
                            cache_kib=limits.sql_cache_mb * 1024)
    except sqlite3.Error as e:
        return fail(f"cannot open the database: {e}", "open")
    try:
        cur = con.execute(sql)
        columns = [d[0] for d in cur.description or []]
        rows: list[list[Any]] = []
        truncated = False
        while columns:  # one row at a time, each cell cut at once: memory stays bounded
            r = cur.fetchone()
            if r is None:
                break
            if len(rows) == limits.sql_max_rows:
                truncated = True
                break
            rows.append([_cell(v, limits.sql_max_cell_chars) for v in r])
        return SqlResult(sql=sql, columns=columns, rows=rows, truncated=truncated,
                         elapsed_s=round(time.monotonic() - t0, 4))
    except sqlite3.Error as e:
        if denied:
            return fail(f"denied by the read-only sandbox: {denied[0]}", "denied")
        if "interrupted" in str(e) and time.monotonic() >= deadline:
            return fail(f"query interrupted at the {limits.sql_timeout_s:g} s time limit",
                        "timeout")
        return fail(f"{type(e).__name__}: {e}", "sql")
    except (ValueError, OverflowError, MemoryError) as e:  # e.g. NUL in SQL, huge integers
        return fail(f"{type(e).__name__}: {e}", "sql")
    finally:
        con.close()
