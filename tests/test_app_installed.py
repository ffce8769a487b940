"""The app ships inside the package: a wheel of the checkout, installed (not editable) into a
fresh virtual environment that sees the dependencies but not the checkout, serves `workbench
app` from a folder outside the checkout, and every page of the installed app renders."""

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

from conftest import REPO, free_port, wait_http

# AppTest inside the new environment: the installed app's navigation and each of its pages,
# on an empty workspace; prints one JSON object.
RENDER = textwrap.dedent("""
    import json
    from pathlib import Path

    import workbench
    import workbench.app
    from streamlit.testing.v1 import AppTest
    from workbench.app.common import navigation_pages

    out = {"workbench": workbench.__file__, "app": workbench.app.__file__, "pages": {}}
    app_dir = Path(workbench.app.__file__).parent
    out["config"] = (app_dir / ".streamlit" / "config.toml").is_file()
    nav = AppTest.from_file(str(app_dir / "app.py"), default_timeout=300).run()
    out["nav"] = {"exception": [str(e.value) for e in nav.exception],
                  "titles": [t.value for t in nav.title]}
    for path, *_ in navigation_pages():
        at = AppTest.from_file(str(path), default_timeout=300).run()
        out["pages"][path.stem] = {
            "file": str(path), "exception": [str(e.value) for e in at.exception],
            "error": [e.value for e in at.error], "titles": [t.value for t in at.title]}
    print("RESULT " + json.dumps(out))
""")


def test_the_app_runs_from_an_installed_wheel(server_process, installed_workbench, tmp_path):
    """Wheel -> fresh venv -> `workbench app` from outside the checkout: the health endpoint
    answers, and every page of the installed app renders with no exception and no error box
    (AppTest in the new venv); the installed pages are the checkout's pages."""
    from workbench.app.common import navigation_pages

    t0 = time.perf_counter()
    venv, py, env = installed_workbench.venv, installed_workbench.python, installed_workbench.env
    away = tmp_path / "elsewhere"  # the cwd of every command: not the checkout
    away.mkdir()

    # the workbench this venv imports is the installed one, never the checkout, and the
    # sample data environments and the sandbox child came with it (the child runs from there)
    show = ("import workbench, workbench.app; from workbench.dataenv import sample_environment;"
            " from workbench.dataenv.sandbox import CHILD, run_python;"
            " r = run_python('result = sum(range(5))'); assert r.result == 10, r;"
            " print(workbench.__file__, workbench.app.__file__, CHILD, *(sample_environment(n)"
            " for n in ('chinook', 'sklearn_classic')), sep=chr(10))")
    where = subprocess.run([str(py), "-c", show], cwd=away, env=env, capture_output=True,
                           text=True, timeout=120, check=False)
    assert where.returncode == 0, where.stderr[-2000:]
    for f in where.stdout.splitlines():
        assert Path(f).resolve().is_relative_to(venv.resolve()), where.stdout
        assert not Path(f).resolve().is_relative_to(REPO), where.stdout
    t1 = time.perf_counter()

    # `workbench app` (the venv's console script) over a workspace outside the checkout
    ws, port = tmp_path / "root" / "ws", free_port()
    proc = subprocess.Popen([str(venv / "bin" / "workbench"), "app", "--workspace", str(ws),
                             "--port", str(port)], cwd=away, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        try:
            wait_http(f"http://127.0.0.1:{port}/_stcore/health", timeout=120, proc=proc)
        except (RuntimeError, TimeoutError) as e:
            os.killpg(proc.pid, signal.SIGTERM)
            raise AssertionError(f"{e}: {proc.communicate(timeout=30)[0][-3000:]}") from None
        import httpx

        home = httpx.get(f"http://127.0.0.1:{port}/distill", timeout=10)
        assert home.status_code == 200 and "<html" in home.text.lower()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        log = proc.communicate(timeout=30)[0]
    assert "workbench app on http://localhost" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    t2 = time.perf_counter()

    # every page of the installed app renders
    script = tmp_path / "render.py"
    script.write_text(RENDER)
    r = subprocess.run([str(py), str(script)], cwd=away, capture_output=True, text=True,
                       env=dict(env, WB_WORKSPACE=str(ws)), timeout=900, check=False)
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert Path(out["app"]).resolve().is_relative_to(venv.resolve()), out["app"]
    assert out["config"], "the app's .streamlit/config.toml is not in the wheel"
    assert out["nav"] == {"exception": [], "titles": ["Projects and runs"]}, out["nav"]
    assert list(out["pages"]) == [p.stem for p, *_ in navigation_pages()]
    for stem, page in out["pages"].items():
        assert Path(page["file"]).resolve().is_relative_to(venv.resolve()), page
        assert not page["exception"] and not page["error"], (stem, page)
        assert len(page["titles"]) == 1, (stem, page)
    print(f"wheel + venv (once a session) {t1 - t0:.0f} s, app served {t2 - t1:.0f} s, "
          f"{len(out['pages'])} pages rendered {time.perf_counter() - t2:.0f} s")
