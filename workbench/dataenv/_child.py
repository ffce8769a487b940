"""The sandbox child: runs one piece of agent code. Not imported by the workbench.

Started by `workbench.dataenv.sandbox.run_python` as `python -I -B _child.py` in a new
session, with a cleared environment and a temporary working folder as cwd. It reads its job
(JSON) from stdin and writes one JSON envelope to the pipe named in the job. It imports
nothing from the workbench, so it works with `-I` wherever the interpreter has pandas.

Layers, outermost first:
1. Namespaces (`unshare`): a new network namespace (only a loopback that is down, so every
   connect fails) and a new PID namespace (the worker's process tree dies with it, reaped by
   the kernel). As root this needs CAP_SYS_ADMIN; as another user, unprivileged user
   namespaces. Without them the supervisor is a child subreaper that kills and reaps
   whatever the worker leaves behind, and the network is blocked by the audit hook only.
2. Privileges: started as root, the worker drops to `nobody` (no groups) after loading the
   data, so file permissions apply and RLIMIT_NPROC counts (root is exempt from it). Where
   `nobody` cannot read the interpreter's folder (a pyenv under /root), it keeps only
   CAP_DAC_READ_SEARCH when Landlock bounds what it may read, else common modules are
   preloaded. `PR_SET_NO_NEW_PRIVS`; `PR_SET_PDEATHSIG` (the worker dies with its supervisor).
3. Landlock (Linux 5.13+, where enabled): the kernel lets the worker read only the
   interpreter's folders, time zones, CPU/cgroup facts and the environment's data files, and
   write only inside its working folder; this holds for native code too (pyarrow's own file
   I/O, which the audit hook never sees).
4. rlimits: CPU, AS (address space), NPROC (above the user's current count), FSIZE, NOFILE,
   CORE=0. SIGXFSZ is ignored, so an oversized write fails with EFBIG instead of killing.
5. An audit hook (best effort, not a security boundary on its own; CPython says so): blocks
   process creation (os.system, subprocess, exec*, fork, posix_spawn), signals, sockets,
   ctypes, pickle loading, rlimit changes, SQLite extensions, gc introspection (which could
   reach the hook), opening or changing files outside the working folder, and reading
   anything but the interpreter's own files, public system files and the data files.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time

CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
MARKER = "...[truncated: {n} more characters]"


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, arg: int) -> bool:
    try:
        return _libc().prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _unshare() -> dict[str, str]:
    """New network + PID namespaces where allowed; says which layers hold."""
    if os.geteuid() == 0:  # as root, no user namespace: the worker drops to nobody instead
        tries = [CLONE_NEWNET | CLONE_NEWPID, CLONE_NEWNET]
    else:
        tries = [CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID, CLONE_NEWUSER | CLONE_NEWNET]
    try:
        libc = _libc()
    except OSError:
        return {"network": "audit hook only (no libc)", "pid_namespace": "no"}
    for flags in tries:
        if libc.unshare(flags) == 0:
            return {"network": "network namespace",
                    "pid_namespace": "yes" if flags & CLONE_NEWPID else "no",
                    "user_namespace": "yes" if flags & CLONE_NEWUSER else "no"}
    err = os.strerror(__import__("ctypes").get_errno())
    return {"network": f"audit hook only (unshare: {err})", "pid_namespace": "no"}


def _maps_to_root() -> bool:
    """Whether our uid is root outside this user namespace (RLIMIT_NPROC exempts root)."""
    uid = os.getuid()
    try:
        with open("/proc/self/uid_map") as fh:
            for line in fh:
                inner, outer, count = (int(x) for x in line.split())
                if inner <= uid < inner + count:
                    return outer + uid - inner == 0
    except (OSError, ValueError):
        pass
    return False


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 70


def _wait_for(pid: int) -> int:
    """Reap children until `pid` exits (orphans reparented to us are reaped on the way)."""
    while True:
        try:
            p, status = os.wait()
        except ChildProcessError:
            return 70
        if p == pid:
            return _exit_code(status)


def _kill_children(timeout: float = 2.0) -> None:
    """As a subreaper: SIGKILL every child left (orphans come to us) and reap them all."""
    me = str(os.getpid())
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as fh:
                    ppid = fh.read().rsplit(")", 1)[1].split()[1]
            except OSError:
                continue
            if ppid == me:
                try:
                    os.kill(int(d), signal.SIGKILL)
                except OSError:
                    pass
        try:
            while True:
                p, _ = os.waitpid(-1, os.WNOHANG)
                if p == 0:
                    break
        except ChildProcessError:
            return
        time.sleep(0.01)


def main() -> None:
    job = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if os.geteuid() != 0:  # counted before a user namespace hides other processes' owners
        job["user_tasks"] = _count_tasks(os.getuid())
    job["real_root"] = os.geteuid() == 0 or _maps_to_root()
    iso = _unshare() if job["isolate"] else {"network": "not isolated (isolate=False)",
                                             "pid_namespace": "no"}
    pidns = iso["pid_namespace"] == "yes"
    if not pidns:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    pid = os.fork()
    if pid == 0:
        if pidns:  # pid 1 of the new namespace: reap, and run the worker one level down
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            worker = os.fork()
            if worker == 0:
                _worker(job, iso)
            os._exit(_wait_for(worker))
        _worker(job, iso)

    def stop(_sig, _frame):  # the parent's "time is up": kill the tree, reap it, then exit
        try:
            os.kill(pid, signal.SIGKILL)  # in a PID namespace its init: the kernel kills the rest
        except OSError:
            pass

    signal.signal(signal.SIGTERM, stop)
    code = _wait_for(pid)
    if not pidns:
        _kill_children()
    os._exit(code)


# --- the worker ----------------------------------------------------------------------------------


class SandboxViolation(PermissionError):
    """Raised by the audit hook; the agent sees its message."""


class _Capped:
    """A text stream that keeps the first `cap` characters and counts the rest."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, cap: int):
        self.cap, self.parts, self.kept, self.dropped = cap, [], 0, 0

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


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        parts = os.uname().release.split(".")
        return (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)) >= \
            (major, minor)
    except (ValueError, IndexError):
        return False


