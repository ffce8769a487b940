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
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from workbench.errors import WorkbenchError
from workbench.io import atomic_write_json, atomic_write_text, pid_alive

KINDS = ("distill", "index", "train", "eval", "pipeline")


@dataclass
class Job:
    id: str
    kind: str
    workspace: str
    config: dict[str, Any]
    status: str = "queued"  # queued | running | completed | failed | stopped
    pid: int | None = None
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    progress: list[str] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def folder(self) -> Path:
        return Path(self.workspace) / "jobs" / self.id

    @property
    def run_dir(self) -> Path:
        c = self.config
        return Path(c.get("output_dir", "runs")) / c.get("name", "experiment")

    def save(self) -> None:
        atomic_write_json(self.folder / "job.json", asdict(self))

    def log_text(self, tail: int = 200) -> str:
        f = self.folder / "log.txt"
        if not f.exists():
            return ""
        return "\n".join(f.read_text(errors="replace").splitlines()[-tail:])


def load_job(folder: str | Path) -> Job:
    data = json.loads((Path(folder) / "job.json").read_text())
    job = Job(**data)
    if job.status == "running" and not pid_alive(job.pid):
        job.status, job.error = "failed", job.error or "the job's process died"
        job.finished = job.finished or time.time()
        job.save()
    return job


def list_jobs(workspace: str | Path) -> list[Job]:
    root = Path(workspace) / "jobs"
    jobs = [load_job(p) for p in root.iterdir() if (p / "job.json").exists()] \
        if root.exists() else []
    return sorted(jobs, key=lambda j: j.created, reverse=True)


def start_job(workspace: str | Path, kind: str, config: dict[str, Any], *,
              job_id: str | None = None) -> Job:
    """Write the job folder and launch it detached; returns at once."""
    if kind not in KINDS:
        raise WorkbenchError(f"unknown job kind {kind!r} (expected {', '.join(KINDS)})")
    from workbench.config import ExperimentConfig

    ExperimentConfig.model_validate(config)  # refuse bad configs before launching
    workspace = Path(workspace).resolve()
    job = Job(id=job_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}-{uuid.uuid4().hex[:6]}",
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
    job.pid, job.status = proc.pid, "running"
    job.save()
    return job


def stop_job(job: Job) -> None:
    if job.status == "running" and pid_alive(job.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGTERM)


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
    """Exclusive lock on a run folder for the duration of a job."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fh = open(run_dir / ".lock", "a+")
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


def _execute(job: Job) -> dict[str, Any]:
    from workbench.config import ExperimentConfig

    cfg = ExperimentConfig.model_validate(job.config)

    def progress(msg: str) -> None:
        print(msg, flush=True)
        job.progress = (job.progress + [msg])[-50:]
        job.save()

    if job.kind == "distill":
        from workbench.distill.api import distill_from_config

        res = distill_from_config(cfg, progress=progress)
        return {"run_dir": str(res.run_dir), "accepted": res.report["accepted"]}
    if job.kind == "index":
        from workbench.rag.api import build_index

        out = cfg.run_dir / "index"
        index, _ = build_index(cfg.distill.corpus, out, cfg.rag, log=progress)
        return {"index": str(out), "chunks": index.manifest["n_chunks"]}
    if job.kind == "train":
        from workbench.train.recipe import train

        out = Path(cfg.train.output) if cfg.train.output else cfg.run_dir / "adapter"
        res = train(cfg.train, model_spec=cfg.models.chat.spec, output=out, seed=cfg.seed,
                    log=progress)
        return {"adapter": str(res.output), "steps": res.steps}
    if job.kind == "eval":
        from workbench.evaluate.run import run_eval

        return run_eval(cfg, log=progress)
    from workbench.pipeline import run_pipeline

    rep = run_pipeline(cfg, log=progress)
    return {"report": str(cfg.run_dir / "report.md"), "table": rep["table"]}


def main(folder: str) -> int:
    job = load_job(folder)
    job.status, job.started, job.pid = "running", time.time(), os.getpid()
    job.save()
    stopped = {"flag": False}

    def on_term(*_):
        stopped["flag"] = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        with run_lock(job.run_dir, job.id):
            job.result = _execute(job)
        job.status = "completed"
    except KeyboardInterrupt:
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
