"""Run an agent's SQL and Python against a data environment without letting it change anything.

SQL runs in this process on a connection opened `mode=ro` with an authorizer that allows only
reads (SELECT, READ, functions other than `load_extension`, recursive CTEs, and a few
introspection pragmas such as `table_info`); `ATTACH`, `DETACH`, `VACUUM` (and `VACUUM INTO`,
which SQLite authorises as an ATTACH), every write, DDL, transactions and any pragma that sets
a value are denied. `SQLITE_LIMIT_ATTACHED` is 0, a progress handler enforces a deadline, and
at most `sql_max_rows` rows come back. `mode=ro` alone is not enough: it still allows
`ATTACH` + `CREATE` and `VACUUM INTO`.

Python runs in a fresh interpreter (`python -I -B workbench/trajsynth/_child.py`) in its own
session, with the layers listed in `_child.py`: new network and PID namespaces where the kernel
allows them, Landlock file confinement where enabled, root dropped to `nobody`, rlimits (CPU,
address space, processes, file size, open files), a cleared environment, a temporary working
folder (removed afterwards) and an audit hook. `PythonResult.isolation` says which layers held.
The parent enforces the wall-clock limit: the child's supervisor kills and reaps its tree, and
the whole process group is killed if it does not. Linux only (namespaces, /proc, prctl).

Errors never raise to the caller: they come back in the result's `error` field, which is what
the agent sees as its observation.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import selectors
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CHILD = Path(__file__).with_name("_child.py")
TRUNCATION_MARKER = "...[truncated: {n} more characters]"


class SandboxLimits(BaseModel):
    """Limits for one execution. The defaults suit an agent exploring a small database."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sql_timeout_s: float = Field(5.0, gt=0, description="SQL deadline (progress handler).")
    sql_max_value_bytes: int = Field(1_000_000, ge=1000, description=(
        "Largest string or blob a statement may make (SQLITE_LIMIT_LENGTH): it bounds the "
        "memory and the time of one function call, which the deadline cannot interrupt."))
    sql_cache_mb: int = Field(32, ge=1, description="Page cache of a statement; sorts and "
                                                    "materialised rows beyond it spill to "
                                                    "temp files.")
    sql_max_rows: int = Field(200, ge=1, description="Rows returned; more sets `truncated`.")
    sql_max_cell_chars: int = Field(2000, ge=16, description="Longer text values are cut.")
    py_timeout_s: float = Field(20.0, gt=0, description="Wall clock, from process start.")
    py_cpu_s: int = Field(20, ge=1, description="RLIMIT_CPU (seconds of CPU).")
    py_memory_mb: int = Field(1024, ge=384, description="RLIMIT_AS (the interpreter with "
                                                        "pandas takes ~330 MB of it).")
    py_max_procs: int = Field(16, ge=1, description="RLIMIT_NPROC above the sandbox user's "
                                                    "current count (processes + threads).")
    py_max_file_mb: int = Field(16, ge=1, description="RLIMIT_FSIZE: largest file written.")
    py_max_open_files: int = Field(256, ge=32, description="RLIMIT_NOFILE.")
    py_max_disk_mb: int = Field(256, ge=1, description="Disk the working folder may use; "
                                "measured every 0.1 s, the code is stopped past it.")
    py_max_disk_files: int = Field(10_000, ge=1, description="Files and folders in it.")
    output_cap_chars: int = Field(65_536, ge=256, description="Captured print output.")
    result_cap_chars: int = Field(65_536, ge=256, description="The JSON of `result`.")


# --- SQL -----------------------------------------------------------------------------------------

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


class SqlResult(BaseModel):
    """What one SQL statement returned, or why it failed (`error`, for the agent to read)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

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
        rows, truncated = [], False
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


# --- Python --------------------------------------------------------------------------------------


class TableSource(BaseModel):
    """Where the child reads one table from: a SQLite table or a CSV/TSV/Parquet file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    format: Literal["sqlite", "csv", "tsv", "parquet"]
    path: str
    table: str | None = None


ErrorKind = Literal["timeout", "cpu_limit", "memory", "blocked", "exception", "non_json",
                    "no_result", "killed", "crashed", "setup", "protocol", "disk_limit"]


