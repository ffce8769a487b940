import json
from pathlib import Path

import streamlit as st

from workbench.app.common import (
    base_config,
    declared_rows,
    job_panel,
    read_or_none,
    show_error,
    workspace,
)
from workbench.app.glossary import show_glossary
from workbench.jobs import start_job
from workbench.runs import Outputs, RunLayout
from workbench.text import interval, percent

st.title("Trajectories for data agents")
st.caption("A verified task pool over a database or a folder of tables, one Monte Carlo tree "
           "search per task, and the verified paths exported as SFT (fine-tuning), ICL "
           "(in-context examples) and preference (chosen / rejected) data.")
show_glossary("SFT", "Wilson", "MCTS", "prior", "ICL")
ws = workspace()

with st.form("ts-form"):
    c1, c2 = st.columns(2)
    sample = c1.selectbox("Environment", ["chinook", "sklearn_classic", "a path on this machine"],
                          key="ts-env")
    path = c2.text_input("SQLite file or CSV/Parquet folder (for a path)", key="ts-path")
    c3, c4, c5, c6 = st.columns(4)
    prior = c3.selectbox("Prior over the grammar", ["model", "uniform", "choose"],
                         key="ts-prior",
                         help="model: the chat model's log-likelihood ranks each option; "
                              "choose: a bandit picks uniform or the model per node")
    iterations = c4.number_input("Iterations per task", 1, 5000, 200, key="ts-iter",
                                 help="Tree-search iterations per task at most: each one "
                                      "walks from the root to a new step and scores it.")
    limit = c5.number_input("Tasks (0 = all)", 0, 10000, 0, key="ts-limit")
    name = c6.text_input("Run name", value="trajsynth", key="ts-name")
    go = st.form_submit_button("Start search",
                               help="Starts a background job: builds the task pool, then "
                                    "searches each task; progress shows below and in the "
                                    "Task centre.")
if go:
    try:
        env = path.strip() if sample.startswith("a path") else sample
        if not env:
            raise ValueError("give the path of a SQLite file or a folder of tables")
        cfg = base_config(name, trajsynth={
            "env": env, "explore": {"prior": prior, "iterations": int(iterations)},
            "limit": int(limit) or None})
        job = start_job(ws, "trajsynth", cfg)
        st.success(f"Started job {job.id}")
    except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
        show_error(e)
job_panel("trajsynth", "trajsynth")

runs_dir = ws / "runs"


def files_of(run: Path) -> Outputs:
    return RunLayout.at(run).outputs("trajsynth")


found = sorted(p for p in runs_dir.iterdir() if p.is_dir()
               and files_of(p).path("explore").is_file()) if runs_dir.is_dir() else []
if not found:
    st.caption("No trajectory search yet.")
    st.stop()
run = st.selectbox("Run", found, format_func=lambda p: p.name, key="ts-run")
files = files_of(Path(run))
summary = read_or_none(files.path("explore").name,
                       lambda: json.loads(files.path("explore").read_text()))
if summary is None:
    st.stop()

lo, hi = summary["yield_ci95"]
led = summary["ledger"]
m1, m2, m3, m4 = st.columns(4)
m1.metric("Tasks verified", f"{summary['tasks_verified']} / {summary['tasks']}",
          help="Tasks with at least one verified trajectory")
m2.metric("Yield", percent(summary["yield"]), help=f"95% interval {interval(lo, hi)} (Wilson)")
m3.metric("Sandbox executions", led["executions"],
          help=f"{led['executions_saved']} more answered by the prefix trie "
               f"({percent(summary['prefix_hit_rate'])})")
m4.metric("Model calls", led["model_calls"], help=f"{led['scored_tokens']} tokens scored, "
          f"{led['prompt_tokens'] + led['completion_tokens']} generated or read")
st.caption(f"95% interval of the yield: {interval(lo, hi)}")

tab_pool, tab_tree, tab_cost = st.tabs(["Task pool", "Tree browser", "Cost ledger"])
tasks = {t.id: t for t in declared_rows(files, "tasks")}  # Task records


def tree_of(task_id: str) -> dict | None:
    f = files.path("trees") / f"{task_id}.json"
    return read_or_none(f.name, lambda: json.loads(f.read_text())) if f.is_file() else None


with tab_pool:
    rows = []
    for t in tasks.values():
        tree = tree_of(t.id)
        rows.append({"task": t.id, "category": t.category,
                     "difficulty": t.difficulty, "split": t.split,
                     "searched": tree is not None,
                     "verified": bool(tree and tree.get("verified_paths")),
                     "question": t.question})
    st.dataframe(rows, hide_index=True, width="stretch")
    st.caption("By category: " + ", ".join(f"{k} {v['verified']}/{v['tasks']}"
                                           for k, v in summary["by_category"].items()))

