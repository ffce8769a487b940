"""Track B's report: no units / local-only / federated units on every site's eval slice (rates
with intervals, paired tests, the listener's transfer), success by round, the active units,
what crossed the wire against a LoRA round, and whether the adversary's workflow ever became
active.

`report.json` is a typed `federated.results.KnowledgeReport`, written by
`federated.report.write_files` beside track A's."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from workbench.evaluate.stats import mcnemar_exact, wilson_interval
from workbench.federated.config import FederatedConfig, parse_agent_settings
from workbench.federated.knowledge.site import POISON
from workbench.federated.knowledge.units import Unit, votes
from workbench.federated.report import write_files
from workbench.federated.results import (
    KnowledgeCondition,
    KnowledgeFigures,
    KnowledgeReport,
    Transfer,
)
from workbench.federated.server import read_rounds
from workbench.io import atomic_savefig
from workbench.runs import outputs_at
from workbench.text import MISSING, markdown_table, number, p_value, percent, percent_interval

KCONDS = {"none": "no units", "local": "local-only units", "federated": "federated units"}
POISON_FLOW = ("lookup", list(POISON))  # the unit the adversary site proposes


def _rate(rows: list[dict], key: str = "eval") -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        for site, m in r["sites"].items():
            if m.get(f"{key}-tasks"):
                out[site].append((r["round"], m[f"{key}-success"] / m[f"{key}-tasks"]))
    return out


@dataclass
class _KnowledgeRun:
    """What the knowledge report is made of, read once."""

    fc: FederatedConfig
    sites: list[str]
    meta: dict[str, dict]  # site -> one of its eval rows (scaffold, contributes, poison)
    by: dict[str, dict[str, dict]]  # condition -> site -> eval row
    fed_rounds: list[dict]
    fed_rate: dict[str, list[tuple[int, float]]]  # site -> (round, eval success)
    local_rate: dict[str, dict[int, float]]  # site -> round -> eval success, local-only
    wire: dict


@dataclass
class _Poison:
    """The adversary's workflow over the rounds' knowledge bases."""

    active: int = 0  # (round, unit) pairs in which it was active
    most_for: int = 0
    most_against: int = 0


def write_knowledge_report(out: Path, fc: FederatedConfig, rows: list[dict], summary: dict, *,
                           adapter_bytes: int | None, seconds: float) -> KnowledgeReport:
    files = outputs_at("fed", out)
    run = _read_knowledge_run(out, fc, rows, summary)
    table = _knowledge_table(run)
    transfer = _transfer(run)
    poison = _poison(files.path("kb"))
    lora_round = 2 * len(run.sites) * adapter_bytes if adapter_bytes else None
    figures = _knowledge_figures(run, table, transfer, poison, lora_round,
                                 len(summary.get("active", [])), seconds)
    how, budget, unit = _agent_description(fc.knowledge)
    lines = [*_knowledge_setup(run, how, budget, seconds),
             *_knowledge_final(run, table, unit), *_knowledge_transfer(transfer),
             *_knowledge_by_round(run), *_knowledge_active(summary.get("active", [])),
             *_knowledge_wire(run, figures, lora_round, poison)]
    _plot_knowledge(files.path("plot"), run.fed_rate, run.local_rate, run.sites)
    report = KnowledgeReport(figures=figures, conditions=table,
                             headline=_knowledge_headline(table))
    return write_files(files, lines, "success by round", report)


def _read_knowledge_run(out: Path, fc: FederatedConfig, rows: list[dict],
                        summary: dict) -> _KnowledgeRun:
    files = outputs_at("fed", out)
    fed_rounds = read_rounds(files.path("federation"))
    sites = sorted({r["site"] for r in rows})
    by: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        by[r["condition"]][r["site"]] = r
    local_rate = {s: dict(_rate(read_rounds(files.path("local") / s)).get(s, []))
                  for s in sites}
    return _KnowledgeRun(fc=fc, sites=sites, meta={r["site"]: r for r in rows}, by=by,
                         fed_rounds=fed_rounds, fed_rate=_rate(fed_rounds),
                         local_rate=local_rate, wire=summary.get("wire", {}))


def _knowledge_table(run: _KnowledgeRun) -> list[KnowledgeCondition]:
    """Per condition: tasks verified with its interval, per site, and the paired test."""
    by, sites = run.by, run.sites
    table = []
    for cond in [c for c in KCONDS if c in by]:
        ver = [v for s in sites for v in by[cond][s]["verified"]]
        k, n = sum(ver), len(ver)
        p = None
        if cond != "federated" and "federated" in by:
            p = mcnemar_exact(ver, [v for s in sites for v in by["federated"][s]["verified"]])
        table.append(KnowledgeCondition(
            condition=cond, label=KCONDS[cond], verified=k, n=n, rate=k / n if n else None,
            ci95=wilson_interval(k, n) if n else None,
            by_site={s: (sum(by[cond][s]["verified"]), len(by[cond][s]["verified"]))
                     for s in sites},
            iterations=sum(i for s in sites for i in by[cond][s]["iterations"]),
            mcnemar_p_vs_federated=p))
    return table


def _transfer(run: _KnowledgeRun) -> Transfer | None:
    """The listener (a site that contributes nothing) with and without the federated units."""
    listener = next((s for s in run.sites if not run.meta[s]["contributes"]), None)
    if not (listener and "none" in run.by and "federated" in run.by):
        return None
    a, b = run.by["none"][listener]["verified"], run.by["federated"][listener]["verified"]
    return Transfer(site=listener, scaffold=run.meta[listener]["scaffold"],
                    none=(sum(a), len(a)), federated=(sum(b), len(b)),
                    mcnemar_p=mcnemar_exact(a, b))


def _poison(kb_dir: Path) -> _Poison:
    """Was the adversary's workflow ever active, and how many sites voted for and against."""
    p = _Poison()
    for path in sorted(kb_dir.glob("round-*.json")):
        kb = json.loads(path.read_text())
        for u in kb["units"].values():
            if (u["family"], u["steps"]) == POISON_FLOW:
                pro, con = votes(Unit.model_validate(u))
                p.most_for, p.most_against = max(p.most_for, pro), max(p.most_against, con)
                p.active += u["status"] == "active"
    return p


