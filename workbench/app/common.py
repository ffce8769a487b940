"""Shared bits of the app's pages: the current workspace and small rendering helpers.
Pages hold no logic: they call one library function per action and render the result.

Run files may be read while a job is still writing them: pages read them through the
helpers here (or inside try/except) and show "not ready yet" instead of raising."""

from __future__ import annotations

import html
import io
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import streamlit as st

from workbench import registry
from workbench.app import grpo_curves as gc
from workbench.errors import WorkbenchError
from workbench.io import iter_jsonl_raw
from workbench.jobs import job_row, list_jobs, run_again, stop_job
from workbench.records import Section, read_records
from workbench.runs import Outputs, RunLayout
from workbench.text import interval, percent
from workbench.workspace import MAX_CORPUS_MB, RunInfo, corpus_files, list_runs, workspace_in

if TYPE_CHECKING:
    from workbench.app.grpo_curves import GrpoTraining

# The pages live in `views/`, not `pages/`: Streamlit treats a `pages/` folder next to the
# entry script as its own automatic navigation, which a reload or a page opened by its address
# showed instead of this app's (file names as titles, an "app" entry).
PAGES = Path(__file__).parent / "views"
CORE_PAGES = [("projects.py", "Projects and runs", ":material/folder:"),
              ("jobs.py", "Task centre", ":material/monitoring:"),
              ("corpus.py", "Corpus", ":material/library_books:")]
CLOSING_PAGES = [("chat.py", "Chat", ":material/forum:")]
LETTERS = "ABCDEFGHIJ"


def navigation_pages() -> list[tuple[Path, str, str, bool]]:
    """(file, title, icon, default) of every page: the core ones, each registered pipeline's
    page in registry order (a relative page is a file in workbench/app/views), then Chat."""
    out = [(PAGES / f, t, i, n == 0) for n, (f, t, i) in enumerate(CORE_PAGES)]
    for p in registry.pipelines():
        if p.page:
            path = Path(p.page)
            out.append((path if path.is_absolute() else PAGES / path,
                        p.page_title or p.name, p.page_icon, False))
    out += [(PAGES / f, t, i, False) for f, t, i in CLOSING_PAGES]
    return out


def root() -> Path:
    """The folder every workspace of this app lives in, fixed when the app starts:
    `WB_ROOT` (set by `workbench app --root`), else the folder holding `WB_WORKSPACE`."""
    if os.environ.get("WB_ROOT"):
        return Path(os.environ["WB_ROOT"]).expanduser().resolve()
    return Path(os.environ.get("WB_WORKSPACE", "workspace")).expanduser().resolve().parent


def workspace() -> Path:
    """The session's workspace: the one the address names (`?ws=`, relative to `root()`, so
    a reload or a shared link keeps it), else the start one (`WB_WORKSPACE`, inside
    `root()`), until the projects page opens another; a start workspace outside the root
    stops the page. The address always names the open one."""
    if "workspace" not in st.session_state:
        st.session_state.workspace = str(_from_address() or _start_workspace())
    ws = Path(st.session_state.workspace)
    name = workspace_name(ws)
    if st.query_params.get(URL_KEY) != name:
        st.query_params[URL_KEY] = name
    return ws


URL_KEY = "ws"


def workspace_name(ws: Path) -> str:
    """The workspace as the address and the sidebar give it: its path inside the root."""
    base = root()
    return str(ws.relative_to(base)) if ws.is_relative_to(base) else str(ws)


def _from_address() -> Path | None:
    """The existing workspace the address names, or None (with a warning when it names one
    that cannot be opened: nothing is created from an address)."""
    name = st.query_params.get(URL_KEY)
    if not name:
        return None
    try:
        return workspace_in(root(), name, create=False)
    except (WorkbenchError, OSError) as e:
        st.warning(f"The address names workspace {name!r}, which cannot be opened ({e}); "
                   "the start workspace is open instead.")
        return None


def _start_workspace() -> Path:
    start = os.environ.get("WB_WORKSPACE")
    try:
        return workspace_in(root(), Path(start).expanduser().resolve() if start
                            else "workspace")
    except WorkbenchError as e:
        st.error(f"No workspace: {e}")
        st.stop()
        raise  # st.stop() raises; this line is never reached