with tab_tree:
    searched = [tid for tid in tasks if (files.path("trees") / f"{tid}.json").is_file()]
    if not searched:
        st.caption("No tree yet.")
    else:
        tid = st.selectbox("Task", searched, key="ts-task",
                           format_func=lambda i: f"{i}: {tasks[i].question[:90]}")
        tree = tree_of(tid)
        if tree:
            st.markdown(f"**{tasks[tid].question}**")
            nodes = {n["id"]: n for n in tree["nodes"]}
            on_path = {i for p in tree.get("verified_paths", []) for i in p}
            min_visits = st.slider("Show nodes visited at least", 1, 20, 1, key="ts-minv")
            shown = [n for n in tree["nodes"] if n["visits"] >= min_visits or n["id"] == 0]
            dot = ["digraph T {", "rankdir=LR; node [shape=box, fontsize=10];"]
            for n in shown[:80]:
                label = (n["move"]["text"][:40] if n["move"] else "root").replace('"', "'")
                value = n["wins"] / n["visits"] if n["visits"] else 0
                color = "palegreen" if n["id"] in on_path else (
                    "mistyrose" if n.get("terminal") else "white")
                dot.append(f'{n["id"]} [label="{label}\\nN={n["visits"]} Q={value:.2f} '
                           f'P={n["prior"]:.2f}", style=filled, fillcolor={color}];')
                if n["parent"] is not None and n["parent"] in {m["id"] for m in shown[:80]}:
                    dot.append(f'{n["parent"]} -> {n["id"]};')
            dot.append("}")
            st.graphviz_chart("\n".join(dot))
            st.caption("Green: a verified path; red: a failed terminal. N visits, Q mean "
                       "reward, P prior.")
            table = []
            for n in shown:
                depth = 0
                p = n
                while p["parent"] is not None:
                    depth += 1
                    p = nodes[p["parent"]]
                table.append({"node": n["id"], "depth": depth,
                              "move": n["move"]["text"] if n["move"] else "(root)",
                              "visits": n["visits"],
                              "value": round(n["wins"] / n["visits"], 3) if n["visits"] else 0,
                              "prior": n["prior"], "verified path": n["id"] in on_path,
                              "children scored by": n.get("scorer") or "",
                              "sql": n.get("sql") or "", "observation": n.get("observation")
                              or n.get("reason") or ""})
            st.dataframe(table, hide_index=True, width="stretch")
            if tree.get("reflections"):
                with st.expander(f"Reflections ({len(tree['reflections'])})"):
                    for r in tree["reflections"][:20]:
                        st.markdown(f"- `{r.get('sql')}`: {r.get('reason')}")

with tab_cost:
    if led.get("seeded_nodes") or summary.get("node_scorers"):
        st.caption(
            f"Nodes seeded from earlier tasks' verified paths: {led.get('seeded_nodes', 0)} "
            f"(model calls saved: {led.get('model_calls_saved', 0)}); sandbox executions "
            f"answered by the trie: {led.get('executions_saved', 0)}"
            + (f"; nodes scored by {summary['node_scorers']}" if summary.get("node_scorers")
               else ""))
    labels = {"iterations": "search iterations", "terminals": "paths run to an answer",
              "verified": "verified paths", "executions": "queries run in the sandbox",
              "executions_saved": "queries answered by the prefix trie (not run again)",
              "probes": "probe queries (checking a partial step)",
              "model_calls": "model calls", "model_calls_saved": "model calls saved",
              "seeded_nodes": "nodes seeded from earlier verified paths",
              "escalated_nodes": "nodes escalated to a costlier scorer",
              "prompt_tokens": "prompt tokens", "completion_tokens": "generated tokens",
              "scored_tokens": "tokens scored (model prior)",
              "search_seconds": "search time (s)"}
    st.dataframe([{"what": labels.get(k, k.replace("_", " ")), "count": v}
                  for k, v in led.items()], hide_index=True, key="ts-ledger")
    st.caption("The ledger as the run wrote it (explore.json):")
    st.json(led, expanded=False)
    if summary.get("arms"):
        st.markdown("**Per arm**")
        st.dataframe([{"arm": k, **v} for k, v in summary["arms"].items()], hide_index=True)
    cm = summary.get("cost_model") or {}
    if cm.get("brier") is not None:
        st.caption(f"Cost model: Brier {cm['brier']} on {cm['held_out']} held-out attempts "
                   f"(base rate {cm['base_brier']})")
    attempts = [a.model_dump() for a in declared_rows(files, "attempts")]  # Attempt
    if attempts:
        st.markdown("**Attempts** (which arm searched each task, and why)")
        st.dataframe(attempts, hide_index=True, width="stretch")
