"""The app's flow as a person meets it (issue 46 item 5): its forms start jobs with the demo
config's settings, pages say where they are (workspace, glossary), state survives a page
change, a reload or a stopped answer. Fast tier: AppTest with a scripted model; no job runs
here (start_job is recorded, not launched)."""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO

APP = REPO / "workbench" / "app"
TESTS = str(Path(__file__).parent)
DEMO = yaml.safe_load((REPO / "configs" / "rf_demo.yaml").read_text())


@pytest.fixture()
def ws(tmp_path, monkeypatch):
    monkeypatch.setenv("WB_WORKSPACE", str(tmp_path / "ws"))
    monkeypatch.setenv("WB_APP_MODEL", "fake")
    monkeypatch.setenv("WB_APP_MODEL_SCRIPT", "fake_teacher:reply")
    monkeypatch.setenv("PYTHONPATH", TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return tmp_path / "ws"


@pytest.fixture()
def started(monkeypatch):
    """The (kind, config) of every job a page starts; nothing is launched."""
    import workbench.jobs

    seen: list[tuple[str, dict]] = []

    def fake_start(ws, kind, config, **_kw):
        from workbench.config import experiment_config_model

        experiment_config_model().model_validate(config)
        seen.append((kind, config))
        return SimpleNamespace(id=f"job-{len(seen)}")

    monkeypatch.setattr(workbench.jobs, "start_job", fake_start)
    return seen


def page(name):
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(str(APP / "views" / f"{name}.py"), default_timeout=120)


def with_corpus(ws):
    from workbench.workspace import open_workspace, save_upload

    w = open_workspace(ws)
    for f in sorted((REPO / "datasets" / "rf").glob("0[12]_*.md")):
        save_upload(w, f.name, f.read_bytes())
    return w


# what a form asks (so it may differ from the demo), and what sizes the demo
ASKED = {"perspectives", "kinds", "mode", "answer_source", "max_steps", "eval_items"}
DEMO_ONLY = {"max_train_tasks"}  # the demo writes questions for 32 tasks: a form for all


def same_as_demo(section: str, asked: dict) -> None:
    for key, value in DEMO[section].items():
        if key not in ASKED | DEMO_ONLY:
            assert asked.get(key) == value, (section, key, asked.get(key), value)


def test_the_distill_form_distils_with_the_demo_settings(ws, started, monkeypatch):
    """The Distill form's job: every distill key the demo config sets is set alike (the
    grammar on: a trial without it ran ~30 min for 1 sample), and the bundled model runs at
    the demo's batch size."""
    with_corpus(ws)
    at = page("distill").run()
    at.button(key="d-start").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    (kind, cfg), = started
    assert kind == "distill" and cfg["distill"]["constrained"] == "auto"
    same_as_demo("distill", cfg["distill"])
    monkeypatch.delenv("WB_APP_MODEL")  # the bundled model, as a person's app has it
    at = page("distill").run()
    at.button(key="d-start").click().run()
    assert started[-1][1]["models"]["chat"] == DEMO["models"]["chat"]


def test_the_comparison_form_runs_as_the_demo_does(ws, started):
    with_corpus(ws)
    at = page("evaluate").run()
    at.button(key="e-start").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    (kind, cfg), = started
    assert kind == "compare"
    for section in ("distill", "eval", "rag", "train", "compare"):
        same_as_demo(section, cfg[section])


# --- a glossary line for every term a page uses ------------------------------------------------

PAGES = ["projects", "jobs", "corpus", "distill", "retrieval", "train", "evaluate",
         "trajsynth", "federated", "agents", "loop", "chat"]


def terms_used(source: str) -> set[str]:
    """The glossary's terms that a page's strings use (any case; a lower-case term also as
    the start of a word: "guards", "Canaries")."""
    import io
    import re
    import tokenize

    from workbench.app.glossary import GLOSSARY

    text = "\n".join(t.string for t in tokenize.generate_tokens(io.StringIO(source).readline)
                     if t.type == tokenize.STRING)
    return {t for t in GLOSSARY if re.search(
        r"(?<![A-Za-z0-9_])" + re.escape(t) + ("" if t.islower() else r"(?![A-Za-z0-9_])"),
        text, re.IGNORECASE)}


@pytest.mark.parametrize("name", PAGES)
def test_every_term_a_page_uses_is_explained_on_it(ws, name):
    """QTSA, MCF/CF, Holm, nDCG, FFA-LoRA, MCTS, ...: the page's "Terms on this page" gives
    one line for each term its text uses."""
    from workbench.app.glossary import GLOSSARY

    at = page(name).run()
    assert not at.exception, at.exception
    (box,) = [e for e in at.expander if e.label == "Terms on this page"]
    shown = "\n".join(m.value for m in box.markdown)
    for term in terms_used((APP / "views" / f"{name}.py").read_text()):
        assert f"**{term}**: {GLOSSARY[term]}" in shown, (name, term)


def test_every_page_says_what_the_bundled_model_is_and_has_the_glossary(ws):
    from streamlit.testing.v1 import AppTest

    from workbench.app.glossary import GLOSSARY

    at = AppTest.from_file(str(APP / "app.py"), default_timeout=60).run()
    assert not at.exception
    assert any("135M-parameter demonstration model" in c.value for c in at.sidebar.caption)
    (box,) = [e for e in at.sidebar.expander if e.label == "Glossary"]
    shown = "\n".join(m.value for m in box.markdown)
    for term in ("QTSA", "MCF", "CF", "Holm", "nDCG", "FFA-LoRA", "MCTS"):
        assert f"**{term}**: {GLOSSARY[term]}" in shown


# --- the improvement loop is not the health domain's alone -------------------------------------

def test_the_loop_form_starts_the_picked_domain(ws, started):
    """The domain pack is picked among those that declare the loop's settings, with its data
    folder; the page names no domain itself (it hard-coded health)."""
    from workbench.domain_packs import available_packs, load_pack

    assert "health" not in (APP / "views" / "loop.py").read_text()
    at = page("loop").run()
    packs = [p for p in available_packs() if "loop" in load_pack(p).pipelines]
    assert at.selectbox(key="lp-pack").options == packs
    at.text_input(key="lp-data").set_value("datasets/mine")
    next(b for b in at.button if b.label == "Start").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    (kind, cfg), = started
    assert kind == "loop" and cfg["domain"] == cfg["loop"]["pack"] == packs[0]
    assert cfg["name"] == f"{packs[0]}_loop" and cfg["loop"]["suites"]["data"] == "datasets/mine"


def test_nothing_the_app_shows_is_fetched_from_the_internet_and_offline_reads_right(
        ws, monkeypatch):
    """The favicon is drawn by the page (a :material/...: icon was fetched from
    fonts.gstatic.com); the app is shown at localhost, where Streamlit's lost-connection
    message asks whether the app still runs, not whether the machine is online."""
    import tomllib

    import streamlit as st
    from streamlit.commands.page_config import _get_favicon_string
    from streamlit.testing.v1 import AppTest

    seen = {}
    real = st.set_page_config
    monkeypatch.setattr(st, "set_page_config", lambda **kw: (seen.update(kw), real(**kw)))
    at = AppTest.from_file(str(APP / "app.py"), default_timeout=60).run()
    assert not at.exception
    assert _get_favicon_string(seen["page_icon"]).startswith("emoji:")
    for cfg in (APP / ".streamlit" / "config.toml",
                REPO / "apps" / "streamlit" / ".streamlit" / "config.toml"):
        assert tomllib.loads(cfg.read_text())["browser"]["serverAddress"] == "localhost"


# --- the open workspace: named on every page, kept in the address ------------------------------

@pytest.fixture()
def rooted(tmp_path, monkeypatch):
    from workbench.workspace import open_workspace

    root = tmp_path / "root"
    for name in ("ws", "other"):
        open_workspace(root / name)
    monkeypatch.setenv("WB_ROOT", str(root))
    monkeypatch.setenv("WB_WORKSPACE", str(root / "ws"))
    monkeypatch.setenv("WB_APP_MODEL", "fake")
    monkeypatch.setenv("WB_APP_MODEL_SCRIPT", "fake_teacher:reply")
    return root


def app_test():
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(str(APP / "app.py"), default_timeout=120)


def sidebar_says(at) -> str:
    return "\n".join(m.value for m in at.sidebar.markdown)


def test_the_open_workspace_is_named_on_every_page_and_kept_in_the_address(rooted):
    """Before, a reload reopened the start workspace and no page said which was open."""
    at = app_test().run()
    assert at.query_params["ws"] == "ws" and "Workspace **`ws`**" in sidebar_says(at)
    at.text_input(key="ws-path").set_value("other")
    at.button(key="ws-open").click().run()
    assert not at.exception and "Workspace **`other`**" in sidebar_says(at)
    assert at.query_params["ws"] == "other"
    at.switch_page(str(APP / "views" / "distill.py")).run()  # another page: still named
    assert not at.exception and "Workspace **`other`**" in sidebar_says(at)
    # a reload: a new session whose address names the workspace
    again = app_test()
    again.query_params["ws"] = "other"
    again.run()
    assert not again.exception and again.session_state.workspace == str(rooted / "other")
    assert "Workspace **`other`**" in sidebar_says(again)


@pytest.mark.parametrize("given", ["../elsewhere", "missing", "/etc"])
def test_an_address_naming_no_workspace_opens_the_start_one_and_says_so(rooted, given):
    at = app_test()
    at.query_params["ws"] = given
    at.run()
    assert not at.exception and at.session_state.workspace == str(rooted / "ws")
    assert any(given in w.value for w in at.warning)
    assert not (rooted / "missing").exists()  # nothing is made from an address


# --- what a person filled in outlives a visit to another page ---------------------------------

def test_the_distill_form_and_the_chat_outlive_a_visit_to_another_page(rooted):
    """Before, the Distill form came back at its defaults and the Chat with a new, empty
    conversation (its setups were reset, so the conversation was another's)."""
    at = app_test().run()
    at.switch_page(str(APP / "views" / "distill.py")).run()
    at.text_input(key="d-name").set_value("trial")
    at.radio(key="d-mode").set_value("single")
    at.multiselect(key="d-kinds").set_value(["mc"])
    at.number_input(key="d-max").set_value(6).run()
    at.switch_page(str(APP / "views" / "chat.py")).run()
    at.slider(key="c-temp").set_value(0.5)
    at.number_input(key="c-max").set_value(64).run()
    at.chat_input(key="c-ask").set_value("What is a quarter-wave transformer?").run()
    assert not at.exception, at.exception
    answered = [m.value for m in at.markdown if m.value.startswith("**Setup 1")]
    assert answered
    at.switch_page(str(APP / "views" / "corpus.py")).run()
    at.switch_page(str(APP / "views" / "distill.py")).run()
    assert not at.exception
    assert at.text_input(key="d-name").value == "trial" and at.radio(key="d-mode").value == \
        "single"
    assert at.multiselect(key="d-kinds").value == ["mc"] and at.number_input(
        key="d-max").value == 6
    at.switch_page(str(APP / "views" / "chat.py")).run()
    assert not at.exception
    assert at.slider(key="c-temp").value == 0.5 and at.number_input(key="c-max").value == 64
    assert "What is a quarter-wave transformer?" in [m.value for m in at.markdown]
    assert [m.value for m in at.markdown if m.value.startswith("**Setup 1")] == answered


# --- Stop keeps the question and what was written ----------------------------------------------

def slow_chat(conv) -> str:
    """The scripted model, 4 s an answer: time to press Chat's Stop in a browser
    (tests/test_e2e_browser.py)."""
    import time

    from fake_teacher import reply

    time.sleep(4)
    return reply(conv)


def test_a_stopped_answer_keeps_its_question_and_text_marked_stopped(rooted):
    """Stop reruns the page; Streamlit starts the new run while the old one still writes, so
    before, the question and its partial answer vanished (kept only after the page was
    drawn). Here the old run is a thread that keeps its answer a moment later: the new run
    tells it to stop, waits for it, and shows both, marked stopped."""
    import threading
    import time

    from workbench.chat import Answer

    at = page("chat").run()
    at.chat_input(key="c-ask").set_value("first question").run()
    assert not at.exception
    session = at.session_state["c-session"]
    live = SimpleNamespace(session=session, turn="t-stopped", question="second question",
                           stop=threading.Event(), texts={0: "a partial"})

    def old_run():  # the interrupted run: stops when told, then keeps what it wrote
        live.stop.wait(10)
        time.sleep(0.3)
        session.answers.append(Answer(turn="t-stopped", setup=0, label=session.setups[0].label,
                                      question="second question", prompt=[],
                                      text="a partial answer", finish="stopped"))

    worker = threading.Thread(target=old_run)
    worker.start()
    at.session_state["c-live"] = live
    at.run()
    worker.join(5)
    assert not at.exception and live.stop.is_set()
    said = [m.value for m in at.markdown]
    assert "first question" in said and "second question" in said and "a partial answer" in said
    assert any(c.value.startswith(":material/stop_circle: Stopped") for c in at.caption)


def test_forms_refuse_an_empty_choice_before_a_job_starts(ws, started):
    with_corpus(ws)
    at = page("distill").run()
    at.multiselect(key="d-kinds").set_value([])
    at.button(key="d-start").click().run()
    assert [e.value for e in at.error] == ["pick at least one perspective and one sample kind"]
    at = page("evaluate").run()
    at.multiselect(key="e-p").set_value([])
    at.button(key="e-start").click().run()
    assert [e.value for e in at.error] == ["pick at least one perspective"]
    assert started == []