def show_workspace() -> None:
    """The open workspace in the sidebar of every page."""
    st.sidebar.markdown(f":material/folder_open: Workspace **`{workspace_name(workspace())}`**",
                        help="Every page reads and writes this folder; the Projects page "
                             "opens another. The address (?ws=) keeps it across reloads.")


# Fields a person fills in that outlive a visit to another page (Streamlit drops a widget's
# value once a run does not draw it), by the page (its url path) that draws them: the Distill
# form and the Chat setups (the conversation itself is in session state, under its setups).
KEPT_FIELDS = {
    "distill": re.compile(r"d-(name|pack|persp-.+|kinds|model|mode|answers|max)"),
    "chat": re.compile(r"c-(n|max|temp|(model|url|index|ret|k)-\d+)"),
}


def keep_fields(current: str) -> None:
    """Keep the fields of every page but `current` through this run: a value set again from
    the script is the session's, which Streamlit keeps while no widget draws it; the current
    page's own widgets keep theirs (setting them here would also set their defaults anew)."""
    for k in list(st.session_state.keys()):
        for page, pattern in KEPT_FIELDS.items():
            if page != current and isinstance(k, str) and pattern.fullmatch(k):
                st.session_state[k] = st.session_state[k]


def max_corpus_mb() -> float:
    """The corpus cap of this app (`workbench app --max-corpus-mb`, else `MAX_CORPUS_MB`)."""
    try:
        cap = float(os.environ.get("WB_MAX_CORPUS_MB") or MAX_CORPUS_MB)
    except ValueError:
        return MAX_CORPUS_MB
    return cap if cap > 0 else MAX_CORPUS_MB


def runs() -> list[RunInfo]:
    """Every run folder of the workspace (CLI or app made), with its typed compare report."""
    from workbench.experiments.compare import read_report

    try:
        return list_runs(workspace(), read_report=read_report)
    except (OSError, ValueError, WorkbenchError) as e:  # a folder renamed while listed
        not_ready("the runs of this workspace", e)
        return []


def not_ready(what: str, e: Exception | None = None) -> None:
    """A file a job may still be writing could not be read: say so, never raise."""
    st.caption(f":material/hourglass_top: {what}: not ready yet"
               + (f" ({str(e).splitlines()[0][:300]})" if e is not None and str(e) else ""))


def read_or_none(what: str, read: Callable[[], Any]) -> Any:
    """`read()`, or None with a "not ready yet" note when the file is missing or
    half-written (any error: the page goes on)."""
    try:
        return read()
    except Exception as e:  # noqa: BLE001 - a half-written file must never crash a page
        not_ready(what, e)
        return None


def jsonl_rows(path: Path) -> list[dict]:
    """The JSON object rows of a JSONL file a job may be appending to: a torn last line is
    skipped; an unreadable file gives [] and a "not ready yet" note."""
    def read() -> list[dict]:
        return [obj for _, obj in iter_jsonl_raw(path, torn_tail=lambda _e: None)
                if isinstance(obj, dict)]

    return read_or_none(path.name, read) or []


def declared_rows(files: Outputs, name: str, value: str | None = None) -> list:
    """A declared JSONL file's rows as its record type (`Outputs.read`) while a job may be
    appending to it: a torn last line is skipped; a missing or unreadable file, or a row
    that does not fit the record, gives [] and a "not ready yet" note."""
    return read_or_none(files.path(name, value).name,
                        lambda: files.read(name, value, appending=True)) or []


def show_image(path: Path, caption: str | None = None) -> None:
    """An image file, or a "not ready yet" note when it is empty or cut short."""
    from PIL import Image

    def read() -> bytes:
        data = path.read_bytes()
        with Image.open(io.BytesIO(data)) as im:
            im.load()  # decodes it all: a truncated file raises here, not in st.image
        return data

    data = read_or_none(path.name, read)
    if data is not None:
        st.image(data, caption=caption)


