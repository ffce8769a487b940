"""Background jobs: detached, state on disk, locks, failure, stop and resume."""

import os
import time
from pathlib import Path

import pytest

from workbench.errors import WorkbenchError
from workbench.jobs import list_jobs, load_job, run_lock, start_job, stop_job, wait_job

TESTS = str(Path(__file__).parent)


def cfg(ws, name="d", **distill):
    return {"name": name, "output_dir": str(ws / "runs"),
            "models": {"chat": {"spec": "fake", "options": {"script": "fake_teacher:reply"}}},
            "distill": {"corpus": str(Path(TESTS).parent / "datasets" / "rf"),
                        "max_sections": 6, "mode": "single",
                        "verifier": {"method": "generate"}, **distill}}


@pytest.fixture(autouse=True)
def _pythonpath(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_job_runs_detached_and_survives_as_state_on_disk(tmp_path):
    job = start_job(tmp_path, "distill", cfg(tmp_path))
    assert job.status == "running"  # start_job returned while the job runs
    done = wait_job(job, timeout=300)
    assert done.status == "completed", done.log_text()
    assert done.result["figures"]["accepted"] > 0 and done.progress
    again = list_jobs(tmp_path)[0]  # a fresh reader (an app restart) sees the same
    assert again.id == job.id and again.status == "completed"
    assert (tmp_path / "runs" / "d" / "distill" / "report.json").exists()


def test_bad_config_is_refused_before_launch(tmp_path):
    with pytest.raises(ValueError):
        start_job(tmp_path, "distill", {"name": "x", "distill": {"nope": 1}})
    with pytest.raises(WorkbenchError, match="unknown job kind"):
        start_job(tmp_path, "dance", {})
    assert not (tmp_path / "jobs").exists() or not list_jobs(tmp_path)


def test_failed_job_shows_its_error_and_resumes(tmp_path):
    bad = cfg(tmp_path, name="f")
    bad["distill"]["corpus"] = str(tmp_path / "missing")
    job = wait_job(start_job(tmp_path, "distill", bad), timeout=120)
    assert job.status == "failed" and "missing" in job.error and "Traceback" not in job.error
    (tmp_path / "missing").mkdir()
    (tmp_path / "missing" / "a.md").write_text("# T\n\n## S\n\n" + "Impedance matching "
                                               "maximises delivered power. " * 20)
    job2 = wait_job(start_job(tmp_path, "distill", bad), timeout=120)
    assert job2.status == "completed", job2.log_text()


def test_two_jobs_on_one_run_cannot_collide(tmp_path):
    run = tmp_path / "runs" / "d"
    with run_lock(run, "job-A"):
        with pytest.raises(WorkbenchError, match="being written by job-A"):
            with run_lock(run, "job-B"):
                pass
        job = wait_job(start_job(tmp_path, "distill", cfg(tmp_path)), timeout=120)
        assert job.status == "failed" and "being written by job-A" in job.error
    with run_lock(run, "job-C"):  # released after use
        pass


def test_stop_and_died_process(tmp_path):
    slow = cfg(tmp_path, name="s")
    slow["models"]["chat"]["options"] = {"script": "fake_teacher:slow"}
    job = start_job(tmp_path, "distill", slow)
    time.sleep(3)
    stop_job(load_job(job.folder))
    job = wait_job(job, timeout=60)
    assert job.status == "stopped" and "resume" in job.error
    # a job whose process vanished is reported as failed, not running forever
    j = load_job(job.folder)
    j.status, j.pid = "running", 999999
    j.save()
    assert load_job(job.folder).status == "failed"
