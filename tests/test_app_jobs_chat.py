"""The app for the domain expert (issue 29's leftovers): "Run again" on a pipeline page's job
panel, where a stopped or failed job stood (its page and the Task centre), a label per chat
setup that tells two setups of one model apart (on the page and in the rows it keeps), and
the verifier's verdict kept out of the Distill page's sample browser until the item is
rated under "Check the verifier"."""

import json
import os
import re
import time
from pathlib import Path

import pytest

from workbench.jobs import Job, job_row, load_job, start_job, stop_job, wait_job

TESTS = Path(__file__).parent
REPO = TESTS.parent
APP = REPO / "workbench" / "app"  # the app ships in the package: workbench.app


def paced(conv):
    """The scripted teacher (`fake_teacher:reply`), 0.15 s a call while the file named by
    WB_TEST_PACE exists: a job slow enough to stop, then fast to finish."""
    from fake_teacher import reply

    pace = os.environ.get("WB_TEST_PACE")
    if pace and os.path.exists(pace):
        time.sleep(0.15)
    return reply(conv)


def cfg(ws: Path, name: str = "d") -> dict:
    return {"name": name, "output_dir": str(ws / "runs"),
            "models": {"chat": {"spec": "fake",
                                "options": {"script": "test_app_jobs_chat:paced"}}},
            "distill": {"corpus": str(REPO / "datasets" / "rf"), "max_sections": 6,
                        "mode": "single", "verifier": {"method": "generate"}}}


@pytest.fixture()
def app_ws(tmp_path, monkeypatch):
    """A workspace the app opens; jobs started here import this file's `paced` teacher and
    print a progress line to their log every 0.2 s (the returned marker keeps them slow)."""
    from workbench.workspace import open_workspace

    marker = tmp_path / "slow"
    marker.write_text("")
    monkeypatch.setenv("WB_WORKSPACE", str(tmp_path / "ws"))
    monkeypatch.setenv("PYTHONPATH", str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH",
                                                                              ""))
    monkeypatch.setenv("WB_TEST_PACE", str(marker))
    monkeypatch.setenv("WB_PROGRESS_SECONDS", "0.2")
    monkeypatch.setenv("WB_PROGRESS_FILE_SECONDS", "0.2")
    monkeypatch.setenv("WB_APP_MODEL", "fake")
    monkeypatch.setenv("WB_APP_MODEL_SCRIPT", "fake_teacher:reply")
    return Path(open_workspace(tmp_path / "ws")), marker


def page(name: str):
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(str(APP / "views" / f"{name}.py"), default_timeout=300)


def texts(at) -> str:
    return "\n".join(str(getattr(e, "value", "")) for e in
                     [*at.markdown, *at.caption, *at.text, *at.success, *at.warning])


def bars(at) -> list[str]:
    return [b.proto.text for b in at.get("progress")]


def _fake(ws: Path, name: str, status: str, log: str = "", **more) -> Job:
    job = Job(id=name, kind="distill", workspace=str(ws), config={"name": f"run-{name}"},
              status=status, created=time.time(), **more)
    job.folder.mkdir(parents=True, exist_ok=True)
    job.save()
    (job.folder / "log.txt").write_text(log)
    return job


def _snap(done: int, total: int | None, **more) -> dict:
    return {"updated_at": time.time(), "label": "distill > model calls",
            "levels": [{"desc": "distill", "done": 0, "total": None},
                       {"desc": "model calls", "done": done, "total": total,
                        "unit": "chunk"}],
            "counted": 1 if total else None, "done": done if total else None,
            "total": total, "unit": "chunk", **more}


# --- where a stopped or failed job stood -----------------------------------------------------

def test_work_cut_off_by_an_error_is_noted_where_it_stood():
    """`progress.where_it_stood`: the loops inside a stage are noted as the error leaves
    them (a job records this when it ends unfinished)."""
    from workbench import progress as P

    with pytest.raises(KeyboardInterrupt), P.stage("distill"):
        for i in P.progress(range(12), "model calls", unit="chunk"):
            if i == 3:
                raise KeyboardInterrupt
    snap = P.where_it_stood()
    assert snap["label"] == "distill > model calls"
    assert (snap["done"], snap["total"], snap["unit"]) == (3, 12, "chunk")
    # work that goes on after a handled error forgets it
    for _ in P.progress(range(2), "again"):
        pass
    assert P.where_it_stood() is None


