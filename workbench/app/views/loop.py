from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from workbench.app.common import (
    base_config,
    declared_rows,
    job_panel,
    rate_decisions,
    read_or_none,
    show_error,
    show_image,
    workspace,
)
from workbench.app.glossary import show_glossary
from workbench.config import dump_config
from workbench.domain_packs import available_packs, load_pack
from workbench.jobs import run_lock, start_job
from workbench.loop.api import Loop
from workbench.loop.records import round_name
from workbench.text import p_value, percent_interval, points, points_interval

st.title("Improvement loop")
st.caption("Rounds of targeted improvement with people at the gates (Cura): the current model's "
           "failures by mode, data synthesised for them with retention anchors, a LoRA "
           "candidate, every subset guarded; you approve the plan and decide keep, continue, "
           "revert or deploy.")
show_glossary("LoRA", "adapter", "McNemar", "kappa", "rubric", "guard", "retention")
ws = workspace()


def loop_packs() -> list[str]:
    """The domain packs that declare the loop's synthesis settings (`pipelines.loop`)."""
    return [p for p in available_packs() if "loop" in (load_pack(p).pipelines or {})]


with st.expander("Start a loop", expanded=False):
    from workbench.loop.config import SuitesSettings

    packs = loop_packs()
    with st.form("lp-form"):
        c1, c2, c3 = st.columns(3)
        pack = c1.selectbox("Domain pack", packs, key="lp-pack",
                            help="The domain's prompts and synthesis templates: the packs "
                                 "that declare the loop's settings (pipelines.loop).")
        data = c2.text_input("Domain data folder",
                             value=SuitesSettings.model_fields["data"].default, key="lp-data",
                             help=SuitesSettings.model_fields["data"].description)
        name = c3.text_input("Run name", value="", key="lp-name", placeholder="PACK_loop",
                             help="Empty: the pack's name and _loop.")
        c4, c5 = st.columns(2)
        mode = c4.selectbox("Start with", ["plan", "auto"], key="lp-mode",
                            help="plan: evaluate and plan round 1 for your approval; auto: "
                                 "unattended rounds, the guards decide")
        n_rounds = c5.number_input("Rounds (auto)", 1, 10, 2, key="lp-rounds")
        go = st.form_submit_button("Start")
    if go:
        try:
            if not pack:
                raise ValueError("no domain pack declares the loop's settings "
                                 "(pipelines.loop)")
            cfg = base_config(name.strip() or f"{pack}_loop", domain=pack,
                              loop={"pack": pack, "suites": {"data": data.strip()},
                                    "mode": mode, "rounds": int(n_rounds)})
            job = start_job(ws, "loop", cfg)
            st.success(f"Started job {job.id}")
        except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
            show_error(e)
job_panel("loop", "loop")

runs_dir = ws / "runs"
found = sorted(p.parent.parent for p in runs_dir.glob("*/loop/config.yaml")) \
    if runs_dir.is_dir() else []
if not found:
    st.caption("No improvement loop yet.")
    st.stop()
run = st.selectbox("Run", found, format_func=lambda p: p.name, key="lp-run")


def locked(what: str):
    """The run folder's lock while the page changes the loop (a running job refuses it)."""
    return run_lock(Path(run), f"the app ({what})")


def open_loop(run: Path):
    return Loop.at(run, log=lambda m: None)


def start_mode(mode: str):
    """A loop job on this run's config: plan the next round, or run the approved one."""
    d = dump_config(loop.cfg)
    return start_job(ws, "loop", {**d, "loop": {**d["loop"], "mode": mode}})


loop = read_or_none("the loop", lambda: open_loop(run))
if loop is None:
    st.stop()
rounds = read_or_none("the rounds", loop.rounds) or []
state = read_or_none(loop.files.path("state").name, loop.state)
if state is not None:
    cur = state.current
    st.markdown(f"Current model: **{'base' if cur is None else 'adapter ' + cur.sha256[:12]}**"
                + (f" (round {cur.round})" if cur else "")
                + (f"; deployed {state.deployed[:12]}" if state.deployed else ""))
if not rounds:
    st.caption("No round planned yet.")
    st.stop()
r = st.selectbox("Round", rounds, index=len(rounds) - 1, key="lp-round",
                 format_func=lambda x: f"round {x.index}: {x.plan.target} ({x.status})")
files = loop.files.for_value(round_name(r.index))
p = r.plan

# --- the plan and its gate
st.subheader(f"Round {r.index}: {r.status}")
c1, c2, c3 = st.columns(3)
c1.metric("Target", p.target)
c2.metric("Targeted samples", sum(v for k, v in p.recipe.items() if k != "anchors"))
c3.metric("Retention anchors (max)", p.recipe.get("anchors", 0))
st.markdown(f"**Why:** {p.rationale}")
GUARD_RULES = {  # what a guard's limit means, by kind (workbench.loop.records.Guard)
    "subset_drop": lambda g: f"may lose at most {points(g.limit, signed=False)} points",
    "length_blowup": lambda g: f"mean answer length at most {g.limit:g} times the current's",
    "non_termination": lambda g: f"answers cut at the token limit rise at most "
                                 f"{points(g.limit, signed=False)} points",
    "judge_agreement": lambda g: f"judge-person kappa interval's lower end at least "
                                 f"{g.limit:g}"}