class PythonResult(BaseModel):
    """What a piece of Python returned: `result` (JSON), captured output, or the error."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    result: Any = None
    result_truncated: bool = False
    result_preview: str | None = Field(None, description="The start of an over-cap result.")
    output: str = Field("", description="print()/sys.stdout/sys.stderr, capped.")
    output_truncated: bool = False
    raw_output: str = Field("", description="Bytes written straight to fd 1/2, capped.")
    raw_output_truncated: bool = False
    error: str | None = None
    error_kind: ErrorKind | None = None
    exit_code: int | None = None
    elapsed_s: float = 0.0
    cpu_s: float = 0.0
    pid: int = Field(0, description="The child's pid, also its process-group id.")
    workdir: str = Field("", description="The temporary working folder (removed on return).")
    isolation: dict[str, str] = Field(default_factory=dict, description="Which layers held.")
    blocked: list[str] = Field(default_factory=list, description="What the audit hook stopped.")

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_observation(self, max_chars: int = 4000) -> str:
        parts = []
        out = (self.output + self.raw_output).strip()
        if out:
            parts.append(out)
        if self.error:
            parts.append(f"Error: {self.error}")
        elif self.result_truncated:
            parts.append(f"result (truncated): {self.result_preview}")
        else:
            parts.append("result: " + json.dumps(self.result, ensure_ascii=False))
        text = "\n".join(parts)
        return text if len(text) <= max_chars else \
            text[:max_chars] + TRUNCATION_MARKER.format(n=len(text) - max_chars)


def _sandbox_user() -> tuple[int, int] | None:
    """(uid, gid) of `nobody` when we run as root (the child drops to it), else None."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        return (65534, 65534)
    return pw.pw_uid, pw.pw_gid


