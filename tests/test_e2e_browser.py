"""End to end in a real browser: headless Debian Chromium driven by Playwright against
`workbench app` of the installed wheel (`pip install .` into a new venv, started outside the
checkout; its jobs run the installed package too) on a free loopback port, with the bundled
model doing the distillation."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, free_port, wait_http

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = REPO / "test-artifacts"
DOC = """# Reflection and Matching

## Reflection Coefficient

When a wave on a line of characteristic impedance Z0 meets a load ZL, part of it is reflected.
The reflection coefficient is the ratio (ZL - Z0) / (ZL + Z0) of reflected to incident voltage.
A matched load reflects nothing, so its reflection coefficient is zero.
A short circuit gives a reflection coefficient of minus one and an open circuit gives plus one.
The fraction of the incident power that is reflected equals the squared magnitude of the reflection coefficient.
Return loss expresses that reflected power in decibels as minus twenty times the logarithm of the magnitude.

## Standing Wave Ratio

The forward and reflected waves add along the line to form a standing wave pattern.
The voltage standing wave ratio is (1 + |G|) / (1 - |G|) for a reflection coefficient magnitude |G|.
A reflection coefficient magnitude of 0.2 therefore gives a standing wave ratio of exactly 1.5.
Antennas are usually specified with a standing wave ratio below 2 across their operating band.
Voltage maxima and minima of the standing wave are spaced a quarter wavelength apart.
Measuring where the voltage minimum sits once revealed an unknown load impedance on a slotted line.

## Quarter-Wave Transformer

A quarter-wavelength line of impedance Z1 transforms a load ZL into the impedance Z1 squared over ZL.
A 100 ohm load is matched to a 50 ohm line with a quarter-wave section of about 70.7 ohms.
The match is exact only at the design frequency, where the section is a quarter wavelength long.
Several quarter-wave sections in cascade widen the bandwidth of the transformer considerably.
A quarter-wave line also turns a short circuit into an open circuit at its input terminals.
Microstrip quarter-wave transformers are common in power dividers and amplifier matching networks.
"""

pytestmark = pytest.mark.usefixtures("browser")


@pytest.fixture()
def running_app(installed_workbench, tmp_path):
    """`workbench app` of the installed wheel (not the checkout) on a free loopback port over
    a workspace, started from a folder outside the checkout; a context manager of (url,
    seconds it took to answer its health check)."""
    away = tmp_path / "elsewhere"
    away.mkdir(exist_ok=True)

    @contextlib.contextmanager
    def run(ws: Path, **env):
        port = free_port()
        proc = subprocess.Popen([str(installed_workbench.workbench), "app", "--workspace",
                                 str(ws), "--port", str(port)], cwd=away,
                                env=dict(installed_workbench.env, TQDM_DISABLE="1", **env),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            t0 = time.perf_counter()
            wait_http(f"http://127.0.0.1:{port}/_stcore/health", timeout=60, proc=proc)
            yield f"http://127.0.0.1:{port}", time.perf_counter() - t0
        finally:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
    return run


@pytest.fixture()
def app(running_app, tmp_path):
    with running_app(tmp_path / "ws") as (url, seconds):
        assert seconds < 20
        yield url, tmp_path / "ws"


def _open_page(p, url: str):
    """A headless Debian Chromium page (no sandbox, no network beyond loopback) on the app's
    first page."""
    browser = p.chromium.launch(executable_path=CHROMIUM, args=[
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"])
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.get_by_text("Projects and runs").first.wait_for(timeout=30000)
    return browser, page


def _jobs_on_disk(ws: Path | None) -> str:
    """Each job's recorded state and the end of its log: what a failure message needs (a
    job that died in CI said only "the job's process died" on the page)."""
    from workbench.jobs import list_jobs

    if ws is None:
        return ""
    return "\n".join(f"--- job {j.id}: {j.status} {j.error or ''} (peak memory "
                     f"{j.peak_rss_mb} MB)\n{j.log_text(40)}" for j in list_jobs(ws))


def _wait_job(page, button_key: str, timeout: float = 600, ws: Path | None = None) -> None:
    """Click the job panel's Refresh until the job is no longer running."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        body = page.inner_text("body")
        if ": completed" in body:
            return
        if ": failed" in body:
            raise AssertionError(body[-1200:] + "\n" + _jobs_on_disk(ws))
        btn = page.locator(f".st-key-{button_key}-refresh button")
        if btn.count() and btn.first.is_visible():
            btn.first.click()
        else:
            page.reload()
        page.wait_for_timeout(2000)
    page.screenshot(path=str(ARTIFACTS / f"wait-{button_key}-timeout.png"), full_page=True)
    raise TimeoutError(f"job did not finish; the page ends: {page.inner_text('body')[-800:]}"
                       f"\n{_jobs_on_disk(ws)}")