def base_config(name: str, **sections) -> dict:
    """An experiment config for a job started from the app (same format as the CLI's); the
    bundled model runs with the demo config's batch size."""
    ws = workspace()
    model = os.environ.get("WB_APP_MODEL")  # tests set a scripted model here
    chat = {"spec": model or "default", "options": {} if model else dict(DEMO_MODEL_OPTIONS)}
    if model and model.startswith("fake"):
        chat = {"spec": "fake", "options": {"script": os.environ["WB_APP_MODEL_SCRIPT"]}}
    cfg = {"name": name, "output_dir": str(ws / "runs"), "models": {"chat": chat}}
    cfg.update(sections)
    return cfg


# What the app's forms do not ask, set as the demo config (configs/rf_demo.yaml) sets it for
# the bundled 135M model (tests/test_app.py checks every key against the file). Distillation:
# under the grammar (no question lost to its format), questions sampled at 0.7, the verifier
# flagging rather than rejecting, a third of the sections held out; in composed mode short
# questions and answers (single mode's writer writes a whole MC block), and with answers
# from the text no rationale for held-out items (scored, never trained on: a long call
# each). Without these a 6-section trial ran ~30 min for 1 sample, free text and all.
DEMO_MODEL_OPTIONS = {"batch_size": 16}
DISTILL_SETTINGS = {"constrained": "auto", "writer_temperature": 0.7,
                    "verifier": {"method": "loglik", "on_disagree": "flag"},
                    "benchmark_fraction": 0.35}
COMPOSED_SETTINGS = {"writer_max_tokens": 48, "answer_max_tokens": 96}
# with answers from the text: held-out items that need the text's knowledge ("Which
# statement about <section> is correct?" over the sentence and three false copies, no model
# call), both benchmarks (unseen sections, seen facts), and a recall sample for each training
# sentence the writer's questions miss
TEXT_ANSWER_SETTINGS = {"benchmark_rationales": False, "distractors": "perturbed",
                        "benchmark_items": "statement", "seen_fraction": 1.0,
                        "recall_samples": True}
# the comparison: one log-likelihood pass (generation answers "A" for the 135M model and cost
# ~40% of the time), letter scoring only without retrieval, no hit-vs-miss passes; short
# chunks keep RAG prompts short; the demo's LoRA settings
EVAL_SETTINGS = {"methods": ["loglik"], "letter_conditions": ["none"], "hit_vs_miss": False,
                 "max_tokens": 48, "oracle_tokens": 64}
RAG_SETTINGS = {"chunk_size": 96, "chunk_overlap": 16}
COMPARE_SETTINGS = {"seen_conditions": ["none"],  # seen: does training teach the facts
                    "letter_benchmarks": []}  # the 135M model's letters: degenerate
TRAIN_SETTINGS = {"max_length": 512, "batch_size": 2, "grad_accum": 1, "learning_rate": 6.0e-4,
                  "lora": {"r": 16, "alpha": 32, "dropout": 0.05},
                  "domain_eval": {"every": 8, "max_items": 16, "keep_best": True}}


def distill_settings(mode: str = "composed", answer_source: str = "text") -> dict[str, Any]:
    """The demo's distillation settings for a form's mode and answer source."""
    composed = mode == "composed"
    return {**DISTILL_SETTINGS, **(COMPOSED_SETTINGS if composed else {}),
            **(TEXT_ANSWER_SETTINGS if composed and answer_source == "text" else {})}


def require_corpus(ws: Path) -> None:
    """Refuse to start work on the corpus when it holds no document (the job failed later,
    in a collapsed panel, and left a stale lock)."""
    folder = ws / "corpus"
    if not folder.is_dir() or not corpus_files(ws):
        raise WorkbenchError("the corpus is empty: upload documents on the Corpus page first")


def show_error(e: Exception) -> None:
    st.error(str(e) if isinstance(e, WorkbenchError | ValueError) else f"{type(e).__name__}: {e}")


STATUS_ICONS = {"running": ":material/hourglass_top:", "queued": ":material/schedule:",
                "completed": ":material/check_circle:", "failed": ":material/error:",
                "stopped": ":material/stop_circle:", "unreadable": ":material/broken_image:"}


RUN_AGAIN_HELP = ("Start a new job with this job's config: it finishes the rest of the run "
                  "(finished stages and cached model calls are skipped).")


def plain_caption(text: str) -> None:
    """A caption of text that is not markdown (a log line: `_`, `*` and `$` stay as they
    are; the text starts with a word, so `#`, `-` and `1.` cannot start a block)."""
    st.caption("".join("\\" + c if c in "\\`*_[]<>|~$" else c for c in text))


