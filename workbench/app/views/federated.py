import streamlit as st

from workbench.app.common import (
    base_config,
    job_panel,
    read_or_none,
    runs,
    show_error,
    show_image,
    workspace,
)
from workbench.app.glossary import show_glossary
from workbench.federated.knowledge.units import load_latest_kb, votes
from workbench.federated.results import KnowledgeReport, LoraReport, read_report
from workbench.jobs import start_job
from workbench.text import interval, p_value, percent

st.title("Federated rounds")
st.caption("Sites learn together on data that never leaves them (Flower): one shared LoRA "
           "adapter, evaluated where the data is against local-only and centralised training "
           "at the same number of steps; or shared knowledge units (workflows) that data "
           "agents propose, filter, gate and vote on.")
show_glossary("QTSA", "MC", "LoRA", "adapter", "McNemar", "guard", "FedAvg", "FFA-LoRA",
              "SuperNode", "canaries")
ws = workspace()

TRACKS = {"LoRA adapters (FedAvg / FFA-LoRA)": None,
          "Knowledge units, search agents": "grammar",
          "Knowledge units, prompted agents (chat model)": "prompted"}
with st.form("fed-form"):
    track = st.selectbox("Track", list(TRACKS), key="fed-track", help=(
        "Knowledge units: data-agent sites (Chinook split by customer, plus a listener site "
        "that contributes nothing) evolve shared workflows; prompted agents run the chat "
        "model with the units in its prompt (minutes per round on a CPU)."))
    c1, c2, c3, c4 = st.columns(4)
    n_sites = c1.number_input("Sites", 2, 8, 3, key="fed-sites")
    rounds = c2.number_input("Rounds", 1, 50, 3, key="fed-rounds")
    steps = c3.number_input("Steps per site per round (LoRA)", 1, 100, 2, key="fed-steps")
    agg = c4.selectbox("Aggregation (LoRA)", ["fedavg", "ffa"], key="fed-agg",
                       help="ffa: FFA-LoRA, A frozen and only B averaged (exact)")
    c5, c6 = st.columns(2)
    source = c5.text_input("QTSA source (LoRA: distillation run folder)",
                           value="datasets/rf_distilled", key="fed-source",
                           help="The distilled question-thinking-solution-answer samples "
                                "split among the sites (a Distill run's folder).")
    name = c6.text_input("Run name", value="federated", key="fed-name")
    go = st.form_submit_button("Start rounds (in process)",
                               help="Starts a background job that simulates every site on "
                                    "this machine, in one process, then trains the "
                                    "local-only and centralised baselines and evaluates all "
                                    "of them; progress shows below and in the Task centre.")
if go:
    try:
        agent = TRACKS[track]
        if agent is None:
            fed = {"rounds": int(rounds), "aggregation": agg,
                   "split": {"source": source.strip(), "sites": int(n_sites)},
                   "local": {"steps": int(steps)}}
        else:
            n = int(n_sites)
            cfg0 = base_config(name)
            knowledge = {"agent": agent, "chinook_parts": max(1, n - 1),
                         "extra": ["sklearn_classic"], "listener": n - 1,
                         "poison": 2 if n >= 4 else None, "k_min": min(2, max(1, n - 1))}
            if agent == "prompted":
                knowledge.update(slice=6, prompted={"model": cfg0["models"]["chat"]["spec"]})
            fed = {"track": "knowledge", "rounds": int(rounds), "model": "",
                   "knowledge": knowledge,
                   "guards": {"min_nodes": n, "min_replies": max(1, n - 1),
                              "round_timeout_s": 3600}}
        job = start_job(ws, "fed", base_config(name, federated=fed))
        st.success(f"Started job {job.id}")
    except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
        show_error(e)
job_panel("fed", "fed")
st.caption("A real deployment (one SuperNode per site) runs from the command line: "
           "`workbench fed up`, `workbench fed run`, `workbench fed down`.")