def _count_tasks(uid: int | None) -> int:
    """Processes + threads whose real uid is `uid` (what RLIMIT_NPROC counts), or with
    `uid=None` those of our own process group (in a new user namespace the kernel counts
    only the tasks inside it, and other users' processes all show as the overflow uid)."""
    n = 0
    group = os.getpgid(0)
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as fh:
                text = fh.read()
            if uid is None and os.getpgid(int(d)) != group:
                continue
        except OSError:
            continue
        real = threads = None
        for line in text.splitlines():
            if line.startswith("Uid:"):
                real = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
        if uid is None or real == uid:
            n += threads or 1
    return n


def _limit(which: int, soft: int, hard: int | None = None) -> None:
    """Set an rlimit, never above the hard limit we inherited (that would fail)."""
    hard = soft if hard is None else hard
    _, old_hard = resource.getrlimit(which)
    if old_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, old_hard), min(hard, old_hard)
    resource.setrlimit(which, (soft, hard))


def _set_limits(lim: dict) -> None:
    mb = 1024 * 1024
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_FSIZE, lim["py_max_file_mb"] * mb)
    _limit(resource.RLIMIT_NOFILE, lim["py_max_open_files"])
    _limit(resource.RLIMIT_CPU, lim["py_cpu_s"], lim["py_cpu_s"] + 1)
    _limit(resource.RLIMIT_AS, lim["py_memory_mb"] * mb)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


# Landlock (Linux 5.13+): the kernel confines the worker's file access, native code included
# (pyarrow's own file I/O never reaches the audit hook).
_LL_READ_FILE, _LL_READ_DIR, _LL_WRITE_FILE, _LL_TRUNCATE = 1 << 2, 1 << 3, 1 << 1, 1 << 14
_LL_FILE_RIGHTS = (1 << 0) | _LL_WRITE_FILE | _LL_READ_FILE | _LL_TRUNCATE | (1 << 15)
_SYS_LANDLOCK = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}


