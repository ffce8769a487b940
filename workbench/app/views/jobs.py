"""The task centre: every job of every pipeline in the workspace, its progress, log, stop and
"run again". The rows come from `workbench.jobs.job_rows`; this page only renders them."""

import streamlit as st

from workbench.app.common import (
    RUN_AGAIN_HELP,
    STATUS_ICONS,
    job_progress_bar,
    read_or_none,
    show_error,
    workspace,
)
from workbench.app.glossary import show_glossary
from workbench.jobs import (
    STATUSES,
    job_folder,
    job_rows,
    kinds_known,
    list_jobs,
    load_job,
    run_again,
    stop_job,
)

REFRESH_S = 2.0

st.title("Task centre")
st.caption("Every job of this workspace, started from any page or from the CLI (`workbench "
           "jobs list --watch` shows the same table in a terminal), newest first. Open a job "
           "for the end of its log; stop a running one, or run a stopped or failed one again "
           "to finish the rest of its run (finished stages and cached model calls are "
           "skipped). Each pipeline page still shows its own newest job.")
show_glossary("ETA")
ws = workspace()
everything = read_or_none("the jobs of this workspace", lambda: list_jobs(ws)) or []

cols = st.columns([3, 3, 2])
kinds = cols[0].multiselect("Pipeline", kinds_known(everything), key="tc-kinds",
                            placeholder="every pipeline",
                            help="Show only the jobs of these pipelines.")
states = cols[1].multiselect("State", list(STATUSES), key="tc-states",
                             placeholder="every state", help="Show only the jobs in these "
                                                             "states.")
auto = cols[2].toggle("Live", value=True, key="tc-live",
                      help=f"Refresh this table every {REFRESH_S:g} s (the rest of the page "
                           "stays as it is).")
cols[2].button("Refresh", key="tc-refresh", help="Read the jobs again now.")


def act(label: str, action) -> None:
    """Run one library action for a button and say what happened."""
    try:
        out = action()
    except Exception as e:  # noqa: BLE001 - e.g. the job ended meanwhile
        show_error(e)
    else:
        st.success(f"{label}: {out}")


@st.fragment(run_every=REFRESH_S if auto else None)
def centre() -> None:
    rows = read_or_none("the jobs of this workspace",
                        lambda: job_rows(ws, kinds=kinds, states=states, log_lines=30))
    if rows is None:
        return
    if not rows:
        st.info("No jobs here yet: start work on a pipeline page (Distill, Train, Evaluate, "
                "...) or with `workbench jobs start KIND CONFIG`." if not (kinds or states)
                else "No job matches these filters.")
        return
    running = sum(r.state == "running" for r in rows)
    st.markdown(f"**{len(rows)} job(s), {running} running**")
    # a stopped or failed job: where its work stood when it ended
    st.dataframe([{"state": f"{r.state}", "pipeline": r.kind, "run": r.run,
                   "progress": r.fraction if r.last_progress is None else r.last_fraction,
                   "done/total": r.progress_text() if r.last_progress is None
                   else r.last_done_text(),
                   "rate": r.rate_text(), "ETA": r.eta_text(), "elapsed": r.elapsed_text(),
                   "id": r.id} for r in rows], hide_index=True, key="tc-table",
                 column_config={"progress": st.column_config.ProgressColumn(
                     "progress", min_value=0.0, max_value=1.0, format="percent")})
    for r in rows:
        # a label that stays the same while the job runs keeps the expander as a person
        # left it across refreshes
        head = f"{STATUS_ICONS.get(r.state, '')} **{r.kind}** · {r.run} · {r.state} · `{r.id}`"
        with st.expander(head, expanded=r.state == "running"):
            job_progress_bar(r)  # in flight, or where a stopped or failed job stood
            st.caption(f"elapsed {r.elapsed_text()} · run folder `{r.run_dir or '-'}`"
                       + (f" · peak memory {r.peak_rss_mb / 1024:.2f} GiB"
                          if r.peak_rss_mb is not None else "")
                       + (f" · last message: {r.message}" if r.message else ""))
            if r.error:
                (st.warning if r.state == "stopped" else st.error)(r.error)
            b = st.columns(4)
            if r.can_stop and b[0].button("Stop", key=f"tc-stop-{r.id}",
                                          help="Stop this job; run it again later to finish "
                                               "it."):
                act("Stop", lambda r=r: "requested" if stop_job(load_job(job_folder(
                    ws, r.id))) else "the job was not running")
            if r.can_run_again and b[0].button(
                    "Run again", key=f"tc-again-{r.id}", help=RUN_AGAIN_HELP):
                act("Run again", lambda r=r: "started job "
                    + run_again(load_job(job_folder(ws, r.id))).id)
            st.code("\n".join(r.log_tail) or "(the log is empty)", language=None)


centre()
