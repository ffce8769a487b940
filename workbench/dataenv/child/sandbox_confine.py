"""Limits, Landlock and privileges for the sandbox child (see `sandbox_main`). Not imported by
the workbench; imports nothing from it."""

from __future__ import annotations

import os
import resource
import signal
import sys

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38


def libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def prctl(option: int, arg: int) -> bool:
    try:
        return libc().prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False



def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        parts = os.uname().release.split(".")
        return (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)) >= \
            (major, minor)
    except (ValueError, IndexError):
        return False


def count_tasks(uid: int | None) -> int:
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


def limit(which: int, soft: int, hard: int | None = None) -> None:
    """Set an rlimit, never above the hard limit we inherited (that would fail)."""
    hard = soft if hard is None else hard
    _, old_hard = resource.getrlimit(which)
    if old_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, old_hard), min(hard, old_hard)
    resource.setrlimit(which, (soft, hard))


def set_limits(lim: dict) -> None:
    mb = 1024 * 1024
    limit(resource.RLIMIT_CORE, 0)
    limit(resource.RLIMIT_FSIZE, lim["py_max_file_mb"] * mb)
    limit(resource.RLIMIT_NOFILE, lim["py_max_open_files"])
    limit(resource.RLIMIT_CPU, lim["py_cpu_s"], lim["py_cpu_s"] + 1)
    limit(resource.RLIMIT_AS, lim["py_memory_mb"] * mb)
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
            keep = prctl(PR_SET_KEEPCAPS, 1)
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
        prctl(PR_SET_KEEPCAPS, 0)
        if _keep_only_cap(CAP_DAC_READ_SEARCH):
            note = (" + CAP_DAC_READ_SEARCH to read the interpreter's folder (Landlock bounds "
                    "what it reads)")
        else:
            _keep_only_cap(None)
            note = " (could not keep read access to the interpreter's folder)"
    return f"dropped to {user[0]}{note}"


def tasks_now(job: dict, iso: dict, user: list[int] | None) -> int:
    """What RLIMIT_NPROC will count (read now: /proc is out of reach once Landlock is on)."""
    if iso.get("user_namespace") == "yes" and _kernel_at_least(5, 14):
        return count_tasks(None)  # since 5.14 counted per user namespace: our own tree
    if iso.get("user_namespace") == "yes":
        return job.get("user_tasks", 0)  # older kernels: every task of the real user
    return count_tasks(user[0] if user else os.getuid())


def confine(job: dict, iso: dict, user: list[int] | None, current: int
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
    limit(resource.RLIMIT_NPROC, cap)
    exempt = os.getuid() == 0 or (job.get("real_root") and not iso["uid"].startswith("dropped"))
    iso["nproc"] = ("not enforced (root is exempt)" if exempt
                    else f"{cap} ({lim['py_max_procs']} above the current {current})")
    return readable, roots, landlocked