def test_a_stopped_or_failed_row_says_where_its_work_stood(tmp_path):
    from workbench.jobs.state import ProgressSnapshot

    ws = tmp_path / "ws"
    stopped = job_row(_fake(ws, "s", "stopped", "log\n", error="stopped by request",
                            last_progress=ProgressSnapshot.model_validate(
                                _snap(3, 12, rate=0.5, eta=18.0))), log_lines=0)
    p = stopped.last_progress
    assert (p.done, p.total, p.unit) == (3, 12, "chunk") and stopped.log_tail == []
    assert p.eta is None and p.rate is None  # nothing is in flight any more
    assert stopped.last_fraction == 0.25 and stopped.last_done_text() == "3/12 chunk"
    assert stopped.last_progress_text() == "distill > model calls: 3/12 chunk"
    assert stopped.progress is None and stopped.progress_text() == "-"
    # work that is not counted: its label only
    row = job_row(_fake(ws, "u", "failed", last_progress=ProgressSnapshot.model_validate(
        _snap(0, None))))
    assert row.last_fraction is None and row.last_progress_text() == \
        "distill > model calls (not counted)"
    # a killed worker recorded nothing: its last snapshot still holds the work in flight
    killed = _fake(ws, "k", "failed")
    (killed.folder / "progress.json").write_text(json.dumps(_snap(5, 12, rate=0.5, eta=14.0)))
    row = job_row(killed)
    assert row.last_done_text() == "5/12 chunk" and row.last_progress.eta is None
    # nothing recorded (it ended before any progress), and finished jobs
    assert job_row(_fake(ws, "e", "stopped")).last_progress is None
    done = _fake(ws, "c", "completed", last_progress=ProgressSnapshot.model_validate(
        _snap(3, 12)))
    assert job_row(done).last_progress is None


def test_task_centre_and_job_panel_show_where_a_stopped_job_stood(app_ws):
    ws, _ = app_ws
    from workbench.jobs.state import ProgressSnapshot

    _fake(ws, "s", "stopped", error="stopped by request; start it again to resume",
          progress=["verifying 3 items"],
          last_progress=ProgressSnapshot.model_validate(_snap(3, 12)))
    at = page("jobs").run()
    assert not at.exception, at.exception
    t = next(d.value for d in at.dataframe if "pipeline" in d.value.columns)
    assert list(t["done/total"]) == ["3/12 chunk"] and list(t["progress"]) == [0.25]
    assert bars(at) == ["stopped at distill > model calls: 3/12 chunk"]
    assert any("last message: verifying 3 items" in c.value for c in at.caption)
    at = page("distill").run()  # the pipeline page's panel: the same bar, and Run again
    assert not at.exception, at.exception
    assert bars(at) == ["stopped at distill > model calls: 3/12 chunk"]
    assert "verifying 3 items" in texts(at)
    assert any("start it again" in w.value for w in at.warning)  # a stop is no error
    again = at.button(key="distill-again")
    assert again.label == "Run again" and "finishes the rest" in again.help
    assert not any(b.key in ("distill-stop", "distill-refresh") for b in at.button)


# --- how far a running job is, without opening its log (issue 46) ---------------------------

