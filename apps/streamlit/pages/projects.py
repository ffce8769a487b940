import streamlit as st
from common import show_error, workspace

from workbench.jobs import list_jobs
from workbench.workspace import list_runs, open_workspace

st.title("Projects and runs")
path = st.text_input("Workspace folder", value=str(workspace()), key="ws-path",
                     help="A folder for this project: corpus, runs and jobs live in it.")
if st.button("Open or create", key="ws-open"):
    try:
        st.session_state.workspace = str(open_workspace(path))
        st.success(f"Workspace: {st.session_state.workspace}")
    except Exception as e:
        show_error(e)
ws = workspace()
st.subheader("Runs")
runs = list_runs(ws)
if not runs:
    st.info("No runs yet: upload documents on the Corpus page, then distil.")
for r in runs:
    with st.expander(f"{r['name']}  ·  stages: {', '.join(r['stages']) or '-'}"):
        st.write({k: v for k, v in r.items() if k not in ("table",)})
        if r.get("table"):
            st.dataframe(r["table"], hide_index=True)
st.subheader("Jobs")
jobs = list_jobs(ws)
if jobs:
    st.dataframe([{"id": j.id, "kind": j.kind, "status": j.status, "error": j.error or "",
                   "last progress": (j.progress or [""])[-1]} for j in jobs], hide_index=True,
                 key="jobs-table")
else:
    st.caption("No jobs yet.")