def _start_job(page, button: str, ws: Path, kind: str, tries: int = 3) -> None:
    """Click `button` until a `kind` job exists in the workspace: a click that lands while
    Streamlit is still re-running the page after navigation can be dropped on a loaded
    machine (seen once in CI), so the job folder on disk, not the page, says it started."""
    for _ in range(tries):
        page.get_by_role("button", name=button).click()
        deadline = time.time() + 30
        while time.time() < deadline:
            if any((ws / "jobs").glob(f"*-{kind}-*/job.json")):
                page.get_by_text("Started job").wait_for(timeout=30000)
                return
            page.wait_for_timeout(500)
    page.screenshot(path=str(ARTIFACTS / f"start-{kind}-failed.png"), full_page=True)
    raise AssertionError(f"clicking {button!r} {tries} times started no {kind} job")


def test_upload_distil_and_retrieve_in_a_browser(app, tmp_path):
    from playwright.sync_api import sync_playwright

    url, ws = app
    doc = tmp_path / "matching.md"
    doc.write_text(DOC)
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser, page = _open_page(p, url)
        page.get_by_role("link", name="Corpus").click()
        page.locator("[data-testid=stFileUploaderDropzoneInput]").set_input_files(str(doc))
        page.get_by_text("Saved matching.md").wait_for(timeout=20000)
        page.get_by_text("Sections found: 3").wait_for(timeout=20000)
        assert page.locator("[data-testid=stException]").count() == 0

        page.get_by_role("link", name="Distill").click()
        page.get_by_text("Start distillation").wait_for(timeout=20000)
        _start_job(page, "Start distillation", ws, "distill")
        _wait_job(page, "distill", timeout=900, ws=ws)
        page.get_by_role("link", name="Distill").click()
        page.get_by_text("accepted").first.wait_for(timeout=30000)
        body = page.inner_text("body")
        import re

        # the page shows the run's own count; a 135M writer keeps 2-6 samples of this
        # document by seed with the form's settings, so a question written is what is sure
        report = json.loads(next((ws / "runs").glob("*/distill/report.json")).read_text())
        accepted = int(re.search(r"(\d+) accepted", body).group(1))
        assert accepted == report["accepted"]["total"], body[-1500:]
        assert report["stages"]["written"] > 0, report["rejects"]
        page.screenshot(path=str(ARTIFACTS / "distill.png"), full_page=True)

        page.get_by_role("link", name="Retrieval playground").click()
        _start_job(page, "Build index", ws, "rag")
        _wait_job(page, "index", timeout=300, ws=ws)
        page.reload()
        page.get_by_label("Query").fill("What VSWR does a reflection coefficient of 0.2 give?")
        page.keyboard.press("Enter")
        for name in ("semantic", "keyword", "hybrid"):
            page.get_by_role("heading", name=name).wait_for(timeout=30000)
        assert page.locator("[data-testid=stException]").count() == 0
        page.screenshot(path=str(ARTIFACTS / "retrieval.png"), full_page=True)
        browser.close()
    assert (ARTIFACTS / "retrieval.png").stat().st_size > 10000


def test_server_limits(app):
    import httpx

    url, _ = app
    # uploads without the XSRF cookie/token are refused
    r = httpx.put(f"{url}/_stcore/upload_file/x/y", files={"file": ("a.md", b"x")}, timeout=10)
    assert r.status_code == 403
    # bodies over maxUploadSize (20 MB) are refused before they are read
    big = b"x" * (21 * 1024 * 1024)
    try:
        r = httpx.put(f"{url}/_stcore/upload_file/x/y", content=big, timeout=30,
                      headers={"Content-Type": "application/octet-stream"})
        assert r.status_code in (403, 413)
    except httpx.HTTPError:
        pass  # the server may close the connection instead of answering