found = {r.path: r.layout for r in runs() if r.layout.has("fed", "rounds")}
if not found:
    st.caption("No federated run yet.")
    st.stop()
run = st.selectbox("Run", list(found), format_func=lambda p: p.name, key="fed-run")
layout = found[run]
files = layout.outputs("fed")
# the round log as typed rows (a torn last line, a job still appending, is skipped)
rounds_log = read_or_none(files.path("rounds").name,
                          lambda: files.read("rounds", appending=True)) or []
train = [r for r in rounds_log if r.kind == "train"]
report = read_or_none(files.path("report").name, lambda: read_report(layout)[0]) \
    if files.path("report").exists() else None

if any(r.kind == "knowledge" for r in rounds_log):
    report = report if isinstance(report, KnowledgeReport) else None
    st.subheader("Knowledge units")
    m1, m2, m3, m4 = st.columns(4)
    m1.metric("Rounds done", len(rounds_log))
    m2.metric("Active units", rounds_log[-1].active if rounds_log else 0,
              help="Units enough sites voted for: every site's agents use them")
    kb = [(r.bytes_down + r.bytes_up) / 1e3 for r in rounds_log]
    m3.metric("kB per round", f"{sum(kb) / len(kb):.1f}" if kb else "–",
              help="units and votes sent to the sites plus those sent back")
    m4.metric("Canaries leaked", report.figures.canary_leaks if report else "–",
              help="secret strings planted in sites' data, searched in every reply")
    st.markdown("**Rounds**")
    st.dataframe([{"round": r.round, "status": r.status,
                   "participants": f"{r.used}/{r.sent}", "active units": r.active,
                   "candidates": r.candidates, "ops": ", ".join(
                       f"{k} {v}" for k, v in r.ops.items() if v),
                   "kB down": round(r.bytes_down / 1e3, 1),
                   "kB up": round(r.bytes_up / 1e3, 1)} for r in rounds_log],
                 hide_index=True, width="stretch")
    st.caption("participants: sites whose reply was used / sites asked; candidates: units "
               "proposed but not yet voted in; ops: what the sites sent (add, agree, edit, "
               "remove a unit) and what the server did with it (merged, promoted to active, "
               "retired).")
    st.markdown("**Each site, each round**")
    st.dataframe([{"round": r.round, "site": site, **m} for r in rounds_log
                  for site, m in r.sites.items()], hide_index=True,
                 width="stretch")
    st.caption("learn-tasks / learn-success: the site's own tasks its agents attempted / "
               "verified; eval-tasks / eval-success: the same on its held-out tasks; "
               "proposed: units it drew from its successes; dropped-privacy: of those, held "
               "back by its privacy filter; dropped-gate: held back because they did not help "
               "on its gate tasks; reviewed: votes it cast on other sites' units; sent-ops: "
               "what it sent. Empty: the site did not do that step (a listener contributes "
               "nothing).")
    kb = read_or_none("knowledge base", lambda: load_latest_kb(files.path("federation")))
    if kb and kb.units:
        st.markdown(f"**Knowledge units after round {kb.round}**")
        st.caption("Sites for and against count one vote each; support is the sum of the "
                   "counts the sites reported.")
        st.dataframe([{"family": u.family, "unit": u.text, "status": u.status,
                       "sites for": votes(u)[0], "against": votes(u)[1],
                       "support": sum(u.support.values()),
                       "proposed in round": u.created_round,
                       "active since": u.promoted_round}
                      for u in sorted(kb.units.values(),
                                      key=lambda u: (u.status != "active", u.family, u.id))],
                     hide_index=True, width="stretch")
    if report:
        st.markdown("**Final evaluation** (every site's held-out tasks)")
        st.dataframe([{"units": t.label, "verified": f"{t.verified}/{t.n}",
                       "95% interval": interval(*t.ci95) if t.ci95 is not None else "-",
                       "p vs federated": p_value(t.mcnemar_p_vs_federated)}
                      for t in report.conditions], hide_index=True)
        st.caption("Tasks verified with no units, with only the site's own units (local-only) "
                   "and with the federated units; p vs federated: exact McNemar test against "
                   "the federated units on the same tasks.")
        show_image(files.path("plot"), "Each site's success by round")
    st.stop()

