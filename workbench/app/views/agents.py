import json

import pandas as pd
import streamlit as st

from workbench.agent_packs.kgv.verdict_check import QUESTION, WHAT, conditions_in, verdict_check
from workbench.app.common import (
    base_config,
    job_panel,
    jsonl_rows,
    not_ready,
    rate_decisions,
    read_or_none,
    show_error,
    show_grpo_training,
    show_image,
    workspace,
)
from workbench.app.glossary import show_glossary
from workbench.chat import workspace_choices
from workbench.errors import DataError, WorkbenchError
from workbench.jobs import list_jobs, start_job
from workbench.text import number_interval, percent, percent_interval

st.title("Domain agents")
st.caption("One agent loop for every domain: knowledge-graph fact verification (kgv) against "
           "the WordNet entries, RF design with unit-checked calculators (rf), literature "
           "search as workflow induction over PubMed records (litsearch). Run one input and "
           "watch the steps, or evaluate the agent against its baselines.")
show_glossary("RAG", "MRR", "SFT", "kappa", "KGV", "adapter")
ws = workspace()
PACKS = {"kgv": ("datasets/kgv", "kgv-0002, 'oak | hypernym | tree' or a sentence"),
         "rf": ("datasets/rf_design", "rfd-000 or a design question"),
         "litsearch": ("datasets/litsearch", "an intent id such as ls-001")}

pack = st.radio("Pack", list(PACKS), horizontal=True, key="ag-pack",
                help="kgv: is a knowledge-graph fact true (searching the WordNet entries)? "
                     "rf: numeric RF design questions with calculators; litsearch: find the "
                     "papers a researcher means, as a search workflow. Both tabs use it.")
data, hint = PACKS[pack]


def evidence_fields(key: str) -> dict:
    """kgv: the evidence to search, the data folder's own entries or an index of this
    workspace made by the Retrieval page or `workbench rag build` (agent.index), and the
    retriever; the other packs search their own entries."""
    if pack != "kgv":
        return {}

    found = read_or_none("the indexes of this workspace", lambda: workspace_choices(ws))
    indexes = found.indexes if found else {}
    c1, c2 = st.columns(2)
    own = "the data folder's entries"
    pick = c1.selectbox("Evidence", [own, *indexes], key=f"{key}-index",
                        help="Search the WordNet entries that come with the pack, or a "
                             "retrieval index built in this workspace (its passages are "
                             "cited with their sources).")
    retriever = c2.selectbox("Retrieval", ["hybrid", "keyword", "semantic"],
                             key=f"{key}-retriever")
    out = {"retriever": retriever}
    if pick != own:
        out["index"] = str(indexes[pick])
    return out


tab_run, tab_eval = st.tabs(["Run one input", "Evaluate"])
with tab_run:
    with st.form("ag-run"):
        text = st.text_input(f"Input ({hint})", key="ag-input")
        policy = st.selectbox("Policy", ["guided", "free"], key="ag-policy",
                              help="guided: the model's log-likelihood picks among the calls "
                                   "the pack proposes (small models); free: the model writes "
                                   "its own tool calls")
        run_evidence = evidence_fields("ag-run")
        go = st.form_submit_button("Run", help="Runs the agent on this one input with the "
                                               "app's chat model and shows every step.")
    if go:
        try:
            if not text.strip():
                raise ValueError("type an input first")
            from workbench.agent_packs.api import run_inputs
            from workbench.config import experiment_config_model

            cfg = experiment_config_model().model_validate(base_config(
                "agent-playground", agent={"pack": pack, "data": data, "policy": policy,
                                           **run_evidence}))
            with st.spinner("running the agent"):
                st.session_state["ag-traj"] = [t.model_dump(mode="json") for t in
                                               run_inputs(cfg, [text.strip()],
                                                          log=lambda m: None)]
        except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
            show_error(e)


def draw_workflow(wf: dict) -> None:
    """A litsearch workflow as a graph (operators as nodes, inputs as edges)."""
    lines = ["digraph {", "rankdir=LR;"]
    for n in wf["nodes"]:
        lines.append(f'"{n["id"]}" [label="{n["id"]}\\n{n["op"]}"];')
        lines += [f'"{i}" -> "{n["id"]}";' for i in n.get("inputs", [])]
    st.graphviz_chart("\n".join([*lines, "}"]))