def _knowledge_figures(run: _KnowledgeRun, table: list[KnowledgeCondition],
                       transfer: Transfer | None, poison: _Poison, lora_round: int | None,
                       active_units: int, seconds: float) -> KnowledgeFigures:
    kbytes = [r["bytes_down"] + r["bytes_up"] for r in run.fed_rounds]
    return KnowledgeFigures(
        sites=len(run.sites), rounds=run.fc.rounds, rate={t.condition: t.rate for t in table},
        active_units=active_units, knowledge_bytes_per_round=sum(kbytes) / max(len(kbytes), 1),
        lora_bytes_per_round=lora_round, canary_leaks=run.wire.get("canary_leaks"),
        poison_active_rounds=poison.active, poison_sites_against=poison.most_against,
        transfer=transfer, seconds=round(seconds, 1))


def _knowledge_headline(table: list[KnowledgeCondition]) -> str:
    fed_t = next((t for t in table if t.condition == "federated"), None)
    none_t = next((t for t in table if t.condition == "none"), None)
    return (f"eval success {fed_t.verified}/{fed_t.n} with federated units vs "
            f"{none_t.verified}/{none_t.n} without" if fed_t and none_t else "")


def _agent_description(ks) -> tuple[str, str, str]:
    """(how a site works its tasks, the eval budget, the unit the budget is counted in)."""
    if ks.agent == "prompted":
        agent = parse_agent_settings(ks.prompted)
        how = (f"a prompted agent: the chat model `{agent.model}` runs the site's scaffold "
               f"(ReAct, plan-then-execute or Reflexion with {agent.trials} trials) with the "
               f"tools run_sql and answer, choosing among {agent.candidates} grammar plans by "
               f"log-likelihood, with the units of the question's family in its system prompt")
        return how, f"{agent.max_steps} model turns per trial", "model turns"
    how = (f"its scaffold as a search strategy over the query grammar "
           f"({ks.learn_iterations} iterations per task), units reweighting its prior")
    return how, f"{ks.eval_iterations} iterations", "iterations"


def _knowledge_setup(run: _KnowledgeRun, how: str, budget: str, seconds: float) -> list[str]:
    """The title, what a site does in a round, and the sites."""
    fc, ks, meta = run.fc, run.fc.knowledge, run.meta
    lines = [f"# Federated knowledge units: {len(run.sites)} data-agent sites x {fc.rounds} "
             f"rounds", "", f"Each site works its learning tasks with {how}, and the units in "
             f"its view; it proposes operations "
             f"(a workflow needs {ks.min_support} verified plan(s)), filters them (privacy), gates "
             f"them (A/B on a gate slice: {'on' if ks.gate else 'off'}) and sends operations "
             f"and counts. A unit is active when {ks.k_min} sites support it. Success is the "
             f"share of a held-back slice of each site's tasks verified within "
             f"{budget}. Wall time {seconds:.0f} s.", "",
             "## Sites", "",
             markdown_table(["site", "scaffold", "contributes", "adversary"],
                            [[s, meta[s]["scaffold"], "yes" if meta[s]["contributes"] else "no",
                              "yes" if meta[s]["poison"] else ""] for s in run.sites])]
    return lines


