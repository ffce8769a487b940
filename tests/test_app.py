"""The Streamlit app: every page renders (AppTest), on an empty workspace and on one holding a
finished compare run made outside the app; the navigation comes from the registry; uploads are
checked, a job started from the app runs with a scripted model, and the security settings
hold."""

import os
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import REPO

APP = REPO / "workbench" / "app"  # the app ships in the package: workbench.app
PAGES = ["projects", "corpus", "distill", "retrieval", "train", "evaluate", "trajsynth",
         "federated", "agents", "loop", "chat"]
TESTS = str(Path(__file__).parent)


@pytest.fixture()
def ws(tmp_path, monkeypatch):
    monkeypatch.setenv("WB_WORKSPACE", str(tmp_path / "ws"))
    monkeypatch.setenv("WB_APP_MODEL", "fake")
    monkeypatch.setenv("WB_APP_MODEL_SCRIPT", "fake_teacher:reply")
    monkeypatch.setenv("PYTHONPATH", TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return tmp_path / "ws"


def page(name):
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(str(APP / "views" / f"{name}.py"), default_timeout=300)


@pytest.fixture(scope="session")
def finished_ws(compare_run):
    """A workspace whose runs/ holds a finished compare run made outside the app (no job):
    the shared tiny `compare_run` (scripted teacher, tiny student)."""
    return compare_run.workspace


@pytest.fixture()
def finished(finished_ws, monkeypatch):
    monkeypatch.setenv("WB_WORKSPACE", str(finished_ws))
    return finished_ws


TITLES = {"projects": "Projects and runs", "corpus": "Corpus", "distill": "Distill QTSA data",
          "retrieval": "Retrieval playground", "train": "Train (LoRA SFT or DPO)",
          "evaluate": "Evaluate and compare", "trajsynth": "Trajectories for data agents",
          "federated": "Federated rounds", "agents": "Domain agents",
          "loop": "Improvement loop", "chat": "Chat"}


@pytest.mark.parametrize("name", PAGES)
def test_every_page_renders_on_an_empty_workspace(ws, name):
    """Each page runs to its end on a new workspace: its title, no exception, no error box,
    and something that tells a person what to do or what is there (text beyond the title)."""
    at = page(name).run()
    assert not at.exception, at.exception
    assert [t.value for t in at.title] == [TITLES[name]]
    assert not at.error, [e.value for e in at.error]
    said = [e.value for kind in ("markdown", "caption", "info", "subheader", "text")
            for e in getattr(at, kind)]
    assert any(len(x) > 20 for x in said), said
    assert (ws / "corpus").is_dir()  # the page opened (made) the workspace it was given


def test_navigation_app_renders(ws):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP / "app.py"), default_timeout=60).run()
    assert not at.exception
    assert at.title[0].value == "Projects and runs"  # the default page ran


def test_navigation_is_built_from_the_registry(tmp_path):
    from workbench import registry
    from workbench.app.common import navigation_pages
    from workbench.registry import Pipeline

    pages = navigation_pages()
    assert [(p.name, t) for p, t, _, _ in pages[:3]] == [("projects.py", "Projects and runs"),
                                                        ("jobs.py", "Task centre"),
                                                        ("corpus.py", "Corpus")]
    assert pages[0][3] and not any(d for *_, d in pages[1:])
    want = [(APP / "views" / p.page, p.page_title or p.name, p.page_icon)
            for p in registry.pipelines() if p.page]
    assert [(p, t, i) for p, t, i, _ in pages[3:-1]] == want
    assert [(p.name, t) for p, t, _, _ in pages[-1:]] == [("chat.py", "Chat")]
    assert all(p.is_file() for p, *_ in pages)
    assert {p.name for p, *_ in pages} >= {"distill.py", "retrieval.py", "train.py",
                                            "evaluate.py"}
    extra = tmp_path / "plugin_page.py"
    extra.write_text("import streamlit as st\nst.title('Plugin page')\n")
    registry.register(Pipeline(name="app_plugin", help="a plugin with a page",
                               run="toy_pipeline:run", page=str(extra), order=99))
    try:
        pages = navigation_pages()
        assert pages[-2][:3] == (extra, "app_plugin", ":material/extension:")
        from streamlit.testing.v1 import AppTest

        assert not AppTest.from_file(str(APP / "app.py"), default_timeout=60).run().exception
    finally:
        registry.unregister("app_plugin")


def test_projects_page_shows_an_unreadable_job(ws):
    from workbench.workspace import open_workspace

    w = open_workspace(ws)
    (w / "jobs" / "broken-job").mkdir()
    (w / "jobs" / "broken-job" / "job.json").write_text("{not json")
    at = page("projects").run()
    assert not at.exception
    table = frame(at, "id", "kind", "status")
    assert list(table["status"]) == ["unreadable"] and "unreadable job state" in table[
        "error"][0]
    assert any("broken-job" in w.value for w in at.warning)


# --- a workspace holding a finished run made outside the app ---------------------------------

def frame(at, *columns):
    """The first table on the page with these columns (AppTest keeps no dataframe keys)."""
    for d in at.dataframe:
        if all(c in d.value.columns for c in columns):
            return d.value
    raise AssertionError(f"no table with columns {columns}")


def texts(at) -> str:
    return "\n".join(e.value for kind in ("markdown", "caption", "text", "subheader", "title")
                     for e in getattr(at, kind))


def test_list_runs_is_typed(finished):
    from workbench.experiments.compare import CompareReport, read_report
    from workbench.workspace import RunInfo, list_runs

    (info,) = list_runs(finished, read_report=read_report)
    assert isinstance(info, RunInfo) and info.name == "tiny"
    assert info.has_adapter and info.has_index and info.has_benchmark and info.has_report
    assert info.distilled and info.distilled > 0
    assert {"distill/distill", "rag/index", "train/train", "compare/report"} <= set(info.stages)
    assert isinstance(info.report, CompareReport) and info.report_error is None
    assert info.has_eval == {"eval": False, "eval_base": True, "eval_sft": True,
                             "eval_base_seen": False, "eval_sft_seen": False}
    assert list_runs(finished)[0].report is None  # no reader, no report


@pytest.mark.parametrize("name", PAGES)
def test_every_page_renders_a_finished_run(finished, name):
    at = page(name).run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]