def test_the_last_progress_line_of_a_log_gives_the_figure(monkeypatch, capsys):
    """`last_progress_figure` reads the lines `workbench.progress` writes (made here by the
    real reporter: a counted loop, a tally of tokens inside a batch, a loop of one item,
    uncounted work) and takes the last of them; other lines, and a log without any, give
    nothing."""
    from workbench import progress as P
    from workbench.jobs import last_progress_figure

    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setenv("WB_PROGRESS_SECONDS", "0.05")
    with P.stage("distill/distill"):
        for _ in P.progress(range(4), desc="model calls", unit="chunk"):
            time.sleep(0.12)
        with P.tally("tokens", "token") as t:
            for _ in range(6):
                t.add(7)
                time.sleep(0.03)
    time.sleep(0.1)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[progress]")]
    counted = [x for x in lines if "model calls" in x]
    assert counted, lines
    f = last_progress_figure("\n".join([*counted, "3 tasks; writing (composed mode)", ""]))
    assert f.where == "distill/distill > model calls" and f.total == 4 and f.unit == "chunk"
    assert 0 <= f.done <= 4 and f.figure.startswith(f"{f.done}/4 chunk (")
    assert f.text() == counted[-1].removeprefix("[progress] ")
    tokens = [x for x in lines if "token" in x]
    assert tokens, lines
    f = last_progress_figure("\n".join(lines[:1] + tokens))
    assert f.where == "distill/distill" and re.match(r"\d+ token \(", f.figure), f
    assert f.done is None and f.fraction is None and f.eta is None
    # written by hand: the forms the reporter makes
    f = last_progress_figure(
        "[progress] a > b 3/4: 2/7 chunk (29%), 0.02/s, 1m40s, ETA 4m10s\n"
        "distill: 2 chunks cached\n")
    assert (f.where, f.done, f.total, f.eta, round(f.fraction, 3)) == (
        "a > b 3/4", 2, 7, "4m10s", 0.286)
    f = last_progress_figure("[progress] x > generating: 0/8 reply (0%), 1234 token (41/s), "
                             "30s, ETA ?")
    assert (f.done, f.total, f.unit, f.eta) == (0, 8, "reply", None)
    assert f.figure == "0/8 reply (0%), 1234 token (41/s), 30s, ETA ?"
    f = last_progress_figure("[progress] distill > model calls: 1 chunk under way, 30s")
    assert f.figure == "1 chunk under way, 30s" and f.done is None
    f = last_progress_figure("[progress] rag: running, 2m05s")
    assert (f.where, f.figure) == ("rag", "running, 2m05s")
    for nothing in ("", "no progress here\n[progress]\n", "  [progress]  \n",
                    "Traceback ...\n[progress] x: "):
        assert last_progress_figure(nothing) is None, nothing
    assert len(last_progress_figure("[progress] " + "x" * 10_000).figure) <= 300


def _running(monkeypatch, ws: Path, name: str, log: str) -> Job:
    """A job that reads as running (its process is taken to be alive)."""
    monkeypatch.setattr("workbench.jobs.state.is_job_process", lambda job: True)
    return _fake(ws, name, "running", log, pid=os.getpid(), started=time.time() - 60)


def test_job_panel_shows_the_last_progress_line_without_opening_the_log(app_ws,
                                                                        monkeypatch):
    """A running job's panel (its pipeline page) and its Task-centre row show the log's last
    progress line, tokens so far included, under the snapshot's bar; with no snapshot (yet),
    the line's count is the bar."""
    ws, _ = app_ws
    line = ("[progress] distill/distill > model calls > generating: 0/8 reply (0%), "
            "1234 token (41/s), 30s, ETA ?")
    job = _running(monkeypatch, ws, "r", "[progress] distill/distill > model calls: 1 chunk "
                   f"under way, 5s\n3 tasks; writing (composed mode)\n{line}\n"
                   "a message after it\n")
    (job.folder / "progress.json").write_text(json.dumps(_snap(2, 7, rate=0.02, eta=250.0)))
    row = job_row(load_job(job.folder), log_lines=0)
    assert row.state == "running" and row.log_figure.text() == line.removeprefix(
        "[progress] ")
    for name in ("distill", "jobs"):
        at = page(name).run()
        assert not at.exception, at.exception
        assert any(re.fullmatch(r"distill > model calls: 2/7 chunk, 0\.02 chunk/s, ETA .+", b)
                   for b in bars(at)), bars(at)
        caps = [c.value.replace("\\", "") for c in at.caption]
        assert "last progress line: " + line.removeprefix("[progress] ") in caps, caps
    # no snapshot: the log's count is the bar, nothing else repeats it
    (job.folder / "progress.json").unlink()
    (job.folder / "log.txt").write_text(
        "[progress] distill/distill > model calls: 3/12 chunk (25%), 0.1/s, 30s, ETA 1m30s\n")
    at = page("distill").run()
    assert not at.exception, at.exception
    assert bars(at) == ["distill/distill > model calls: 3/12 chunk (25%), 0.1/s, 30s, "
                        "ETA 1m30s"]
    assert not any("last progress line" in c.value for c in at.caption)
    assert not any("count shows once" in c.value for c in at.caption)
    # a log without a progress line and no snapshot: it says it has started
    (job.folder / "log.txt").write_text("loading the model\n")
    at = page("distill").run()
    assert not at.exception, at.exception
    assert not bars(at) and any("count shows once" in c.value for c in at.caption)


