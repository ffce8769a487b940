"""Long work as background jobs with their state on disk, shared by the CLI and the app.

A job is a folder `<workspace>/jobs/<id>/` holding `job.json` (kind, config, status, pid,
progress, error), `config.yaml` and `log.txt`. `start_job` launches a detached process that
runs one library function; the caller never waits. Status survives restarts of the app:
anyone can read the folder, and a job whose process died is reported as failed. Jobs writing
the same run folder exclude each other with a lock file, so two jobs cannot corrupt one run;
a failed or stopped job is resumed by starting it again (the stages and the call cache skip
finished work).
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


MAX_JOB_JSON = 8 * 1024 * 1024  # a job's state is kilobytes; more is not a job.json


def _read_job_json(f: Path) -> bytes:
    """The bytes of a job.json that is a regular file (never through a link, never a
    device or FIFO), at most MAX_JOB_JSON of them."""
    import stat

    fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_JOB_JSON:
            raise ValueError(f"{st.st_size} bytes, over {MAX_JOB_JSON}")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(MAX_JOB_JSON + 1)
    finally:
        os.close(fd)


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


def list_jobs(workspace: str | Path, kind: str | None = None) -> list[Job]:
    """Every job of a workspace, read-only. Entries of `jobs/` that are not plain folders
    (links, files) or are not job ids are not jobs and are left out."""
    workspace = Path(workspace)
    if workspace.exists() and not workspace.is_dir():
        raise WorkbenchError(f"{workspace}: not a folder (a workspace is a folder)")
    root = workspace / "jobs"
    jobs = [load_job(p) for p in sorted(root.iterdir())
            if not p.is_symlink() and p.is_dir() and JOB_ID.match(p.name)
            and os.path.lexists(p / "job.json")] if root.is_dir() else []
    jobs = [j for j in jobs if kind is None or j.kind == kind]
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


def main(folder: str) -> int:
    from workbench.progress import quiet_libraries

    quiet_libraries()  # library warnings stay out of the job's log
    job = load_job(folder)
    job.status, job.started = "running", time.time()
    job.pid, job.pid_start = os.getpid(), process_start(os.getpid())
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
    job.finished = time.time()
    job.save()
    return 0 if job.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
