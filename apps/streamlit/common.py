"""Shared bits of the app's pages: the current workspace and small rendering helpers.
Pages hold no logic: they call one library function per action and render the result."""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from workbench.errors import WorkbenchError
from workbench.workspace import open_workspace


def workspace() -> Path:
    if "workspace" not in st.session_state:
        st.session_state.workspace = str(open_workspace(
            os.environ.get("WB_WORKSPACE", "workspace")))
    return Path(st.session_state.workspace)


def base_config(name: str, **sections) -> dict:
    """An experiment config for a job started from the app (same format as the CLI's)."""
    ws = workspace()
    model = os.environ.get("WB_APP_MODEL")  # tests set a scripted model here
    chat = {"spec": model or "default", "options": {}}
    if model and model.startswith("fake"):
        chat = {"spec": "fake", "options": {"script": os.environ["WB_APP_MODEL_SCRIPT"]}}
    cfg = {"name": name, "output_dir": str(ws / "runs"), "models": {"chat": chat}}
    cfg.update(sections)
    return cfg


def show_error(e: Exception) -> None:
    st.error(str(e) if isinstance(e, WorkbenchError | ValueError) else f"{type(e).__name__}: {e}")


def job_panel(kind: str, key: str) -> None:
    """Status, progress and log of the newest job of a kind; survives reloads (on disk)."""
    from workbench.jobs import list_jobs, stop_job

    jobs = [j for j in list_jobs(workspace()) if j.kind == kind]
    if not jobs:
        st.caption(f"No {kind} job yet.")
        return
    job = jobs[0]
    icon = {"running": ":material/hourglass_top:", "completed": ":material/check_circle:",
            "failed": ":material/error:", "stopped": ":material/stop_circle:"}.get(job.status,
                                                                                  "")
    st.markdown(f"**{icon} {kind} job `{job.id}`: {job.status}**")
    if job.progress:
        st.caption(job.progress[-1])
    if job.error:
        st.error(job.error)
    cols = st.columns(3)
    if job.status == "running":
        if cols[0].button("Stop", key=f"{key}-stop"):
            stop_job(job)
            st.rerun()
        cols[1].button("Refresh", key=f"{key}-refresh")
    with st.expander("log"):
        st.code(job.log_text(80) or "(empty)")
