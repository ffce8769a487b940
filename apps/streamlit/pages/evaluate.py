import json

import streamlit as st
from common import base_config, job_panel, show_error, workspace

from workbench.jobs import start_job

st.title("Evaluate and compare")
ws = workspace()
with st.expander("Run the whole comparison (distil, index, base vs RAG vs SFT)"):
    name = st.text_input("Run name", value="pipeline", key="e-name")
    persp = st.multiselect("Perspectives", ["concepts", "analysis", "design", "performance",
                                            "applications"], default=["concepts"], key="e-p")
    steps = st.number_input("Training steps", 1, 10000, 4, key="e-steps")
    items = st.number_input("Benchmark items to score", 1, 5000, 20, key="e-items")
    if st.button("Start pipeline", key="e-start"):
        try:
            cfg = base_config(name, distill={"corpus": str(ws / "corpus"),
                                             "perspectives": persp, "kinds": ["mc", "nd"],
                                             "answer_source": "text",
                                             "verifier": {"on_disagree": "flag"}},
                              train={"max_steps": int(steps), "batch_size": 2,
                                     "max_length": 512},
                              eval={"methods": ["loglik", "generate"], "max_tokens": 32},
                              pipeline={"eval_items": int(items)})
            job = start_job(ws, "pipeline", cfg)
            st.success(f"Started job {job.id}")
        except Exception as e:
            show_error(e)
    job_panel("pipeline", "pipeline")
reports = sorted(p.parent for p in (ws / "runs").glob("*/report.json"))
if not reports:
    st.info("No comparison yet.")
    st.stop()
picked = st.multiselect("Runs", reports, default=reports[-1:], format_func=lambda p: p.name,
                        key="e-runs")
for run in picked:
    rep = json.loads((run / "report.json").read_text())
    st.subheader(run.name)
    st.dataframe([{"configuration": r["name"], "items": r["n"],
                   "accuracy (log-likelihood)": r["acc_loglik"],
                   "accuracy (generation)": r["acc_generate"],
                   "s/item": r["seconds_per_item"]} for r in rep["table"]], hide_index=True,
                 key=f"table-{run.name}")
    if (run / "comparison.png").exists():
        st.image(str(run / "comparison.png"))
    if rep.get("retrieval"):
        st.caption("Retrieval quality (source section of each question)")
        st.dataframe(rep["retrieval"])
    res_file = run / "eval_base" / "results.jsonl"
    if res_file.exists():
        rows = [json.loads(x) for x in res_file.read_text().splitlines()]
        conds = sorted({r["condition"] for r in rows})
        cond = st.selectbox("Condition", conds, key=f"cond-{run.name}")
        sel = [r for r in rows if r["condition"] == cond]
        i = st.number_input("Example", 0, max(len(sel) - 1, 0), 0, key=f"ex-{run.name}")
        if sel:
            r = sel[int(i)]
            st.write({"example": r["example_id"], "prediction": r.get("prediction"),
                      "gold": r.get("gold"), "correct": r.get("correct")})
            if r.get("extra", {}).get("context"):
                with st.expander("Retrieved context"):
                    st.text(r["extra"]["context"])
            if r.get("extra", {}).get("generation"):
                st.caption("Generated answer: " + r["extra"]["generation"])
