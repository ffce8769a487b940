"""The task centre: every job of a workspace with its progress, in one table (library rows,
`workbench jobs list [--watch]`, the app's Task centre page), stop and "run again", which
finishes a stopped job's run (the call cache serves the finished calls)."""

import json
import os
import re
import time
from pathlib import Path

import pytest

from workbench.errors import WorkbenchError
from workbench.jobs import Job, job_progress, job_row, job_rows, list_jobs, load_job, \
    run_again, start_job, wait_job

TESTS = Path(__file__).parent
REPO = TESTS.parent
APP = REPO / "workbench" / "app"  # the app ships in the package: workbench.app


def paced(conv):
    """The scripted teacher (`fake_teacher:reply`), 0.15 s a call while the file named by
    WB_TEST_PACE exists: a job slow enough to watch and stop, then fast to finish."""
    from fake_teacher import reply

    pace = os.environ.get("WB_TEST_PACE")
    if pace and os.path.exists(pace):
        time.sleep(0.15)
    return reply(conv)


def cfg(ws, name="d"):
    return {"name": name, "output_dir": str(ws / "runs"),
            "models": {"chat": {"spec": "fake",
                                "options": {"script": "test_task_centre:paced"}}},
            "distill": {"corpus": str(REPO / "datasets" / "rf"), "max_sections": 6,
                        "mode": "single", "verifier": {"method": "generate"}}}


@pytest.fixture()
def paced_env(tmp_path, monkeypatch):
    """Jobs started here import this file's `paced` teacher and write their progress
    snapshot every 0.2 s; the returned file keeps them slow while it exists."""
    marker = tmp_path / "slow"
    marker.write_text("")
    monkeypatch.setenv("PYTHONPATH", str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH",
                                                                              ""))
    monkeypatch.setenv("WB_TEST_PACE", str(marker))
    monkeypatch.setenv("WB_PROGRESS_FILE_SECONDS", "0.2")
    return marker


def _counted_progress(job, timeout=120, label=""):
    """The job's row once its snapshot shows a counted loop (whose label holds `label`) that
    has moved."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        row = job_row(load_job(job.folder))
        assert row.state == "running", (row.error, job.log_text())
        if row.progress is not None and row.progress.done and label in row.progress.label:
            return row
        time.sleep(0.2)
    raise AssertionError(f"no progress in {timeout}s: {job.log_text()}")


def _stop(job) -> None:
    """Clean-up after a failed assertion: the job's process does not outlive the test."""
    import contextlib

    from workbench.jobs import stop_job

    with contextlib.suppress(WorkbenchError):
        stop_job(load_job(job.folder))


def _fake(ws: Path, name: str, kind: str, status: str, **more) -> Job:
    job = Job(id=name, kind=kind, workspace=str(ws), config={"name": f"run-{name}"},
              status=status, **more)
    job.folder.mkdir(parents=True, exist_ok=True)
    job.save()
    return job


# --- library ---------------------------------------------------------------------------------

def test_rows_filter_by_kind_and_state(tmp_path):
    ws = tmp_path / "ws"
    now = time.time()
    _fake(ws, "a", "distill", "completed", created=now - 30, started=now - 30,
          finished=now - 10)
    _fake(ws, "b", "train", "failed", created=now - 20, error="boom")
    _fake(ws, "c", "distill", "stopped", created=now - 10, started=now - 100,
          finished=now - 40, progress=["writing", "verifying 3 items"])
    _fake(ws, "d", "retired_plugin", "completed", created=now)
    assert [j.id for j in list_jobs(ws)] == ["d", "c", "b", "a"]
    assert [r.id for r in job_rows(ws, kinds=["distill"])] == ["c", "a"]
    assert [r.id for r in job_rows(ws, states=["failed", "stopped"])] == ["c", "b"]
    assert [r.id for r in job_rows(ws, kinds=["distill", "train"], states=["completed"])] == \
        ["a"]
    assert [r.id for r in job_rows(ws, kinds=["retired_plugin"])] == ["d"]  # an old kind
    with pytest.raises(WorkbenchError, match="unknown job state 'done'"):
        job_rows(ws, states=["done"])
    with pytest.raises(WorkbenchError, match="unknown job kind 'distil'"):
        job_rows(ws, kinds=["distil"])
    c = job_row(load_job(ws / "jobs" / "c"))
    assert (c.state, c.kind, c.run, c.message) == ("stopped", "distill", "run-c",
                                                    "verifying 3 items")
    assert c.elapsed == pytest.approx(60, abs=1) and c.elapsed_text() == "1m00s"
    assert c.can_run_again and not c.can_stop and c.progress is None
    a = job_row(load_job(ws / "jobs" / "a"))
    assert not a.can_run_again and a.elapsed_text() == "20s"
    assert job_row(load_job(ws / "jobs" / "b")).elapsed is None  # never started