def job_progress_bar(row) -> bool:
    """A task-centre row's progress: the work in flight of a running job (done/total, rate,
    time left), or where a stopped or failed job's work stood when it ended; under a running
    job's bar, the last progress line of its log (the figure that moves inside a slow step:
    tokens generated so far, each level's count), so how far it is shows without opening the
    log. Whether there was any to show."""
    fig = row.log_figure if row.state == "running" else None
    label: str | None = None
    frac = None
    if row.progress is not None and row.progress.levels:
        label = (f"{row.progress.label}: {row.progress_text()}, {row.rate_text()}, "
                 f"ETA {row.eta_text()}")
        frac = row.fraction
    elif row.last_progress is not None:
        label, frac = f"{row.state} at {row.last_progress_text()}", row.last_fraction
    elif fig is not None and fig.fraction is not None:  # no snapshot (yet): the log's count
        label, frac, fig = fig.text(), fig.fraction, None
    if label is not None and frac is not None:
        st.progress(frac, text=label)
    elif label is not None:
        st.caption(f"{label} (not counted)" if row.state == "running" else label)
    if fig is not None:
        plain_caption(f"last progress line: {fig.text()}")
    return label is not None or fig is not None


def run_again_button(job, key: str) -> None:
    """The "Run again" button of a stopped or failed job (as the Task centre's): a new job
    of its kind and config that finishes its run; the page then shows the new job."""
    if st.button("Run again", key=f"{key}-again", help=RUN_AGAIN_HELP):
        try:
            new = run_again(job)
        except Exception as e:  # noqa: BLE001 - e.g. another job writes the same run
            show_error(e)
        else:
            st.session_state[f"{key}-said"] = f"Run again: started job {new.id}"
            st.rerun()


PANEL_REFRESH_S = 2.0


def job_panel(kind: str, key: str) -> None:
    """Status, progress and log of the newest job of a kind; survives reloads (on disk):
    Stop while it runs, Run again once it stopped or failed. While the job runs the panel
    redraws itself every PANEL_REFRESH_S (its progress bar moves on), and the whole page
    reruns once it ends (its results show). Every job of every kind: the Task centre page."""
    if said := st.session_state.pop(f"{key}-said", None):
        st.success(said)
    jobs = read_or_none(f"{kind} jobs", lambda: list_jobs(workspace(), kind=kind))
    if not jobs:
        st.caption(f"No {kind} job started from the app yet.")
        return
    running = jobs[0].status == "running"
    st.fragment(_job_panel_body, run_every=PANEL_REFRESH_S if running else None)(
        kind, key, jobs[0].id if running else None)


def _job_panel_body(kind: str, key: str, was_running: str | None) -> None:
    jobs = read_or_none(f"{kind} jobs", lambda: list_jobs(workspace(), kind=kind))
    if not jobs:
        return
    job = jobs[0]
    if was_running is not None and (job.id != was_running or job.status != "running"):
        st.rerun(scope="app")  # it ended (or another began): the page shows its results
    st.markdown(f"**{STATUS_ICONS.get(job.status, '')} {kind} job `{job.id}`: {job.status}**")
    if job.progress:
        st.caption(job.progress[-1])
    row = read_or_none("the job's progress", lambda: job_row(job, log_lines=0))
    if row is not None and not job_progress_bar(row) and job.status == "running":
        st.caption(":material/hourglass_top: started: the count shows once its first "
                   "stage reports one")
    if job.error:
        (st.warning if job.status == "stopped" else st.error)(job.error)
    cols = st.columns(3)
    if job.status == "running":
        if cols[0].button("Stop", key=f"{key}-stop"):
            try:
                stop_job(job)
            except Exception as e:  # noqa: BLE001 - e.g. the job ended meanwhile
                show_error(e)
            else:
                st.rerun(scope="app")
        cols[1].button("Refresh", key=f"{key}-refresh")
    elif row is not None and row.can_run_again:
        with cols[0]:
            run_again_button(job, key)
    with st.expander("log"):
        st.code(read_or_none("the job log", lambda: job.log_text(80)) or "(empty)")