def last_workflow(t: dict) -> dict | None:
    for m in reversed(t["messages"]):
        for c in m.get("tool_calls") or ():
            if c["function"]["name"] == "submit_workflow":
                try:
                    return json.loads(c["function"]["arguments"])["workflow"]
                except (ValueError, KeyError, TypeError):
                    return None
    return None


def args_text(args) -> str:
    """A call's arguments as "name: value" pairs (a nested value stays JSON)."""
    if not isinstance(args, dict):
        return json.dumps(args)

    def value(v) -> str:
        if isinstance(v, list) and all(isinstance(x, str | int | float) for x in v):
            return ", ".join(map(str, v)) or "(none)"
        return json.dumps(v) if not isinstance(v, str | int | float) else str(v)

    return " · ".join(f"{k}: {value(v)}" for k, v in args.items())


def show_steps(t: dict) -> None:
    st.markdown(f"**{t['task_id']}**: {t['messages'][1]['content']}")
    for s in t["steps"]:
        if s["kind"] == "tool_call":
            line = f"{s['turn']}. call `{s['tool']}` with {args_text(s['arguments'])}"
            st.markdown(line + (f"  \n:red[{s['error']}]" if s.get("error") else ""))
            if s.get("candidates") and len(s["candidates"]) > 1:
                with st.expander("candidates the model chose among"):
                    st.dataframe(pd.DataFrame(s["candidates"]), hide_index=True)
        elif s["kind"] == "observation":
            st.code(s["content"][:1500], language=None, wrap_lines=True)
        elif s["kind"] == "final":
            st.success(f"{s['turn']}. answer: {args_text(s['arguments'])}")
        elif s["kind"] == "plan":
            st.info(s["content"])
        elif s["kind"] == "error":
            st.error(f"{s['turn']}. {s['error']}")
    for p in (t.get("metadata") or {}).get("cited") or ():  # a KGV verdict's passages
        st.caption(f"cites [{p.get('id')}] {p.get('source') or p.get('doc')}")
    gold = (t.get("metadata") or {}).get("claim", {}).get("label")
    st.caption(f"stop: {t['stop']} · {t['tool_calls']} tool calls · {t['model_turns']} model "
               f"turns · {t['seconds']:.1f} s" + (f" · gold: {gold}" if gold and not
                                                  t["task_id"].startswith("input") else ""))


def check_verdicts(run) -> None:
    """A person checks a KGV evaluation's verdicts: the claim and the passages a verdict
    cites, its verdict hidden; kappa, the confusion table and the reading so far."""
    st.subheader("Check the verdicts")
    st.caption("Each SUPPORTED or REFUTED verdict rests on the claim and the passages it "
               "cites. Rate a seeded sample of one condition's verdicts (half SUPPORTED where "
               "there are enough) without seeing the verdict: is the claim true? Cohen's kappa "
               "between the agent and you, with its 95% interval, says how far its verdicts "
               "can be trusted. Ratings go to agent/verdict_ratings.jsonl, as `workbench "
               "agent verdict-check RUN --rate` keeps them.")
    conds = read_or_none("the verdicts", lambda: conditions_in(run)) or []
    if not conds:
        st.caption("No verdicts to check in this run.")
        return
    cond = st.selectbox("Verdicts of", conds, key="ag-vc-cond",
                        help="agent: searches as it sees fit; rag: one search; closed_book: "
                             "no search; agent_sft: the student after SFT.")
    try:
        vc = verdict_check(run, condition=cond)
    except DataError as e:  # a file a job is still writing, or a bad line (named)
        not_ready("the verdicts", e)
    except WorkbenchError as e:  # no run gave a verdict
        st.caption(f"Nothing to check: {str(e).splitlines()[0]}")
    except Exception as e:  # noqa: BLE001 - never a traceback in the page
        not_ready("the verdicts", e)
    else:
        d = vc.decisions
        st.caption(f"{len(d.items)} {cond} verdicts of {d.decider}"
                   + (f"; evidence searched: {d.evidence}" if d.evidence else "") + ".")
        rate_decisions("ag-vc", vc.check, vc.reading,
                       lambda key, verdict, by: d.rate(key, verdict, by=by),
                       question=QUESTION, machine=WHAT.removeprefix("the "),
                       answers=("True", "False"), verdicts=("SUPPORTED", "REFUTED"))