def test_a_running_row_reads_the_snapshot_and_survives_a_bad_one(tmp_path):
    ws = tmp_path / "ws"
    job = _fake(ws, "r", "distill", "running", started=time.time() - 5)
    snap = job.folder / "progress.json"
    assert job_progress(job) is None and job_row(job).progress_text() == "-"
    snap.write_text(json.dumps({
        "schema_version": 1, "pid": 1, "updated_at": time.time() - 2,
        "label": "distill > model calls",
        "levels": [{"desc": "distill", "done": 0, "total": None, "unit": ""},
                   {"desc": "model calls", "done": 3, "total": 12, "unit": "chunk"}],
        "counted": 1, "done": 3, "total": 12, "unit": "chunk", "rate": 0.5, "elapsed": 6.0,
        "eta": 18.0}))
    row = job_row(job)  # an in-memory "running" job: load_job would see no process
    assert (row.done, row.total, row.fraction) == (3, 12, 0.25)
    assert row.progress_text() == "3/12 chunk" and row.rate_text() == "0.5 chunk/s"
    assert row.eta == pytest.approx(16, abs=1)  # the estimate, less its age
    assert row.eta_text() in ("15s", "16s") and row.elapsed_text() in ("5s", "6s")
    for bad in ('{"updated_at": 1, "levels": [{"desc": "x", "do', "[]", "",
                '{"updated_at": "soon"}'):
        snap.write_text(bad)
        assert job_progress(job) is None and job_row(job).progress_text() == "-"
    snap.unlink()
    snap.symlink_to("/dev/zero")
    assert job_progress(job) is None
    snap.unlink()
    os.mkfifo(snap)
    assert job_progress(job) is None  # a FIFO is never opened for a blocking read
    snap.unlink()
    snap.write_text(json.dumps({"updated_at": 1.0, "pad": "x" * (300 * 1024)}))
    assert job_progress(job) is None  # over the size cap
    # a finished job shows no progress, whatever its folder still holds
    assert job_row(_fake(ws, "s", "distill", "stopped")).progress is None


def test_run_again_refuses_what_cannot_be_resumed(tmp_path):
    ws = tmp_path / "ws"
    broken = ws / "jobs" / "broken"
    broken.mkdir(parents=True)
    (broken / "job.json").write_text("{not json")
    with pytest.raises(WorkbenchError, match="unreadable"):
        run_again(load_job(broken))
    with pytest.raises(WorkbenchError, match="no such job"):
        run_again(Job(id="gone", kind="distill", workspace=str(ws), config={}))
    assert [j.id for j in list_jobs(ws)] == ["broken"]  # nothing was started


# --- a real job: watched, stopped, refused, run again to completion (CLI) --------------------

