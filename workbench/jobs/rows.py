"""The task centre's rows: each job with its progress, elapsed time and the end of its log,
as one typed table for the CLI (`workbench jobs list --watch`) and the app."""

from __future__ import annotations

import re
import time
from pathlib import Path

from pydantic import BaseModel, Field

from workbench.jobs.state import Job, ProgressSnapshot, job_progress, list_jobs, run_root
from workbench.progress import duration

ENDED_UNFINISHED = ("stopped", "failed")  # ended with work left: where it stood is shown


PROGRESS_PREFIX = "[progress] "  # a progress line of a log (`workbench.progress`)
MAX_FIGURE_CHARS = 300  # the most of a progress line shown (a line is ~100 characters)
_COUNT = re.compile(r"(?:^|, )(\d+)/(\d+) (\S*) ?\(\d+%\)")
_ETA = re.compile(r"(?:^|, )ETA (\S+)$")


class LogFigure(BaseModel):
    """The last progress line of a job's log, as a person reads it: where the work is (its
    levels) and the figure (done/total, rate, tokens so far, elapsed, ETA)."""

    where: str  # "distill/distill > model calls > generating 3/4"
    figure: str  # "2/7 chunk (29%), 0.02/s, 1m40s, ETA 4m10s"
    done: int | None = None  # the counted level's done/total, when the line has one
    total: int | None = None
    unit: str = ""
    eta: str | None = None  # "4m10s"; None when unknown ("?") or not given

    @property
    def fraction(self) -> float | None:
        if self.done is None or not self.total:
            return None
        return min(1.0, max(0.0, self.done / self.total))

    def text(self) -> str:
        return f"{self.where}: {self.figure}" if self.where else self.figure


def last_progress_figure(log: str) -> LogFigure | None:
    """The figure of the last progress line in `log` (a job's log text): what the app's job
    panel shows without the log being opened; None when the log has no progress line. A
    line of another process's making that only starts like one is read as far as it goes."""
    for raw in reversed(log.splitlines()):
        line = raw.strip()
        if not line.startswith(PROGRESS_PREFIX):
            continue
        body = line[len(PROGRESS_PREFIX):].strip()[:MAX_FIGURE_CHARS]
        if not body or body.endswith(":"):  # a name and no figure
            continue
        where, sep, figure = body.rpartition(": ")
        if not sep:  # "working" with nothing after it
            where, figure = "", body
        if not figure:
            continue
        m = _COUNT.search(figure)
        e = _ETA.search(figure)
        return LogFigure(where=where, figure=figure,
                         done=int(m.group(1)) if m else None,
                         total=int(m.group(2)) if m else None,
                         unit=m.group(3) if m else "",
                         eta=e.group(1) if e and e.group(1) != "?" else None)
    return None


FIGURE_LOG_BYTES = 64 * 1024  # the end of a running job's log searched for its progress line


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
    # stopped or failed: where its work stood when it ended (`last_progress`)
    last_progress: ProgressSnapshot | None = None
    # running: the last progress line of its log (tokens so far included, which the
    # snapshot's done/total does not say)
    log_figure: LogFigure | None = None
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
    def last_fraction(self) -> float | None:
        """done/total in [0, 1] of where a stopped or failed job's work stood, None when it
        recorded no counted progress."""
        p = self.last_progress
        if not p or not p.total or p.done is None:
            return None
        return min(1.0, max(0.0, p.done / p.total))

    def last_done_text(self) -> str:
        """Where a stopped or failed job stood as "3/12 chunk" ("-" when not counted)."""
        p = self.last_progress
        return f"{p.done}/{p.total} {p.unit}".rstrip() if p and p.total else "-"

    def last_progress_text(self) -> str:
        """Where a stopped or failed job stood as "model calls: 3/12 chunk" (the work's
        label alone when it was not counted, "-" when the job recorded nothing)."""
        p = self.last_progress
        if p is None:
            return "-"
        label = p.label or "working"
        return f"{label}: {self.last_done_text()}" if p.total else f"{label} (not counted)"

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
        eta = self.eta
        return duration(eta) if eta is not None else "-"

    def elapsed_text(self) -> str:
        return duration(self.elapsed) if self.elapsed is not None else "-"


def job_row(job: Job, *, log_lines: int = 10) -> JobRow:
    """A job as the task centre shows it (read-only)."""
    now = time.time()
    run = job.config.get("name") if isinstance(job.config, dict) else None
    root = run_root(job) if job.status != "unreadable" else None
    elapsed = None
    if job.started is not None:
        end = job.finished if job.finished is not None else (
            now if job.status == "running" else None)
        elapsed = max(0.0, end - job.started) if end is not None else None
    running = job.status == "running"
    ended = job.status in ENDED_UNFINISHED
    log = job.log_text(log_lines, max_bytes=64 * 1024) if log_lines > 0 else ""
    figure = None
    if running:  # progress lines come every WB_PROGRESS_SECONDS: the last one is near the end
        figure = last_progress_figure(job.log_text(400, max_bytes=FIGURE_LOG_BYTES))
    return JobRow(id=job.id, kind=job.kind, state=job.status, run=str(run or "-"),
                  run_dir=str(root) if root else None, created=job.created,
                  started=job.started, finished=job.finished, elapsed=elapsed,
                  error=job.error, message=job.progress[-1] if job.progress else None,
                  progress=job_progress(job) if running else None,
                  last_progress=last_progress(job) if ended else None,
                  log_figure=figure,
                  log_tail=log.splitlines() if log else [],
                  can_stop=running, can_run_again=job.status in ("stopped", "failed"),
                  peak_rss_mb=job.peak_rss_mb)


def last_progress(job: Job) -> ProgressSnapshot | None:
    """Where a stopped or failed job's work stood when it ended: what its worker recorded
    when the error or the stop request left the work (`Job.last_progress`), else, for a
    worker killed before it could record anything, its last progress snapshot (at most
    `WB_PROGRESS_FILE_SECONDS` old); None when it recorded neither (it ended before any
    progress). Rate and time left are dropped: nothing is in flight any more."""
    snap = job.last_progress
    if snap is None or not snap.levels:
        snap = job_progress(job)
    if snap is None or not snap.levels:
        return None
    return snap.model_copy(update={"rate": None, "eta": None})


def job_rows(workspace: str | Path, *, kinds: list[str] | tuple[str, ...] | None = None,
             states: list[str] | tuple[str, ...] | None = None,
             log_lines: int = 10) -> list[JobRow]:
    """Every job of a workspace as task-centre rows, newest first, filtered by kind(s) and
    state(s) when given."""
    return [job_row(j, log_lines=log_lines)
            for j in list_jobs(workspace, kinds=kinds, states=states)]


