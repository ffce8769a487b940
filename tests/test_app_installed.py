"""The app ships inside the package: a wheel of the checkout, installed (not editable) into a
fresh virtual environment that sees the dependencies but not the checkout, serves `workbench
app` from a folder outside the checkout, and every page of the installed app renders."""

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
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


def _build_wheel(dest: Path) -> Path:
    """A wheel of the checkout's tracked and new (not ignored) files, built from a copy so
    that no build/ or egg-info folder lands in the checkout (no build isolation: offline)."""
    src = dest / "src"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True, check=True, timeout=60).stdout
    for rel in filter(None, listed.split("\0")):
        if not (rel.startswith("workbench/") or rel in ("pyproject.toml", "README.md")):
            continue
        f = REPO / rel
        if f.is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, src / rel)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--no-index", "-q", "-w", str(dest / "dist"), str(src)],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (wheel,) = (dest / "dist").glob("domain_agent_workbench-*.whl")
    return wheel


def _venv_with(wheel: Path, venv: Path) -> Path:
    """A fresh venv holding the wheel; the project venv's site-packages folder is added
    after its own by a .pth line, which adds the folder only: the .pth files in it (the
    editable install's finder among them) are not run, so the checkout stays out of sight."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    py = venv / "bin" / "python"
    # installed before the dependencies are visible: pip sees no other workbench to replace
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                        "--no-deps", "--no-index", str(wheel)],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(py), "-c", purelib], check=True, capture_output=True,
                               text=True, timeout=60).stdout.strip())
    paths = sysconfig.get_paths()  # this (the project's) environment
    deps = dict.fromkeys([paths["purelib"], paths["platlib"]])
    (site / "zz_project_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    return py


def _env(venv: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(PATH=str(venv / "bin") + os.pathsep + env.get("PATH", ""), VIRTUAL_ENV=str(venv),
               TQDM_DISABLE="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def test_the_app_runs_from_an_installed_wheel(server_process, tmp_path):
    """Wheel -> fresh venv -> `workbench app` from outside the checkout: the health endpoint
    answers, and every page of the installed app renders with no exception and no error box
    (AppTest in the new venv); the installed pages are the checkout's pages."""
    from workbench.app.common import navigation_pages

    t0 = time.perf_counter()
    wheel = _build_wheel(tmp_path / "wheel")
    venv = tmp_path / "venv"
    py = _venv_with(wheel, venv)
    env = _env(venv)
    away = tmp_path / "elsewhere"  # the cwd of every command: not the checkout
    away.mkdir()

    # the workbench this venv imports is the installed one, never the checkout
    show = ("import workbench, workbench.app; "
            "print(workbench.__file__, workbench.app.__file__, sep=chr(10))")
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
    assert "workbench app on http://127.0.0.1" in log, log[-3000:]
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
    print(f"wheel + venv {t1 - t0:.0f} s, app served {t2 - t1:.0f} s, "
          f"{len(out['pages'])} pages rendered {time.perf_counter() - t2:.0f} s")
