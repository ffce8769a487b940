"""Starting, stopping and running jobs: `start_job` launches the supervisor (`main`), which
runs the work in a child (`_worker`) and records how it ended; the run-folder lock that keeps
two jobs off one run."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from workbench import registry
from workbench.config import experiment_config_model
from workbench.errors import TrainingInterrupted, WorkbenchError
from workbench.io import atomic_write_text
from workbench.jobs.state import (
    ACTIVE,
    PROGRESS_FILE,
    Job,
    ProgressSnapshot,
    _read_job_json,
    check_job_id,
    is_job_process,
    kinds,
    list_jobs,
    load_job,
    process_start,
    run_root,
)
from workbench.progress import (
    quiet_libraries,
    set_progress_file,
    where_it_stood,
    write_progress_file,
)
from workbench.runs import RunContext, RunLayout, launch_rank, run_pipeline


def start_job(workspace: str | Path, kind: str, config: dict[str, Any], *,
              job_id: str | None = None) -> Job:
    """Write the job folder and launch it detached; returns at once."""
    if kind not in kinds():
        raise WorkbenchError(f"unknown job kind {kind!r} (expected {', '.join(kinds())})")

    experiment_config_model().model_validate(config)  # refuse bad configs before launching
    workspace = Path(workspace).resolve()
    job = Job(id=check_job_id(job_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}-"
                                        f"{uuid.uuid4().hex[:6]}"),
              kind=kind, workspace=str(workspace), config=config)
    job.folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(job.folder / "config.yaml", yaml.safe_dump(config, sort_keys=False))
    job.save()
    with open(job.folder / "log.txt", "ab") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen([sys.executable, "-m", "workbench.jobs", str(job.folder)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=str(workspace), start_new_session=True,
                                env=dict(os.environ, TQDM_DISABLE="1"))
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
    pid = job.pid
    if pid is None or not is_job_process(job):
        raise WorkbenchError(f"job {job.id}: process {pid} is not this job's (it ended, "
                             "its pid was reused, or job.json was changed); nothing was "
                             "signalled")
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(pid) == pid:  # start_job made it a group leader
            os.killpg(pid, signal.SIGTERM)
        else:
            os.kill(pid, signal.SIGTERM)
    return True


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
    root = run_root(job)
    busy = [j for j in list_jobs(job.workspace, states=ACTIVE)
            if root is not None and run_root(j) == root]
    if busy:
        raise WorkbenchError(f"{root} is being written by job {busy[0].id}; wait for it or "
                             "stop it before running this job again")
    return start_job(job.workspace, job.kind, job.config)


@contextlib.contextmanager
def run_lock(run_dir: Path, job_id: str):
    """Exclusive lock on a run folder for the duration of a job. A run that ends having
    written nothing but the lock (bad input found before its first output) leaves nothing:
    the lock and the folders made for it are removed."""
    made = [d for d in (run_dir, *run_dir.parents) if not d.exists()]
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        fh = open(run_dir / ".lock", "a+")  # noqa: SIM115 - held across the yield below
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
    cfg = experiment_config_model().model_validate(job.config)

    def progress(msg: str) -> None:
        print(msg, flush=True)
        job.progress = (job.progress + [msg])[-50:]
        job.save()

    return run_in_process(job.kind, cfg, log=progress, lock_id=job.id).model_dump(mode="json")


def _worker(folder: str) -> int:
    """The job's work, in the process its supervisor (`main`) started and waits on."""
    import faulthandler

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
        try:
            job.result = _execute(job)
            job.status = "completed"
        except BaseException:
            stood = where_it_stood()  # before the loops' generators are let go
            job.last_progress = ProgressSnapshot.model_validate(stood) if stood else None
            raise
    except (KeyboardInterrupt, TrainingInterrupted):
        job.status, job.error = "stopped", "stopped by request; start it again to resume"
    except WorkbenchError as e:
        job.status, job.error = "failed", str(e)
    except SystemExit as e:  # the trainer's graceful stop
        job.status = "stopped" if stopped["flag"] or e.code == 143 else "failed"
        job.error = "stopped; start it again to resume" if job.status == "stopped" else str(e)
    except Exception as e:  # noqa: BLE001 - our bug: the traceback to the log, a line to state
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
    # (preexec_fn is safe here: the supervisor runs no threads)
    proc = subprocess.Popen([sys.executable, "-m", "workbench.jobs", "--worker", folder],
                            stdin=subprocess.DEVNULL, preexec_fn=_default_signals)  # noqa: PLW1509
    rc = proc.wait()
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    try:
        job = Job.model_validate_json(_read_job_json(job.folder / "job.json")).model_copy(
            update={"id": job.id, "workspace": job.workspace})
    except (ValidationError, ValueError, OSError, WorkbenchError):
        return 1
    job.peak_rss_mb = round(peak_mb, 1)
    if job.status in ACTIVE:
        job.status, job.error = "failed", how_it_ended(rc)
        job.finished = time.time()
        print(f"[workbench] {job.error}", flush=True)
    job.save()
    return 0 if job.status == "completed" else 1


