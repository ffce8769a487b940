"""A job's state on disk: `job.json` read safely (a regular file, bounded), the job's
identity checked against its process, the workspace's jobs listed."""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workbench import registry
from workbench.errors import DataError, WorkbenchError
from workbench.io import atomic_write_json, pid_alive, read_regular_file
from workbench.records import StrictModel
from workbench.runs import RunLayout, check_run_name

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


class Job(StrictModel):
    """A job's state, as `job.json` holds it."""

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
    # stopped or failed: where its work stood when it ended (`workbench.progress`)
    last_progress: ProgressSnapshot | None = None

    @property
    def folder(self) -> Path:
        return Path(self.workspace) / "jobs" / self.id

    @property
    def layout(self):
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


def _read_job_json(f: Path) -> bytes:
    """The bytes of a job.json that is a regular file (never through a link, never a device
    or FIFO), at most MAX_JOB_JSON of them; else a DataError naming it (`io`'s reader)."""
    return read_regular_file(f, cap=MAX_JOB_JSON, what="job state", missing="no such job")


def job_progress(job: Job) -> ProgressSnapshot | None:
    """The job's progress snapshot (`<job folder>/progress.json`), or None when there is none
    or it cannot be read: missing, half-written, a link, a device, too large. Read-only."""
    try:
        return ProgressSnapshot.model_validate_json(read_regular_file(
            job.folder / PROGRESS_FILE, cap=MAX_PROGRESS_JSON, what="progress snapshot"))
    except (ValidationError, ValueError, OSError, DataError):
        return None


def load_job(folder: str | Path) -> Job:
    """A job's state, read-only. The job's identity (id, workspace) is its folder's, never
    what its file says. A `job.json` that cannot be read (broken, a link, a device, too
    large) comes back as an "unreadable" job naming the file, so one broken job never hides
    the others. A running job whose process is gone, or is not the job's, reads as failed."""
    folder = Path(folder)
    f = folder / "job.json"
    ident = {"id": folder.name, "workspace": str(folder.parent.parent)}
    first: str | None  # the first line of why the file cannot be read
    try:
        job = Job.model_validate_json(_read_job_json(f)).model_copy(update=ident)
    except DataError as e:
        if e.code == "not_found":
            raise WorkbenchError(f"{folder}: no such job") from None
        first = str(e).removeprefix(f"{f}: ")[:200]
    except (ValidationError, ValueError, OSError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0][:200]
    else:
        first = None
    if first is not None:
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


def wait_job(job: Job, timeout: float = 600, poll: float = 0.5) -> Job:
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = load_job(job.folder)
        # over once its state is final and its supervisor has written its bookkeeping
        if job.status not in ACTIVE and not is_job_process(job):
            return job
        time.sleep(poll)
    raise TimeoutError(f"job {job.id} still {job.status} after {timeout}s")


def run_root(job: Job) -> Path | None:
    """The run folder a job writes, as its process sees it (relative to its workspace)."""
    try:
        return (Path(job.workspace) / job.run_dir).resolve()
    except (WorkbenchError, ValueError, OSError, TypeError):
        return None
