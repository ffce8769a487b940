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

from workbench.jobs.launch import (
    how_it_ended,
    main,
    run_again,
    run_in_process,
    run_lock,
    start_job,
    stop_job,
)
from workbench.jobs.rows import JobRow, LogFigure, job_row, job_rows, last_progress_figure
from workbench.jobs.state import (
    ACTIVE,
    JOB_SCHEMA,
    MAX_JOB_JSON,
    MAX_PROGRESS_JSON,
    PROGRESS_FILE,
    STATUSES,
    Job,
    ProgressLevel,
    ProgressSnapshot,
    check_job_id,
    is_job_process,
    job_folder,
    job_progress,
    kinds,
    kinds_known,
    list_jobs,
    load_job,
    process_start,
    run_root,
    wait_job,
)

__all__ = ["ACTIVE", "JOB_SCHEMA", "MAX_JOB_JSON", "MAX_PROGRESS_JSON", "PROGRESS_FILE",
           "STATUSES", "Job", "JobRow", "LogFigure", "ProgressLevel", "ProgressSnapshot", "check_job_id",
           "how_it_ended", "is_job_process", "job_folder", "job_progress", "job_row",
           "job_rows", "kinds", "kinds_known", "last_progress_figure", "list_jobs", "load_job", "main",
           "process_start", "run_again", "run_in_process", "run_lock", "run_root",
           "start_job", "stop_job", "wait_job"]