def test_projects_page_lists_the_run(finished):
    at = page("projects").run()
    table = frame(at, "accuracy (headline, 95% CI)")
    assert table["configuration"][0] == "Base" and "SFT" in list(table["configuration"])
    assert "%" in table["accuracy (headline, 95% CI)"][0] and "[" in table[
        "accuracy (headline, 95% CI)"][0]
    assert "distilled: **" in texts(at)


def test_compare_table_with_intervals_and_significance(finished):
    from workbench.evaluate.report import SCORING_LABELS
    from workbench.experiments.compare import read_report

    report = read_report(finished / "runs" / "tiny")
    at = page("evaluate").run()
    assert at.multiselect(key="e-runs").value == ["tiny"]
    table = frame(at, "configuration", "s/item")
    assert list(table["configuration"]) == [r.name for r in report.rows]
    head = report.rows[0].headline
    # the headline's star leads its cell, so a narrow column never cuts it off
    col = next(c for c in table.columns if str(table[c][0]).startswith("★"))
    assert col.startswith({"letter": "letter", "cloze_norm": "cloze, per-char",
                           "cloze": "cloze (CF)", "generate": "generation"}[head])
    a = report.rows[0].scorings[head]
    assert table[col][0].endswith(f"{100 * a.value:.1f}% [{100 * a.ci_low:.1f}, "
                                  f"{100 * a.ci_high:.1f}]")
    # one column per scoring for every row: a cell is a figure or empty, never None
    assert not table.isna().any().any() and "None" not in table.to_string()
    # one name per scoring on the whole page: the column's, never the key "cloze_norm"
    assert list(table["headline"]) == [SCORING_LABELS[r.headline] if r.headline
                                       else "none (all degenerate)" for r in report.rows]
    assert "cloze_norm" not in texts(at) and not any(
        "cloze_norm" in str(d.value.to_string()) for d in at.dataframe)
    assert "degenerate" in table.columns
    pairs = frame(at, "p (Holm)")
    assert len(pairs) == len(report.comparisons)
    assert list(pairs["significant"]) == ["yes" if c.significant else "no"
                                          for c in report.comparisons]
    assert "Significant differences:" in texts(at)
    assert frame(at, "retriever", "mrr").shape[0] == 3


def test_evaluation_drill_down_renders_the_item(finished):
    from workbench.evaluate.benchmark import load_benchmark
    from workbench.evaluate.report import read_eval_results
    from workbench.runs import RunLayout

    lay = RunLayout.at(finished / "runs" / "tiny")
    items = {it.id: it for it in load_benchmark(lay.artifact("distill", "benchmark"))}
    rows = read_eval_results(lay.artifact("compare", "eval_base_results"))
    at = page("evaluate").run()
    first = rows[0]
    assert at.selectbox(key="cond-tiny-eval_base").value == first.condition
    body = texts(at)
    assert items[first.example_id].question in body
    assert "✓" in body and "(gold)" in body
    preds = frame(at, "scoring", "prediction")
    assert set(preds["prediction"]) <= {"A", "B", "C", "D", "(none)"}
    assert len(preds) == len(first.extra["predictions"])
    assert "Source section:" in body  # no context without retrieval
    rag = next(r for r in rows if r.condition == "semantic")
    at.selectbox(key="cond-tiny-eval_base").set_value("semantic").run()
    assert not at.exception
    body = texts(at)
    assert "Retrieved context (semantic)" in body
    assert any(rag.extra["context"][:60] in t.value for t in at.text)
    at.selectbox(key="ev-tiny").set_value("eval_sft").run()
    assert not at.exception and frame(at, "scoring", "prediction").shape[0] > 0


def test_the_evaluate_page_says_how_many_predictions_the_adapter_changed(finished):
    """Before, an adapter that moved no prediction left SFT's rows equal to the base
    model's with nothing to say why; now the page counts the changed items by condition."""
    from workbench.evaluate.report import read_eval_results
    from workbench.runs import RunLayout

    lay = RunLayout.at(finished / "runs" / "tiny")

    def preds(name):
        return {(r.condition, r.example_id): r.extra.get("predictions")
                for r in read_eval_results(lay.artifact("compare", name).parent)}

    base, sft = preds("eval_base"), preds("eval_sft")
    changed = sum(p != base[k] for k, p in sft.items() if k in base)
    at = page("evaluate").run()
    assert not at.exception
    said = [m.value for m in [*at.info, *at.caption]
            if "the adapter changed" in m.value.lower()]
    assert len(said) == 1, said
    assert ("changed no prediction" in said[0]) == (changed == 0), said


def test_train_page_shows_an_adapter_made_outside_the_app(finished):
    at = page("train").run()
    assert at.selectbox(key="t-run").value == "tiny"
    body = texts(at)
    assert "Adapter:" in body and "Training loss" in body
    m = frame(at, "status", "steps")
    assert m["status"][0] == "completed" and m["steps"][0] == 3
    assert len(at.get("vega_lite_chart")) >= 2  # loss, and held-out loss / domain accuracy
    assert len(at.get("image")) == 1  # training_curves.png


def test_distill_page_shows_a_sample(finished):
    from workbench.distill.api import load_samples

    s = load_samples(finished / "runs" / "tiny", reviewed=False)[0]
    at = page("distill").run()
    body = texts(at)
    assert "accepted" in body and s.question in body and s.solution in body
    assert "Source section:" in body
    if s.options:
        assert "(gold)" in body
        assert any(s.options[0][:40] in m.value for m in at.markdown)


def test_retrieval_page_uses_the_run_index(finished):
    at = page("retrieval").run()
    assert at.selectbox(key="r-index").value == "tiny"
    at.text_input(key="r-query").set_value("characteristic impedance").run()
    assert not at.exception
    assert [s.value for s in at.subheader][:3] == ["semantic", "keyword", "hybrid"]
    at.button(key="r-metrics").click().run()
    assert not at.exception and frame(at, "hybrid").shape[0] > 0


