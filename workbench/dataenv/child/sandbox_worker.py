"""The sandbox child's worker (see `sandbox_main`): confines itself, runs the agent's code and
sends the envelope. Not imported by the workbench; imports nothing from it."""

from __future__ import annotations

import json
import os
import signal
import sys

from sandbox_confine import (
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    confine,
    prctl,
    set_limits,
    tasks_now,
)
from sandbox_hook import SandboxViolation, blocked, make_hook

MARKER = "...[truncated: {n} more characters]"


class _Capped:
    """A text stream that keeps the first `cap` characters and counts the rest."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, cap: int):
        self.parts: list[str] = []
        self.cap, self.kept, self.dropped = cap, 0, 0

    def write(self, s) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        room = self.cap - self.kept
        if room > 0:
            piece = s[:room]
            self.parts.append(piece)
            self.kept += len(piece)
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def text(self) -> str:
        out = "".join(self.parts).encode("utf-8", "replace").decode("utf-8")  # no lone surrogates
        return out + ("\n" + MARKER.format(n=self.dropped) if self.dropped else "")



def _load_tables(specs: list[dict], pd) -> dict:
    import sqlite3
    from urllib.parse import quote

    tables = {}
    for t in specs:
        path, fmt = t["path"], t["format"]
        if fmt == "sqlite":
            con = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True)
            try:
                name = '"' + (t["table"] or t["name"]).replace('"', '""') + '"'
                tables[t["name"]] = pd.read_sql_query(f"SELECT * FROM {name}", con)
            finally:
                con.close()
        elif fmt == "parquet":
            tables[t["name"]] = pd.read_parquet(path)
        else:
            tables[t["name"]] = pd.read_csv(path, sep="\t" if fmt == "tsv" else ",")
    return tables



def _json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    hint = ""
    if type(o).__name__ in ("DataFrame", "Series"):
        hint = " (convert it, e.g. df.to_dict(orient='records') or series.tolist())"
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable{hint}")


def _describe(e: BaseException) -> str:
    line = None
    tb = e.__traceback__
    while tb is not None:  # no source lookups: frame filename and line number only
        if tb.tb_frame.f_code.co_filename == "<agent>":
            line = tb.tb_lineno
        tb = tb.tb_next
    msg = f"{type(e).__name__}: {e}"
    if len(msg) > 2000:
        msg = msg[:2000] + MARKER.format(n=len(msg) - 2000)
    return msg + (f" (line {line})" if line else "")


def worker(job: dict, iso: dict) -> None:
    code = 70
    try:
        code = _work(job, iso)
    except BaseException as e:  # noqa: BLE001 - setup failed: say so if we can
        try:
            _send(job["envelope_fd"], {"output": "", "error": f"sandbox setup failed: "
                                       f"{_describe(e)}", "error_kind": "setup",
                                       "isolation": iso}, job.get("token", ""))
            code = 0
        except BaseException:  # noqa: BLE001, S110 - nothing left to tell; the exit code says it
            pass
    finally:
        os._exit(code)


def _send(fd: int, envelope: dict, token: str = "", *, kind: str = "final") -> None:
    """One line on the channel to the parent: `{"kind", "token", ...}`. The parent takes the
    isolation from the first line (sent before the code runs), every `blocked` line as it
    came, and exactly one `final` line, last; the final line closes the channel."""
    line = json.dumps({"kind": kind, "token": token, **envelope}) + "\n"
    view = memoryview(line.encode("ascii"))  # escapes anything odd, lone surrogates too
    while view:
        n = os.write(fd, view)
        view = view[n:]
    if kind == "final":
        os.close(fd)



def _run_code(code: str, ns: dict, lim: dict, violations: list[str], landlocked: bool
              ) -> tuple[str | None, str | None]:
    """Run the agent's code in `ns`: (error, error kind), both None when it ran through."""
    error = kind = None
    try:
        exec(compile(code, "<agent>", "exec"), ns)  # noqa: S102 - the sandboxed code
    except SystemExit as e:
        if e.code not in (None, 0):
            error, kind = f"SystemExit: {e.code}", "exception"
    except MemoryError:
        ns.clear()
        error, kind = (f"MemoryError: the code needed more than the {lim['py_memory_mb']} MB "
                       "memory limit"), "memory"
    except BaseException as e:  # noqa: BLE001 - any failure of the code is an observation
        error, kind = _describe(e), "exception"
        if isinstance(e, SandboxViolation):
            kind = "blocked"
        elif violations and (isinstance(e, PermissionError) or violations[-1] in str(e)):
            kind = "blocked"
            if not isinstance(e, SandboxViolation):
                error = f"SandboxViolation: {violations[-1]} ({error})"
        elif isinstance(e, PermissionError) and landlocked:  # the kernel refused it
            kind = "blocked"
    return error, kind


def _envelope(job: dict, out: _Capped, error: str | None, kind: str | None, iso: dict,
              violations: list[str], ns: dict) -> dict:
    """The final envelope: the output, the error or the result (as JSON, capped)."""
    env = {"output": out.text(), "output_truncated": out.dropped > 0, "error": error,
           "error_kind": kind, "isolation": iso, "blocked": violations}
    if error is None:
        if "result" not in ns:
            if job["require_result"]:
                env["error"] = "the code did not set `result` (assign the answer to `result`)"
                env["error_kind"] = "no_result"
        else:
            try:
                text = json.dumps(ns["result"], default=_json_default, allow_nan=False,
                                  ensure_ascii=False)
            except (TypeError, ValueError, OverflowError, RecursionError) as e:
                env["error"] = f"`result` is not JSON-serialisable: {type(e).__name__}: {e}"
                env["error_kind"] = "non_json"
            else:
                cap = job["limits"]["result_cap_chars"]
                if len(text) > cap:
                    env["result_truncated"] = True
                    env["result_preview"] = text[:cap] + MARKER.format(n=len(text) - cap)
                else:
                    env["result"] = json.loads(text)
    return env


def _work(job: dict, iso: dict) -> int:
    lim = job["limits"]
    workdir = job["workdir"]
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    set_limits(lim)
    import builtins

    import numpy as np
    import pandas as pd

    tables = _load_tables(job["tables"], pd)
    user = job.get("user") if os.getuid() == 0 else None
    readable, roots, landlocked = confine(job, iso, user, tasks_now(job, iso, user))
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after setuid, which clears it
    os.chdir(workdir)
    pd.read_pickle = blocked("read_pickle (unpickling runs code)")
    if "_posixsubprocess" in sys.modules:  # fork_exec itself raises no audit event
        vars(sys.modules["_posixsubprocess"])["fork_exec"] = blocked("_posixsubprocess.fork_exec")
    violations: list[str] = []
    out = _Capped(lim["output_cap_chars"])
    ns = {"__name__": "__main__", "__builtins__": builtins, "tables": tables, "pd": pd, "np": np}
    fd, token = job["envelope_fd"], job.pop("token", "")
    _send(fd, {"isolation": iso}, token, kind="isolation")  # before the code can write here
    sys.stdout = sys.stderr = out
    if job["audit"]:
        sys.addaudithook(make_hook(
            workdir, frozenset(readable), tuple(roots), violations,
            lambda msg: _send(fd, {"message": msg}, token, kind="blocked")))
    error, kind = _run_code(job["code"], ns, lim, violations, landlocked)
    _send(fd, _envelope(job, out, error, kind, iso, violations, ns), token)
    return 0

