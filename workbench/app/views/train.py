from typing import Any

import streamlit as st

from workbench.app.common import (
    base_config,
    job_panel,
    jsonl_rows,
    not_ready,
    pick_run,
    read_or_none,
    runs,
    show_error,
    show_grpo_training,
    show_image,
    workspace,
)
from workbench.app.glossary import show_glossary
from workbench.app.grpo_curves import GrpoTraining, find_trainings, is_grpo_row
from workbench.jobs import list_jobs, start_job
from workbench.records import RunManifest

st.title("Train (LoRA SFT or DPO)")
st.caption("Fine-tune the chat model on the workspace's data with LoRA: small adapter matrices "
           "are trained and the base model stays as it is. The adapter is kept in the run "
           "folder; Evaluate scores it and Chat talks to it. GRPO (an agent trained on its "
           "own rollouts against a pack's reward) runs as an agent condition, the RF pack's "
           "tools+grpo on the Domain agents page; its live curves show there and at the "
           "foot of this page.")
show_glossary("SFT", "DPO", "LoRA", "adapter")
ws = workspace()
infos = runs()
data = [r for r in infos if r.has_sft_data]
# preference pairs the pipelines exported (trajectory search; the litsearch agent)
pair_files = {f"{r.name}: {pipe} pairs": r.layout.artifact(pipe, "preferences")
              for r in infos for pipe in ("trajsynth", "agent")
              if r.layout.has(pipe, "preferences")}
adapters = [r for r in infos if r.has_adapter]
method = st.radio("Method", ["SFT", "DPO"], horizontal=True, key="t-method",
                  help="SFT imitates the assistant turns of distilled conversations. DPO "
                       "(direct preference optimisation) teaches the model to prefer the "
                       "chosen continuation of each pair over the rejected one, e.g. a "
                       "verified tool call over a plausible mistake.")
dpo = method == "DPO"
pick = None
if not dpo and not data:
    st.info("Distil some data first (Distill page).")
if dpo and not pair_files:
    st.info("No preference pairs in this workspace yet: run trajectory synthesis or the "
            "litsearch agent (both export chosen/rejected pairs), or make step-level pairs "
            "from trajectories with `workbench train pairs`.")
with st.form("train-form"):
    if dpo:
        pick = st.selectbox("Preference pairs", list(pair_files), key="t-pairs") \
            if pair_files else None
        start = st.selectbox("Start from (also the reference policy)",
                             ["the base model"] + [r.name for r in adapters], key="t-init",
                             help="DPO usually follows SFT: pick the run whose adapter the "
                                  "pairs should refine.")
        beta = st.number_input("Beta", 0.01, 10.0, 0.1, key="t-beta",
                               help="How strongly the policy is held near the reference.")
        source = None
    else:
        source = pick_run("Training data (a run's distilled SFT split)", data, "t-data") \
            if data else None
    name = st.text_input("Run name", value="dpo" if dpo else "train", key=f"t-name-{method}")
    c1, c2, c3 = st.columns(3)
    steps = c1.number_input("Steps", 1, 100000, 8, key="t-steps",
                            help="Optimiser steps; each one sees one batch.")
    lr = c2.number_input("Learning rate", 1e-6, 1e-2, 5e-5 if dpo else 3e-4, format="%.1e",
                         key="t-lr")
    rank = c3.number_input("LoRA rank", 1, 256, 8, key="t-rank",
                           help="Width of the adapter matrices: higher trains more "
                                "parameters (alpha is set to twice the rank).")
    c4, c5, c6 = st.columns(3)
    max_len = c4.number_input("Max length", 64, 32768, 1024 if dpo else 512, key="t-len",
                              help="Tokens per example; longer ones are cut.")
    batch = c5.number_input("Batch size" + (" (pairs)" if dpo else ""), 1, 512, 2,
                            key="t-bs", help="Examples per step.")
    save_every = c6.number_input("Checkpoint every (steps)", 0, 100000, 4, key="t-save",
                                 help="Save a checkpoint (a stopped job resumes from it) and "
                                      "measure the held-out loss and domain accuracy this "
                                      "often; 0: only at the end.")
    ready = (pick is not None) if dpo else source is not None
    go = st.form_submit_button("Start training", disabled=not ready,
                               help="Starts a background job; its curves draw below as it "
                                    "trains, and the Task centre lists it.")
if go and ready:
    try:
        common = {"max_steps": int(steps), "learning_rate": float(lr),
                  "lora": {"r": int(rank), "alpha": 2 * int(rank)},
                  "max_length": int(max_len), "batch_size": int(batch),
                  "save_every": int(save_every)}
        if dpo:
            assert pick is not None  # `ready`
            init = next((r for r in adapters if r.name == start), None)
            train = {**common, "method": "dpo", "data": str(pair_files[pick]),
                     "dpo": {"beta": float(beta)}, "eval_every": max(1, int(save_every)),
                     "init_adapter": str(init.layout.artifact("train", "adapter"))
                     if init else None}
        else:
            assert source is not None  # `ready`
            lay = source.layout
            bench = lay.artifact("distill", "benchmark")
            train = {**common, "data": str(lay.artifact("distill", "sft")),
                     "domain_eval": {"benchmark": str(bench) if source.has_benchmark
                                     else None, "every": int(save_every), "max_items": 20}}
        job = start_job(ws, "train", base_config(name, train=train))
        st.success(f"Started job {job.id}")
    except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
        show_error(e)