def test_chat_page_answers_side_by_side_with_sources_and_keeps_ratings(finished, monkeypatch):
    """Base (scripted) beside the run's adapter on its own base model (the tiny Llama) with the
    run's index: one question, both answers, the passages under the second, and a good and a
    bad rating (with what it should have said) kept as SFT rows and a preference pair."""
    from workbench.formats import read_dataset, read_preferences

    monkeypatch.setenv("WB_APP_MODEL", "fake")
    monkeypatch.setenv("WB_APP_MODEL_SCRIPT", "fake_teacher:reply")
    monkeypatch.setenv("PYTHONPATH", TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    at = page("chat").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="c-model-1").value == "tiny (adapter)"
    assert at.selectbox(key="c-index-1").value == "tiny (index)"
    at.chat_input(key="c-ask").set_value("What does a quarter-wave transformer match?").run()
    assert not at.exception, at.exception
    body = texts(at)
    assert body.count("What does a quarter-wave transformer match?") == 1
    assert "**Setup 1: base, no retrieval**" in [m.value for m in at.markdown]
    assert "**Setup 2: tiny-llama + adapter tiny + hybrid k=3 (index tiny)**" in [
        m.value for m in at.markdown]
    assert [e.label for e in at.expander if "passages" in e.label] == ["3 passages"]
    session = at.session_state["c-session"]
    first, second = session.answers
    assert first.text == "I do not know." and first.passages == []
    assert second.finish == "stop" and len(second.passages) == 3  # the tiny Llama's tokens
    chat = finished / "chat"
    at.button(key="c-good-0").click().run()
    assert not at.exception, at.exception
    assert "rated good" in texts(at)
    assert [r.messages[-1].content for r in read_dataset(chat / "sft.jsonl")] == [first.text]
    # the person changes their mind and says what it should have said: the last rating counts
    at.text_area(key="c-fix-0").input("It matches a load to a line of another impedance.")
    at.button(key="c-bad-0").click().run()
    assert not at.exception, at.exception
    assert "rated bad" in texts(at)
    rows = read_dataset(chat / "sft.jsonl")
    assert [r.messages[-1].content for r in rows] == [
        "It matches a load to a line of another impedance."]
    (pair,) = read_preferences(chat / "pairs.jsonl")
    assert pair.rejected[0].content == first.text
    assert pair.prompt[-1].content == "What does a quarter-wave transformer match?"
    at.button(key="c-reset").click().run()
    assert not at.exception and not at.session_state["c-session"].answers


def test_upload_saves_and_rejects(ws):
    at = page("corpus").run()
    at.file_uploader(key="corpus-upload").set_value(
        [("vswr.md", b"# Reflection\n\n## VSWR\n\n" + b"VSWR is (1+G)/(1-G). " * 20,
          "text/markdown"),
         ("../../escape.md", b"# X\n\n## Y\n\n" + b"body text here " * 5, "text/markdown")]).run()
    assert not at.exception
    saved = sorted(p.name for p in (ws / "corpus").iterdir())
    assert saved == ["escape.md", "vswr.md"]  # the name lost its folders
    assert not (ws.parent / "escape.md").exists()
    assert any("Sections found" in s.value for s in at.subheader)
    assert at.dataframe[0].value.shape[0] == 2


def test_upload_of_a_slide_deck_shows_where_each_section_lies(ws, tmp_path):
    from docgen import make_pptx

    make_pptx(tmp_path / "talk.pptx", [("Mixers", "A mixer multiplies two signals.", None),
                                       ("Filters", "Butterworth is maximally flat.", None)])
    at = page("corpus").run()
    at.file_uploader(key="corpus-upload").set_value(
        [("talk.pptx", (tmp_path / "talk.pptx").read_bytes(),
          "application/vnd.openxmlformats-officedocument.presentationml.presentation")]).run()
    assert not at.exception
    table = at.dataframe[0].value
    assert list(table["heading path"]) == ["Mixers", "Filters"]
    assert list(table["from"]) == ["slide 1", "slide 2"]


def test_upload_guards(tmp_path):
    from workbench.errors import DataError
    from workbench.workspace import open_workspace, save_upload

    w = open_workspace(tmp_path / "w")
    for bad in ("../../../etc/passwd.md", "/abs/x.md", "..\\..\\win.md"):
        p = save_upload(w, bad, b"# a\n\n## b\n\ntext")
        assert p.parent == (w / "corpus").resolve()
    with pytest.raises(DataError, match="unsupported"):
        save_upload(w, "model.pkl", b"\x80\x04")
    with pytest.raises(DataError, match="over the 1 MB cap"):
        save_upload(w, "big.md", b"x" * (2 * 1024 * 1024), max_mb=1)
    with pytest.raises(DataError, match="unusable"):
        save_upload(w, "..", b"x")


def test_distill_from_the_app_with_a_scripted_model(ws):
    from workbench.jobs import list_jobs, wait_job
    from workbench.workspace import open_workspace, save_upload

    w = open_workspace(ws)
    for f in sorted((REPO / "datasets" / "rf").glob("0[12]_*.md")):
        save_upload(w, f.name, f.read_bytes())
    at = page("distill").run()
    at.text_input(key="d-name").set_value("app-run")
    at.radio(key="d-mode").set_value("single")
    at.multiselect(key="d-kinds").set_value(["mc"])
    at.button(key="d-start").click().run()
    assert not at.exception
    jobs = list_jobs(w)
    assert len(jobs) == 1 and jobs[0].kind == "distill"
    # what the form does not ask is set as the demo config distils with a small teacher
    demo = yaml.safe_load((REPO / "configs" / "rf_demo.yaml").read_text())["distill"]
    asked = jobs[0].config["distill"]
    for key in ("constrained", "writer_temperature", "verifier"):
        assert asked[key] == demo[key], key
    assert "writer_max_tokens" not in asked  # single mode: a whole MC block, the default
    job = wait_job(jobs[0], timeout=300)
    assert job.status == "completed", job.log_text()
    at = page("distill").run()
    assert not at.exception
    assert any("accepted" in m.value for m in at.markdown)
    at.button(key=next(b.key for b in at.button if b.key and b.key.startswith("rej-"))).click()
    at.run()
    assert (w / "runs" / "app-run" / "distill" / "review.jsonl").exists()


def test_work_on_an_empty_corpus_is_refused_before_a_job_starts(ws):
    """Distil, build an index or run the comparison over an empty corpus: one line says to
    upload documents first and no job starts (it used to start, fail in a collapsed panel
    and leave a stale lock)."""
    from workbench.jobs import list_jobs
    from workbench.workspace import open_workspace

    w = open_workspace(ws)
    for name, click in (("distill", lambda at: at.button(key="d-start")),
                        ("retrieval", lambda at: at.button(key="r-build")),
                        ("evaluate", lambda at: at.button(key="e-start"))):
        at = page(name).run()
        click(at).click().run()
        assert not at.exception, name
        assert any("the corpus is empty" in e.value for e in at.error), name
    assert list_jobs(w) == []