def grpo_section(trainings: list) -> None:
    """The live curves of the run's GRPO trainings (the RF pack's tools+grpo: rf_grpo), one
    at a time; they redraw themselves while an agent job runs."""
    if not trainings:
        return
    st.subheader("GRPO training")
    st.caption("The agent trained with GRPO on its own rollouts against the pack's reward "
               "(the RF pack's tools+grpo condition): one point per optimizer step from the "
               "training's live file, the held-out (dev) items at its evaluation steps; the "
               "kept adapter is the one with the best held-out reward.")
    t = trainings[0] if len(trainings) == 1 else st.selectbox(
        "Training", trainings, format_func=lambda t: t.label, key="ag-grpo-pick")
    if len(trainings) == 1:
        st.markdown(f"**{t.label}** · `{t.live.name}`")
    jobs = read_or_none("the agent jobs", lambda: list_jobs(ws, kind="agent")) or []
    show_grpo_training(t, "ag-grpo", refresh=bool(jobs) and jobs[0].status == "running")


with tab_run:
    for t in st.session_state.get("ag-traj", []):
        if src := (t.get("metadata") or {}).get("evidence_source"):
            st.caption(f"Evidence searched: {src}")
        show_steps(t)
        if (wf := last_workflow(t)) is not None:
            st.caption("The last workflow submitted")
            draw_workflow(wf)