def test_a_job_is_watched_stopped_and_run_again_from_the_cli(tmp_path, paced_env, cli):
    ws = tmp_path / "ws"
    job = start_job(ws, "distill", cfg(ws))
    try:
        # the model calls' loop: reading the documents is counted too, and comes first (a
        # loaded run's first snapshot was "reading documents", 1 of 12 files)
        row = _counted_progress(job, label="model calls")
        p = row.progress
        assert "model calls" in p.label and p.unit == "chunk"
        assert 1 <= p.done <= p.total and p.rate > 0 and p.eta is not None
        assert row.can_stop and not row.can_run_again and row.elapsed > 0
        r = cli("jobs", "list", "--workspace", str(ws), "--watch", "--interval", "0.2",
                "--count", "2")
        assert r.returncode == 0, r
        tables = r.stdout.split("--- ")[1:]
        assert len(tables) == 2 and all("1 running" in t for t in tables), r.stdout
        line = next(x for x in tables[-1].splitlines() if x.startswith(job.id))
        assert re.search(r"\brunning\s+\d+/\d+ chunk\s+(?:[0-9.e+-]+ chunk/s|-)\s+\S+\s+"
                         r"\d+s\s+d\b", line), line
        assert re.match(r"id\s+kind\s+state\s+progress\s+rate\s+ETA\s+elapsed\s+run\s+note",
                        tables[-1].splitlines()[1])
        # running: run again is refused, for this job and for another job of the same run
        r = cli("jobs", "again", job.id, "--workspace", str(ws))
        assert r.returncode == 1 and "still running" in r.stderr, r
        twin = _fake(ws, "twin", "distill", "stopped")
        twin.config = cfg(ws)
        twin.save()
        with pytest.raises(WorkbenchError, match=f"being written by job {job.id}"):
            run_again(twin)
        r = cli("jobs", "stop", job.id, "--workspace", str(ws))
        assert r.returncode == 0 and "stop requested" in r.stdout
    except BaseException:
        _stop(job)
        raise
    stopped = wait_job(job, timeout=60)
    assert stopped.status == "stopped", stopped.log_text()
    paced_env.unlink()  # fast from here on
    # nothing runs: --watch prints one table and ends (no --count needed off a terminal)
    r = cli("jobs", "list", "--workspace", str(ws), "--watch", "--interval", "0.1")
    assert r.returncode == 0 and r.stdout.count("--- ") == 1 and "0 running" in r.stdout
    assert re.search(rf"^{job.id}\s+distill\s+stopped\s+-", r.stdout, re.M), r.stdout
    r = cli("jobs", "again", job.id, "--workspace", str(ws))
    assert r.returncode == 0, r
    new_id = r.stdout.split()[0]
    assert new_id != job.id and f"running {job.id} again" in r.stdout
    new = wait_job(load_job(ws / "jobs" / new_id), timeout=300)
    assert new.status == "completed", new.log_text()
    assert new.config == job.config and new.kind == "distill"
    report = json.loads((ws / "runs" / "d" / "distill" / "report.json").read_text())
    assert report["model_calls"]["from_cache"] > 0  # the stopped job's calls, not redone
    assert load_job(job.folder).status == "stopped"  # the old job stays as it ended
    snap = job_progress(new)
    assert snap is not None and snap.levels == []  # written at the end: nothing in flight
    r = cli("jobs", "list", "--workspace", str(ws), "--state", "completed")
    assert r.returncode == 0 and [x.split()[0] for x in r.stdout.splitlines()[1:]] == [new_id]
    r = cli("jobs", "list", "--workspace", str(ws), "--kind", "train")
    assert r.returncode == 0 and "no jobs" in r.stdout and "match the filters" in r.stdout
    r = cli("jobs", "list", "--workspace", str(ws), "--state", "finished")
    assert r.returncode == 1 and "unknown job state 'finished'" in r.stderr


def test_jobs_help_explains_the_task_centre(cli):
    r = cli("jobs", "list", "--help")
    assert r.returncode == 0
    for word in ("task centre", "--watch", "--kind", "--state", "--interval", "--count",
                 "ETA"):
        assert word in r.stdout, word
    r = cli("jobs", "again", "--help")
    assert r.returncode == 0 and "finishes the rest" in " ".join(r.stdout.split())


# --- the app's Task centre page --------------------------------------------------------------

@pytest.fixture()
def app_ws(tmp_path, monkeypatch):
    monkeypatch.setenv("WB_WORKSPACE", str(tmp_path / "ws"))
    return tmp_path / "ws"