def test_the_checkout_entry_runs_the_packaged_app_with_its_settings(tmp_path, monkeypatch):
    """apps/streamlit/app.py (`streamlit run apps/streamlit/app.py` from a checkout) renders
    the packaged app, and its .streamlit/config.toml is the package's."""
    from streamlit.testing.v1 import AppTest

    entry = REPO / "apps" / "streamlit"
    assert (entry / ".streamlit" / "config.toml").read_text() == \
        (APP / ".streamlit" / "config.toml").read_text()
    monkeypatch.chdir(tmp_path)  # its workspace is ./workspace, as with `workbench app`
    monkeypatch.delenv("WB_WORKSPACE", raising=False)
    monkeypatch.delenv("WB_ROOT", raising=False)
    at = AppTest.from_file(str(entry / "app.py"), default_timeout=120).run()
    assert not at.exception
    assert [t.value for t in at.title] == [TITLES["projects"]]
    # every page says what the bundled model is
    assert any("135M-parameter demonstration model" in c.value for c in at.sidebar.caption)
    assert (tmp_path / "workspace").is_dir()


def test_streamlit_config_is_secure():
    cfg = tomllib.loads((APP / ".streamlit" / "config.toml").read_text())
    s = cfg["server"]
    assert s["enableXsrfProtection"] is True and s["enableCORS"] is True
    assert s["headless"] is True and s["address"] == "127.0.0.1"
    assert s["maxUploadSize"] <= 20
    from workbench.workspace import streamlit_command

    cmd = streamlit_command(APP / "app.py", host="127.0.0.1", port=8501)
    flags = dict(zip(cmd[5::2], cmd[6::2], strict=True))
    assert flags["--server.enableXsrfProtection"] == "true"
    assert flags["--server.enableCORS"] == "true" and flags["--server.address"] == "127.0.0.1"


def test_bring_your_own_benchmark_from_the_app(ws):
    """An MMLU-style file with other field names, uploaded as it is, runs as an eval job."""
    import json

    from workbench.evaluate.report import read_eval_summary
    from workbench.jobs import list_jobs, wait_job
    from workbench.runs import RunLayout

    rows = [{"stem": f"What is {i} plus {i}?", "opts": [str(2 * i), str(i), "0", str(3 * i)],
             "label": 0} for i in range(1, 7)]
    at = page("evaluate").run()
    at.file_uploader(key="b-file").set_value(
        [("mine.jsonl", "\n".join(json.dumps(r) for r in rows).encode(),
          "application/json")]).run()
    at.text_input(key="b-q").set_value("stem")
    at.text_input(key="b-c").set_value("opts")
    at.text_input(key="b-a").set_value("label")
    at.button(key="b-start").click().run()
    assert not at.exception and any("6 items read" in s.value for s in at.success)
    (job,) = list_jobs(ws, kind="eval")
    job = wait_job(job, timeout=300)
    assert job.status == "completed", job.log_text()
    summary = read_eval_summary(RunLayout.at(ws / "runs" / "my-benchmark").folder("eval"))
    assert summary.items == 6 and summary.conditions["none"].n == 6
    shown = page("evaluate").run()  # its table: the headline's star leads its cell
    shown.multiselect(key="e-runs").set_value(["my-benchmark"]).run()
    table = frame(shown, "condition", "items")
    assert any(str(v).startswith("★ ") for v in table.iloc[0]), table
    assert not table.isna().any().any() and "None" not in table.to_string()
    at.file_uploader(key="b-file").set_value(
        [("bad.jsonl", b'{"stem": "q", "opts": ["a", "b"], "label": 0}\n{"stem": "q2"}\n',
          "application/json")]).run()
    at.button(key="b-start").click().run()
    assert any(":2:" in e.value for e in at.error)  # the error names the line


# --- workspaces confined to a root fixed at start ---------------------------------------------