with tab_eval:
    with st.form("ag-eval"):
        c1, c2, c3 = st.columns(3)
        limit = c1.number_input("Items (0 = all)", 0, 5000, 40, key="ag-limit")
        conds = c2.text_input("Conditions (empty = all)", key="ag-conds",
                              help="kgv: closed_book, rag, agent, agent_sft · rf: alone, rag, "
                                   "tools; tools+grpo on request (it trains an adapter "
                                   "first, its curves show below)")
        name = c3.text_input("Run name", value=f"agent-{pack}", key="ag-name")
        eval_evidence = evidence_fields("ag-eval")
        start = st.form_submit_button("Start evaluation",
                                      help="Starts a background job: every condition on the "
                                           "pack's dev items, with 95% intervals; progress "
                                           "shows below and in the Task centre.")
    if start:
        try:
            section = {"pack": pack, "data": data, "dev_limit": int(limit) or None,
                       **eval_evidence}
            if conds.strip():
                section["conditions"] = [c.strip() for c in conds.split(",") if c.strip()]
            job = start_job(ws, "agent", base_config(name, agent=section))
            st.success(f"Started job {job.id}")
        except Exception as e:  # noqa: BLE001
            show_error(e)
    job_panel("agent", "agent")

    from workbench.agent_packs.api import read_report, report_packs, report_path
    from workbench.agent_packs.reports import agent_folder
    from workbench.app.grpo_curves import find_trainings

    runs_dir = ws / "runs"
    # a run with a report, or one whose GRPO condition is training (no report before it ends)
    found = sorted(p for p in runs_dir.iterdir() if p.is_dir() and (
        report_packs(p) or find_trainings(agent_folder(p)))) if runs_dir.is_dir() else []
    if not found:
        st.caption("No agent evaluation yet.")
        st.stop()
    run = st.selectbox("Run", found, format_func=lambda p: p.name, key="ag-run")
    trainings = find_trainings(agent_folder(run))
    packs = report_packs(run)
    if not packs:
        st.caption("No report in this run yet: its GRPO condition trains first, and every "
                   "condition is scored once the adapter is kept.")
        grpo_section(trainings)
        st.stop()
    shown = packs[0]  # kgv, then litsearch, then rf
    rep = read_or_none(report_path(run, shown).name, lambda: read_report(run, shown))
    if rep is None:
        grpo_section(trainings)
        st.stop()
    if shown == "kgv":
        from workbench.agent_packs.kgv.report import REPORT_PNG, trajectory_files

        split = st.radio("Claims", ["all", "seen", "longtail"], horizontal=True, key="ag-split",
                         help="seen: claims on frequent relations (their training part feeds "
                              "distillation); longtail: rare relations held out of training.")
        rows = []
        for c, r in rep.conditions.items():
            s = r.get(split)
            if not s:
                continue
            p = s.predictions
            rows.append({"condition": c, "macro-F1": percent_interval(
                             s.macro_f1, s.macro_f1_ci95.low, s.macro_f1_ci95.high),
                         "Pos-F1 (true)": round(100 * s.pos_f1_true, 1),
                         "Pos-F1 (error)": round(100 * s.pos_f1_error, 1),
                         "accuracy": round(100 * s.accuracy, 1),
                         "searches / claim": round(s.search_calls_mean, 2),
                         "parametric route": round(100 * s.routes.parametric.rate, 1),
                         "predicted S/R/none": f"{p.SUPPORTED}/{p.REFUTED}/{p.none}",
                         "n": s.n})
        st.dataframe(pd.DataFrame(rows), hide_index=True)
        st.caption("Figures in %. Conditions: closed_book answers without searching, rag "
                   "searches once, agent searches as it sees fit. macro-F1: the mean of the "
                   "F1 on true and on false claims, with its 95% interval; Pos-F1 (true): F1 "
                   "with a true fact as the positive class, Pos-F1 (error): with a detected "
                   "error as the positive class; parametric route: share of claims answered "
                   "without any search; predicted S/R/none: claims called SUPPORTED, REFUTED "
                   "or left without a verdict; n: claims.")
        if rep.evidence:
            st.caption(f"Evidence searched: {rep.evidence}.")
        show_image(agent_folder(run) / REPORT_PNG, "macro-F1 with 95% intervals")
        trajs = trajectory_files(run)
        if trajs:
            f = st.selectbox("Trajectories", trajs, format_func=lambda p: p.stem, key="ag-tf")
            items = jsonl_rows(f)
            if items:
                pick = st.selectbox("Claim", range(len(items)), key="ag-claim",
                                    format_func=lambda i: f"{items[i]['task_id']}: "
                                    f"{items[i]['messages'][1]['content'][:80]}")
                show_steps(items[pick])
        check_verdicts(run)
    elif shown == "litsearch":
        from workbench.agent_packs.litsearch.report import METRICS, dialogues_file

        def final(v, k: str) -> str:
            value, ci = v.final(k)
            return number_interval(value, ci.low, ci.high)

        st.dataframe(pd.DataFrame([
            {"condition": c, **{f"{k} final": final(v, k) for k in METRICS},
             "execution errors": percent(v.execution_error_rate),
             "memo hits after turn 1": percent(v.memo_hit_rate_after_turn1)}
            for c, v in rep.conditions.items()]), hide_index=True)
        st.caption("At the dialogue's last turn, with 95% intervals: hit5: share of dialogues "
                   "with a relevant paper in the top 5; mrr: mean of 1 / rank of the first "
                   "relevant paper (top 10); "
                   "ndcg10: the top 10 scored by graded relevance, discounted by rank. "
                   "execution errors: workflows that failed to run; memo hits: node outputs "
                   "reused from an earlier turn instead of recomputed.")
        cond = st.selectbox("Dialogues", list(rep.conditions), key="ag-ls")
        rows = jsonl_rows(dialogues_file(run, cond))
        if rows:
            pick = st.selectbox("Intent", range(len(rows)), key="ag-ls-i",
                                format_func=lambda i: rows[i]["id"])
            d = rows[pick]
            st.dataframe(pd.DataFrame([{k: t[k] if k != "error" else (t[k] or "")
                                        for k in ("turn", "choice", "hit5", "mrr", "ndcg10",
                                                  "error")}
                                       for t in d["turns"]]), hide_index=True)
            wf = d["turns"][-1].get("workflow")
            if wf:
                st.caption("The workflow of the last turn: each box a step (its id, then its "
                           "operator), arrows from the steps it reads.")
                draw_workflow(wf)
    else:
        from workbench.agent_packs.rf.report import condition_rows

        st.dataframe(pd.DataFrame([
            {"condition": c, "accuracy": percent_interval(s.accuracy, s.accuracy_ci95.low,
                                                          s.accuracy_ci95.high),
             "answered": f"{s.answered}/{s.n}", "tool calls / item":
                 round(s.tool_calls_mean, 2), **s.by_family}
            for c, s in rep.conditions.items()]), hide_index=True)
        tools = condition_rows(run, "tools")
        if tools.is_file():
            items = jsonl_rows(tools)
            if items:
                pick = st.selectbox("Item", range(len(items)), key="ag-rf",
                                    format_func=lambda i: items[i]["id"])
                show_steps(items[pick]["trajectory"])
    grpo_section(trainings)
