"""Progress a person can see: the log lines of work in flight (unchanged) and the JSON snapshot
a background job keeps in its folder for the task centre."""

import json
import re
import time

import pytest

from workbench import progress as P


@pytest.fixture(autouse=True)
def _no_file(monkeypatch):
    monkeypatch.delenv("WB_PROGRESS_FILE", raising=False)
    monkeypatch.setenv("WB_PROGRESS_FILE_SECONDS", "0.05")
    monkeypatch.setenv("TQDM_DISABLE", "1")  # bars off: pytest's stderr is no terminal anyway
    yield
    P.set_progress_file(None)


def _read(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _wait_for(check, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = check()
        if out:
            return out
        time.sleep(0.02)
    raise AssertionError("timed out")


LINE = re.compile(r"^\[progress\] outer > items: (\d+)/10 row \((\d+)%\), [0-9.e+-]+/s, "
                  r"\d+s, ETA \S+$")


def _ten_items_logged(monkeypatch, capsys) -> list[str]:
    """Ten items of 50 ms in a stage, reported every 0.1 s: the progress lines on stderr,
    each checked against LINE (there must be some)."""
    monkeypatch.setenv("WB_PROGRESS_SECONDS", "0.1")
    with P.stage("outer"):
        for _ in P.progress(range(10), desc="items", unit="row"):
            time.sleep(0.05)
    time.sleep(0.15)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[progress]")]
    assert lines and all(LINE.match(x) for x in lines), lines
    return lines


def test_log_lines_name_the_levels_and_the_counts(monkeypatch, capsys):
    """Without a terminal and without a progress file: one line per tick on stderr, as
    before the snapshot existed; no file is written anywhere."""
    lines = _ten_items_logged(monkeypatch, capsys)
    done = [int(LINE.match(x).group(1)) for x in lines]
    assert done == sorted(done) and 0 < done[-1] <= 10


def test_a_reporter_asleep_on_an_earlier_interval_wakes_for_new_work(monkeypatch, capsys):
    """Work that ends leaves the reporter asleep (up to 1 s at the default interval); work
    that starts before it wakes is reported at its own interval all the same (this was a
    flaky test when an earlier test's work had just ended)."""
    monkeypatch.delenv("WB_PROGRESS_SECONDS", raising=False)
    with P.stage("earlier"):
        for _ in P.progress(range(3), desc="x"):
            pass
    time.sleep(0.3)
    _ten_items_logged(monkeypatch, capsys)


def test_snapshot_of_a_real_loop(tmp_path, monkeypatch, capsys):
    """A progress file set: the ticker keeps the levels, done/total, rate, elapsed and ETA of
    the loop in flight in it (replaced whole, so every read parses), and says when no work
    is in flight any more."""
    from workbench.jobs import Job, job_progress

    monkeypatch.setenv("WB_PROGRESS_SECONDS", "100")  # no log line during this test
    folder = tmp_path / "jobs" / "j1"
    folder.mkdir(parents=True)
    f = folder / "progress.json"
    P.set_progress_file(f)
    job = Job(id="j1", kind="distill", workspace=str(tmp_path), config={})
    seen = []
    with P.stage("distill"):
        for i in P.progress(range(8), desc="model calls", unit="chunk"):
            time.sleep(0.12)
            if i == 5:
                snap = _wait_for(lambda: (s := job_progress(job)) and s.done and s.done >= 4
                                 and s)
                seen.append(snap)
    assert job.snapshot() is not None
    snap = seen[0]
    assert [(lv.desc, lv.total, lv.unit) for lv in snap.levels] == [
        ("distill", None, ""), ("model calls", 8, "chunk")]
    assert snap.total == 8 and 4 <= snap.done <= 6 and snap.unit == "chunk"
    assert snap.counted == 1 and snap.label == "distill > model calls"
    assert snap.rate > 0 and snap.eta is not None and snap.elapsed > 0
    assert abs(snap.updated_at - time.time()) < 30
    # the work ended: the file says nothing is in flight (no stale "5/8")
    idle = _wait_for(lambda: (s := job_progress(job)) is not None and not s.levels and s)
    assert idle.done is None and idle.total is None
    assert not [p for p in folder.iterdir() if p.name != "progress.json"]  # no temp left
    assert "[progress]" not in capsys.readouterr().err


def test_snapshot_is_kept_on_a_terminal_too(tmp_path, monkeypatch, capsys):
    """With bars on (a terminal), a set progress file is still written; the bars are drawn
    and no log line is printed. Without a file nothing is tracked, as before."""
    monkeypatch.setattr(P, "bars_enabled", lambda: True)
    monkeypatch.setenv("WB_PROGRESS_SECONDS", "0.05")
    for _ in P.progress(range(3), desc="quiet"):
        time.sleep(0.02)
    assert not P._ticker.stacks
    f = tmp_path / "p.json"
    monkeypatch.setenv("WB_PROGRESS_FILE", str(f))
    for i in P.progress(range(6), desc="bars", unit="batch"):
        time.sleep(0.1)
        if i == 3:
            snap = _wait_for(lambda: (s := _read(f)) and s["levels"] and s["done"] and s)
    assert snap["levels"][0]["desc"] == "bars" and snap["total"] == 6
    assert "[progress]" not in capsys.readouterr().err


def test_the_setter_wins_over_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("WB_PROGRESS_FILE", str(tmp_path / "env.json"))
    assert P.progress_file() == tmp_path / "env.json"
    P.set_progress_file(tmp_path / "set.json")
    assert P.progress_file() == tmp_path / "set.json"
    P.set_progress_file(None)
    monkeypatch.delenv("WB_PROGRESS_FILE")
    assert P.progress_file() is None and P.write_progress_file() is False


def test_snapshot_never_replaces_what_is_not_a_regular_file(tmp_path):
    import os

    target = tmp_path / "target.txt"
    target.write_text("keep")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    (tmp_path / "dir.json").mkdir()
    snap = P._ticker.snapshot()
    for p in (link, fifo, tmp_path / "dir.json"):
        assert P.write_snapshot(p, snap) is False
    assert link.is_symlink() and target.read_text() == "keep"
    assert fifo.is_fifo() and (tmp_path / "dir.json").is_dir()
    assert P.write_snapshot(tmp_path / "ok.json", snap) is True
    assert json.loads((tmp_path / "ok.json").read_text())["levels"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.json", "fifo.json",
                                                          "link.json", "ok.json",
                                                          "target.txt"]