def options_html(options: list[str], gold: str | None, marks: dict[str, list[str]] | None = None
                 ) -> str:
    """The options as a list: the gold answer green with ✓, options that some prediction
    picked but are wrong red with ✗, each labelled with the scorings that picked it."""
    marks = marks or {}
    gold_letters = set(gold or "")
    rows = []
    for i, o in enumerate(options):
        letter = LETTERS[i]
        who = marks.get(letter, [])
        is_gold = letter in gold_letters
        sign = "✓" if is_gold else ("✗" if who else "&nbsp;")
        colour = "green" if is_gold else ("red" if who else "inherit")
        tag = (f" <small>← {html.escape(', '.join(who))}</small>" if who else "")
        gold_tag = " <small>(gold)</small>" if is_gold else ""
        rows.append(f"<div style='color:{colour}'>{sign} <b>{letter})</b> "
                    f"{html.escape(o)}{gold_tag}{tag}</div>")
    return "\n".join(rows)


def sections_of(run: Path) -> dict:
    """The distilled sections of a run by id ({} when it has none)."""
    lay = RunLayout.at(run)
    if not lay.has("distill", "sections"):
        return {}
    return read_or_none("the distilled sections", lambda: {
        s.id: s for s in read_records(lay.artifact("distill", "sections"), Section)}) or {}


def show_section(sec) -> None:
    if sec is None:
        st.caption("Source section: not found in this run.")
        return
    st.markdown(f"**Source section:** {sec.title or sec.source} · `{sec.source}`")
    st.text(sec.text)


def pick_run(label: str, infos: list[RunInfo], key: str) -> RunInfo:
    """A select box over runs (by name; the newest name last, preselected)."""
    by_name = {r.name: r for r in infos}
    names = list(by_name)
    return by_name[st.selectbox(label, names, index=len(names) - 1, key=key)]


def rate_decisions(key: str, c, reading, rate: Callable[[str, bool | None, str], Any], *,
                   question: str, machine: str, answers: tuple[str, str],
                   verdicts: tuple[str, str]) -> None:
    """A person checks a machine's yes/no decisions (`workbench.evaluate.agreement.Check`
    `c` and its `reading`): the next sampled item as the machine saw it, its verdict hidden,
    the buttons `answers` (yes, no) and Skip, a "Rated by" name (kept for the session), and
    the agreement so far. `rate(item key, verdict or None for a skip, name)` keeps a rating
    through the library; the page then reruns. `machine` names the machine ("judge") and
    `verdicts` its yes and no ("met", "not met") in the confusion table."""
    done, size = c.progress
    st.caption(f"{done} of {size} sampled decisions rated ({c.n_rated} rated in all; skips "
               "are replaced and not counted).")
    item = c.next
    if item is None:
        st.caption("Every sampled decision is rated.")
    else:
        by_key = f"{key}-by"
        if by_key not in st.session_state:  # the name given on any page of this session
            st.session_state[by_key] = st.session_state.get("rated-by", "")
        with st.form(f"{key}-form"):
            for s in item.shown:
                st.markdown(f"**{s.label[:1].upper() + s.label[1:]}**")
                st.text(s.text)
            st.markdown(f"**{question}**")
            by = st.text_input("Rated by", key=by_key,
                               help="Your name, recorded with every rating.")
            cols = st.columns(3)
            said = {v: cols[n].form_submit_button(label, key=f"{key}-{k}")
                    for n, (v, label, k) in enumerate(((True, answers[0], "yes"),
                                                       (False, answers[1], "no"),
                                                       (None, "Skip", "skip")))}
        clicked = [v for v, hit in said.items() if hit]
        if clicked:
            try:
                rate(item.key, clicked[0], by)
            except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
                show_error(e)
            else:
                st.session_state["rated-by"] = by.strip()
                st.rerun()
    if c.mode == "precision":
        p = c.precision
        if p is not None:
            st.markdown(f"Precision **{percent(p.share)}** {interval(p.ci_low, p.ci_high)} (95% "
                        f"Wilson interval): {p.agreed} of the {p.n} rated items the {machine} "
                        f"said yes to are right for the person.")
        st.caption(f"Only the {machine}'s yeses can be shown (the run keeps too little of its "
                   "rejections): their precision is measured, not kappa.")
    elif (a := c.agreement) is not None:
        k = ("undefined (no variation)" if a.kappa is None
             else f"{a.kappa:.2f} [{a.ci_low:.2f}, {a.ci_high:.2f}]")
        st.markdown(f"Cohen's kappa **{k}** (95% bootstrap interval) over **{a.n}** rated "
                    f"items; observed agreement {percent(a.observed)}, by chance "
                    f"{percent(a.expected)}.")
        import pandas as pd

        cf, (yes, no) = a.confusion, verdicts
        st.table(pd.DataFrame([[cf["yes/yes"], cf["yes/no"]], [cf["no/yes"], cf["no/no"]]],
                              index=[f"{machine}: {yes}", f"{machine}: {no}"],
                              columns=[f"person: {yes}", f"person: {no}"]))
    (st.info if reading.trusted is None else st.success if reading.trusted
     else st.warning)(f"Reading: {reading.text}")