@pytest.fixture()
def rooted(tmp_path, monkeypatch):
    """A root holding the start workspace, a folder outside it and a symlink leading out."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside, target_is_directory=True)
    monkeypatch.setenv("WB_ROOT", str(root))
    monkeypatch.setenv("WB_WORKSPACE", str(root / "ws"))
    return root, outside


REFUSED_WORKSPACES = {  # what the projects page is given -> a phrase of its message
    "/etc": "outside the workspace root", "{outside}": "outside the workspace root",
    "{outside}/new": "outside the workspace root", "../outside": "'..' is not allowed",
    "ws/../../outside": "'..' is not allowed", "link": "outside the workspace root",
    "link/new": "outside the workspace root", "{root}": "workspace root",
    "": "give a workspace folder", "a\0b": "not a usable folder path",
    "ws/corpus/x.md/sub": "cannot open the workspace"}


def test_projects_page_opens_workspaces_only_inside_the_root(rooted):
    """Each refused path: one message in the page (no traceback), the session keeps its
    workspace and nothing is created; names and paths inside the root open or create."""
    root, outside = rooted
    at = page("projects").run()
    assert not at.exception and at.session_state.workspace == str(root / "ws")
    assert at.text_input(key="ws-path").value == "ws"  # shown relative to the root
    assert any(str(root) in c.value for c in at.caption)
    (root / "ws" / "corpus" / "x.md").write_text("# a\n")
    for given, phrase in REFUSED_WORKSPACES.items():
        at.text_input(key="ws-path").set_value(given.format(root=root, outside=outside))
        at.button(key="ws-open").click().run()
        assert not at.exception, (given, at.exception)
        assert [phrase in e.value for e in at.error] == [True], (given, at.error)
        assert at.session_state.workspace == str(root / "ws")
    assert sorted(p.name for p in outside.iterdir()) == []  # nothing was created outside
    assert sorted(p.name for p in root.iterdir()) == ["link", "ws"]
    for given, made in (("team/p2", root / "team" / "p2"), (str(root / "p3"), root / "p3")):
        at.text_input(key="ws-path").set_value(given)
        at.button(key="ws-open").click().run()
        assert not at.exception and not at.error
        assert at.session_state.workspace == str(made)
        assert sorted(p.name for p in made.iterdir()) == ["corpus", "jobs", "runs"]


def test_app_command_fixes_the_root(tmp_path, monkeypatch):
    """`workbench app` passes the root to Streamlit and refuses a start workspace outside it
    with one line, before starting anything."""
    import workbench.io
    from workbench.cli.main import main

    started: list[dict] = []
    served: list[tuple[list[str], Path]] = []

    def run_child(cmd, env, cwd):
        served.append((cmd, cwd))
        started.append(env)
        return 0

    monkeypatch.setattr(workbench.io, "run_child", run_child)
    root = tmp_path / "root"
    assert main(["app", "--root", str(root), "--max-corpus-mb", "5"]) == 0
    assert started[-1]["WB_ROOT"] == str(root) and started[-1]["WB_MAX_CORPUS_MB"] == "5"
    assert started[-1]["WB_WORKSPACE"] == str(root / "workspace")
    # the script is found through the package (workbench.app), served from its folder
    assert str(APP / "app.py") in served[-1][0] and served[-1][1] == APP
    assert main(["app", "--workspace", str(tmp_path / "w2")]) == 0  # default root: its folder
    assert started[-1]["WB_ROOT"] == str(tmp_path) and len(started) == 2
    assert main(["app", "--root", str(root), "--workspace", str(tmp_path / "elsewhere")]) == 1
    assert len(started) == 2 and not (tmp_path / "elsewhere").exists()


# --- the corpus: "Remove" sticks, and a total cap ----------------------------------------------

def test_removed_upload_stays_removed_after_reruns(ws):
    at = page("corpus").run()
    at.file_uploader(key="corpus-upload").set_value(
        [("a.md", b"# A\n\n## One\n\n" + b"alpha text. " * 20, "text/markdown"),
         ("b.md", b"# B\n\n## Two\n\n" + b"beta text. " * 20, "text/markdown")]).run()
    assert sorted(p.name for p in (ws / "corpus").iterdir()) == ["a.md", "b.md"]
    assert sorted(s.value for s in at.success) == ["Saved a.md", "Saved b.md"]
    at.button(key="rm-a.md").click().run()
    assert not at.exception
    for _ in range(3):  # the uploader still holds a.md on every rerun
        assert sorted(p.name for p in (ws / "corpus").iterdir()) == ["b.md"]
        assert not at.success and "1 documents" in [s.value for s in at.subheader]
        at.run()
    at.file_uploader(key="corpus-upload").set_value(  # uploading it again brings it back
        [("a.md", b"# A\n\n## One\n\n" + b"alpha text. " * 20, "text/markdown")]).run()
    assert sorted(p.name for p in (ws / "corpus").iterdir()) == ["a.md", "b.md"]


def test_corpus_cap_refuses_an_upload_and_writes_nothing(tmp_path):
    from workbench.errors import DataError
    from workbench.workspace import MAX_CORPUS_MB, MB, corpus_bytes, open_workspace, save_upload

    assert MAX_CORPUS_MB == 200
    w = open_workspace(tmp_path / "w")
    save_upload(w, "a.md", b"a" * (MB // 2), max_corpus_mb=1)
    save_upload(w, "b.md", b"b" * (MB // 4), max_corpus_mb=1)
    before = {p.name: p.read_bytes() for p in (w / "corpus").iterdir()}
    with pytest.raises(DataError, match=r"c\.md: the corpus holds 0\.8 MB and this file is "
                                        r"0\.5 MB: over the 1 MB corpus cap") as e:
        save_upload(w, "c.md", b"c" * (MB // 2), max_corpus_mb=1)
    assert e.value.code == "corpus_full"
    assert {p.name: p.read_bytes() for p in (w / "corpus").iterdir()} == before  # no temp
    save_upload(w, "a.md", b"A" * (3 * MB // 4), max_corpus_mb=1)  # a replacement fits:
    assert corpus_bytes(w) == MB  # 3/4 + 1/4, the old a.md no longer counts
    with pytest.raises(DataError, match="over the 1 MB corpus cap"):
        save_upload(w, "d.md", b"d", max_corpus_mb=1)


def test_corpus_page_shows_the_cap_refusal(ws, monkeypatch):
    monkeypatch.setenv("WB_MAX_CORPUS_MB", "0.001")  # 1,048 bytes
    at = page("corpus").run()
    at.file_uploader(key="corpus-upload").set_value(
        [("a.md", b"# A\n\n## One\n\n" + b"x" * 600, "text/markdown"),
         ("b.md", b"# B\n\n## Two\n\n" + b"y" * 600, "text/markdown")]).run()
    assert not at.exception
    assert [s.value for s in at.success] == ["Saved a.md"]
    assert len(at.error) == 1 and "b.md: the corpus holds 0.0 MB" in at.error[0].value \
        and "over the 0.001 MB corpus cap" in at.error[0].value
    assert sorted(p.name for p in (ws / "corpus").iterdir()) == ["a.md"]


# --- run files read while a job may still be writing them ------------------------------------

RUN_PAGES = ["projects", "distill", "retrieval", "train", "evaluate"]  # corpus reads no run
READERS = {"distill": ["distill", "evaluate", "retrieval"], "eval_base": ["evaluate"],
           "eval_sft": ["evaluate"], "adapter": ["train"], "index": ["retrieval"]}


def _readers(rel: Path) -> list[str]:
    """The pages that read a run file (by its folder); run-level state: every page."""
    if len(rel.parts) > 1:
        return READERS[rel.parts[0]]
    return ["train"] if rel.name.startswith("adapter.") else \
        ["evaluate"] if rel.suffix == ".png" else RUN_PAGES


def test_pages_survive_half_written_run_files(finished_ws, tmp_path, monkeypatch):
    """Every file the pages read (live metrics, the training manifest and curves, reports,
    summaries, per-item results, samples, sections, review log, plots, index files, stage
    state, job.json), cut to half its bytes and to nothing, one at a time and then all at
    once: every page that reads it renders without an exception, and says "not ready yet"
    where a file cannot be read at all."""
    import shutil

    import streamlit as st

    from workbench.distill.api import load_samples, review_sample
    from workbench.jobs import Job

    w = tmp_path / "ws"
    shutil.copytree(finished_ws, w)
    monkeypatch.setenv("WB_WORKSPACE", str(w))
    run = w / "runs" / "tiny"
    review_sample(run, load_samples(run, reviewed=False)[0].id, "accept")  # review.jsonl
    job = Job(id="20260101-000000-train-abcdef", kind="train", workspace=str(w), config={},
              status="completed", progress=["step 3/3"])
    job.folder.mkdir(parents=True)
    job.save()
    (job.folder / "log.txt").write_text("done\n")
    model_files = {"adapter_config.json", "tokenizer.json", "tokenizer_config.json"}
    files = sorted(p for p in run.rglob("*") if p.is_file() and p.suffix in (
        ".json", ".jsonl", ".png", ".md", ".npy", ".index") and p.name not in model_files
        and "sft" not in p.parts)
    assert len(files) >= 30

    apps = {name: page(name) for name in RUN_PAGES}  # reruns skip Streamlit's set-up scan

    def render(names: list[str], why) -> list[str]:
        shown = []
        for name in names:
            at = apps[name].run()
            assert not at.exception, (why, name, at.exception)
            if any("not ready yet" in c.value for c in at.caption):
                shown.append(name)
        return shown

    renders, not_ready = 0, {}
    for f in files + [job.folder / "job.json"]:
        whole = f.read_bytes()
        names = RUN_PAGES if f.name == "job.json" else _readers(f.relative_to(run))
        for cut in (len(whole) // 2, 0):
            f.write_bytes(whole[:cut])
            if f.parent.name == "index":
                st.cache_resource.clear()  # the retrieval page must load the cut index
            not_ready[f.relative_to(w), cut] = render(names, (f, cut))
            renders += len(names)
        f.write_bytes(whole)
    originals = {f: f.read_bytes() for f in files}
    for cut in (0.5, 0):  # every file cut at once
        for f, whole in originals.items():
            f.write_bytes(whole[:int(len(whole) * cut)])
        st.cache_resource.clear()
        render(RUN_PAGES, cut)
        renders += len(RUN_PAGES)
    for rel in ("adapter/manifest.json", "adapter/training_curves.png", "comparison.png",
                "distill/report.json", "index/manifest.json", "index/faiss.index"):
        for cut in (0, len(originals[run / rel]) // 2):
            assert not_ready[Path("runs/tiny") / rel, cut], (rel, cut)
    print(f"{len(files) + 1} files x 2 cuts, then all at once: {renders} page renders, "
          f"0 exceptions; {sum(map(bool, not_ready.values()))} of {len(not_ready)} cut files "
          "shown as 'not ready yet'")


def test_trajectories_page_shows_the_pool_the_tree_and_the_ledger(ws):
    """A search run made outside the app: the pool table, the tree browser (graph + node
    table with the verified path marked) and the cost ledger render."""
    from conftest import small_trajsynth_run

    small_trajsynth_run(ws / "runs" / "ts" / "trajsynth")
    at = page("trajsynth").run()
    assert not at.exception
    text = " ".join(m.value for m in at.markdown) + " ".join(c.value for c in at.caption)
    assert "Green: a verified path" in text
    assert any(m.label == "Tasks verified" for m in at.metric)
    frames = [d.value for d in at.dataframe]
    nodes = next(f for f in frames if "verified path" in f.columns)
    assert nodes["verified path"].any() and (nodes["visits"] > 0).all()


def test_federated_page_shows_rounds_sites_and_conditions(federated_run, monkeypatch):
    """A federated run made outside the app (the shared `federated_run`): the round table,
    per-site metrics and the conditions table with intervals render."""
    monkeypatch.setenv("WB_WORKSPACE", str(federated_run.workspace))
    at = page("federated").run()
    assert not at.exception, at.exception
    assert {m.label for m in at.metric} >= {"Rounds done", "Canaries leaked"}
    assert next(m for m in at.metric if m.label == "Canaries leaked").value == "0"
    frames = [d.value for d in at.dataframe]
    rounds = next(f for f in frames if "participants" in f.columns)
    assert list(rounds["participants"]) == ["3/3", "3/3", "3/3"]
    conds = next(f for f in frames if "condition" in f.columns)
    assert set(conds["condition"]) == {"no training", "local-only", "federated",
                                       "centralised"}


def test_federated_page_shows_a_knowledge_run(knowledge_run, monkeypatch):
    monkeypatch.setenv("WB_WORKSPACE", str(knowledge_run.workspace))
    at = page("federated").run()
    assert not at.exception, at.exception
    assert any(m.label == "Active units" for m in at.metric)
    assert next(m for m in at.metric if m.label == "Canaries leaked").value == "0"
    units = next(d.value for d in at.dataframe if "sites for" in d.value.columns)
    assert len(units) > 0 and set(units["status"]) <= {"candidate", "active", "retired"}


def test_federated_page_starts_a_prompted_knowledge_job(ws):
    """The form's third track: a knowledge run whose sites run prompted agents with the
    app's chat model (the job is stopped once its config is checked)."""
    import yaml

    from workbench.jobs import list_jobs, stop_job

    at = page("federated").run()
    at.selectbox(key="fed-track").set_value(
        "Knowledge units, prompted agents (chat model)")
    at.number_input(key="fed-sites").set_value(4)
    at.button[0].click().run()
    assert not at.exception, at.exception
    (job,) = list_jobs(ws, kind="fed")
    try:
        cfg = yaml.safe_load((job.folder / "config.yaml").read_text())["federated"]
        k = cfg["knowledge"]
        assert cfg["track"] == "knowledge" and k["agent"] == "prompted"
        assert k["prompted"]["model"] == "fake" and k["listener"] == 3 and k["poison"] == 2
    finally:
        stop_job(job)


