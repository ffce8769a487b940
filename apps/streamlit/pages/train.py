import json

import streamlit as st
from common import base_config, job_panel, show_error, workspace

from workbench.jobs import list_jobs, start_job

st.title("Train (LoRA SFT)")
ws = workspace()
data = sorted((ws / "runs").glob("*/distill/sft/instruct_mixed.messages.jsonl"))
if not data:
    st.info("Distil some data first (Distill page).")
with st.form("train-form"):
    source = st.selectbox("Training data", data, format_func=lambda p: p.parents[2].name,
                          key="t-data") if data else None
    name = st.text_input("Run name", value="train", key="t-name")
    c1, c2, c3 = st.columns(3)
    steps = c1.number_input("Steps", 1, 100000, 8, key="t-steps")
    lr = c2.number_input("Learning rate", 1e-6, 1e-2, 3e-4, format="%.1e", key="t-lr")
    rank = c3.number_input("LoRA rank", 1, 256, 8, key="t-rank")
    c4, c5, c6 = st.columns(3)
    max_len = c4.number_input("Max length", 64, 32768, 512, key="t-len")
    batch = c5.number_input("Batch size", 1, 512, 2, key="t-bs")
    save_every = c6.number_input("Checkpoint every (steps)", 0, 100000, 4, key="t-save")
    go = st.form_submit_button("Start training", disabled=source is None)
if go and source is not None:
    try:
        bench = source.parents[1] / "benchmark.jsonl"
        cfg = base_config(name, train={
            "data": str(source), "max_steps": int(steps), "learning_rate": float(lr),
            "lora": {"r": int(rank), "alpha": 2 * int(rank)}, "max_length": int(max_len),
            "batch_size": int(batch), "save_every": int(save_every),
            "domain_eval": {"benchmark": str(bench) if bench.exists() else None,
                            "every": int(save_every), "max_items": 20}})
        job = start_job(ws, "train", cfg)
        st.success(f"Started job {job.id}")
    except Exception as e:
        show_error(e)
job_panel("train", "train")
jobs = [j for j in list_jobs(ws) if j.kind == "train"]
if jobs:
    job = jobs[0]
    if job.status in ("failed", "stopped") and st.button("Resume", key="t-resume"):
        start_job(ws, "train", job.config)
        st.rerun()
    live = job.run_dir / "adapter.live.jsonl"
    if live.exists():
        rows = [json.loads(x) for x in live.read_text().splitlines() if x.strip()]
        if rows:
            st.line_chart({"loss": [r["loss"] for r in rows]}, x_label="step")
            dom = [r["domain_accuracy"] for r in rows if "domain_accuracy" in r]
            if dom:
                st.line_chart({"domain accuracy": dom})