def test_approve_a_loop_plan_in_a_browser(running_app, tmp_path):
    """A planned improvement-loop round (scripted model and trainer): a person names
    themself and approves the plan in the browser; the round is approved on disk, the run
    job it starts finishes the round, and Keep decides it."""
    from playwright.sync_api import sync_playwright

    from workbench.config import load_config
    from workbench.loop.api import Loop

    tests = str(Path(__file__).parent)
    sys.path.insert(0, tests)
    import loop_scripted  # noqa: F401 - registers the loopfake backend

    ws = tmp_path / "ws"
    cfg = load_config(REPO / "configs" / "health_demo.yaml", [
        "models.chat.spec=fake-loop", "models.chat.backend=loopfake", "models.chat.options={}",
        "loop.trainer=loop_scripted:train", "cache.enabled=false",
        f"output_dir={ws / 'runs'}", "name=looprun", "loop.suites.max_items_per_subset=6",
        # the installed app runs outside the checkout: its data by absolute path, as a
        # user's own would be
        f"loop.suites.data={REPO / 'datasets' / 'health'}",
        f"loop.suites.retention={REPO / 'datasets' / 'rf_distilled' / 'benchmark.jsonl'}",
        f"loop.suites.retention_data={REPO / 'datasets' / 'rf_distilled' / 'mcQTSA.jsonl'}",
        "loop.suites.open_items=4", "loop.weightings=[1.0]"])
    loop = Loop(cfg, log=lambda m: None)
    loop.plan()
    ARTIFACTS.mkdir(exist_ok=True)
    with running_app(ws, WB_PLUGINS="loop_scripted", PYTHONPATH=tests) as (url, _):
        with sync_playwright() as p:
            browser, page = _open_page(p, url)
            page.get_by_role("link", name="Improvement loop").click()
            page.get_by_text("Round 1: planned").wait_for(timeout=30000)
            name = page.locator(".st-key-lp-approver input")
            name.fill("Dr. Ana")
            name.press("Tab")
            _start_job(page, "Approve plan and run", ws, "loop")
            r = loop.round(1)
            assert r.approved_by == "Dr. Ana" and r.status != "planned"
            deadline = time.time() + 300
            while loop.round(1).status != "awaiting_decision" and time.time() < deadline:
                for job in (ws / "jobs").glob("*-loop-*/job.json"):
                    assert '"failed"' not in job.read_text(), job.read_text()[-3000:]
                time.sleep(1)
            assert loop.round(1).status == "awaiting_decision"
            page.reload()
            page.get_by_text("The guards recommend").first.wait_for(timeout=30000)
            page.locator(".st-key-lp-decider input").fill("Dr. Ana")
            page.locator(".st-key-lp-reason input").fill("looks right")
            page.locator(".st-key-lp-reason input").press("Tab")
            page.locator(".st-key-lp-keep button").click()
            page.get_by_text("Decision: keep").wait_for(timeout=30000)
            # Check the judge: rate the next sampled decision, its verdict hidden
            # the rerun after "keep" can show the judge's field twice for a moment (the stale
            # element and its replacement; a loaded CI-like run failed Playwright's strict
            # mode on it): wait until one is left, then fill it
            judge = page.locator(".st-key-lp-judge-by input")
            page.wait_for_function(
                "() => document.querySelectorAll('.st-key-lp-judge-by input').length === 1",
                timeout=30000)
            judge.fill("Dr. Ana")
            page.locator(".st-key-lp-judge-yes button").click()
            page.get_by_text("rated items; observed agreement").wait_for(timeout=30000)
            page.screenshot(path=str(ARTIFACTS / "loop-decided.png"), full_page=True)
            browser.close()
        assert loop.round(1).decision.by == "Dr. Ana"
        from workbench.loop.agreement import read_ratings

        assert [(r.verdict, r.by) for r in read_ratings(loop).values()] == [(True, "Dr. Ana")]


