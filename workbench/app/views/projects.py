import streamlit as st

from workbench import registry
from workbench.app.common import read_or_none, root, runs, show_error, workspace
from workbench.app.glossary import show_glossary
from workbench.jobs import list_jobs
from workbench.text import accuracy
from workbench.workspace import workspace_in

st.title("Projects and runs")
base = root()
current = workspace()
st.caption(f"Workspaces are folders inside `{base}` (fixed when the app started): give a "
           "name relative to it, or a path inside it.")
path = st.text_input("Workspace folder", value=str(current.relative_to(base))
                     if current.is_relative_to(base) else str(current), key="ws-path",
                     help="A folder for this project: corpus, runs and jobs live in it.")
if st.button("Open or create", key="ws-open",
             help="Switch this browser tab to that workspace; a new folder is made with empty "
                  "corpus/, runs/ and jobs/ folders. The other pages then show its runs."):
    try:
        st.session_state.workspace = str(workspace_in(base, path))
    except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
        show_error(e)
    else:  # again from the top: the sidebar and the address name the new one
        st.session_state["ws-said"] = f"Workspace: {st.session_state.workspace}"
        st.rerun()
if said := st.session_state.pop("ws-said", None):
    st.success(said)
show_glossary("adapter", "headline")
ws = workspace()
st.subheader("Runs")
infos = runs()
if not infos:
    st.info("No runs yet: upload documents on the Corpus page, then distil.")


def holds(r) -> list[str]:
    return [label for label, have in (
        ("distilled samples", r.has_samples), ("benchmark", r.has_benchmark),
        ("index", r.has_index), ("adapter", r.has_adapter),
        ("compare report", r.has_report)) if have]


def parts(r) -> list[str]:
    """The run's pipeline folders (trajsynth, fed, agent, loop, ...): where to look."""
    return read_or_none(r.name, lambda: sorted(
        p.name for p in r.path.iterdir() if p.is_dir() and not p.name.startswith("."))) or []


PAGES = {p.name: p.page_title for p in registry.pipelines() if p.page_title}


def elsewhere(r) -> str:
    """Where a run that holds nothing of the core pages shows: its pipeline's page (a run
    folder holds one folder per pipeline, named as the pipeline)."""
    where = parts(r)
    pages = [PAGES[p] for p in where if p in PAGES]
    return (f"{', '.join(where) or 'nothing yet'}" + (f" (see the {', '.join(pages)} page)"
                                                       if pages else ""))


if infos:
    st.dataframe([{"run": r.name, "holds": ", ".join(holds(r)) or elsewhere(r),
                   "distilled samples": r.distilled} for r in infos],
                 hide_index=True, key="runs-overview",
                 column_config={"holds": st.column_config.TextColumn(width="large")})
    st.caption("Open a run below for its folder, its finished stages and, for a comparison, "
               "the headline accuracy of each configuration.")
for r in infos:
    have = holds(r)
    with st.expander(f"{r.name}  ·  {', '.join(have) or elsewhere(r)}"):
        lines = [f"`{r.path}`", "holds: " + ", ".join(have) if have else
                 "holds: nothing the Distill, Retrieval, Train or Evaluate pages read; its "
                 f"folders: {elsewhere(r)}"]
        if r.distilled is not None:
            lines.append(f"distilled: **{r.distilled}** samples")
        if r.stages:
            lines.append("finished stages: " + ", ".join(r.stages))
        st.markdown("  \n".join(lines))
        if r.report_error:
            st.warning(r.report_error)
        if r.report is not None:
            st.dataframe([{"configuration": row.name, "items": row.n,
                           "headline": row.headline or "-",
                           "accuracy (headline, 95% CI)": accuracy(row.headline_accuracy)}
                          for row in r.report.rows], hide_index=True, key=f"runs-{r.name}")
st.subheader("Jobs")
jobs = read_or_none("the jobs of this workspace", lambda: list_jobs(ws))
if jobs:
    st.caption("Progress, time left, logs, stop and run again: the Task centre page.")
    st.dataframe([{"id": j.id, "kind": j.kind,
                   "status": j.status,
                   "error": j.error or "", "last progress": (j.progress or [""])[-1]}
                  for j in jobs], hide_index=True, key="jobs-table")
    for j in jobs:
        if j.status == "unreadable":
            st.warning(f"Job `{j.id}` is unreadable: {j.error}")
else:
    st.caption("No jobs yet.")
