"""Run an agent's SQL and Python against a data environment without letting it change anything.

SQL runs in this process on a read-only connection (`sqlsandbox`: `mode=ro`, an authorizer
that allows only reads, no ATTACH, a deadline, a row cap); its names are importable from here
too, as are the limits (`sandboxlimits`).

Python runs in a fresh interpreter (`python -I -B workbench/dataenv/child/sandbox_main.py`) in
its own session, with the layers listed in `child/sandbox_main.py`: new network and PID
namespaces where the kernel allows them, Landlock file confinement where enabled, root dropped
to `nobody`, rlimits (CPU, address space, processes, file size, open files), a cleared
environment, a temporary working folder (removed afterwards) and an audit hook.
`PythonResult.isolation` says which layers held. The parent enforces the wall-clock limit: the
child's supervisor kills and reaps its tree, and the whole process group is killed if it does
not. Linux only (namespaces, /proc, prctl).

Errors never raise to the caller: they come back in the result's `error` field, which is what
the agent sees as its observation.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field

from workbench.dataenv.sandboxlimits import TRUNCATION_MARKER, SandboxLimits
from workbench.dataenv.sqlsandbox import (  # noqa: F401  (importable from here: tests, callers)
    SqlResult,
    open_readonly,
    quote_ident,
    run_sql,
)
from workbench.records import StrictModel

CHILD = Path(__file__).parent / "child" / "sandbox_main.py"  # imports nothing of the workbench


class TableSource(StrictModel):
    """Where the child reads one table from: a SQLite table or a CSV/TSV/Parquet file."""

    model_config = ConfigDict(frozen=True)

    name: str
    format: Literal["sqlite", "csv", "tsv", "parquet"]
    path: str
    table: str | None = None


ErrorKind = Literal["timeout", "cpu_limit", "memory", "blocked", "exception", "non_json",
                    "no_result", "killed", "crashed", "setup", "protocol", "disk_limit"]


class PythonResult(StrictModel):
    """What a piece of Python returned: `result` (JSON), captured output, or the error."""

    model_config = ConfigDict(frozen=True)

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


class _Capture:
    """The child's two pipes as they fill: its raw output (kept up to the cap, the rest
    counted) and the result channel (bounded)."""

    def __init__(self, limits: SandboxLimits) -> None:
        self.out_cap = limits.output_cap_chars
        self.env_cap = limits.output_cap_chars * 4 + limits.result_cap_chars * 4 + (1 << 20)
        self.out, self.env = bytearray(), bytearray()
        self.out_total = 0

    def pump(self, sel: selectors.BaseSelector, timeout: float) -> bool:
        """Read what is ready; False once nothing was ready within `timeout`."""
        events = sel.select(timeout=timeout)
        for key, _ in events:
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:
                sel.unregister(key.fileobj)
            elif key.data == "out":
                self.out_total += len(chunk)
                room = self.out_cap - len(self.out)
                if room > 0:
                    self.out.extend(chunk[:room])
            elif len(self.env) < self.env_cap:
                self.env.extend(chunk)
        return bool(events)

    def raw_output(self) -> tuple[str, bool]:
        """What the child wrote straight to fd 1/2, and whether it was cut."""
        raw = self.out.decode("utf-8", errors="replace")
        truncated = self.out_total > len(self.out)
        if truncated:
            raw += "\n" + TRUNCATION_MARKER.format(n=self.out_total - len(self.out))
        return raw, truncated


def _send_job(proc: subprocess.Popen, job: dict[str, Any]) -> None:
    stdin = proc.stdin
    assert stdin is not None  # the child is started with stdin=PIPE
    try:
        stdin.write(json.dumps(job).encode("utf-8"))
    except OSError:  # the child died at once; its exit status tells the rest
        pass
    finally:
        with contextlib.suppress(OSError):
            stdin.close()


def _pump_until_exit(proc: subprocess.Popen, r_env: int, workdir: str, limits: SandboxLimits,
                     deadline: float, cap: _Capture):
    """Read both pipes until they reach EOF, the child exits, time is up or the working folder
    passes its disk limit: ((wait status, rusage) if it was reaped, timed out, disk over)."""
    timed_out = disk_over = False
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None  # the child is started with stdout=PIPE
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(r_env, selectors.EVENT_READ, "env")
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
        if not cap.pump(sel, min(left, 0.05)):
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:  # exited, though a stray process may still hold a pipe open
                reaped = (status, usage)
                while sel.get_map() and cap.pump(sel, 0):
                    pass
                break
    sel.close()
    return reaped, timed_out, disk_over


def _reap(proc: subprocess.Popen, reaped, timed_out: bool, disk_over: bool, deadline: float):
    """Make sure the child and everything it started are gone: ((wait status, rusage),
    timed out)."""
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
    return reaped, timed_out


def _clean_up(proc: subprocess.Popen | None, fds: tuple[int, int], workdir: str) -> None:
    """Close our pipe ends, never leave a child behind, remove the working folder."""
    for fd in fds:
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


def _outcome(envelope: dict[str, Any] | None, forged: str | None, base: dict[str, Any], *,
             timed_out: bool, disk_over: bool, cpu_s: float, limits: SandboxLimits
             ) -> PythonResult:
    """The result: the worker's envelope, or why there is none (time, disk, a forged channel,
    a signal, a protocol failure)."""
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
    rc = base["exit_code"]
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
    tail = base["raw_output"].strip().splitlines()[-1:] or [""]
    return PythonResult(error=f"the sandbox ended without a result (exit code {rc}) {tail[0]}"
                        .strip(), error_kind="protocol", **base)


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
    cap = _Capture(limits)
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
        _send_job(proc, job)
        reaped, timed_out, disk_over = _pump_until_exit(proc, r_env, workdir, limits,
                                                        deadline, cap)
        reaped, timed_out = _reap(proc, reaped, timed_out, disk_over, deadline)
        proc.returncode = os.waitstatus_to_exitcode(reaped[0])
        cpu_s = reaped[1].ru_utime + reaped[1].ru_stime
        _wait_group_empty(proc.pid, 2.0)
    except OSError as e:
        return PythonResult(error=f"the sandbox could not start: {e}", error_kind="setup",
                            elapsed_s=round(time.monotonic() - t0, 3), workdir=workdir)
    finally:
        _clean_up(proc, (r_env, w_env), workdir)
    elapsed = round(time.monotonic() - t0, 3)
    raw, raw_trunc = cap.raw_output()
    base: dict[str, Any] = {"raw_output": raw, "raw_output_truncated": raw_trunc,
                            "exit_code": proc.returncode, "elapsed_s": elapsed,
                            "cpu_s": round(cpu_s, 3), "pid": proc.pid, "workdir": workdir}
    envelope, forged = _read_channel(bytes(cap.env), token, base)
    return _outcome(envelope, forged, base, timed_out=timed_out, disk_over=disk_over,
                    cpu_s=cpu_s, limits=limits)