report = report if isinstance(report, LoraReport) else None

m1, m2, m3, m4 = st.columns(4)
m1.metric("Rounds done", len(train))
m2.metric("Failed rounds", sum(r.status == "failed" for r in train))
mb = [(r.bytes_down + r.bytes_up) / 1e6 for r in train]
m3.metric("MB per round", f"{sum(mb) / len(mb):.1f}" if mb else "–",
          help="adapter tensors sent to the sites plus those sent back")
m4.metric("Canaries leaked", report.figures.canary_leaks if report else "–",
          help="secret strings planted in sites' rows, searched in every reply")

tab_rounds, tab_sites, tab_cond = st.tabs(["Rounds", "By site", "Conditions"])
with tab_rounds:
    st.dataframe([{"round": r.round, "kind": r.kind, "status": r.status,
                   "participants": f"{r.used}/{r.sent}", "failures": len(r.failures),
                   "examples": r.num_examples, "MB down": round(r.bytes_down / 1e6, 2),
                   "MB up": round(r.bytes_up / 1e6, 2), "seconds": round(r.seconds, 1),
                   "sha256": r.sha256[:12]} for r in rounds_log],
                 hide_index=True, width="stretch")
    st.caption("participants: sites whose reply was used / sites asked; examples: training "
               "rows the sites used; MB down / up: adapter tensors sent to the sites / sent "
               "back; sha256: the start of the global adapter's hash after the round.")
    failures = [dict(round=r.round, **f) for r in rounds_log for f in r.failures]
    if failures:
        with st.expander(f"Failures ({len(failures)})"):
            st.dataframe(failures, hide_index=True, width="stretch")
with tab_sites:
    rows = [{"round": r.round, "kind": r.kind, "site": site, **{k: round(v, 4)
            for k, v in m.items()}} for r in rounds_log for site, m in r.sites.items()]
    st.dataframe(rows, hide_index=True, width="stretch")
    if train:
        chart: dict[str, dict[int, float]] = {}  # site: {round: loss}
        for r in train:
            for site, m in r.sites.items():
                if "eval-loss-before" in m:
                    chart.setdefault(site, {})[r.round - 1] = m["eval-loss-before"]
        st.caption("Held-out loss of the global adapter each site received, by round")
        st.line_chart(chart)
with tab_cond:
    if report is None:
        st.caption("The report is written when the baselines and evaluations finish.")
    else:
        st.dataframe([{"condition": t.label,
                       "held-out loss": round(t.eval_loss, 4) if t.eval_loss else None,
                       "MC accuracy": None if t.mc_accuracy is None
                       else percent(t.mc_accuracy),
                       "95% interval": interval(*t.mc_ci95) if t.mc_ci95 else "",
                       "predictions A/B/C/D": "/".join(str(t.predictions[k]) for k in "ABCD"),
                       "p vs federated": p_value(t.mcnemar_p_vs_federated)}
                      for t in report.conditions], hide_index=True,
                     width="stretch")
        st.caption("no training: the base model; local-only: each site alone on its own "
                   "rows; federated: the shared adapter; centralised: all rows pooled in one "
                   "place (what federation tries to match without moving data); the last "
                   "three trained the same number of steps. held-out loss: per token on the "
                   "sites' held-out rows, lower is better; MC accuracy: on their held-out "
                   "multiple-choice questions; predictions A/B/C/D: how often each letter "
                   "was picked (one letter picked always means the model is guessing); p vs "
                   "federated: exact McNemar test against the federated condition.")
        show_image(files.path("plot"), "Each site's held-out loss by round")