def test_trajectory_tree_browser_in_a_browser(app):
    """A search run made outside the app (6 Chinook tasks, uniform prior): in Chromium the
    Trajectories page lists the pool, draws a searched task's tree as a graph with the
    verified path in green, lists its nodes and shows the cost ledger."""
    from conftest import small_trajsynth_run
    from playwright.sync_api import sync_playwright

    url, ws = app
    small_trajsynth_run(ws / "runs" / "ts" / "trajsynth")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser, page = _open_page(p, url)
        page.get_by_role("link", name="Trajectories").click()
        page.get_by_text("Tasks verified").wait_for(timeout=60000)
        page.get_by_role("tab", name="Tree browser").click()
        graph = page.locator("[data-testid=stGraphVizChart] svg")
        graph.first.wait_for(timeout=60000)
        green = page.locator("[data-testid=stGraphVizChart] svg polygon[fill=palegreen]")
        assert green.count() >= 2  # the root's child and the answering node of a verified path
        assert page.get_by_text("Green: a verified path").count() == 1
        page.get_by_role("tab", name="Cost ledger").click()
        page.locator("[data-testid=stJson]").first.wait_for(timeout=30000)  # the ledger
        page.screenshot(path=str(ARTIFACTS / "trajectories-tree.png"), full_page=True)
        browser.close()


def test_grpo_curves_draw_while_training_and_after_in_a_browser(app):
    """A GRPO condition's live file (the RF pack's agent/rf_grpo.live.jsonl, written outside
    the app): in Chromium the Domain agents page draws its curves before any report exists,
    the best held-out step so far named; once the training ends (every row, the adapter's
    manifest) a reload names the kept step and the start's reward. The Train page lists the
    same training at its foot."""
    from playwright.sync_api import sync_playwright
    from test_app_grpo import grpo_rows, write_manifest, write_rows

    url, ws = app
    agent = ws / "runs" / "rfgrpo" / "agent"
    rows = grpo_rows(6, kl=0.01)
    write_rows(agent / "rf_grpo.live.jsonl", rows[:4])
    ARTIFACTS.mkdir(exist_ok=True)

    def curves(page, text: str) -> None:
        page.get_by_text(text).first.wait_for(timeout=60000)
        drawn = page.locator("[data-testid=stVegaLiteChart] canvas, "
                             "[data-testid=stVegaLiteChart] svg.marks")
        deadline = time.time() + 60
        while drawn.count() < 6 and time.time() < deadline:
            page.wait_for_timeout(500)
        assert drawn.count() >= 6, drawn.count()  # reward, held-out, no signal, tools, KL, clip
        assert page.locator("[data-testid=stException]").count() == 0

    def shot(page, name: str) -> None:  # the whole section: a viewport as tall as the page
        page.set_viewport_size({"width": 1400, "height": 2600})
        page.wait_for_timeout(1500)
        page.screenshot(path=str(ARTIFACTS / name), full_page=True)
        page.set_viewport_size({"width": 1400, "height": 1000})

    with sync_playwright() as p:
        browser, page = _open_page(p, url)
        page.get_by_role("link", name="Domain agents").click()
        page.get_by_role("tab", name="Evaluate").click()
        curves(page, "best so far: step 3 (held-out reward 0.700)")
        assert page.get_by_text("No report in this run yet").count() == 1
        shot(page, "agents-grpo-training.png")
        write_rows(agent / "rf_grpo.live.jsonl", rows)
        write_manifest(agent / "rf_grpo", steps=6, adapter_step=3, start=0.5)
        page.reload()
        page.get_by_role("tab", name="Evaluate").click()
        curves(page, "kept: step 3 (held-out reward 0.700)")
        assert page.get_by_text("held-out reward before training 0.500").count() == 1
        shot(page, "agents-grpo-kept.png")
        page.get_by_role("link", name="Train", exact=True).click()
        curves(page, "GRPO trainings")
        browser.close()