def _landlock(workdir: str, read_dirs: list[str], read_files: list[str]) -> str:
    """Allow reading `read_dirs`/`read_files`, everything in `workdir`, and nothing else."""
    import ctypes

    nrs = _SYS_LANDLOCK.get(os.uname().machine)
    if nrs is None:
        return f"audit hook only (no Landlock syscall numbers for {os.uname().machine})"
    libc = ctypes.CDLL(None, use_errno=True)
    create, add, restrict = nrs
    abi = libc.syscall(create, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return f"audit hook only (Landlock unavailable: {os.strerror(ctypes.get_errno())})"
    handled = (1 << 13) - 1  # ABI 1: execute .. make_sym
    handled |= (1 << 13) if abi >= 2 else 0  # refer
    handled |= _LL_TRUNCATE if abi >= 3 else 0
    handled |= (1 << 15) if abi >= 5 else 0  # ioctl_dev
    attr = ctypes.c_uint64(handled)
    ruleset = libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(8), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"audit hook only (Landlock ruleset: {os.strerror(ctypes.get_errno())})"

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    def allow(path: str, rights: int) -> None:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if not os.path.isdir(path):
                rights &= _LL_FILE_RIGHTS
            rule = PathBeneath(rights & handled, fd)
            libc.syscall(add, ruleset, ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0))
        finally:
            os.close(fd)

    try:
        allow(workdir, handled)
        for d in read_dirs:
            allow(d, _LL_READ_FILE | _LL_READ_DIR)
        for f in read_files:
            allow(f, _LL_READ_FILE)
        allow("/dev/null", _LL_READ_FILE | _LL_WRITE_FILE | _LL_TRUNCATE)
        if libc.syscall(restrict, ruleset, ctypes.c_uint32(0)) != 0:
            return f"audit hook only (Landlock restrict: {os.strerror(ctypes.get_errno())})"
    finally:
        os.close(ruleset)
    return f"Landlock (ABI {abi}) + audit hook"


def _world_readable(folder: str) -> bool:
    """Whether any user may list `folder` and pass through every folder above it."""
    import stat

    path = os.path.realpath(folder)
    try:
        if not os.stat(path).st_mode & stat.S_IROTH:
            return False
        while True:
            if not os.stat(path).st_mode & stat.S_IXOTH:
                return False
            parent = os.path.dirname(path)
            if parent == path:
                return True
            path = parent
    except OSError:
        return False


# Standard modules an agent's code commonly imports (or pandas imports lazily), loaded before
# dropping to `nobody` when that user cannot read the interpreter's own folder.
PRELOAD = ("abc", "array", "ast", "base64", "bisect", "bz2", "calendar", "cmath", "collections",
           "collections.abc", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal",
           "difflib", "encodings.ascii", "encodings.idna", "encodings.latin_1",
           "encodings.unicode_escape", "encodings.utf_16", "encodings.utf_8", "enum", "fnmatch",
           "fractions", "functools", "glob", "gzip", "hashlib", "heapq", "html", "io",
           "itertools", "json", "locale", "lzma", "math", "numbers", "operator", "pathlib",
           "pprint", "random", "re", "secrets", "shutil", "socket", "statistics", "string",
           "struct", "tempfile", "textwrap", "time", "timeit", "typing", "unicodedata",
           "urllib.parse", "uuid", "warnings", "weakref", "zipfile", "zlib", "zoneinfo")


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


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


_BLOCKED = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
    "os.kill", "os.killpg", "signal.pthread_kill", "pty.spawn", "pickle.find_class",
    "resource.setrlimit", "resource.prlimit", "sqlite3.load_extension",
    "sqlite3.enable_load_extension", "gc.get_objects", "gc.get_referrers",
    "gc.get_referents", "sys._current_frames", "sys._current_exceptions", "os.chroot",
    "os.startfile", "sys.remote_exec"})
_BLOCKED_PREFIXES = ("socket.", "ctypes.", "subprocess.", "http.client.", "urllib.", "ftplib.",
                     "smtplib.", "imaplib.", "poplib.", "nntplib.", "telnetlib.", "webbrowser.",
                     "_winapi.", "winreg.", "msvcrt.", "_posixsubprocess.")
# (multiprocessing may be imported, libraries do; its fork and spawn are blocked as events)
_BLOCKED_MODULES = frozenset({"ctypes", "_ctypes", "_posixsubprocess", "_xxsubinterpreters",
                              "_interpreters"})
_WRITE_EVENTS = frozenset({
    "os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod", "os.chown", "os.link",
    "os.symlink", "os.truncate", "os.utime", "os.chflags", "os.lchflags", "os.setxattr",
    "os.removexattr", "os.mkfifo", "os.mknod", "shutil.rmtree", "shutil.move",
    "shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.copytree", "shutil.chown",
    "shutil.make_archive", "shutil.unpack_archive", "os.chdir", "os.fchdir"})