st.dataframe(pd.DataFrame([{"guard": g.name, "limit": g.limit,
                            "rule": GUARD_RULES[g.kind](g) if g.kind in GUARD_RULES else ""}
                           for g in p.guards]), hide_index=True)
st.caption("The guards the candidate must pass before it may be kept; each is checked on "
           "the same items for the current model and the candidate.")
if r.status == "planned":
    with st.form("lp-approve"):
        who = st.text_input("Your name", key="lp-approver")
        target = st.selectbox("Target", p.subsets, index=p.subsets.index(p.target),
                              key="lp-target")
        ok = st.form_submit_button("Approve plan and run",
                                   help="Records your approval and starts a background job: "
                                        "synthesise the data, train the candidate, measure "
                                        "it; the round then waits here for your decision.")
    if ok:
        try:
            edits = {"target": target} if target != p.target else {}
            with locked("approve"):
                loop.approve(r.index, by=who, edits=edits)
            job = start_mode("run")
            st.success(f"Approved by {who}; started job {job.id}")
        except Exception as e:  # noqa: BLE001
            show_error(e)
elif r.approved_by:
    st.caption(f"Plan approved by {r.approved_by} at {r.approved_at}.")

# --- failures by mode
failures = declared_rows(files, "failures")  # FailureRow records
if failures:
    st.subheader("Failures of the current model, by mode")
    df = pd.DataFrame([f.model_dump() for f in failures])
    st.dataframe(df.groupby(["mode", "subset"]).size().rename("rows").reset_index(),
                 hide_index=True)
    st.caption("mode: why an answer failed. missing_knowledge: right once its corpus section "
               "is in the prompt; wrong_reasoning: wrong even then; option_length_bias: picked "
               "the shortest option over a longer gold one; unparsable: no option letter; "
               "premature / non_terminating: an open answer that stopped before saying "
               "anything / ran to the token limit; unsafe: met a negative safety rubric item; "
               "incomplete: missed most of the rubric. Each mode gets its own synthesised "
               "data.")
    for mode, g in df.groupby("mode"):
        with st.expander(f"{mode}: {len(g)} rows"):
            st.dataframe(g.reindex(columns=["id", "subset", "question", "gold", "prediction",
                                            "detail"]).head(8), hide_index=True)

# --- the synthesised data, reviewable while the round waits for it
accepted = declared_rows(files, "accepted")  # ChatExample records
if accepted:
    st.subheader("Synthesised data (after the quality gates)")
    gates = r.steps.get("gates", {})
    st.caption(f"Kept {gates.get('kept', len(accepted))} of {gates.get('in', '?')}; dropped: "
               + (", ".join(f"{k} {v}" for k, v in gates.get("dropped", {}).items())
                  or "none"))
    review_file = files.path("review")
    review = (read_or_none(review_file.name, lambda: files.read("review"))
              if review_file.exists() else None) or {}
    table = pd.DataFrame([{
        "id": e.id, "job": (e.metadata or {}).get("job"), "mode": (e.metadata or {}).get("mode"),
        "question": (e.messages[-2].content or "")[:300],
        "answer": (review.get(e.id) or {}).get("answer", e.messages[-1].content)
        if isinstance(review.get(e.id), dict) else e.messages[-1].content,
        "decision": "reject" if review.get(e.id) == "reject" else
        ("edit" if isinstance(review.get(e.id), dict) else "accept")} for e in accepted])
    waiting = r.status == "running" and r.plan.review_data and not r.reviewed_by \
        and "mixture" not in r.steps
    edited = st.data_editor(
        table, hide_index=True, key=f"lp-review-{r.index}",
        disabled=["id", "job", "mode", "question"] if waiting else True,
        column_config={"decision": st.column_config.SelectboxColumn(
            options=["accept", "edit", "reject"]),
            "answer": st.column_config.TextColumn(width="large")})
    if waiting:
        with st.form("lp-data"):
            who = st.text_input("Your name", key="lp-reviewer")
            ok = st.form_submit_button("Approve the data and continue")
        if ok:
            try:
                orig = {e.id: e.messages[-1].content for e in accepted}
                rev: dict[str, Any] = {}  # {id: "reject"} or {id: {"answer": text}}
                for row in edited.to_dict("records"):
                    if row["decision"] == "reject":
                        rev[row["id"]] = "reject"
                    elif row["answer"] != orig[row["id"]] or row["decision"] == "edit":
                        rev[row["id"]] = {"answer": row["answer"]}
                with locked("review"):
                    loop.approve(r.index, by=who, data=True, review=rev)
                job = start_mode("run")
                st.success(f"Data approved by {who}; started job {job.id}")
            except Exception as e:  # noqa: BLE001
                show_error(e)