def test_agents_page_shows_a_kgv_evaluation_and_its_steps(ws):
    """A KGV evaluation made outside the app (scripted model, 4 claims, no student): the
    metrics table with intervals and a trajectory's steps render."""
    from workbench.config import load_config
    from workbench.runs import RunContext, RunLayout, run_pipeline

    cfg = load_config(None, ["models.chat.spec=fake", "agent.dev_limit=4",
                             "agent.conditions=[closed_book,rag,agent]", "agent.chunk=4",
                             f"output_dir={ws / 'runs'}", "name=kgvrun"])
    run_pipeline("agent", cfg, RunContext(layout=RunLayout.of(cfg), log=lambda m: None))
    at = page("agents").run()
    assert not at.exception, at.exception
    frames = [d.value for d in at.dataframe]
    table = next(f for f in frames if "macro-F1" in f.columns)
    assert set(table["condition"]) == {"closed_book", "rag", "agent"}
    assert table["macro-F1"].str.contains(r"\[").all()  # every figure with its interval
    assert any("answer" in s.value for s in at.success)  # a trajectory's verdict step


def test_agents_page_shows_a_litsearch_evaluation_and_its_workflow(ws, tmp_path):
    """A literature-search evaluation on a tiny corpus (no model: keyword, fixed and oracle
    conditions): the metrics table, one dialogue's turns and its workflow graph render."""
    from conftest import tiny_litsearch_data

    from workbench.config import load_config
    from workbench.runs import RunContext, RunLayout, run_pipeline

    data = tiny_litsearch_data(tmp_path / "ls")
    cfg = load_config(None, ["agent.pack=litsearch", f"agent.data={data}", "agent.turns=2",
                             "agent.conditions=[query_only,fixed,oracle]",
                             f"output_dir={ws / 'runs'}", "name=lsrun"])
    run_pipeline("agent", cfg, RunContext(layout=RunLayout.of(cfg), log=lambda m: None))
    at = page("agents").run()
    assert not at.exception, at.exception
    frames = [d.value for d in at.dataframe]
    table = next(f for f in frames if "ndcg10 final" in f.columns)
    assert set(table["condition"]) == {"query_only", "fixed", "oracle"}
    turns = next(f for f in frames if "choice" in f.columns)
    assert list(turns["turn"]) == [1, 2]