_LIST_EVENTS = frozenset({"os.listdir", "os.scandir", "glob.glob", "glob.glob/2",
                          "os.listxattr", "os.getxattr"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _make_hook(workdir: str, readable: frozenset, roots: tuple, violations: list,
               report=None):
    """The audit hook. Everything it consults is bound here, immutable (strings, tuples,
    frozensets) and out of reach of the agent's code: it cannot rebind module globals or
    builtins to switch the checks off. `report(message)` sends each violation to the parent
    as it happens, so the code cannot take it back afterwards."""
    wd = os.path.realpath(workdir)
    wd_prefix = wd + os.sep
    realpath, fspath, fsdecode, isdir = os.path.realpath, os.fspath, os.fsdecode, os.path.isdir
    blocked, prefixes, modules = _BLOCKED, _BLOCKED_PREFIXES, _BLOCKED_MODULES
    write_events, list_events, write_flags = _WRITE_EVENTS, _LIST_EVENTS, _WRITE_FLAGS
    violation, is_a, length, has = SandboxViolation, isinstance, len, hasattr

    def where(p):
        if p is None or is_a(p, int):
            return None
        try:
            return realpath(fsdecode(fspath(p)))
        except (TypeError, ValueError):
            return "?"

    def inside(p) -> bool:
        return p is None or p == wd or p.startswith(wd_prefix)

    def may_read(p) -> bool:
        return inside(p) or p in readable or p.startswith(roots) or p == "/dev/null"

    def deny(event: str, detail: str = "") -> None:
        msg = f"{event} is not allowed in the sandbox" + (f" ({detail})" if detail else "")
        if length(violations) < 20:
            violations.append(msg)
            if report is not None:
                report(msg)
        raise violation(msg)

    def pathlike(a) -> bool:
        return is_a(a, (str, bytes)) or has(a, "__fspath__")

    def hook(event: str, args: tuple) -> None:
        if event in blocked or event.startswith(prefixes):
            deny(event)
        elif event == "open":
            p = where(args[0])
            if p is None:
                return
            mode = args[1] if length(args) > 1 else None
            flags = args[2] if length(args) > 2 else 0
            writing = (is_a(flags, int) and flags > 0 and flags & write_flags) or \
                (is_a(mode, str) and ("w" in mode or "a" in mode or "x" in mode or "+" in mode))
            if writing and not inside(p):
                deny("writing a file outside the working folder", p)
            if not inside(p) and isdir(p):  # a folder's descriptor would be a `dir_fd`, and
                # paths relative to it are checked here as if relative to the working folder
                deny("opening a folder outside the working folder", p)
            if not writing and not may_read(p):
                deny("reading a file outside the working folder and the data", p)
        elif event in write_events:
            for a in args:
                if pathlike(a):
                    p = where(a)
                    if not inside(p) and not (event == "os.chdir" and may_read(p)):
                        deny(event, p)
        elif event in list_events:
            p = where(args[0]) if args else None
            if p is not None and not may_read(p):
                deny(event, p)
        elif event == "sqlite3.connect":
            db = args[0] if args else ""
            if pathlike(db):
                name = fsdecode(fspath(db))
                if name not in ("", ":memory:") and not inside(where(name)):
                    deny("sqlite3.connect outside the working folder", name)
        elif event == "import" and args and args[0] in modules:
            deny(f"import {args[0]}")

    return hook


def _blocked(what: str):
    def blocked(*_a, **_k):
        raise SandboxViolation(f"{what} is not allowed in the sandbox")
    return blocked


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


def _worker(job: dict, iso: dict) -> None:
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


# System folders and files (shared libraries and their cache, time zones, CA certificates,
# CPU/cgroup facts that libraries size thread pools by): public, harmless to read.
SYSTEM_READ = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib",
               "/usr/share/zoneinfo", "/etc/ssl/certs", "/sys/fs/cgroup",
               "/sys/devices/system/cpu", "/etc/ld.so.cache", "/etc/localtime")


def _read_roots() -> tuple[list[str], list[str]]:
    """(folders, files) the worker may read: the interpreter's own files plus SYSTEM_READ.
    Folders come with a trailing separator."""
    dirs, files = set(), set()
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
              *SYSTEM_READ):
        for q in (p, os.path.realpath(p)):
            if os.path.isdir(q):
                dirs.add(q.rstrip(os.sep) + os.sep)
            elif os.path.isfile(q):
                files.add(q)
    return sorted(dirs), sorted(files)