# --- Run again on a pipeline page ------------------------------------------------------------

def _wait_log(job, pattern: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        row = job_row(load_job(job.folder), log_lines=0)
        assert row.state == "running", (row.error, job.log_text())
        if re.search(pattern, job.log_text(50)):
            return
        time.sleep(0.2)
    raise AssertionError(f"no {pattern!r} in the log in {timeout}s: {job.log_text()}")


def test_distill_page_runs_a_stopped_job_again_to_completion(app_ws):
    ws, marker = app_ws
    job = start_job(ws, "distill", cfg(ws))
    try:
        # a counted loop that has moved: some of its calls are in the cache
        _wait_log(job, r"\[progress\] .*model calls: [1-9]\d*/\d+ chunk")
        at = page("distill").run()
        assert not at.exception, at.exception
        assert f"`{job.id}`: running" in texts(at)
        # how far it is: the bar of the work in flight (it redraws itself while the job runs:
        # tests/test_e2e_browser.py watches it move on)
        assert any(re.fullmatch(r"distill.* > .*: \d+/\d+ chunk, .+, ETA .+", b)
                   for b in bars(at)), bars(at)
        assert not any(b.key == "distill-again" for b in at.button)  # running: Stop only
        at.button(key="distill-stop").click().run()
        assert not at.exception, at.exception
    except BaseException:
        stop_job(load_job(job.folder))
        raise
    assert wait_job(job, timeout=60).status == "stopped"
    at.run()
    assert not at.exception, at.exception
    row = job_row(load_job(job.folder), log_lines=0)
    assert re.fullmatch(r".+: \d+/\d+ chunk", row.last_progress_text())  # counted
    assert f"`{job.id}`: stopped" in texts(at)
    assert bars(at) == [f"stopped at {row.last_progress_text()}"]
    marker.unlink()  # fast from here on
    at.button(key="distill-again").click().run()
    assert not at.exception, at.exception
    said = next(s.value for s in at.success if s.value.startswith("Run again: started job"))
    new_id = said.rsplit(" ", 1)[-1]
    assert new_id != job.id and f"`{new_id}`" in texts(at)  # the panel shows the new job
    new = wait_job(load_job(ws / "jobs" / new_id), timeout=300)
    assert new.status == "completed", new.log_text()
    assert new.config == job.config and load_job(job.folder).status == "stopped"
    report = json.loads((ws / "runs" / "d" / "distill" / "report.json").read_text())
    assert report["model_calls"]["from_cache"] > 0  # it finished the rest, not all again
    at.run()
    assert not at.exception, at.exception
    assert f"`{new_id}`: completed" in texts(at) and not at.success
    assert not any(b.key == "distill-again" for b in at.button)  # nothing left to finish


# --- chat: a label per setup -----------------------------------------------------------------

@pytest.fixture()
def chat_ws(app_ws):
    """The app's workspace with one small retrieval index (run `kb`)."""
    from workbench.corpus import ingest
    from workbench.retrieval.index import RagConfig, RagIndex

    ws, _ = app_ws
    sections = ingest(REPO / "datasets" / "rf").sections[:4]
    RagIndex.build(sections, ws / "runs" / "kb" / "index",
                   config=RagConfig(chunk_size=96, chunk_overlap=16))
    return ws


def test_chat_labels_two_setups_of_the_base_model_apart(chat_ws):
    """The base model without and with retrieval: each answer, SFT row and preference pair
    carries its own setup's label, and the training core reads the rows."""
    from workbench.formats import read_dataset, read_preferences

    at = page("chat").run()
    assert not at.exception, at.exception
    assert [at.selectbox(key=f"c-model-{i}").value for i in (0, 1)] == ["base model"] * 2
    assert [at.selectbox(key=f"c-index-{i}").value for i in (0, 1)] == ["none", "kb (index)"]
    at.chat_input(key="c-ask").set_value("What does a quarter-wave transformer match?").run()
    assert not at.exception, at.exception
    one, two = "Setup 1: base, no retrieval", "Setup 2: base + hybrid k=3 (index kb)"
    heads = [m.value for m in at.markdown]
    assert f"**{one}**" in heads and f"**{two}**" in heads and "**base**" not in heads
    first, second = at.session_state["c-session"].answers
    assert (first.label, second.label) == (one, two) and second.passages
    at.button(key="c-good-0").click().run()
    at.text_area(key="c-fix-1").input("It matches a load to a line of another impedance.")
    at.button(key="c-bad-1").click().run()
    assert not at.exception, at.exception
    chat = chat_ws / "chat"
    sft = [json.loads(x) for x in (chat / "sft.jsonl").read_text().splitlines()]
    assert sorted(r["metadata"]["setup"] for r in sft) == [one, two]
    pairs = [json.loads(x) for x in (chat / "pairs.jsonl").read_text().splitlines()]
    assert [p["metadata"]["setup"] for p in pairs] == [two]
    rows = read_dataset(chat / "sft.jsonl")  # as the training core reads them
    assert {r.metadata["setup"] for r in rows} == {one, two}
    (pair,) = read_preferences(chat / "pairs.jsonl")
    assert pair.metadata["setup"] == two and pair.rejected[0].content == second.text
    ratings = [json.loads(x) for x in (chat / "ratings.jsonl").read_text().splitlines()]
    assert [r["label"] for r in ratings] == [one, two]


def test_chat_labels_two_identical_setups_apart(app_ws):
    at = page("chat").run()
    at.number_input(key="c-n").set_value(2).run()
    assert not at.exception, at.exception
    at.chat_input(key="c-ask").set_value("What is a Smith chart?").run()
    assert not at.exception, at.exception
    labels = [a.label for a in at.session_state["c-session"].answers]
    assert labels == ["Setup 1: base, no retrieval", "Setup 2: base, no retrieval"]


# --- distill: the verifier's verdict is kept from a rater ------------------------------------

VERDICT_NOTE = "The verifier's verdict on this item is hidden"


def test_distill_browser_hides_the_verifier_verdict_until_the_item_is_rated(app_ws):
    """A verifier that answers D to everything, its disagreements flagged: while the check
    has items to rate, the browser shows neither the flag nor its explanation for an unrated
    item the verifier decided (flagged or not: the same note on both); once the item is
    rated, or every sampled item is, the flag is back."""
    from workbench.distill.api import load_samples
    from workbench.distill.config import AgentModel, DistillConfig
    from workbench.distill.pipeline import run_distill
    from workbench.distill.verifier_check import verifier_check

    ws, _ = app_ws
    run = ws / "runs" / "vrun"
    run_distill(DistillConfig(
        mode="single", max_sections=10, benchmark_fraction=0.3, corpus="datasets/rf",
        domain="rf", verifier={"method": "generate", "on_disagree": "flag"},
        models={"verifier": {"spec": "fake", "options": {"name": "always-d",
                                                         "responses": ["D"]}}}),
        run / "distill", default_model=AgentModel(
            spec="fake", options={"script": "fake_teacher:reply"}), seed=3)
    samples = load_samples(run, reviewed=False)
    vc = verifier_check(run)
    sampled = {d.key for d in vc.check.sample}
    flagged = next(n for n, s in enumerate(samples)
                   if "verifier_disagrees" in s.flags and s.id in sampled)
    agreed = next(n for n, s in enumerate(samples) if s.kind == "mc" and s.id in sampled
                  and "verifier_disagrees" not in s.flags)
    at = page("distill").run()
    assert not at.exception, at.exception
    for n in (flagged, agreed):  # the two read alike: nothing tells them apart
        at.number_input(key="d-sample").set_value(n).run()
        assert not at.exception, at.exception
        body = texts(at)
        assert "verifier_disagrees" not in body and "second reading" not in body
        assert VERDICT_NOTE in body
    vc.decisions.rate(samples[flagged].id, False, by="bo")  # rated: its verdict may show
    at.number_input(key="d-sample").set_value(flagged).run()
    body = texts(at)
    assert "flags: " in body and "verifier_disagrees" in body and VERDICT_NOTE not in body
    at.number_input(key="d-sample").set_value(agreed).run()
    assert VERDICT_NOTE in texts(at)  # still unrated
    for key in sampled:  # the check is done: nothing is left to rate, the flags are back
        vc.decisions.rate(key, True, by="bo")
    at.number_input(key="d-sample").set_value(flagged).run()
    assert not at.exception, at.exception
    assert "verifier_disagrees" in texts(at) and VERDICT_NOTE not in texts(at)
    assert "Every sampled decision is rated." in texts(at)