def page():
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(str(APP / "views" / "jobs.py"), default_timeout=120)


def table(at):
    return next(d.value for d in at.dataframe if "pipeline" in d.value.columns)


def test_page_on_an_empty_workspace_and_its_filters(app_ws):
    at = page().run()
    assert not at.exception, at.exception
    assert [t.value for t in at.title] == ["Task centre"]
    assert any("No jobs here yet" in i.value for i in at.info)
    now = time.time()
    _fake(app_ws, "a", "distill", "completed", created=now - 30)
    _fake(app_ws, "b", "train", "failed", created=now - 20, error="out of memory")
    _fake(app_ws, "c", "distill", "stopped", created=now - 10)
    at.run()
    assert not at.exception, at.exception
    t = table(at)
    assert list(t["id"]) == ["c", "b", "a"] and list(t["pipeline"]) == ["distill", "train",
                                                                         "distill"]
    assert list(t["state"]) == ["stopped", "failed", "completed"]
    assert any("out of memory" in e.value for e in at.error)
    keys = {b.key for b in at.button}
    assert {"tc-again-c", "tc-again-b"} <= keys and "tc-again-a" not in keys
    assert not any(k.startswith("tc-stop-") for k in keys)  # nothing runs
    at.multiselect(key="tc-kinds").set_value(["distill"]).run()
    assert list(table(at)["id"]) == ["c", "a"]
    at.multiselect(key="tc-states").set_value(["completed"]).run()
    assert list(table(at)["id"]) == ["a"]
    at.multiselect(key="tc-kinds").set_value(["train"]).run()
    assert not at.exception and not at.dataframe
    assert any("No job matches" in i.value for i in at.info)


def test_page_stops_a_running_job_and_runs_it_again(app_ws, paced_env):
    from workbench.workspace import open_workspace

    ws = Path(open_workspace(app_ws))
    job = start_job(ws, "distill", cfg(ws, name="app"))
    try:
        _counted_progress(job)
        at = page().run()
        assert not at.exception, at.exception
        t = table(at)
        # (the counted loop may have moved on to its next one, at 0, since)
        assert list(t["state"]) == ["running"] and 0 <= t["progress"][0] <= 1
        assert re.fullmatch(r"\d+/\d+ chunk", t["done/total"][0])
        bars = at.get("progress")
        assert bars and "model calls" in bars[0].proto.text
        assert not any(b.key == f"tc-again-{job.id}" for b in at.button)
        at.button(key=f"tc-stop-{job.id}").click().run()
        assert not at.exception, at.exception
        assert any("Stop: requested" in s.value for s in at.success)
    except BaseException:
        _stop(job)
        raise
    assert wait_job(job, timeout=60).status == "stopped"
    paced_env.unlink()
    at.run()
    assert list(table(at)["state"]) == ["stopped"]
    at.button(key=f"tc-again-{job.id}").click().run()
    assert not at.exception, at.exception
    said = next(s.value for s in at.success if s.value.startswith("Run again"))
    new_id = said.rsplit(" ", 1)[-1]
    new = wait_job(load_job(ws / "jobs" / new_id), timeout=300)
    assert new.status == "completed", new.log_text()
    at.run()
    t = table(at)
    assert list(t["id"]) == [new_id, job.id] and list(t["state"]) == ["completed", "stopped"]
    assert not any(b.key == f"tc-again-{new_id}" for b in at.button)
    # the log's last lines are in each job's expander, the newest job's first
    logs = [c.value for c in at.code]
    assert "verifying" in logs[0].splitlines()[-1] and logs[0] == new.log_text(30)


def test_task_centre_is_in_the_navigation_after_projects():
    from workbench.app.common import navigation_pages

    pages = navigation_pages()
    assert [(p.name, t, d) for p, t, _, d in pages[:3]] == [
        ("projects.py", "Projects and runs", True), ("jobs.py", "Task centre", False),
        ("corpus.py", "Corpus", False)]
