import streamlit as st
from common import acc_text, runs, show_error, workspace

from workbench.jobs import list_jobs
from workbench.workspace import open_workspace

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
jobs = list_jobs(ws)
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
