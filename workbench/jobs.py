"""Long work as background jobs with their state on disk, shared by the CLI and the app.

A job is a folder `<workspace>/jobs/<id>/` holding `job.json` (kind, config, status, pid,
progress, error), `config.yaml` and `log.txt`. `start_job` launches a detached process that
runs one library function; the caller never waits. Status survives restarts of the app:
anyone can read the folder, and a job whose process died is reported as failed. Jobs writing
the same run folder exclude each other with a lock file, so two jobs cannot corrupt one run;
a failed or stopped job is resumed by starting it again (the stages and the call cache skip
finished work): `run_again(job)` does so with the job's own kind and config.

While it runs, a job's process keeps `progress.json` in its folder: a snapshot of the work in
flight (each level's done/total, the rate and the time left), written by the progress ticker
(`workbench.progress`). `job_rows` puts a workspace's jobs, their progress and the end of
their logs in one typed table: the task centre of the CLI (`workbench jobs list --watch`)
and of the app.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

import yaml

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workbench import registry
from workbench.errors import TrainingInterrupted, WorkbenchError
from workbench.io import atomic_write_json, atomic_write_text, pid_alive

JOB_SCHEMA = 1
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
STATUSES = ("queued", "running", "completed", "failed", "stopped", "unreadable")
ACTIVE = ("queued", "running")  # a job in one of these may still write its run folder
PROGRESS_FILE = "progress.json"
MAX_PROGRESS_JSON = 256 * 1024  # a snapshot is a few hundred bytes


def kinds() -> list[str]:
    """Job kinds: every registered pipeline and experiment."""
    return registry.names()


def check_job_id(job_id: str) -> str:
    if not JOB_ID.match(job_id or "") or ".." in job_id:
        raise WorkbenchError(f"job id {job_id!r}: not a job id (letters, digits, '.', '_', "
                             "'-')")
    return job_id


class Job(BaseModel):
    """A job's state, as `job.json` holds it."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = JOB_SCHEMA
    id: str
    kind: str
    workspace: str
    config: dict[str, Any]
    status: str = "queued"  # one of STATUSES
    pid: int | None = None
    pid_start: int | None = None  # the process's start time (clock ticks since boot)
    created: float = Field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    progress: list[str] = Field(default_factory=list)
    result: dict[str, Any] = Field(default_factory=dict)
    peak_rss_mb: float | None = None  # the work's peak memory, recorded when it ends

    @property
    def folder(self) -> Path:
        return Path(self.workspace) / "jobs" / self.id

    @property
    def layout(self):
        from workbench.runs import RunLayout, check_run_name

        c = self.config
        return RunLayout(Path(c.get("output_dir", "runs")) /
                         check_run_name(c.get("name", "experiment")))

    @property
    def run_dir(self) -> Path:
        return self.layout.root

    def save(self) -> None:
        if self.status != "unreadable":
            atomic_write_json(self.folder / "job.json", self.model_dump(mode="json"))

    def log_text(self, tail: int = 200, max_bytes: int = 1 << 20) -> str:
        """The last `tail` lines of the job's log (a regular file, never through a link;
        only its last `max_bytes` are read)."""
        import stat

        try:
            fd = os.open(self.folder / "log.txt", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return ""
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                return ""
            fh.seek(max(0, st.st_size - max_bytes))
            data = fh.read(max_bytes)
        return "\n".join(data.decode(errors="replace").splitlines()[-tail:])

    def snapshot(self) -> ProgressSnapshot | None:
        """The job's last progress snapshot (`job_progress`)."""
        return job_progress(self)


class ProgressLevel(BaseModel):
    """One level of the work in flight: a stage, a loop inside it, a batch loop inside that."""

    model_config = ConfigDict(extra="ignore")
    desc: str = ""
    done: int = 0
    total: int | None = None  # None: not counted (a stage)
    unit: str = ""


class ProgressSnapshot(BaseModel):
    """`progress.json` of a job (written by `workbench.progress`): the levels of the work in
    flight and, for the outermost counted level that has moved, done/total, rate (per
    second), elapsed and time left (seconds) as of `updated_at` (epoch seconds)."""

    model_config = ConfigDict(extra="ignore")
    schema_version: int = 1
    pid: int | None = None
    updated_at: float
    label: str = ""
    levels: list[ProgressLevel] = Field(default_factory=list)
    counted: int | None = None
    done: int | None = None
    total: int | None = None
    unit: str = ""
    rate: float | None = None
    elapsed: float | None = None
    eta: float | None = None


MAX_JOB_JSON = 8 * 1024 * 1024  # a job's state is kilobytes; more is not a job.json


def _read_regular(f: Path, cap: int) -> bytes:
    """The bytes of a file that is a regular file (never through a link, never a device or
    FIFO), at most `cap` of them."""
    import stat

    fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > cap:
            raise ValueError(f"{st.st_size} bytes, over {cap}")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(cap + 1)
    finally:
        os.close(fd)


def _read_job_json(f: Path) -> bytes:
    """The bytes of a job.json that is a regular file, at most MAX_JOB_JSON of them."""
    return _read_regular(f, MAX_JOB_JSON)


def job_progress(job: Job) -> ProgressSnapshot | None:
    """The job's progress snapshot (`<job folder>/progress.json`), or None when there is none
    or it cannot be read: missing, half-written, a link, a device, too large. Read-only."""
    try:
        return ProgressSnapshot.model_validate_json(
            _read_regular(job.folder / PROGRESS_FILE, MAX_PROGRESS_JSON))
    except (ValidationError, ValueError, OSError):
        return None


def load_job(folder: str | Path) -> Job:
    """A job's state, read-only. The job's identity (id, workspace) is its folder's, never
    what its file says. A `job.json` that cannot be read (broken, a link, a device, too
    large) comes back as an "unreadable" job naming the file, so one broken job never hides
    the others. A running job whose process is gone, or is not the job's, reads as failed."""
    folder = Path(folder)
    f = folder / "job.json"
    ident = {"id": folder.name, "workspace": str(folder.parent.parent)}
    try:
        job = Job.model_validate_json(_read_job_json(f)).model_copy(update=ident)
    except FileNotFoundError:
        raise WorkbenchError(f"{folder}: no such job") from None
    except (ValidationError, ValueError, OSError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0][:200]
        with contextlib.suppress(OSError):
            created = f.lstat().st_mtime
        return Job(**ident, kind="?", config={}, status="unreadable",
                   error=f"{f}: unreadable job state ({first})",
                   created=locals().get("created", 0.0))
    if job.status == "running" and not is_job_process(job):
        job.status, job.error = "failed", job.error or "the job's process died"
        job.finished = job.finished or time.time()
    elif job.status == "queued" and job.pid is None and time.time() - job.created > 120:
        job.status = "failed"
        job.error = "the job's process never started (see log.txt)"
    return job


def process_start(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (/proc), None if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[-1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def is_job_process(job: Job) -> bool:
    """Whether `job.pid` is this job's process: alive, running `workbench.jobs` on this
    job's folder, and (when recorded) started when the job's process started. A pid reused
    by another process, or named by a changed job.json, is not."""
    if not job.pid or job.pid <= 1 or not pid_alive(job.pid):
        return False
    try:
        with open(f"/proc/{job.pid}/cmdline", "rb") as fh:
            argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return False
    if "workbench.jobs" not in argv or not argv or \
            Path(argv[-1]).resolve() != job.folder.resolve():
        return False
    return job.pid_start is None or process_start(job.pid) == job.pid_start


def job_folder(workspace: str | Path, job_id: str) -> Path:
    return Path(workspace) / "jobs" / check_job_id(job_id)


def kinds_known(jobs: list[Job] | None = None) -> list[str]:
    """The registered kinds, then those of `jobs` no longer registered (a removed plugin)."""
    known = kinds()
    return known + sorted({j.kind for j in jobs or () if j.kind not in known
                           and j.status != "unreadable"})


def _check_states(states) -> None:
    bad = [s for s in states or () if s not in STATUSES]
    if bad:
        raise WorkbenchError(f"unknown job state {bad[0]!r} (expected one of "
                             f"{', '.join(STATUSES)})")


def list_jobs(workspace: str | Path, kind: str | None = None, *,
              kinds: list[str] | tuple[str, ...] | None = None,
              states: list[str] | tuple[str, ...] | None = None) -> list[Job]:
    """Every job of a workspace, newest first, read-only; only those of `kind` (or of one of
    `kinds`) and in one of `states` when given. Entries of `jobs/` that are not plain folders
    (links, files) or are not job ids are not jobs and are left out."""
    _check_states(states)
    workspace = Path(workspace)
    if workspace.exists() and not workspace.is_dir():
        raise WorkbenchError(f"{workspace}: not a folder (a workspace is a folder)")
    root = workspace / "jobs"
    jobs = [load_job(p) for p in sorted(root.iterdir())
            if not p.is_symlink() and p.is_dir() and JOB_ID.match(p.name)
            and os.path.lexists(p / "job.json")] if root.is_dir() else []
    unknown = [k for k in kinds or () if k not in kinds_known(jobs)]
    if unknown:
        raise WorkbenchError(f"unknown job kind {unknown[0]!r} (expected one of "
                             f"{', '.join(kinds_known(jobs))})")
    jobs = [j for j in jobs if (kind is None or j.kind == kind)
            and (not kinds or j.kind in kinds) and (not states or j.status in states)]
    return sorted(jobs, key=lambda j: j.created, reverse=True)


def start_job(workspace: str | Path, kind: str, config: dict[str, Any], *,
              job_id: str | None = None) -> Job:
    """Write the job folder and launch it detached; returns at once."""
    if kind not in kinds():
        raise WorkbenchError(f"unknown job kind {kind!r} (expected {', '.join(kinds())})")
    from workbench.config import experiment_config_model

    experiment_config_model().model_validate(config)  # refuse bad configs before launching
    workspace = Path(workspace).resolve()
    job = Job(id=check_job_id(job_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}-"
                                        f"{uuid.uuid4().hex[:6]}"),
              kind=kind, workspace=str(workspace), config=config)
    job.folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(job.folder / "config.yaml", yaml.safe_dump(config, sort_keys=False))
    job.save()
    log = open(job.folder / "log.txt", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "workbench.jobs", str(job.folder)],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=str(workspace), start_new_session=True,
                            env=dict(os.environ, TQDM_DISABLE="1"))
    log.close()
    # the supervisor records the same pid, status and start time when it starts
    job.pid, job.pid_start, job.status = proc.pid, process_start(proc.pid), "running"
    job.save()
    return job


def stop_job(job: Job) -> bool:
    """SIGTERM to the job's process group, only once the process is verified to be this
    job's (`is_job_process`); returns whether a signal was sent. A running job whose pid
    is not its process is refused with one line, and nothing is signalled."""
    if job.status != "running":
        return False
    if not is_job_process(job):
        raise WorkbenchError(f"job {job.id}: process {job.pid} is not this job's (it ended, "
                             "its pid was reused, or job.json was changed); nothing was "
                             "signalled")
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(job.pid) == job.pid:  # start_job made it a group leader
            os.killpg(job.pid, signal.SIGTERM)
        else:
            os.kill(job.pid, signal.SIGTERM)
    return True


def _run_root(job: Job) -> Path | None:
    """The run folder a job writes, as its process sees it (relative to its workspace)."""
    try:
        return (Path(job.workspace) / job.run_dir).resolve()
    except (WorkbenchError, ValueError, OSError, TypeError):
        return None


def run_again(job: Job) -> Job:
    """Start a new job of the same kind and config as `job`, which resumes its run folder:
    the stages and the call cache skip what is finished, as starting it again from the CLI
    does. Refused (WorkbenchError) while the job, or another job of the same run folder, is
    still running, and for a job whose state is unreadable."""
    job = load_job(job.folder)  # its state now, not a caller's stale copy
    if job.status in ACTIVE:
        raise WorkbenchError(f"job {job.id} is still {job.status}; stop it or wait for it to "
                             "end before running it again")
    if job.status == "unreadable":
        raise WorkbenchError(f"job {job.id}: its state is unreadable, so its kind and config "
                             "are unknown; start the work again with `workbench jobs start`")
    root = _run_root(job)
    busy = [j for j in list_jobs(job.workspace, states=ACTIVE)
            if root is not None and _run_root(j) == root]
    if busy:
        raise WorkbenchError(f"{root} is being written by job {busy[0].id}; wait for it or "
                             "stop it before running this job again")
    return start_job(job.workspace, job.kind, job.config)


class JobRow(BaseModel):
    """One line of the task centre: a job, its progress and the end of its log."""

    id: str
    kind: str
    state: str  # one of STATUSES
    run: str  # the run's name (config `name`)
    run_dir: str | None  # the run folder it writes
    created: float
    started: float | None = None
    finished: float | None = None
    elapsed: float | None = None  # seconds since it started (running) or that it ran
    error: str | None = None
    message: str | None = None  # the pipeline's last progress message
    progress: ProgressSnapshot | None = None  # the work in flight (running jobs only)
    log_tail: list[str] = Field(default_factory=list)
    can_stop: bool = False
    can_run_again: bool = False  # stopped or failed: there is work left to finish
    peak_rss_mb: float | None = None  # the work's peak memory (recorded when it ended)

    @property
    def done(self) -> int | None:
        return self.progress.done if self.progress else None

    @property
    def total(self) -> int | None:
        return self.progress.total if self.progress else None

    @property
    def fraction(self) -> float | None:
        """done/total in [0, 1] (1 for a completed job), None when the work in flight is not
        counted."""
        if self.state == "completed":
            return 1.0
        if not self.progress or not self.progress.total or self.progress.done is None:
            return None
        return min(1.0, max(0.0, self.progress.done / self.progress.total))

    @property
    def eta(self) -> float | None:
        """Seconds left, from the snapshot's estimate less the time since it was written."""
        p = self.progress
        if p is None or p.eta is None:
            return None
        return max(0.0, p.eta - max(0.0, time.time() - p.updated_at))

    def progress_text(self) -> str:
        p = self.progress
        if p is None or not p.levels:
            return "-"
        if p.total:
            return f"{p.done}/{p.total} {p.unit}".rstrip()
        return "running"

    def rate_text(self) -> str:
        p = self.progress
        return f"{p.rate:.2g} {p.unit}/s".replace(" /", "/") if p and p.rate else "-"

    def eta_text(self) -> str:
        from workbench.progress import duration

        eta = self.eta
        return duration(eta) if eta is not None else "-"

    def elapsed_text(self) -> str:
        from workbench.progress import duration

        return duration(self.elapsed) if self.elapsed is not None else "-"


def job_row(job: Job, *, log_lines: int = 10) -> JobRow:
    """A job as the task centre shows it (read-only)."""
    now = time.time()
    run = job.config.get("name") if isinstance(job.config, dict) else None
    root = _run_root(job) if job.status != "unreadable" else None
    elapsed = None
    if job.started is not None:
        end = job.finished if job.finished is not None else (
            now if job.status == "running" else None)
        elapsed = max(0.0, end - job.started) if end is not None else None
    running = job.status == "running"
    log = job.log_text(log_lines, max_bytes=64 * 1024) if log_lines > 0 else ""
    return JobRow(id=job.id, kind=job.kind, state=job.status, run=str(run or "-"),
                  run_dir=str(root) if root else None, created=job.created,
                  started=job.started, finished=job.finished, elapsed=elapsed,
                  error=job.error, message=(job.progress or [None])[-1],
                  progress=job_progress(job) if running else None,
                  log_tail=log.splitlines() if log else [],
                  can_stop=running, can_run_again=job.status in ("stopped", "failed"),
                  peak_rss_mb=job.peak_rss_mb)


def job_rows(workspace: str | Path, *, kinds: list[str] | tuple[str, ...] | None = None,
             states: list[str] | tuple[str, ...] | None = None,
             log_lines: int = 10) -> list[JobRow]:
    """Every job of a workspace as task-centre rows, newest first, filtered by kind(s) and
    state(s) when given."""
    return [job_row(j, log_lines=log_lines)
            for j in list_jobs(workspace, kinds=kinds, states=states)]


def wait_job(job: Job, timeout: float = 600, poll: float = 0.5) -> Job:
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = load_job(job.folder)
        if job.status not in ("queued", "running"):
            return job
        time.sleep(poll)
    raise TimeoutError(f"job {job.id} still {job.status} after {timeout}s")


@contextlib.contextmanager
def run_lock(run_dir: Path, job_id: str):
    """Exclusive lock on a run folder for the duration of a job. A run that ends having
    written nothing but the lock (bad input found before its first output) leaves nothing:
    the lock and the folders made for it are removed."""
    made = [d for d in (run_dir, *run_dir.parents) if not d.exists()]
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        fh = open(run_dir / ".lock", "a+")
    except OSError:
        _remove_if_only_lock(run_dir, made)
        raise
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "another job"
        fh.close()
        raise WorkbenchError(f"{run_dir} is being written by {holder}; wait for it or stop "
                             "it") from None
    fh.seek(0)
    fh.truncate()
    fh.write(job_id)
    fh.flush()
    try:
        yield
    finally:
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()
        _remove_if_only_lock(run_dir, made)


def _remove_if_only_lock(run_dir: Path, made: list[Path]) -> None:
    """With `run_dir` made by this run and holding nothing but its lock, remove the lock and
    the folders `made` for it (innermost first), each only while it is empty."""
    if run_dir not in made:
        return
    with contextlib.suppress(OSError):
        if {p.name for p in run_dir.iterdir()} <= {".lock"}:
            (run_dir / ".lock").unlink(missing_ok=True)
            for d in made:
                d.rmdir()  # refuses (and stops the cleanup) as soon as one is not empty


def run_in_process(kind: str, cfg, *, log=print, should_stop=lambda: False,
                   fresh: bool = False, lock_id: str | None = None) -> registry.PipelineResult:
    """Run a registered pipeline here and now, holding its run folder's lock. Under a
    distributed launch (torchrun) rank 0 holds the lock and keeps the run's records; the other
    ranks compute beside it and write neither."""
    from workbench.runs import RunContext, RunLayout, launch_rank, run_pipeline

    layout = RunLayout.of(cfg)
    if launch_rank() > 0:
        return run_pipeline(kind, cfg, RunContext(layout=layout, log=log,
                                                  should_stop=should_stop, fresh=fresh,
                                                  records=False))
    with run_lock(layout.root, lock_id or f"pid {os.getpid()}"):
        return run_pipeline(kind, cfg, RunContext(layout=layout, log=log,
                                                           should_stop=should_stop,
                                                           fresh=fresh))


def _execute(job: Job) -> dict[str, Any]:
    from workbench.config import experiment_config_model

    cfg = experiment_config_model().model_validate(job.config)

    def progress(msg: str) -> None:
        print(msg, flush=True)
        job.progress = (job.progress + [msg])[-50:]
        job.save()

    return run_in_process(job.kind, cfg, log=progress, lock_id=job.id).model_dump(mode="json")


def _worker(folder: str) -> int:
    """The job's work, in the process its supervisor (`main`) started and waits on."""
    import faulthandler

    from workbench.progress import quiet_libraries, set_progress_file, write_progress_file

    faulthandler.enable()  # a crash in native code leaves its Python stack in log.txt
    quiet_libraries()  # library warnings stay out of the job's log
    job = load_job(folder)
    set_progress_file(job.folder / PROGRESS_FILE)  # this process only, not its children
    job.status, job.started = "running", time.time()
    job.save()
    stopped = {"flag": False}

    def on_term(*_):
        stopped["flag"] = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        job.result = _execute(job)
        job.status = "completed"
    except (KeyboardInterrupt, TrainingInterrupted):
        job.status, job.error = "stopped", "stopped by request; start it again to resume"
    except WorkbenchError as e:
        job.status, job.error = "failed", str(e)
    except SystemExit as e:  # the trainer's graceful stop
        job.status = "stopped" if stopped["flag"] or e.code == 143 else "failed"
        job.error = "stopped; start it again to resume" if job.status == "stopped" else str(e)
    except Exception as e:  # our bug: keep the traceback in the log, a line in the state
        traceback.print_exc()
        job.status, job.error = "failed", f"{type(e).__name__}: {e}"
    # the work is over: a second stop request (a double click) must not cut the bookkeeping
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    write_progress_file()  # no work in flight any more
    job.finished = time.time()
    job.save()
    return 0 if job.status == "completed" else 1


def how_it_ended(returncode: int) -> str:
    """What a worker's exit status says, for a job that did not record its own end."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        why = {"SIGKILL": "the system ends a process this way when memory runs out (the "
                          "out-of-memory killer), or someone killed it",
               "SIGSEGV": "a crash in native code; log.txt has its Python stack",
               "SIGABRT": "native code aborted; log.txt has its Python stack",
               "SIGBUS": "a crash in native code; log.txt has its Python stack"}.get(
            name, "a signal the job does not handle")
        return f"the job's process was killed by {name} ({why})"
    return (f"the job's process exited with code {returncode} without recording its end "
            "(see log.txt)")


def _default_signals() -> None:
    """In the worker before exec: the handlers the supervisor ignores, back to default (an
    ignored signal stays ignored through exec)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def main(folder: str) -> int:
    """The supervisor `start_job` launches (the process group's leader, `job.pid`): it runs
    the work in a child process (`_worker`), waits for it, and when the child ends without
    recording its end (killed, crashed in native code) records how it ended and its peak
    memory, so a job never just reads "died". Stop requests go to the whole group (the
    worker handles them); the supervisor itself only waits."""
    import resource

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    job = load_job(folder)
    job.pid, job.pid_start = os.getpid(), process_start(os.getpid())
    if job.status in ACTIVE:
        job.status = "running"
    job.save()
    # the worker gets the default handlers back (SIG_IGN would be inherited through exec)
    proc = subprocess.Popen([sys.executable, "-m", "workbench.jobs", "--worker", folder],
                            stdin=subprocess.DEVNULL, preexec_fn=_default_signals)
    rc = proc.wait()
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    try:
        job = Job.model_validate_json(_read_job_json(job.folder / "job.json")).model_copy(
            update={"id": job.id, "workspace": job.workspace})
    except (ValidationError, ValueError, OSError):
        return 1
    job.peak_rss_mb = round(peak_mb, 1)
    if job.status in ACTIVE:
        job.status, job.error = "failed", how_it_ended(rc)
        job.finished = time.time()
        print(f"[workbench] {job.error}", flush=True)
    job.save()
    return 0 if job.status == "completed" else 1


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        sys.exit(_worker(sys.argv[2]))
    sys.exit(main(sys.argv[1]))