def _knowledge_final(run: _KnowledgeRun, table: list[KnowledgeCondition], unit: str
                     ) -> list[str]:
    """The final evaluation: each condition's units on every site's eval slice."""
    sites = run.sites
    lines = ["", "## Final evaluation", "",
             "Wilson 95% intervals; p: exact McNemar against federated units on the same "
             "tasks.", ""]
    rows = [[t.label, f"{t.verified}/{t.n} = {percent_interval(t.rate, *(t.ci95 or (0, 0)))}",
             *(f"{a}/{b}" for a, b in (t.by_site[s] for s in sites)), t.iterations,
             p_value(t.mcnemar_p_vs_federated)] for t in table]
    return lines + [markdown_table(["units", "verified [95% CI]", *sites, unit,
                                    "p vs federated"], rows)]


def _knowledge_transfer(transfer: Transfer | None) -> list[str]:
    if transfer is None:
        return []
    return ["", "## Cross-scaffold transfer", "",
            f"{transfer.site} ({transfer.scaffold}) contributed nothing: with the "
            f"units the other sites' scaffolds evolved it verified "
            f"{transfer.federated[0]}/{transfer.federated[1]} vs "
            f"{transfer.none[0]}/{transfer.none[1]} without (McNemar p "
            f"{p_value(transfer.mcnemar_p)})."]


def _knowledge_by_round(run: _KnowledgeRun) -> list[str]:
    """Each round: every site's eval success, federated and local-only, and the wire."""
    sites, lr = run.sites, run.local_rate
    lines = ["", "## By round", "", "Each site's eval success with the view it received "
             "(round 1: no units yet); federated vs local-only.", "",
             ]
    rows = []
    for r in run.fed_rounds:
        cells = []
        for s in sites:
            cells += [percent(dict(run.fed_rate.get(s, [])).get(r["round"])),
                      percent(lr[s].get(r["round"]))]
        ops = ", ".join(f"{k} {v}" for k, v in r["ops"].items() if v)
        rows.append([r["round"], *cells, r["active"], ops or MISSING,
                     number(r["bytes_down"] / 1e3, 1), number(r["bytes_up"] / 1e3, 1)])
    header = ["round", *(f"{s} {w}" for s in sites for w in ("fed", "local")), "active units",
              "ops", "KB down", "KB up"]
    return lines + [markdown_table(header, rows)]


def _knowledge_active(active: list[dict]) -> list[str]:
    return ["", "## Active units", "",
            markdown_table(["family", "unit (workflow or insight)", "sites for", "against",
                            "support (counts)"],
                           [[u["family"], u["text"], u["sites"], u["against"], u["support"]]
                            for u in active])]


def _knowledge_wire(run: _KnowledgeRun, figures: KnowledgeFigures, lora_round: int | None,
                    poison: _Poison) -> list[str]:
    """What left the sites: bytes against LoRA's, canaries, record names, the adversary."""
    kb_round, wire = figures.knowledge_bytes_per_round, run.wire
    lora = (f" vs {lora_round / 1e6:.1f} MB for the LoRA adapters of `{run.fc.model}` "
            f"({lora_round / max(kb_round, 1):,.0f}x)" if lora_round else "")
    return ["", "## What left the sites", "",
            f"- bytes per round: knowledge {kb_round / 1e3:.1f} kB" + lora,
            f"- planted canaries found in replies: {wire.get('canary_leaks')} (of "
            f"{wire.get('canaries')} planted in the sites' data)",
            f"- record names: {', '.join(wire.get('record_names', []))}",
            f"- adversary's workflow (`{' -> '.join(POISON_FLOW[1])}` for lookups) active in "
            f"{poison.active} of {len(run.fed_rounds)} rounds; most sites for it: "
            f"{poison.most_for}, against it: {poison.most_against} "
            f"(k_min {run.fc.knowledge.k_min})"]


def _plot_knowledge(path: Path, fr, lr, sites) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for s in sites:
        pts = fr.get(s, [])
        if pts:
            line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                            label=f"{s} federated")
            loc = sorted(lr[s].items())
            if loc:
                ax.plot([p[0] for p in loc], [p[1] for p in loc], linestyle=":",
                        color=line.get_color(), label=f"{s} local-only")
    ax.set_xlabel("round (its eval uses the view received that round)")
    ax.set_ylabel("share of eval tasks verified")
    ax.set_title("Site success by round")
    ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path)
    plt.close(fig)