GRPO_REFRESH_S = 5.0


def show_grpo_training(t: GrpoTraining, key: str, *, refresh: bool = False) -> None:
    """A GRPO training's live curves (`grpo_curves.GrpoTraining`): mean reward per step with
    the within-group spread, the held-out reward with the kept step, groups with no signal,
    tool calls per rollout, KL and clip fraction, throughput. With `refresh` (a job is
    running) they redraw themselves every GRPO_REFRESH_S from the live file."""
    st.fragment(_grpo_body, run_every=GRPO_REFRESH_S if refresh else None)(t, key)


def _grpo_chart(data: list[dict], spec: dict, key: str) -> None:
    st.vega_lite_chart(data, spec, width="stretch", height=220, key=key)


def _grpo_body(t: GrpoTraining, key: str) -> None:
    rows = read_or_none(t.live.name, lambda: gc.read_rows(t.live))
    if rows is None:
        return
    c = gc.shape(rows, gc.read_outputs(t, rows))
    if not c.steps:
        st.caption(f":material/hourglass_top: {t.label}: started, no step finished yet "
                   "(each step rolls out every task of the step, then updates the adapter).")
        return
    st.caption(gc.summary(c) + ".")
    c1, c2 = st.columns(2)
    with c1:
        st.markdown("**Mean reward per step** (training rollouts; the band: one standard "
                    "deviation within a task's group either side)")
        _grpo_chart(c.reward, gc.band_spec(), f"{key}-reward")
    with c2:
        mark = "kept" if c.kept.final else "best so far"
        st.markdown("**Held-out (dev) reward** (greedy, at the evaluation steps; red: "
                    + ("the adapter kept)" if c.kept.final else "the best adapter so far)"))
        if c.heldout:
            _grpo_chart(c.heldout, gc.heldout_spec(mark=mark, steps=c.steps),
                        f"{key}-heldout")
        else:
            st.caption("No held-out evaluation yet (every grpo.eval_every steps and at the "
                       "end, when the training has held-out tasks).")
    c1, c2 = st.columns(2)
    with c1:
        st.markdown("**Groups with no signal** (every rollout of a task rewarded alike: no "
                    "gradient)")
        _grpo_chart(c.no_signal, gc.line_spec("groups_no_signal", "share of groups",
                                              (0.0, 1.0)), f"{key}-nosignal")
    with c2:
        st.markdown("**Tool calls per rollout**")
        _grpo_chart(c.tool_calls, gc.lines_spec("tool calls"), f"{key}-tools")
    c1, c2 = st.columns(2)
    with c1:
        st.markdown("**KL** (per policy token)")
        if c.kl:
            _grpo_chart(c.kl, gc.lines_spec("KL"), f"{key}-kl")
        else:
            st.caption("Not measured: grpo.beta is 0 (no reference pass) and distillation "
                       "is off.")
    with c2:
        st.markdown("**Clip fraction** (policy tokens whose probability ratio was clipped; "
                    "always 0 with one update per rollout batch, grpo.iterations 1)")
        _grpo_chart(c.clip, gc.line_spec("clip_fraction", "share of tokens", fmt="~g"),
                    f"{key}-clip")
    if c.speed:
        with st.expander("Throughput (tokens per second)"):
            _grpo_chart(c.speed, gc.lines_spec("tokens / s"), f"{key}-speed")