def test_agents_page_shows_an_rf_report_and_names_a_broken_one(ws):
    """An RF design report (written by the pack's writer): its accuracy table with intervals
    and families renders through the reader; the same report broken renders a note naming
    the file, never a traceback."""
    from workbench.agent_packs.rf.api import rf_report
    from workbench.agent_packs.rf.bench import DesignItem
    from workbench.agents.steps import AgentTrajectory
    from workbench.io import write_jsonl

    out = ws / "runs" / "rfrun" / "agent"
    out.mkdir(parents=True)
    items = [DesignItem(id=f"i{k}", question="q", answer=10.0, quantity="x", tool="t",
                        family="f") for k in range(2)]
    traj = AgentTrajectory(id="i0", task_id="i0", messages=[
        {"role": "system", "content": "s"}, {"role": "user", "content": "q"}], stop="final")
    rows = {"alone": [{"id": "i0", "family": "f", "prediction": 10.0, "tool_calls": 0,
                       "errors": 0}, {"id": "i1", "family": "f", "prediction": None,
                                      "tool_calls": 0, "errors": 0}],
            "tools": [{"id": f"i{k}", "family": "f", "prediction": 10.0, "tool_calls": 1,
                       "errors": 0, "tool": "t", "trajectory": traj.model_dump(mode="json")}
                      for k in range(2)]}
    write_jsonl(out / "rf_tools.jsonl", rows["tools"])
    rf_report(out, items, rows, {}, model="m")
    at = page("agents").run()
    assert not at.exception, at.exception
    table = next(d.value for d in at.dataframe if "accuracy" in d.value.columns)
    assert list(table["condition"]) == ["alone", "tools"]
    assert list(table["accuracy"]) == ["50.0% [9.5, 90.5]", "100.0% [34.2, 100.0]"]
    assert list(table["f"]) == ["1/2", "2/2"] and list(table["answered"]) == ["1/2", "2/2"]
    assert any("stop: final" in c.value for c in at.caption)  # the tools run's steps

    (out / "rf_report.json").write_text('{"items": 2,')
    at = page("agents").run()
    assert not at.exception, at.exception
    note = [c.value for c in at.caption if "rf_report.json: not ready yet" in c.value]
    assert note and str(out / "rf_report.json") in note[0] and "bad JSON" in note[0]


def _loop_round(ws, **loop):
    """An improvement loop in the workspace, made outside the app with the scripted model
    and trainer (tests/loop_scripted.py): round 1 run up to its decision."""
    import loop_scripted  # noqa: F401 - registers the loopfake backend

    from workbench.config import load_config
    from workbench.loop.api import Loop

    cfg = load_config(REPO / "configs" / "health_demo.yaml", [
        "models.chat.spec=fake-loop", "models.chat.backend=loopfake", "models.chat.options={}",
        "loop.trainer=loop_scripted:train", "cache.enabled=false",
        f"output_dir={ws / 'runs'}", "name=looprun", "loop.suites.max_items_per_subset=6",
        "loop.suites.open_items=4", "loop.weightings=[1.0]",
        *[f"loop.{k}={v}" for k, v in loop.items()]])
    return Loop(cfg, log=lambda m: None)


def test_loop_page_shows_a_finished_round_and_its_decision_buttons(ws):
    """A round waiting for its decision: failures by mode, the reviewed data, per-subset
    deltas with intervals, the guards; clicking Keep with a name and reason decides it."""
    loop = _loop_round(ws)
    r = loop.plan()
    loop.approve(r.index, by="ana")
    loop.run_round(r.index)
    at = page("loop").run()
    assert not at.exception, at.exception
    frames = [d.value for d in at.dataframe]
    deltas = next(f for f in frames if "delta" in f.columns)
    assert deltas["delta"].str.contains(r"\[").all()  # every delta with its interval
    assert deltas["candidate"].str.contains(r"\[").all()
    assert {"test", "retention", "open"} <= set(deltas["suite"])
    assert any("mode" in f.columns and "rows" in f.columns for f in frames)
    assert any("recommend" in i.value for i in at.info)
    assert len(at.success) + len(at.error) >= len(loop.round(1).guards)  # one line a guard
    labels = [b.label for b in at.button]
    assert {"Keep", "Continue", "Revert", "Deploy"} <= set(labels)
    at.text_input(key="lp-decider").input("ana")
    at.text_input(key="lp-reason").input("target improved, no guard tripped")
    at.button(key="lp-keep").click().run()
    assert not at.exception, at.exception
    r = loop.round(1)
    assert r.status == "decided" and r.decision.choice == "keep" and r.decision.by == "ana"
    assert loop.state().current.sha256 == r.candidate
    assert any("Decision" in s.value for s in at.success)


