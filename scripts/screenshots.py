"""Screenshots of every page of the app, each over a finished run of its pipeline.

    .venv/bin/python scripts/screenshots.py                      # build a workspace, shoot
    .venv/bin/python scripts/screenshots.py --workspace /tmp/wb-shots/ws   # reuse one
    .venv/bin/python scripts/screenshots.py --only chat --only jobs        # some pages

The workspace is made cheaply and offline with the test suite's own helpers (tests/): the
tiny compare run (a scripted teacher distils, a tiny random-init Llama is the student), a
trajectory search over six Chinook tasks, a federated LoRA run and a knowledge-track run, a
KGV and a literature-search agent evaluation (scripted or no model), an improvement-loop
round waiting for its decision (scripted model and trainer), the RF corpus, and two
distillation jobs, one stopped and one finished. A real `workbench compare run
configs/rf_demo.yaml` output given with --real-run (default /tmp/cold13/run, used only if
it is there) is copied in as `rf_demo`, and the compare, evaluate, train, distill, retrieval
and chat pages show it.

The app runs with the scripted base model (WB_APP_MODEL=fake, WB_APP_MODEL_SCRIPT=
fake_teacher:reply, PYTHONPATH=tests), so the chat page's "base" answer is the script's.
Each page is opened by its address in headless Chromium at 1400 px wide, a page's own
action is done where it has one (a query, a chat question, a tab), and the whole page is
saved as docs/screenshots/<page>.png (palette PNG, to keep the folder small).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
sys.path[:0] = [str(TESTS)]
os.environ.setdefault("TQDM_DISABLE", "1")

import conftest  # noqa: E402 - the tests' helpers (tests/ is on sys.path above)

OUT = REPO / "docs" / "screenshots"
REAL_RUN = Path("/tmp/cold13/run")
WIDTH, MAX_HEIGHT = 1400, 9000
APP_ENV = {"WB_APP_MODEL": "fake", "WB_APP_MODEL_SCRIPT": "fake_teacher:reply",
           "PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def log(msg: str) -> None:
    print(f"[screenshots {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- the workspace ------------------------------------------------------------------------------

class Scratch:
    """Stands in for pytest's `tmp_path_factory`: each `mktemp(name)` is a folder next to the
    workspace holding `ws`, a link to it, so every helper's run lands in the one workspace
    (the helpers open `mktemp(name) / "ws"`, which resolves to it)."""

    def __init__(self, ws: Path):
        self.ws, self.root = ws, ws.parent / "build"

    def mktemp(self, name: str) -> Path:
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        if not (d / "ws").exists():
            (d / "ws").symlink_to(self.ws, target_is_directory=True)
        return d


def fixture(f):
    """The plain function under a pytest fixture (pytest 9 wraps it)."""
    get = getattr(f, "_get_wrapped_function", None)
    return get() if get else getattr(f, "__wrapped__", f)


def build(ws: Path, real_run: Path | None) -> None:
    """Every finished run the pages show; what the workspace already holds is kept."""
    from workbench.workspace import open_workspace

    ws = open_workspace(ws)
    runs, scratch = ws / "runs", Scratch(ws)
    if not any((ws / "corpus").iterdir()):
        log("corpus: the RF chapters")
        for f in sorted((REPO / "datasets" / "rf").glob("[0-9]*.md")):
            shutil.copy(f, ws / "corpus" / f.name)
    tiny = scratch.root / "tiny" / "tiny-llama"
    if not (tiny / "config.json").exists():
        log("a tiny random-init Llama")
        shutil.rmtree(tiny, ignore_errors=True)
        fixture(conftest.tiny_model)(scratch)
    if not (runs / "tiny" / "report.json").exists():
        log("compare run 'tiny' (scripted teacher, tiny student)")
        fixture(conftest.compare_run)(scratch, str(tiny))
    if real_run is not None and real_run.is_dir() and not (runs / "rf_demo").exists():
        log(f"copying the real run {real_run} as rf_demo")
        shutil.copytree(real_run, runs / "rf_demo")
    if not (runs / "ts" / "trajsynth" / "explore.json").exists():
        log("trajectory search 'ts' (6 Chinook tasks)")
        conftest.small_trajsynth_run(runs / "ts" / "trajsynth")
    if not (runs / "fedrun" / "fed" / "report.json").exists():
        log("federated LoRA run 'fedrun'")
        fixture(conftest.federated_run)(scratch, str(tiny))
    if not (runs / "krun" / "fed" / "report.json").exists():
        log("federated knowledge run 'krun'")
        fixture(conftest.knowledge_run)(scratch)
    agents(runs)
    if not loop_ready(runs / "looprun"):
        log("improvement loop 'looprun': round 1 up to its decision")
        from test_app import _loop_round

        shutil.rmtree(runs / "looprun", ignore_errors=True)  # a round cut short: anew
        loop = _loop_round(ws)
        r = loop.plan()
        loop.approve(r.index, by="ana")
        loop.run_round(r.index)
    jobs(ws)


def loop_ready(run: Path) -> bool:
    """Whether the loop run's last round got as far as its decision."""
    if not (run / "loop" / "config.yaml").exists():
        return False
    from workbench.loop.api import Loop

    try:
        rounds = Loop.at(run, log=lambda m: None).rounds()
    except Exception:  # noqa: BLE001 - an unreadable loop is made again
        return False
    return bool(rounds) and rounds[-1].status in ("awaiting_decision", "decided")