job_panel("train", "train")
jobs = read_or_none("the train jobs", lambda: list_jobs(ws, kind="train")) or []
if jobs and jobs[0].status in ("failed", "stopped") and jobs[0].config \
        and st.button("Resume", key="t-resume",
                      help="Start the stopped or failed training again with the same "
                           "settings: it continues from its last checkpoint."):
    try:
        start_job(ws, "train", jobs[0].config)
        st.rerun()
    except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
        show_error(e)


def grpo_trainings() -> None:
    """The GRPO trainings of the workspace's runs (the agent conditions' live files, such as
    `agent/rf_grpo.live.jsonl`), one at a time with its live curves; they redraw themselves
    while an agent job runs."""
    found = {f"{r.name}: {t.label}": t for r in infos
             for t in find_trainings(r.layout.folder("agent"))}
    st.subheader("GRPO trainings")
    if not found:
        st.caption("No GRPO training in this workspace yet: add tools+grpo to the RF pack's "
                   "conditions on the Domain agents page.")
        return
    pick = st.selectbox("GRPO training (run: training)", list(found), index=len(found) - 1,
                        key="t-grpo")
    agent_jobs = read_or_none("the agent jobs", lambda: list_jobs(ws, kind="agent")) or []
    show_grpo_training(found[pick], "t-grpo",
                       refresh=bool(agent_jobs) and agent_jobs[0].status == "running")


st.subheader("Adapters and training curves")
trained = [r for r in infos if r.has_adapter or r.has_training_metrics]
if not trained:
    st.caption("No run has an adapter or training metrics yet.")
    grpo_trainings()
    st.stop()
info = pick_run("Run", trained, "t-run")
lay = info.layout
if info.has_adapter:
    st.markdown(f"**Adapter:** `{lay.artifact('train', 'adapter')}`")
    m = read_or_none("the training manifest", lambda: RunManifest.model_validate_json(
        lay.artifact("train", "manifest").read_bytes())) \
        if lay.has("train", "manifest") else None
    if m is not None:
        o = m.outputs
        try:
            final = o.get("final") or {}
            row = {"status": m.status, "method": m.config.get("method", "sft"),
                   "steps": o.get("steps"), "base model": o.get("base_model"),
                   "train examples": o.get("train_examples"),
                   "eval examples": o.get("eval_examples"),
                   "final loss": final.get("loss"), "eval loss": final.get("eval_loss"),
                   "domain accuracy": final.get("domain_accuracy"),
                   "reward accuracy": final.get("reward_accuracy"),
                   "held-out preference accuracy": final.get("eval_preference_accuracy")}
            st.dataframe([{k: v for k, v in row.items() if v is not None
                           or k in ("status", "steps")}],  # what the method does not measure
                         hide_index=True, key="t-manifest")
            st.caption("eval loss: loss on held-out examples the adapter never trained on; "
                       "domain accuracy: share of the run's benchmark questions answered "
                       "right during training (a quick check on a few items, not the "
                       "Evaluate page's scores)."
                       + (f" Trained on {o['device']}" if o.get("device") else "")
                       + (f" in {o['dtype']}" if o.get("dtype") else "")
                       + ("." if o.get("device") or o.get("dtype") else ""))
        except Exception as e:  # noqa: BLE001 - an odd manifest, never a traceback
            not_ready("the training manifest", e)
else:
    st.caption("Training in progress or stopped: no exported adapter yet.")
metrics_file = lay.artifact("train", "live") if lay.has("train", "live") \
    else lay.artifact("train", "metrics")
rows = jsonl_rows(metrics_file) if metrics_file.exists() else []
grpo = bool(rows) and is_grpo_row(rows[0])  # a GRPO training written into the run's adapter


def curve(points: list[dict], y: str, scale: tuple[float, float] | None = None) -> None:
    """One metric by step, as a line with a dot at each measurement (a metric measured
    once still shows)."""
    data = [{"step": p.get("step"), y: p.get(y)} for p in points if p.get(y) is not None]
    enc_y: dict[str, Any] = {"field": y, "type": "quantitative", "title": y.replace("_", " ")}
    if scale:
        enc_y["scale"] = {"domain": list(scale)}
    st.vega_lite_chart(data, {"mark": {"type": "line", "point": True, "tooltip": True},
                              "encoding": {"x": {"field": "step", "type": "quantitative",
                                                 "axis": {"format": "d", "tickMinStep": 1}},
                                           "y": enc_y}}, width="stretch", height=220)


if grpo:
    show_grpo_training(GrpoTraining("adapter", metrics_file, "GRPO",
                                    folder=lay.artifact("train", "adapter")),
                       "t-run-grpo", refresh=bool(jobs) and jobs[0].status == "running")
elif rows:
    st.markdown("**Training loss**")
    curve([{**r, "step": r.get("step", i + 1)} for i, r in enumerate(rows)], "loss")
    pref = [r for r in rows if "reward_accuracy" in r]
    if pref:  # DPO: live reward accuracy and margin
        st.markdown("**Reward accuracy and margin** (chosen reward above rejected; their "
                    "mean difference)")
        c1, c2 = st.columns(2)
        with c1:
            curve(pref, "reward_accuracy", (0.0, 1.0))
        with c2:
            curve(pref, "reward_margin")
    ev = [r for r in rows if "eval_loss" in r or "domain_accuracy" in r]
    if ev:
        st.markdown("**Held-out loss and domain accuracy** (measured at each checkpoint)")
        c1, c2 = st.columns(2)
        with c1:
            curve(ev, "eval_loss")
        with c2:
            curve(ev, "domain_accuracy", (0.0, 1.0))
if lay.has("train", "curves"):
    with st.expander("The same curves as a picture (training_curves.png, in the adapter "
                     "folder)"):
        show_image(lay.artifact("train", "curves"), caption="training_curves.png")
grpo_trainings()