def test_every_page_opens_by_its_address_with_the_apps_navigation(app):
    """A bookmark or a shared link: each page opened by its address in a fresh browser (no
    session, no cookies) shows that page under the app's own navigation titles, never
    Streamlit's file-name navigation of a `pages/` folder (an "app" entry, "agents", ...)."""
    import re

    from playwright.sync_api import sync_playwright

    from workbench.app.common import navigation_pages

    url, _ = app
    pages = navigation_pages()
    titles = [t for _, t, _, _ in pages]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        for path, title, _, default in pages:
            ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = ctx.new_page()
            page.goto(url + ("/" if default else f"/{path.stem}"))
            nav = page.locator("[data-testid=stSidebarNav] a")
            nav.first.wait_for(timeout=30000)
            page.locator("h1").first.wait_for(timeout=60000)
            shown = [re.sub(r"^\S+\s+", "", t.strip()) for t in nav.all_inner_texts()]
            assert shown == titles, (path.stem, shown)
            assert page.locator("[data-testid=stException]").count() == 0, path.stem
            # the page itself ran: its heading, and the navigation marks it as the current one
            current = page.locator("[data-testid=stSidebarNav] a[aria-current=page]")
            assert re.sub(r"^\S+\s+", "", current.inner_text().strip()) == title, path.stem
            ctx.close()
        browser.close()


def test_chat_two_setups_side_by_side_in_a_browser(running_app, tmp_path):
    """The bundled model beside itself with the workspace's index: one question, two
    answers streamed into their columns, passages under the second; Good keeps the first as
    a training row that `workbench data validate` accepts."""
    from conftest import cli_in_process
    from playwright.sync_api import sync_playwright

    from workbench.corpus import ingest
    from workbench.retrieval.index import RagIndex

    ws = tmp_path / "ws"
    RagIndex.build(ingest(REPO / "datasets" / "rf").sections, ws / "runs" / "rf" / "index",
                   log=lambda m: None)
    ARTIFACTS.mkdir(exist_ok=True)
    with running_app(ws) as (url, _), sync_playwright() as p:
        browser, page = _open_page(p, url)
        page.goto(f"{url}/chat")
        page.get_by_text("Setup 2").wait_for(timeout=30000)
        longest = page.get_by_role("spinbutton", name="Longest answer (tokens)")
        longest.fill("48")
        longest.press("Enter")
        page.wait_for_timeout(1500)  # the rerun that takes the new length
        box = page.locator("[data-testid=stChatInputTextArea]")
        box.fill("What does a quarter-wave transformer do?")
        box.press("Enter")
        # both columns fill as they are written, then the page settles with both answers
        page.get_by_role("button", name="Good").nth(1).wait_for(timeout=300000)
        assert page.get_by_text("base + hybrid k=3").count() >= 1
        assert page.get_by_text("3 passages").count() == 1
        assert page.locator("[data-testid=stException]").count() == 0
        page.screenshot(path=str(ARTIFACTS / "chat.png"), full_page=True)
        page.get_by_role("button", name="Good").first.click()
        page.get_by_text("rated good").wait_for(timeout=30000)
        browser.close()
    sft = ws / "chat" / "sft.jsonl"
    r = cli_in_process("data", "validate", str(sft))
    assert r.returncode == 0 and "1 " in r.stdout + r.stderr, r
    (row,) = [json.loads(x) for x in sft.read_text().splitlines()]
    assert row["messages"][-1]["role"] == "assistant" and row["messages"][-1]["content"].strip()


