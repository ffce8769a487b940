"""The Streamlit app: every page renders (AppTest), uploads are checked, a job started from
the app runs with a scripted model, and the security settings hold."""

import os
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import REPO

APP = REPO / "apps" / "streamlit"
PAGES = ["projects", "corpus", "distill", "retrieval", "train", "evaluate"]
TESTS = str(Path(__file__).parent)
sys.path.insert(0, str(APP))


@pytest.fixture()
def ws(tmp_path, monkeypatch):
    monkeypatch.setenv("WB_WORKSPACE", str(tmp_path / "ws"))
    monkeypatch.setenv("WB_APP_MODEL", "fake")
    monkeypatch.setenv("WB_APP_MODEL_SCRIPT", "fake_teacher:reply")
    monkeypatch.setenv("PYTHONPATH", TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return tmp_path / "ws"


def page(name):
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(str(APP / "pages" / f"{name}.py"), default_timeout=60)


@pytest.mark.parametrize("name", PAGES)
def test_every_page_renders_without_exception(ws, name):
    at = page(name).run()
    assert not at.exception, at.exception


def test_navigation_app_renders(ws):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP / "app.py"), default_timeout=60).run()
    assert not at.exception


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
    at.button[0].click().run()  # the form's submit button
    assert not at.exception
    jobs = list_jobs(w)
    assert len(jobs) == 1 and jobs[0].kind == "distill"
    job = wait_job(jobs[0], timeout=300)
    assert job.status == "completed", job.log_text()
    at = page("distill").run()
    assert not at.exception
    assert any("accepted" in m.value for m in at.markdown)
    at.button(key=next(b.key for b in at.button if b.key and b.key.startswith("rej-"))).click()
    at.run()
    assert (w / "runs" / "app-run" / "distill" / "review.jsonl").exists()


def test_streamlit_config_is_secure():
    cfg = tomllib.loads((APP / ".streamlit" / "config.toml").read_text())
    s = cfg["server"]
    assert s["enableXsrfProtection"] is True and s["enableCORS"] is True
    assert s["headless"] is True and s["address"] == "127.0.0.1"
    assert s["maxUploadSize"] <= 20
    src = (REPO / "workbench" / "cli" / "main.py").read_text()
    assert '"--server.enableXsrfProtection", "true"' in src
