"""The Domain agents page checks a KGV evaluation's verdicts with a person ("Check the
verdicts", through the app's shared rating panel): the claim and the passages a verdict cites
shown without the verdict, a name required, ratings kept in agent/verdict_ratings.jsonl as the
CLI keeps them, kappa, the confusion table and the reading shown as they stand."""

import json
import sys
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(Path(__file__).parent))
from kgv_scripted import make_kg, write_config

APP = REPO / "workbench" / "app"


@pytest.fixture()
def ws(tmp_path, monkeypatch):
    monkeypatch.setenv("WB_WORKSPACE", str(tmp_path / "ws"))
    return tmp_path / "ws"


def page():
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(str(APP / "views" / "agents.py"), default_timeout=300)


def texts(at) -> str:
    return "\n".join(e.value for kind in ("markdown", "caption", "text", "subheader", "title")
                     for e in getattr(at, kind))


def _kgv_run(ws: Path, tmp_path: Path, embedder) -> Path:
    """A finished KGV evaluation in the workspace's runs/ (a scripted verifier over a prebuilt
    index: 4 SUPPORTED and 4 REFUTED verdicts citing its passages)."""
    from workbench.config import load_config
    from workbench.runs import RunContext, RunLayout, run_pipeline

    data, index = make_kg(tmp_path / "kg", embedder)
    conf = write_config(tmp_path / "kgi.yaml", data=data, out=ws / "runs", name="kgv")
    cfg = load_config(conf, [f"agent.index={json.dumps(str(index))}"])
    run_pipeline("agent", cfg, RunContext(layout=RunLayout.of(cfg), log=lambda m: None))
    return ws / "runs" / "kgv"


def test_agents_page_checks_the_verdicts_with_a_person(ws, tmp_path, embedder):
    from workbench.agent_packs.kgv.verdict_check import RATINGS, verdict_check
    from workbench.evaluate.agreement import read_ratings

    run = _kgv_run(ws, tmp_path, embedder)
    at = page().run()
    assert not at.exception, at.exception
    assert "Check the verdicts" in [s.value for s in at.subheader]
    body = texts(at)
    assert "Evidence searched: prebuilt index " in body  # the report names its evidence
    assert at.selectbox(key="ag-vc-cond").options == ["agent", "rag"]
    first = verdict_check(run).check.next
    shown = {s.label: s.text for s in first.shown}
    assert list(shown) == ["claim", "evidence cited"] and "[chk-" in shown["evidence cited"]
    assert all(t in [x.value for x in at.text] for t in shown.values())
    assert {"True", "False", "Skip"} <= {b.label for b in at.button}
    at.button(key="ag-vc-yes").click().run()  # no name: refused, nothing kept
    assert not at.exception and any("name of the person" in e.value for e in at.error)
    assert read_ratings(run / "agent" / RATINGS) == {}
    at.text_input(key="ag-vc-by").input("bo")
    at.button(key="ag-vc-skip").click().run()  # a skip is kept and the next item shown
    assert not at.exception, at.exception
    second = verdict_check(run).check.next
    assert second.key != first.key and second.shown[0].text in [x.value for x in at.text]
    at.button(key="ag-vc-yes").click().run()
    assert not at.exception, at.exception
    third = verdict_check(run).check.next
    at.button(key="ag-vc-no").click().run()  # the name is remembered
    assert not at.exception, at.exception
    rated = read_ratings(run / "agent" / RATINGS)
    assert {k: (x.verdict, x.by) for k, x in rated.items()} == {
        first.key: (None, "bo"), second.key: (True, "bo"), third.key: (False, "bo")}
    done, size = verdict_check(run).check.progress
    body = texts(at)
    assert done == 2 and f"2 of {size} sampled decisions rated" in body
    assert "over **2** rated items" in body
    (table,) = [t.value for t in at.table]
    assert list(table.index) == ["agent: SUPPORTED", "agent: REFUTED"]
    assert list(table.columns) == ["person: SUPPORTED", "person: REFUTED"]
    assert table.to_numpy().sum() == 2

    def row(item):  # the agent's verdicts, as they were
        return "agent: SUPPORTED" if item.machine else "agent: REFUTED"

    assert table.loc[row(second), "person: SUPPORTED"] >= 1
    assert table.loc[row(third), "person: REFUTED"] >= 1
    assert any("Reading: not yet measured: 2 of 20" in i.value for i in at.info)
    # the baseline's verdicts are a separate check: nothing of them rated yet
    at.selectbox(key="ag-vc-cond").select("rag").run()
    assert not at.exception, at.exception
    assert "0 of " in texts(at) and "rag verdicts of" in texts(at)


def test_agents_page_runs_kgv_on_an_index_of_the_workspace(ws, tmp_path, embedder,
                                                            monkeypatch):
    """The Run and Evaluate forms offer the workspace's indexes as KGV evidence; a run on one
    searches it and cites its passages."""
    make_kg(ws / "runs" / "kb", embedder)  # its index lies where a run's index lies
    monkeypatch.setenv("WB_APP_MODEL", "fake")
    monkeypatch.setenv("WB_APP_MODEL_SCRIPT", "kgv_scripted:verifier")
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    at = page().run()
    assert not at.exception, at.exception
    own = "the data folder's entries"
    for key in ("ag-run-index", "ag-eval-index"):
        assert at.selectbox(key=key).options == [own, "kb (index)"]
    at.selectbox(key="ag-run-index").select("kb (index)")
    at.selectbox(key="ag-run-retriever").select("keyword")
    at.selectbox(key="ag-policy").select("free")
    at.text_input(key="ag-input").input("the mixer is driven by the local oscillator")
    at = next(b for b in at.button if b.label == "Run").click().run()
    assert not at.exception, at.exception
    body = texts(at)
    assert f"Evidence searched: prebuilt index {ws / 'runs' / 'kb' / 'index'}" in body, body
    steps = json.dumps(at.session_state["ag-traj"])
    assert "chk-" in steps and "SUPPORTED" in steps
