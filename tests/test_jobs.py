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


def test_other_ranks_of_a_distributed_launch_neither_lock_nor_record(tmp_path, monkeypatch):
    """torchrun starts the same command N times: rank 0 holds the run's lock and writes
    stages.json, the others compute beside it (the gpu_check torchrun stage found them
    refused by rank 0's lock)."""
    from workbench.config import experiment_config_model
    from workbench.jobs import run_in_process

    config = experiment_config_model().model_validate(cfg(tmp_path))
    run = tmp_path / "runs" / "d"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with run_lock(run, "rank 0"):
        result = run_in_process("distill", config)
    assert result.figures["accepted"] > 0
    assert not (run / "stages.json").exists()
    monkeypatch.setenv("RANK", "0")
    with run_lock(run, "job-A"), pytest.raises(WorkbenchError, match="being written by job-A"):
        run_in_process("distill", config)


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


def _worker_of(job) -> int:
    """The pid of the job's worker: the child of its supervisor (`job.pid`)."""
    deadline = time.time() + 30
    while time.time() < deadline:
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and (d / "stat").read_text().rsplit(")", 1)[1].split()[1] \
                        == str(job.pid):
                    return int(d.name)
            except OSError:
                continue
        time.sleep(0.1)
    raise AssertionError("the supervisor started no worker")


def test_a_killed_or_crashed_worker_is_recorded_with_how_it_ended(tmp_path):
    import signal

    slow = cfg(tmp_path, name="k")
    slow["models"]["chat"]["options"] = {"script": "fake_teacher:slow"}
    job = start_job(tmp_path, "distill", slow)
    worker = _worker_of(job)
    time.sleep(2)
    assert load_job(job.folder).status == "running"
    os.kill(worker, signal.SIGKILL)  # as the out-of-memory killer would
    job = wait_job(job, timeout=60)
    assert job.status == "failed" and "killed by SIGKILL" in job.error
    assert "memory runs out" in job.error and job.peak_rss_mb > 20
    assert "killed by SIGKILL" in job.log_text()
    # a worker that exits without recording its end (os._exit in the scripted model)
    dies = cfg(tmp_path, name="x")
    dies["models"]["chat"]["options"] = {"script": "fake_teacher:reply", "die_after": 3}
    job = wait_job(start_job(tmp_path, "distill", dies), timeout=120)
    assert job.status == "failed" and "exited with code 137" in job.error
    # a job that ends by itself keeps its own state, with its peak memory
    done = wait_job(start_job(tmp_path, "distill", cfg(tmp_path, name="ok")), timeout=120)
    assert done.status == "completed" and done.error is None and done.peak_rss_mb > 20


def _tampered(ws: Path, name: str, **state) -> Path:
    from workbench.jobs import Job

    folder = ws / "jobs" / name
    folder.mkdir(parents=True)
    job = Job(id=name, kind="distill", workspace=str(ws), config={}, status="running",
              pid=os.getpid()).model_dump(mode="json")
    job.update(state)
    (folder / "job.json").write_text(__import__("json").dumps(job))
    return folder


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_listing_is_read_only_and_a_job_is_its_folder(tmp_path):
    """A job.json naming another workspace or id, a job folder that is a link out of the
    workspace, a job.json that is a link to a device or a FIFO: listing writes nothing
    anywhere, names jobs by their folders, and keeps listing the others."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    outside.mkdir()
    _tampered(ws, "elsewhere", workspace="../elsewhere")
    _tampered(ws, "climber", id="../../../x")
    real = _tampered(outside, "real")
    (ws / "jobs" / "linked").symlink_to(real)
    zero = ws / "jobs" / "zero"
    zero.mkdir()
    (zero / "job.json").symlink_to("/dev/zero")
    fifo = ws / "jobs" / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "job.json")
    before = _tree(tmp_path)
    mtimes = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if not p.is_symlink()}
    jobs = {j.id: j for j in list_jobs(ws)}
    assert set(jobs) == {"elsewhere", "climber", "zero", "fifo"}
    assert jobs["elsewhere"].workspace == str(ws) and jobs["climber"].folder == ws / "jobs" / \
        "climber"
    # pid is this test's own process, not the job's: it reads as failed
    assert jobs["elsewhere"].status == "failed" and jobs["climber"].status == "failed"
    assert jobs["zero"].status == jobs["fifo"].status == "unreadable"
    assert "job.json" in jobs["zero"].error
    assert _tree(tmp_path) == before
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes


def test_stop_signals_only_the_jobs_own_process(tmp_path, cli):
    """job.json naming an unrelated process (a `setsid sleep`, as a changed file or a
    reused pid would): stop refuses with one line and the process lives on."""
    import subprocess

    sleeper = subprocess.Popen(["setsid", "sleep", "60"])
    try:
        time.sleep(0.3)
        ws = tmp_path / "ws"
        folder = _tampered(ws, "victim", pid=sleeper.pid)
        job = load_job(folder)  # read: the pid is not the job's process, so it is not running
        assert job.status == "failed" and stop_job(job) is False
        job.status = "running"  # a caller holding a stale "running" state
        with pytest.raises(WorkbenchError, match="not this job's"):
            stop_job(job)
        r = cli("jobs", "stop", "victim", "--workspace", str(ws))
        assert r.returncode == 0 and "victim is not running (failed)" in r.stdout
        time.sleep(0.3)
        assert sleeper.poll() is None  # still running
    finally:
        sleeper.kill()
        sleeper.wait()


def test_jobs_list_of_a_file_is_one_line(tmp_path, cli):
    f = tmp_path / "notes.txt"
    f.write_text("x")
    r = cli("jobs", "list", "--workspace", str(f))
    assert r.returncode == 1 and r.stderr.strip() == f"error: {f}: not a folder (a " \
        "workspace is a folder)"
