"""The sandbox child's entry: the supervisor. Not imported by the workbench.

Started by `workbench.dataenv.sandbox.run_python` as `python -I -B sandbox_main.py` in a new
session, with a cleared environment and a temporary working folder as cwd. It reads its job
(JSON) from stdin and writes one JSON envelope to the pipe named in the job. It and its
sibling modules (`sandbox_confine`: limits, Landlock, privileges; `sandbox_hook`: the audit
hook; `sandbox_worker`: runs the code and reports) import nothing from the workbench, so the
child works with `-I` wherever the interpreter has pandas. `-I` puts no script folder on
`sys.path`; this module appends its own folder, which holds only these four modules (named
`sandbox_*`, so they shadow nothing), imports them before any confinement and takes the folder
off the path again.

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
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(HERE)

# the sibling modules, found through the folder appended above
from sandbox_confine import (
    PR_SET_CHILD_SUBREAPER,
    PR_SET_PDEATHSIG,
    count_tasks,
    libc,
    prctl,
)
from sandbox_worker import worker

# ... and off the path again: in a checkout the folder is outside what the worker may read, so
# code that lists the path (pkgutil.iter_modules, importlib.metadata) would be refused there
while HERE in sys.path:
    sys.path.remove(HERE)
sys.path_importer_cache.pop(HERE, None)

CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000


def _unshare() -> dict[str, str]:
    """New network + PID namespaces where allowed; says which layers hold."""
    if os.geteuid() == 0:  # as root, no user namespace: the worker drops to nobody instead
        tries = [CLONE_NEWNET | CLONE_NEWPID, CLONE_NEWNET]
    else:
        tries = [CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID, CLONE_NEWUSER | CLONE_NEWNET]
    try:
        lib = libc()
    except OSError:
        return {"network": "audit hook only (no libc)", "pid_namespace": "no"}
    for flags in tries:
        if lib.unshare(flags) == 0:
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
        job["user_tasks"] = count_tasks(os.getuid())
    job["real_root"] = os.geteuid() == 0 or _maps_to_root()
    iso = _unshare() if job["isolate"] else {"network": "not isolated (isolate=False)",
                                             "pid_namespace": "no"}
    pidns = iso["pid_namespace"] == "yes"
    if not pidns:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
    pid = os.fork()
    if pid == 0:
        if pidns:  # pid 1 of the new namespace: reap, and run the worker one level down
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            below = os.fork()
            if below == 0:
                worker(job, iso)
            os._exit(_wait_for(below))
        worker(job, iso)

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


if __name__ == "__main__":
    main()