def test_task_centre_shows_progress_advance_and_stops_the_job_in_a_browser(
        running_app, installed_workbench, tmp_path):
    """A distillation job (scripted teacher, paced) started in the workspace: the Task centre,
    opened by its address, shows its done/total moving on while it runs, and Stop stops it."""
    import re

    from playwright.sync_api import sync_playwright

    from workbench.jobs import list_jobs

    tests = str(Path(__file__).parent)
    ws = tmp_path / "ws"
    marker = tmp_path / "slow"
    marker.write_text("")
    # the tests folder only (the paced teacher): never the outer PYTHONPATH, which could
    # name the checkout
    env = {"PYTHONPATH": tests, "WB_TEST_PACE": str(marker),
           "WB_PROGRESS_FILE_SECONDS": "0.5"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        from test_task_centre import cfg

        # started by the installed package, from outside the checkout, as the app would
        start = ("import json, sys; from workbench.jobs import start_job; "
                 "print(start_job(sys.argv[1], 'distill', json.loads(sys.argv[2])).id)")
        r = subprocess.run([str(installed_workbench.python), "-c", start, str(ws),
                            json.dumps(cfg(ws))], cwd=tmp_path, capture_output=True, text=True,
                           env=dict(installed_workbench.env, **env), timeout=120, check=False)
        assert r.returncode == 0, r.stderr[-3000:]
        job_id = r.stdout.split()[-1]
        with running_app(ws, **env) as (url, _), sync_playwright() as p:
            browser, page = _open_page(p, url)
            # the Distill page's own panel: a bar that moves on by itself (no Refresh click)
            page.goto(f"{url}/distill")
            page.locator("[data-testid=stProgress]").first.wait_for(timeout=60000)
            shown: set[str] = set()
            deadline = time.time() + 60
            while len(shown) < 2 and time.time() < deadline:
                for text in page.locator("[data-testid=stProgress]").all_inner_texts():
                    shown.update(re.findall(r"\d+/\d+", text))
                page.wait_for_timeout(500)
            assert len(shown) >= 2, shown
            page.goto(f"{url}/jobs")
            page.get_by_text("1 job(s), 1 running").wait_for(timeout=60000)
            seen = []  # the done/total counts of the job's levels, as the page shows them
            deadline = time.time() + 120
            while len(set(seen)) < 3 and time.time() < deadline:
                # the job's own expander (the page's first is its "Terms on this page")
                counts = tuple(re.findall(r"\d+/\d+", page.locator(
                    "[data-testid=stExpander]").filter(has_text=job_id).first.inner_text()))
                if counts:
                    seen.append(counts)
                page.wait_for_timeout(700)  # the page refreshes itself ("Live")
            assert len(set(seen)) >= 3, seen
            page.screenshot(path=str(ARTIFACTS / "task-centre.png"), full_page=True)
            page.get_by_text("1 job(s), 1 running").wait_for(timeout=60000)
            page.get_by_role("button", name="Stop").click()
            page.get_by_text("1 job(s), 0 running").wait_for(timeout=60000)
            browser.close()
        assert list_jobs(ws)[0].status == "stopped" and list_jobs(ws)[0].id == job_id
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_chat_stop_workspace_and_offline_in_a_browser(running_app, tmp_path):
    """Chat's Stop keeps the question and the answer, marked stopped (a scripted model that
    takes 4 s an answer); every page names the open workspace and the address keeps it
    across a reload; nothing is fetched from outside the app (the favicon was fetched from
    fonts.gstatic.com)."""
    from playwright.sync_api import sync_playwright

    from workbench.workspace import open_workspace

    ws = tmp_path / "ws"
    open_workspace(tmp_path / "other")
    env = {"WB_APP_MODEL": "fake", "WB_APP_MODEL_SCRIPT": "test_app_flow:slow_chat",
           "PYTHONPATH": str(Path(__file__).parent)}
    ARTIFACTS.mkdir(exist_ok=True)
    with running_app(ws, **env) as (url, _), sync_playwright() as p:
        browser, page = _open_page(p, url)
        asked = []
        page.on("request", lambda r: asked.append(r.url))
        page.goto(f"{url}/?ws=other")
        page.get_by_text("Projects and runs").first.wait_for(timeout=30000)
        side = page.locator("[data-testid=stSidebar]")
        side.get_by_text("Workspace").wait_for(timeout=30000)
        assert "other" in side.inner_text() and page.url.endswith("?ws=other")
        page.get_by_role("link", name="Chat").click()
        page.get_by_text("Setup 1").first.wait_for(timeout=30000)
        assert page.url.endswith("/chat?ws=other") and "other" in side.inner_text()
        question = "What does a quarter-wave transformer do?"
        box = page.locator("[data-testid=stChatInputTextArea]")
        box.fill(question)
        box.press("Enter")
        page.get_by_role("button", name="Stop").wait_for(timeout=30000)
        page.wait_for_timeout(1000)
        page.get_by_role("button", name="Stop").click()
        page.get_by_text("Stopped: the answer is as far as it was written").wait_for(
            timeout=30000)
        assert question in page.inner_text("body")
        page.screenshot(path=str(ARTIFACTS / "chat-stopped.png"), full_page=True)
        page.reload()
        page.get_by_text("Setup 1").first.wait_for(timeout=30000)
        assert page.url.endswith("/chat?ws=other") and "other" in side.inner_text()
        icon = page.evaluate("document.querySelector('link[rel*=icon]').href")
        assert icon.startswith("data:"), icon
        browser.close()
    outside = {u for u in asked if not u.startswith((url, "data:", "blob:"))}
    assert not outside, outside