def agents(runs: Path) -> None:
    """A KGV evaluation (scripted model, 4 claims) and a literature-search one (no model),
    as tests/test_app.py makes them."""
    from workbench.config import load_config
    from workbench.runs import RunContext, RunLayout, run_pipeline

    todo = {"kgvrun": ["models.chat.spec=fake", "agent.dev_limit=4", "agent.chunk=4",
                       "agent.conditions=[closed_book,rag,agent]"],
            "lsrun": ["agent.pack=litsearch", f"agent.data={REPO / 'datasets' / 'litsearch'}",
                      "agent.turns=2", "agent.dev_limit=4",
                      "agent.conditions=[query_only,fixed,oracle]"]}
    for name, settings in todo.items():
        if any((runs / name / "agent").glob("*report.json")):
            continue
        log(f"agent evaluation '{name}'")
        cfg = load_config(None, [*settings, f"output_dir={runs}", f"name={name}"])
        run_pipeline("agent", cfg, RunContext(layout=RunLayout.of(cfg), log=lambda m: None))


def jobs(ws: Path) -> None:
    """Two distillation jobs of the scripted teacher (tests/test_task_centre.py): one run to
    the end, then one stopped once its progress moved (the newest: the Distill page's job
    panel shows it, stopped)."""
    from test_task_centre import _counted_progress, cfg

    from workbench.jobs import list_jobs, load_job, start_job, stop_job, wait_job

    have = {j.status for j in list_jobs(ws)}
    os.environ.update(PYTHONPATH=APP_ENV["PYTHONPATH"], WB_PROGRESS_FILE_SECONDS="0.5")
    if "completed" not in have:
        log("distillation job, run to the end")
        done = wait_job(start_job(ws, "distill", cfg(ws, name="distill-done")), timeout=600)
        if done.status != "completed":
            raise SystemExit(f"the distillation job ended {done.status}: "
                             f"{done.log_text()[-2000:]}")
    if "stopped" not in have:
        log("distillation job, stopped midway")
        marker = ws.parent / "build" / "slow"  # the scripted teacher is slow while it exists
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("")
        os.environ["WB_TEST_PACE"] = str(marker)
        try:
            job = start_job(ws, "distill", cfg(ws, name="distill-stopped"))
            _counted_progress(job, timeout=180)  # its progress has moved: stop it there
            stop_job(load_job(job.folder))
            wait_job(job, timeout=60)
        finally:
            marker.unlink()
            del os.environ["WB_TEST_PACE"]


# --- the browser ----------------------------------------------------------------------------------

def settle(page, quiet_s: float = 1.5, timeout_s: float = 120) -> None:
    """Wait until Streamlit has stopped running the script for `quiet_s` seconds."""
    page.wait_for_timeout(600)  # a click's rerun may take a moment to begin
    deadline, quiet_since = time.time() + timeout_s, None
    while time.time() < deadline:
        busy = page.locator("[data-testid=stApp][data-test-script-state=running], "
                            "[data-testid=stSpinner], [data-testid=stSkeleton]").count()
        if busy:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.time()
        elif time.time() - quiet_since >= quiet_s:
            return
        page.wait_for_timeout(250)


def choose(page, key: str, option: str) -> None:
    """Pick `option` in the select box whose widget key is `key`."""
    box = page.locator(f".st-key-{key} [role=combobox]").first
    item = page.get_by_role("option", name=option, exact=True).first
    for _ in range(4):  # a click that lands while the page redraws opens nothing
        box.click(timeout=180000)
        try:
            item.wait_for(timeout=5000)
            break
        except Exception:  # noqa: BLE001 - try again
            page.keyboard.press("Escape")
            settle(page)
    item.click()
    page.keyboard.press("Escape")
    settle(page)


