"""The sandbox child's audit hook (see `sandbox_main`, layer 5): best effort, not a security
boundary on its own. Not imported by the workbench; imports nothing from it."""

from __future__ import annotations

import os


class SandboxViolation(PermissionError):
    """Raised by the audit hook; the agent sees its message."""



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


def make_hook(workdir: str, readable: frozenset, roots: tuple, violations: list,
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
            mode = args[1] if length(args) > 1 else "r"  # open()'s default
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


def blocked(what: str):
    def blocked(*_a, **_k):
        raise SandboxViolation(f"{what} is not allowed in the sandbox")
    return blocked