def _child_env(workdir: str) -> dict[str, str]:
    """Nothing from the parent's environment: no keys, tokens or proxies reach the child."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "HOME": workdir, "TMPDIR": workdir, "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMEXPR_MAX_THREADS": "1",
            "ARROW_IO_THREADS": "1", "ARROW_DEFAULT_MEMORY_POOL": "system", "MPLBACKEND": "Agg"}


def processes_in_group(pgid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process (zombies included) whose process group is `pgid`."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            out.append((int(d), fields[0]))
    return out


def _wait_leader(pid: int, timeout: float):
    """(wait status, rusage) of the child once it exits within `timeout`, else None."""
    end = time.monotonic() + max(timeout, 0.0)
    while True:
        p, status, usage = os.wait4(pid, os.WNOHANG)
        if p:
            return status, usage
        if time.monotonic() >= end:
            return None
        time.sleep(0.002)


def _wait_group_empty(pgid: int, timeout: float) -> None:
    """Wait until no process of group `pgid` is left (dying ones take a moment)."""
    end = time.monotonic() + timeout
    while processes_in_group(pgid) and time.monotonic() < end:
        time.sleep(0.005)


def _rmtree(path: str) -> None:
    def retry(func, p, _exc):  # a read-only folder made by the code: make it writable
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry)
    else:
        shutil.rmtree(path, onerror=retry)
    if os.path.exists(path):
        shutil.rmtree(path, ignore_errors=True)


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


DISK_CHECK_S = 0.1  # how often the parent measures the working folder


def _disk_within(workdir: str, limits: SandboxLimits) -> bool:
    """Whether the working folder holds at most `py_max_disk_mb` (blocks in use) and
    `py_max_disk_files` entries; the walk stops as soon as either is passed."""
    cap, files, used = limits.py_max_disk_mb << 20, 0, 0
    stack = [workdir]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for e in entries:
                files += 1
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                used += st.st_blocks * 512
                if files > limits.py_max_disk_files or used > cap:
                    return False
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
    return True


def _read_channel(data: bytes, token: str, base: dict[str, Any]
                  ) -> tuple[dict[str, Any] | None, str | None]:
    """The worker's lines: isolation (first, sent before the code ran), `blocked` (each as it
    happened), then exactly one `final`, last. Fills `base`'s isolation and blocked; returns
    (the final envelope, or None; why the channel was refused, or None). A line without the
    run's token, a second final line or a line after it means the code wrote on the channel
    itself (the descriptor is inherited by the worker it runs in): refused, never trusted."""
    lines = data.split(b"\n")
    lines.pop()  # "" after the last newline, or a line cut short (a kill, the cap): unread
    msgs: list[dict[str, Any]] = []
    foreign = False
    for raw in lines:
        try:
            msg = json.loads(raw.decode("utf-8"))
        except ValueError:
            msg = None
        if isinstance(msg, dict) and msg.get("token") == token:
            msgs.append(msg)
        else:
            foreign = True
    if msgs and msgs[0].get("kind") in ("isolation", "final"):
        iso = msgs[0].get("isolation") or {}
        base["isolation"] = {str(k): str(v) for k, v in iso.items()}
    base["blocked"] = [str(m.get("message")) for m in msgs if m.get("kind") == "blocked"][:20]
    if foreign:
        return None, "the code wrote on the sandbox's result channel (refused)"
    finals = [i for i, m in enumerate(msgs) if m.get("kind") == "final"]
    if len(finals) > 1 or (finals and finals[0] != len(msgs) - 1):
        return None, "the code wrote a result on the sandbox's channel itself (refused)"
    return (msgs[finals[0]] if finals else None), None


def run_python(code: str, *, tables: list[TableSource] | tuple = (),
               readable: list[str] | tuple = (), limits: SandboxLimits | None = None,
               require_result: bool = True, audit_hook: bool = True,
               isolate: bool = True) -> PythonResult:
    """Run `code` in a sandboxed child; it sees `tables` (dict of DataFrames), `pd`, `np`,
    and must set `result` to a JSON value. Never raises: failures come back in `error`.

    `readable`: extra files the code may open read-only (the environment's data files).
    `audit_hook=False` (no audit hook) and `isolate=False` (no namespaces, no Landlock) switch
    layers off; tests use them to check that each remaining layer holds on its own.
    """
    limits = limits or SandboxLimits()
    t0 = time.monotonic()
    deadline = t0 + limits.py_timeout_s
    workdir = tempfile.mkdtemp(prefix="wb-sandbox-")
    user = _sandbox_user()
    r_env = w_env = -1
    proc: subprocess.Popen | None = None
    out_buf, env_buf = bytearray(), bytearray()
    out_total = 0
    timed_out = disk_over = False
    cpu_s = 0.0
    try:
        if user is not None:
            try:
                os.chown(workdir, *user)
            except OSError:  # the child then stays root (it cannot write here otherwise)
                user = None
        os.chmod(workdir, 0o700)
        r_env, w_env = os.pipe()
        token = secrets.token_hex(16)  # lines without it did not come from the worker
        job = {"code": code, "workdir": workdir, "envelope_fd": w_env, "token": token,
               "tables": [t.model_dump() for t in tables],
               "readable": [str(Path(p).resolve()) for p in readable],
               "user": list(user) if user else None, "require_result": require_result,
               "audit": audit_hook, "isolate": isolate,
               "limits": limits.model_dump()}
        proc = subprocess.Popen([sys.executable, "-I", "-B", str(CHILD)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=workdir,
                                env=_child_env(workdir), start_new_session=True,
                                pass_fds=(w_env,), close_fds=True)
        os.close(w_env)
        w_env = -1
        try:
            proc.stdin.write(json.dumps(job).encode("utf-8"))
        except OSError:  # the child died at once; its exit status tells the rest
            pass
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        env_cap = limits.output_cap_chars * 4 + limits.result_cap_chars * 4 + (1 << 20)
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ, "out")
        sel.register(r_env, selectors.EVENT_READ, "env")

        def pump(timeout: float) -> bool:
            """Read what is ready; False once nothing was ready within `timeout`."""
            nonlocal out_total
            events = sel.select(timeout=timeout)
            for key, _ in events:
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                elif key.data == "out":
                    out_total += len(chunk)
                    room = limits.output_cap_chars - len(out_buf)
                    if room > 0:
                        out_buf.extend(chunk[:room])
                elif len(env_buf) < env_cap:
                    env_buf.extend(chunk)
            return bool(events)

        reaped = None
        next_disk_check = time.monotonic() + DISK_CHECK_S
        while sel.get_map():  # until both pipes reach EOF, the child exits, or time is up
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if time.monotonic() >= next_disk_check:
                next_disk_check = time.monotonic() + DISK_CHECK_S
                if not _disk_within(workdir, limits):
                    disk_over = True
                    break
            if not pump(min(left, 0.05)):
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:  # exited, though a stray process may still hold a pipe open
                    reaped = (status, usage)
                    while sel.get_map() and pump(0):
                        pass
                    break
        sel.close()
        if reaped is None and not (timed_out or disk_over):  # pipes closed: it is exiting
            reaped = _wait_leader(proc.pid, deadline - time.monotonic())
            timed_out = reaped is None
        if reaped is None:  # time (or disk) is up: the supervisor kills and reaps its tree
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGTERM)
            reaped = _wait_leader(proc.pid, 1.0)
        if reaped is None:  # it did not: kill the whole group (the unreaped leader holds the
            with contextlib.suppress(ProcessLookupError, PermissionError):  # group id)
                os.killpg(proc.pid, signal.SIGKILL)
            _, status, usage = os.wait4(proc.pid, 0)
            reaped = (status, usage)
        elif processes_in_group(proc.pid):  # left behind (possible without a PID namespace)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.returncode = os.waitstatus_to_exitcode(reaped[0])
        cpu_s = reaped[1].ru_utime + reaped[1].ru_stime
        _wait_group_empty(proc.pid, 2.0)
    except OSError as e:
        return PythonResult(error=f"the sandbox could not start: {e}", error_kind="setup",
                            elapsed_s=round(time.monotonic() - t0, 3), workdir=workdir)
    finally:
        for fd in (r_env, w_env):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if proc is not None:
            if proc.poll() is None:  # an exception above: never leave a child behind
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if proc.stdout:
                proc.stdout.close()
        _rmtree(workdir)
    elapsed = round(time.monotonic() - t0, 3)
    raw = out_buf.decode("utf-8", errors="replace")
    raw_trunc = out_total > len(out_buf)
    if raw_trunc:
        raw += "\n" + TRUNCATION_MARKER.format(n=out_total - len(out_buf))
    base: dict[str, Any] = {"raw_output": raw, "raw_output_truncated": raw_trunc,
                            "exit_code": proc.returncode, "elapsed_s": elapsed,
                            "cpu_s": round(cpu_s, 3), "pid": proc.pid, "workdir": workdir}
    envelope, forged = _read_channel(bytes(env_buf), token, base)
    if timed_out:
        return PythonResult(error=f"TimeoutError: the code ran past the "
                                  f"{limits.py_timeout_s:g} s wall-clock limit and was stopped",
                            error_kind="timeout", **base)
    if disk_over:
        return PythonResult(error=f"disk limit: the code wrote more than "
                                  f"{limits.py_max_disk_mb} MB (or {limits.py_max_disk_files} "
                                  "files) in its working folder and was stopped",
                            error_kind="disk_limit", **base)
    if forged:
        return PythonResult(error=f"SandboxViolation: {forged}", error_kind="blocked", **base)
    if isinstance(envelope, dict) and "output" in envelope:
        return PythonResult(result=envelope.get("result"),
                            result_truncated=bool(envelope.get("result_truncated")),
                            result_preview=envelope.get("result_preview"),
                            output=str(envelope.get("output", "")),
                            output_truncated=bool(envelope.get("output_truncated")),
                            error=envelope.get("error"), error_kind=envelope.get("error_kind"),
                            **base)
    rc = proc.returncode
    # killed by a signal: the supervisor itself (rc < 0), or its worker (reported as 128+n)
    sig = -rc if rc is not None and rc < 0 else (rc - 128 if rc is not None and rc > 128 else 0)
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s >= limits.py_cpu_s):
        return PythonResult(error=f"CPU limit: the code used more than {limits.py_cpu_s} s of "
                                  "CPU time and was stopped", error_kind="cpu_limit", **base)
    if sig == signal.SIGKILL:
        return PythonResult(error="the sandbox process was killed (SIGKILL; most likely over "
                                  f"the {limits.py_memory_mb} MB memory limit)",
                            error_kind="killed", **base)
    if sig:
        return PythonResult(error=f"the sandbox process crashed ({_signal_name(sig)})",
                            error_kind="crashed", **base)
    tail = raw.strip().splitlines()[-1:] or [""]
    return PythonResult(error=f"the sandbox ended without a result (exit code {rc}) {tail[0]}"
                        .strip(), error_kind="protocol", **base)