# --- deltas, guards, decision
if r.deltas:
    st.subheader("Per-subset deltas (candidate - current, same items)")
    st.dataframe(pd.DataFrame([{
        "suite": d.suite, "subset": d.subset + (" (target)" if d.target else ""), "n": d.n,
        "current": percent_interval(d.before, *d.before_ci),
        "candidate": percent_interval(d.after, *d.after_ci),
        "delta": points_interval(d.delta, d.ci_low, d.ci_high),
        "p": p_value(d.p_value)} for d in r.deltas]),
        hide_index=True)
    st.caption("current / candidate: score with its 95% interval (accuracy; the open suite: "
               "rubric score); delta in points with its 95% interval; p: paired test on the "
               "same items (exact McNemar for multiple choice, sign-flip for the rubric).")
if r.guards:
    st.subheader("Guards")
    for g in r.guards:
        (st.success if g.passed else st.error)(f"{g.guard.name}: {g.detail}")
if r.status == "awaiting_decision":
    st.info(f"The guards recommend **{r.recommendation}**.")
    who = st.text_input("Your name", key="lp-decider")
    reason = st.text_input("Reason", key="lp-reason")
    # said in a caption, not as help= (a button with help renders twice in the page, and
    # tests/test_e2e_browser.py clicks `.st-key-lp-keep button`)
    st.caption("**Keep**: the candidate becomes the current model. **Continue**: keep it and "
               "plan the next round (a job evaluates and plans it for your approval). "
               "**Revert**: drop it; the current model stays (checked by its hash). "
               "**Deploy**: keep it and copy it to the loop's deployed/ folder.")
    cols = st.columns(4)
    for col, choice in zip(cols, ("keep", "continue", "revert", "deploy"), strict=True):
        if col.button(choice.capitalize(), key=f"lp-{choice}"):
            try:
                with locked("decide"):
                    loop.decide(r.index, choice, reason=reason, by=who, plan_next=False)
                if choice == "continue":
                    start_mode("plan")
                st.rerun()
            except Exception as e:  # noqa: BLE001
                show_error(e)
elif r.decision:
    d = r.decision
    st.success(f"Decision: **{d.choice}** by {d.by}: {d.reason}")
elif r.status in ("planned", "approved", "running"):
    with st.expander("Abandon this round (revert: the current model stays)"):
        with st.form("lp-abandon"):
            who = st.text_input("Your name", key="lp-abandoner")
            reason = st.text_input("Reason", key="lp-abandon-reason")
            gone = st.form_submit_button("Abandon")
        if gone:
            try:
                with locked("abandon"):
                    loop.decide(r.index, "revert", reason=reason, by=who, plan_next=False)
                st.rerun()
            except Exception as e:  # noqa: BLE001
                show_error(e)

# --- the rubric judge checked against a person
st.subheader("Check the judge")
st.caption("The rubric judge decides, item by item, whether an open answer meets a criterion; "
           "the open questions' rubric delta is only as good as those decisions. Rate a "
           "seeded sample of them (half the judge called met) without seeing the judge's "
           "verdict: Cohen's kappa between the judge and you, with its 95% interval, says how "
           "far it can be trusted, and the guard judge-person agreement flags a round when "
           "it cannot.")
from workbench.loop.agreement import QUESTION, judge_check, judge_guard, rate_item
from workbench.loop.decide import refresh_round_guard

jc = read_or_none("the judge's decisions", lambda: judge_check(loop))
if jc is not None and not jc.decisions.sample:
    st.caption("No judged open answers yet.")
elif jc is not None:
    def rate_judged(key: str, verdict: bool | None, by: str) -> None:
        with locked("judge-check"):
            rate_item(loop, key, verdict, by=by)
            # the round awaiting a decision, as the ratings stand
            refresh_round_guard(loop.store, loop.evaluator)

    guards = loop.lc.guards
    rate_decisions("lp-judge", jc.decisions, jc.reading(guards), rate_judged,
                   question=QUESTION, machine="judge",
                   answers=("Meets it", "Does not"), verdicts=("met", "not met"))
    g = judge_guard(jc, guards)
    st.markdown(f"**Guard {g.guard.name}:** {'passed' if g.passed else 'FLAGGED'}: "
                f"{g.detail}")

# --- history
if any(x.decision for x in rounds):
    st.subheader("History")
    from workbench.loop.api import history_rows

    st.dataframe(pd.DataFrame(history_rows(loop.store)), hide_index=True)
    if loop.files.path("history_plot").exists():
        show_image(loop.files.path("history_plot"), "deltas per subset, round by round")