def shoot(page, path: Path) -> None:
    """The whole page: the viewport is made as tall as the app's scrolling content (a
    Streamlit page scrolls inside its own container, so a plain full-page capture stops at
    the window), then the PNG is reduced to a 256-colour palette."""
    from PIL import Image

    height = page.evaluate("""() => {
        const all = [...document.querySelectorAll('*')];
        for (const e of all) if (e.scrollTop) e.scrollTop = 0;  // back to the top
        return Math.max(document.body.scrollHeight, ...all.map(e => e.scrollHeight));
    }""")
    page.set_viewport_size({"width": WIDTH, "height": int(min(max(height, 1000), MAX_HEIGHT))})
    page.wait_for_timeout(1500)  # charts redraw at the new size
    settle(page, quiet_s=1.0)
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size({"width": WIDTH, "height": 1000})
    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def act(page, stem: str, ws: Path) -> None:
    """What a person would do first on the page, so the shot shows the page at work."""
    real = (ws / "runs" / "rf_demo").is_dir()
    if stem == "distill" and real:
        choose(page, "d-run", "rf_demo")
    elif stem == "train" and real:
        choose(page, "t-run", "rf_demo")
    elif stem == "evaluate" and real:
        choose(page, "e-runs", "rf_demo")  # a multiselect: rf_demo joins tiny ...
        drop = page.locator(".st-key-e-runs button[aria-label='Remove tiny']")
        if drop.count():  # ... which leaves (random-init student: numbers of no interest)
            drop.first.click()
            settle(page)
    elif stem == "retrieval":
        if real:
            choose(page, "r-index", "rf_demo")
            choose(page, "r-bench", "rf_demo")
        box = page.locator(".st-key-r-query input")
        box.fill("What VSWR does a reflection coefficient of 0.2 give?")
        box.press("Enter")
        settle(page)
        page.get_by_role("button", name="Compute Hit@k / MRR / nDCG").click()
        settle(page, timeout_s=600)
    elif stem == "chat":
        box = page.locator("[data-testid=stChatInputTextArea]")
        box.fill("What does a quarter-wave transformer match?")
        box.press("Enter")
        # the scripted base answers at once; the others as their models write (a tiny
        # random-init model may write nothing: no rating buttons under it)
        page.get_by_role("button", name="Good").first.wait_for(timeout=600000)
        settle(page, quiet_s=3, timeout_s=600)
    elif stem == "agents":
        page.get_by_role("tab", name="Evaluate").click()
        settle(page)
    elif stem == "federated":
        page.get_by_role("tab", name="Conditions").click()
        settle(page)
    elif stem == "jobs":
        page.get_by_text("job(s)").first.wait_for(timeout=60000)
        stopped = page.locator("[data-testid=stExpander] summary").filter(has_text="stopped")
        if stopped.count():  # its log and its "Run again" button
            stopped.first.click()
            settle(page)


def extra_shots(page, stem: str, out: Path) -> None:
    """A second view where a page's main content sits behind a tab."""
    if stem == "trajsynth":
        page.get_by_role("tab", name="Tree browser").click()
        settle(page)
        shoot(page, out / "trajsynth-tree.png")
    elif stem == "agents":
        choose(page, "ag-run", "lsrun")
        shoot(page, out / "agents-litsearch.png")
    elif stem == "federated":
        choose(page, "fed-run", "krun")
        shoot(page, out / "federated-knowledge.png")


def screenshots(ws: Path, out: Path, only: list[str]) -> list[Path]:
    from playwright.sync_api import sync_playwright
    from test_e2e_browser import _open_page, _running_app

    from workbench.app.common import navigation_pages

    out.mkdir(parents=True, exist_ok=True)
    pages = [(p.stem, default) for p, _, _, default in navigation_pages()]
    made = []
    with _running_app(ws, **APP_ENV) as (url, _), sync_playwright() as p:
        browser, page = _open_page(p, url)
        for stem, default in pages:
            if only and stem not in only:
                continue
            log(f"page {stem}")
            for attempt in (1, 2):
                page.goto(url + ("/" if default else f"/{stem}"))
                page.locator("h1").first.wait_for(timeout=60000)
                settle(page)
                try:
                    act(page, stem, ws)
                    break
                except Exception as e:  # noqa: BLE001 - e.g. a model import racing another
                    log(f"  {stem}: {type(e).__name__} ({str(e).splitlines()[0][:200]}); "
                        + ("once more" if attempt == 1 else "giving up"))
                    if attempt == 2:
                        raise
            for what in ("stException", "stAlertContentError"):
                if page.locator(f"[data-testid={what}]").count():
                    log(f"  {stem}: the page shows {what}")
            if page.get_by_text("not ready yet").count():
                log(f"  {stem}: the page says something is not ready yet")
            shoot(page, out / f"{stem}.png")
            made.append(out / f"{stem}.png")
            extra_shots(page, stem, out)
        browser.close()
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workspace", type=Path, default=None,
                    help="a workspace to reuse or fill (default: a new one under the temp "
                         "folder); runs it already holds are kept")
    ap.add_argument("--real-run", type=Path, default=REAL_RUN,
                    help="a finished `workbench compare run configs/rf_demo.yaml` folder to "
                         "copy in as rf_demo, if it exists (default %(default)s)")
    ap.add_argument("--out", type=Path, default=OUT, help="where the PNGs go")
    ap.add_argument("--only", action="append", default=[], metavar="PAGE",
                    help="only this page (its file stem: chat, jobs, ...); repeatable")
    args = ap.parse_args(argv)
    # a stop by signal still ends the app it started (the context managers run)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ws = (args.workspace or Path(tempfile.mkdtemp(prefix="wb-shots-")) / "ws").resolve()
    log(f"workspace {ws}")
    build(ws, args.real_run)
    made = screenshots(ws, args.out.resolve(), args.only)
    total = sum(f.stat().st_size for f in args.out.glob("*.png"))
    log(f"{len(made)} pages shot into {args.out} ({total / 1e6:.2f} MB in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