def _keep_only_cap(cap: int | None) -> bool:
    """Reduce our capabilities to `cap` alone (None: to nothing)."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    data = (Data * 2)()
    if cap is not None:
        data[cap // 32].effective = data[cap // 32].permitted = 1 << (cap % 32)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.capset(ctypes.byref(Header(0x20080522, 0)), data) == 0
    except (OSError, AttributeError):
        return False


CAP_DAC_READ_SEARCH = 2
PR_SET_KEEPCAPS = 8


def _drop_privileges(user: list[int], landlocked: bool) -> str:
    """As root: become `user` (no groups). When that user cannot read the interpreter's
    folder (a pyenv under /root, say), keep CAP_DAC_READ_SEARCH if Landlock already limits
    what may be read, else preload common modules first."""
    note = ""
    keep = False
    if not _world_readable(os.path.dirname(os.__file__)):
        if landlocked:
            keep = _prctl(PR_SET_KEEPCAPS, 1)
        if not keep:
            _preload()
            note = " (the interpreter's folder is not readable by it: common modules preloaded)"
    try:
        os.setgroups([])
        os.setgid(user[1])
        os.setuid(user[0])
    except OSError as e:  # a container that forbids it: carry on as root, and say so
        return f"unchanged (0; could not drop to {user[0]}: {e.strerror})"
    if keep:
        _prctl(PR_SET_KEEPCAPS, 0)
        if _keep_only_cap(CAP_DAC_READ_SEARCH):
            note = (" + CAP_DAC_READ_SEARCH to read the interpreter's folder (Landlock bounds "
                    "what it reads)")
        else:
            _keep_only_cap(None)
            note = " (could not keep read access to the interpreter's folder)"
    return f"dropped to {user[0]}{note}"


def _tasks_now(job: dict, iso: dict, user: list[int] | None) -> int:
    """What RLIMIT_NPROC will count (read now: /proc is out of reach once Landlock is on)."""
    if iso.get("user_namespace") == "yes" and _kernel_at_least(5, 14):
        return _count_tasks(None)  # since 5.14 counted per user namespace: our own tree
    if iso.get("user_namespace") == "yes":
        return job.get("user_tasks", 0)  # older kernels: every task of the real user
    return _count_tasks(user[0] if user else os.getuid())


def _confine(job: dict, iso: dict, user: list[int] | None, current: int
             ) -> tuple[set[str], list[str], bool]:
    """Landlock, the dropped uid and RLIMIT_NPROC, each noted in `iso`: (the files the code
    may read, the folders it may read, whether Landlock holds)."""
    lim, workdir = job["limits"], job["workdir"]
    roots, system_files = _read_roots()
    readable = {os.path.realpath(p) for p in job["readable"]} | set(system_files)
    readable |= {os.path.realpath(t["path"]) for t in job["tables"]}
    if job["isolate"]:
        iso["filesystem"] = _landlock(workdir, sorted({r.rstrip(os.sep) or os.sep
                                                       for r in roots}), sorted(readable))
    else:
        iso["filesystem"] = "audit hook only (isolate=False)"
    landlocked = iso["filesystem"].startswith("Landlock")
    iso["uid"] = _drop_privileges(user, landlocked) if user else f"unchanged ({os.getuid()})"
    cap = current + lim["py_max_procs"]
    _limit(resource.RLIMIT_NPROC, cap)
    exempt = os.getuid() == 0 or (job.get("real_root") and not iso["uid"].startswith("dropped"))
    iso["nproc"] = ("not enforced (root is exempt)" if exempt
                    else f"{cap} ({lim['py_max_procs']} above the current {current})")
    return readable, roots, landlocked


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
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    _set_limits(lim)
    import builtins

    import numpy as np
    import pandas as pd

    tables = _load_tables(job["tables"], pd)
    user = job.get("user") if os.getuid() == 0 else None
    readable, roots, landlocked = _confine(job, iso, user, _tasks_now(job, iso, user))
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after setuid, which clears it
    os.chdir(workdir)
    pd.read_pickle = _blocked("read_pickle (unpickling runs code)")
    if "_posixsubprocess" in sys.modules:  # fork_exec itself raises no audit event
        sys.modules["_posixsubprocess"].fork_exec = _blocked("_posixsubprocess.fork_exec")
    violations: list[str] = []
    out = _Capped(lim["output_cap_chars"])
    ns = {"__name__": "__main__", "__builtins__": builtins, "tables": tables, "pd": pd, "np": np}
    fd, token = job["envelope_fd"], job.pop("token", "")
    _send(fd, {"isolation": iso}, token, kind="isolation")  # before the code can write here
    sys.stdout = sys.stderr = out
    if job["audit"]:
        sys.addaudithook(_make_hook(
            workdir, frozenset(readable), tuple(roots), violations,
            lambda msg: _send(fd, {"message": msg}, token, kind="blocked")))
    error, kind = _run_code(job["code"], ns, lim, violations, landlocked)
    _send(fd, _envelope(job, out, error, kind, iso, violations, ns), token)
    return 0


if __name__ == "__main__":
    main()
