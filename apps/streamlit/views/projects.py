import streamlit as st
from common import acc_text, read_or_none, root, runs, show_error, workspace

from workbench.jobs import list_jobs
from workbench.workspace import workspace_in

st.title("Projects and runs")
base = root()
current = workspace()
st.caption(f"Workspaces are folders inside `{base}` (fixed when the app started): give a "
           "name relative to it, or a path inside it.")
path = st.text_input("Workspace folder", value=str(current.relative_to(base))
                     if current.is_relative_to(base) else str(current), key="ws-path",
                     help="A folder for this project: corpus, runs and jobs live in it.")
if st.button("Open or create", key="ws-open"):
    try:
        st.session_state.workspace = str(workspace_in(base, path))
        st.success(f"Workspace: {st.session_state.workspace}")
    except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
        show_error(e)
ws = workspace()
st.subheader("Runs")
infos = runs()
if not infos:
    st.info("No runs yet: upload documents on the Corpus page, then distil.")
for r in infos:
    with st.expander(f"{r.name}  ·  stages: {', '.join(r.stages) or '-'}"):
        holds = [label for label, have in (
            ("distilled samples", r.has_samples), ("benchmark", r.has_benchmark),
            ("index", r.has_index), ("adapter", r.has_adapter),
            ("compare report", r.has_report)) if have]
        st.markdown(f"`{r.path}`  \nholds: {', '.join(holds) or 'nothing finished yet'}"
                    + (f"  \ndistilled: **{r.distilled}** samples" if r.distilled is not None
                       else ""))
        if r.report_error:
            st.warning(r.report_error)
        if r.report is not None:
            st.dataframe([{"configuration": row.name, "items": row.n,
                           "headline": row.headline or "-",
                           "accuracy (headline, 95% CI)": acc_text(row.headline_accuracy)}
                          for row in r.report.rows], hide_index=True, key=f"runs-{r.name}")
st.subheader("Jobs")
jobs = read_or_none("the jobs of this workspace", lambda: list_jobs(ws))
if jobs:
    st.dataframe([{"id": j.id, "kind": j.kind,
                   "status": j.status,
                   "error": j.error or "", "last progress": (j.progress or [""])[-1]}
                  for j in jobs], hide_index=True, key="jobs-table")
    for j in jobs:
        if j.status == "unreadable":
            st.warning(f"Job `{j.id}` is unreadable: {j.error}")
else:
    st.caption("No jobs yet.")