def test_loop_page_refuses_a_decision_without_a_name(ws):
    loop = _loop_round(ws)
    r = loop.plan()
    loop.approve(r.index, by="ana")
    loop.run_round(r.index)
    at = page("loop").run()
    at.button(key="lp-revert").click().run()
    assert not at.exception
    assert any("reason" in e.value for e in at.error)
    assert loop.round(1).status == "awaiting_decision"


def test_loop_page_reviews_data_before_training(ws):
    """With loop.review_data the round stops after the gates; rejecting a sample in the
    editor and approving the data records the review that training then applies."""
    loop = _loop_round(ws, review_data="true")
    r = loop.plan()
    loop.approve(r.index, by="ana")
    r = loop.run_round(r.index)
    assert r.status == "running" and "mixture" not in r.steps
    at = page("loop").run()
    assert not at.exception, at.exception
    assert any(b.label == "Approve the data and continue" for b in at.button)
    loop.approve(r.index, by="bo", data=True, review={_ids(loop, r)[0]: "reject"})
    rejected = _ids(loop, r)[0]
    r = loop.run_round(r.index)
    assert r.status == "awaiting_decision" and loop.round(1).reviewed_by == "bo"
    assert rejected not in (loop.folder(1) / "train.jsonl").read_text()


def _ids(loop, r):
    import json as _json

    return [_json.loads(x)["id"] for x in
            (loop.folder(r.index) / "accepted.jsonl").read_text().splitlines()]


def test_loop_page_checks_the_judge_with_a_person(ws):
    """Check the judge: the next sampled decision shown without the judge's verdict, a
    name required, two ratings kept through the library (the ratings file) and the
    agreement, reading and guard shown as they stand."""
    from workbench.loop.agreement import judge_check, read_ratings

    loop = _loop_round(ws)
    r = loop.plan()
    loop.approve(r.index, by="ana")
    loop.run_round(r.index)
    at = page("loop").run()
    assert not at.exception, at.exception
    assert "Check the judge" in [s.value for s in at.subheader]
    first = judge_check(loop).next
    body = texts(at)
    assert first.question in body and first.criterion in body
    assert {"Meets it", "Does not", "Skip"} <= {b.label for b in at.button}
    at.button(key="lp-judge-yes").click().run()  # no name: refused, nothing kept
    assert not at.exception and any("name of the person" in e.value for e in at.error)
    assert read_ratings(loop) == {}
    at.text_input(key="lp-judge-by").input("ana")
    at.button(key="lp-judge-yes").click().run()
    assert not at.exception, at.exception
    second = judge_check(loop).next
    assert second.key != first.key and second.criterion in texts(at)
    at.button(key="lp-judge-no").click().run()  # the name is remembered
    assert not at.exception, at.exception
    rated = read_ratings(loop)
    assert {k: (x.verdict, x.by) for k, x in rated.items()} == {
        first.key: (True, "ana"), second.key: (False, "ana")}
    assert at.session_state["rated-by"] == "ana"
    body = texts(at)
    assert "2 of " in body and "over **2** rated items" in body
    (table,) = [t.value for t in at.table]
    assert list(table.columns) == ["person: met", "person: not met"]
    assert table.to_numpy().sum() == 2
    def row(item):
        return "judge: met" if item.judge_met else "judge: not met"

    assert table.loc[row(first), "person: met"] >= 1  # the judge's verdicts, as they were
    assert table.loc[row(second), "person: not met"] >= 1
    assert any("Reading: not yet measured: 2 of 20" in i.value for i in at.info)
    assert "not measured: 2 of 20" in body and "FLAGGED" not in body
    guard = next(g for g in loop.round(1).guards if g.guard.kind == "judge_agreement")
    assert guard.detail.startswith("not measured: 2 of 20")  # the round's guard refreshed


def test_distill_page_checks_the_verifier_with_a_person(ws):
    """Check the verifier of a distillation run (a verifier that answers D to everything,
    its disagreements flagged): the text, question, options and keyed answer shown without
    its verdict; two ratings kept in distill/verifier_ratings.jsonl and kappa shown."""
    from workbench.distill.config import AgentModel, DistillConfig
    from workbench.distill.pipeline import run_distill
    from workbench.distill.verifier_check import verifier_check
    from workbench.evaluate.agreement import read_ratings

    run = ws / "runs" / "vrun"
    run_distill(DistillConfig(
        mode="single", max_sections=10, benchmark_fraction=0.3, corpus="datasets/rf",
        domain="rf", verifier={"method": "generate", "on_disagree": "flag"},
        models={"verifier": {"spec": "fake", "options": {"name": "always-d",
                                                         "responses": ["D"]}}}),
        run / "distill", default_model=AgentModel(
            spec="fake", options={"script": "fake_teacher:reply"}), seed=3)
    at = page("distill").run()
    assert not at.exception, at.exception
    assert "Check the verifier" in [s.value for s in at.subheader]
    first = verifier_check(run).check.next
    shown = {s.label: s.text for s in first.shown}
    assert {"text", "question", "options", "keyed answer"} <= set(shown)
    assert all(t in [x.value for x in at.text] for t in shown.values())
    assert {"Correct", "Not correct", "Skip"} <= {b.label for b in at.button}
    at.text_input(key="d-vc-by").input("bo")
    at.button(key="d-vc-skip").click().run()  # a skip is kept and the next item shown
    assert not at.exception, at.exception
    second = verifier_check(run).check.next
    at.button(key="d-vc-yes").click().run()
    assert not at.exception, at.exception
    third = verifier_check(run).check.next
    at.button(key="d-vc-no").click().run()
    assert not at.exception, at.exception
    rated = read_ratings(run / "distill" / "verifier_ratings.jsonl")
    assert {k: (x.verdict, x.by) for k, x in rated.items()} == {
        first.key: (None, "bo"), second.key: (True, "bo"), third.key: (False, "bo")}
    done, size = verifier_check(run).check.progress
    body = texts(at)
    assert done == 2 and f"2 of {size} sampled decisions rated" in body
    assert "over **2** rated items" in body
    (table,) = [t.value for t in at.table]
    assert list(table.index) == ["verifier: correct", "verifier: not correct"]
    assert table.to_numpy().sum() == 2
    assert any("Reading: not yet measured: 2 of 20" in i.value for i in at.info)
