"""The federated report: conditions x sites (held-out loss, MC accuracy with intervals,
prediction distributions, paired tests against the federation), rounds (per-site loss of the
global adapter, bytes, time, failures), what left the sites, and a plot.

`report.json` is a typed record (`federated.results`): the writers here build it and dump it;
`read_report` is its one reader."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from workbench.federated.config import FederatedConfig
from workbench.federated.results import (
    FedFiles,
    FedReport,
    KnowledgeCondition,
    KnowledgeFigures,
    KnowledgeReport,
    LoraCondition,
    LoraFigures,
    LoraReport,
    Transfer,
    read_report,
)
from workbench.federated.server import read_rounds
from workbench.io import atomic_write_json, atomic_write_text

__all__ = ["FedFiles", "FedReport", "KnowledgeReport", "LoraReport", "read_report",
           "write_knowledge_report", "write_report"]

ORDER = ["initial", "local", "federated", "central"]
LABELS = {"initial": "no training", "local": "local-only", "federated": "federated",
          "central": "centralised"}
R = TypeVar("R", LoraReport, KnowledgeReport)


# --- track A ------------------------------------------------------------------------------------

def _mean_loss(rows: list[dict]) -> float | None:
    num = sum(r["eval_loss"] * r["n_eval"] for r in rows if r.get("eval_loss") is not None)
    den = sum(r["n_eval"] for r in rows if r.get("eval_loss") is not None)
    return num / den if den else None


def _fmt(x: float | None, nd: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def condition_table(rows: list[dict]) -> list[LoraCondition]:
    from workbench.evaluate.stats import mcnemar_exact, prediction_counts, wilson_interval

    by_cond: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_cond[r["condition"]].append(r)
    fed = {r["site"]: r for r in by_cond.get("federated", [])}
    table = []
    for cond in [c for c in ORDER if c in by_cond]:
        rs = sorted(by_cond[cond], key=lambda r: r["site"])
        correct = [c for r in rs for c in r["mc_correct"]]
        preds = [p for r in rs for p in r["mc_predictions"]]
        k, n = sum(correct), len(correct)
        p = None
        if cond != "federated" and fed and all(r["site"] in fed for r in rs):
            base = [c for r in rs for c in fed[r["site"]]["mc_correct"]]
            if len(base) == len(correct) and n:
                p = mcnemar_exact(correct, base)
        table.append(LoraCondition(
            condition=cond, label=LABELS[cond], eval_loss=_mean_loss(rs),
            eval_loss_by_site={r["site"]: r["eval_loss"] for r in rs}, mc_correct=k, mc_n=n,
            mc_accuracy=k / n if n else None, mc_ci95=wilson_interval(k, n) if n else None,
            predictions=prediction_counts(preds, "ABCD"), mcnemar_p_vs_federated=p))
    return table


def write_report(out: Path, fc: FederatedConfig, sites, rows: list[dict], summary: dict, *,
                 seconds: float) -> LoraReport:
    files = FedFiles(out)
    train_rounds = [r for r in read_rounds(files.federated) if r["kind"] == "train"]
    table = condition_table(rows)
    by = {t.condition: t for t in table}
    wire = summary.get("wire", {})
    names = [s.name for s in sites]
    figures = _lora_figures(fc, sites, by, train_rounds, wire, seconds)
    lines = [*_lora_setup(fc, sites, seconds), *_lora_conditions(table, names),
             *_lora_rounds(train_rounds, names), *_lora_wire(wire, sites)]
    _plot(files.plot, train_rounds, by, names)
    report = LoraReport(figures=figures, conditions=table, headline=_lora_headline(by))
    return _write(files, lines, "loss by round", report)


def _lora_figures(fc: FederatedConfig, sites, by: dict[str, LoraCondition],
                  train_rounds: list[dict], wire: dict, seconds: float) -> LoraFigures:
    return LoraFigures(
        sites=len(sites), rounds=fc.rounds,
        eval_loss={c: (round(t.eval_loss, 4) if t.eval_loss is not None else None)
                   for c, t in by.items()},
        mc_accuracy={c: t.mc_accuracy for c, t in by.items()},
        bytes_per_round=(sum(r["bytes_down"] + r["bytes_up"] for r in train_rounds)
                         / max(len(train_rounds), 1)),
        round_seconds=(sum(r["seconds"] for r in train_rounds) / max(len(train_rounds), 1)),
        failed_rounds=sum(r["status"] == "failed" for r in train_rounds),
        canary_leaks=wire.get("canary_leaks"),
        seconds=round(seconds, 1),
    )


def _loss(by: dict[str, LoraCondition], cond: str, site: str | None = None) -> float | None:
    """A condition's pooled held-out loss, or its loss on `site` (None: not evaluated)."""
    t = by.get(cond)
    if t is None:
        return None
    return t.eval_loss if site is None else t.eval_loss_by_site.get(site)


def _lora_headline(by: dict[str, LoraCondition]) -> str:
    return (f"held-out loss federated {_fmt(_loss(by, 'federated'))} vs local-only "
            f"{_fmt(_loss(by, 'local'))} vs centralised {_fmt(_loss(by, 'central'))}")


def _lora_setup(fc: FederatedConfig, sites, seconds: float) -> list[str]:
    """The title, how the run was set up, and the sites' data."""
    lines = [f"# Federated LoRA: {len(sites)} sites x {fc.rounds} rounds "
             f"({fc.aggregation})", "",
             f"Model `{fc.model}`; each site trains {fc.local.steps} steps per round "
             f"(batch {fc.local.batch_size}, lr {fc.local.learning_rate:g}, LoRA r "
             f"{fc.local.lora.r}). Baselines use the same total steps: local-only "
             f"{fc.rounds * fc.local.steps} per site, centralised "
             f"{fc.rounds * fc.local.steps * len(sites)} on the pooled rows. Wall time "
             f"{seconds:.0f} s.", "",
             "## Sites", "", "| site | train rows | eval rows | MC items |", "|---|---|---|---|"]
    return lines + [f"| {s.name} | {len(s.train)} | {len(s.eval)} | {len(s.benchmark)} |"
                    for s in sites]


def _lora_conditions(table: list[LoraCondition], names: list[str]) -> list[str]:
    """The table of conditions (loss per site, MC accuracy, predictions, paired test)."""
    lines = ["", "## Conditions", "",
             "Held-out loss is per labelled token on each site's own eval rows (pooled: "
             "weighted by rows). MC accuracy is cloze (length-normalised log-likelihood) over "
             "every site's benchmark items; the interval is Wilson 95%, p is the exact "
             "McNemar test against the federated adapter on the same items.", "",
             "| condition | pooled loss | " + " | ".join(f"loss {n}" for n in names)
             + " | MC acc [95% CI] | predictions A/B/C/D | p vs federated |",
             "|---|---|" + "---|" * len(names) + "---|---|---|"]
    for t in table:
        ci = t.mc_ci95
        acc = (f"{t.mc_correct}/{t.mc_n} = {t.mc_accuracy:.2f} "
               f"[{ci[0]:.2f}, {ci[1]:.2f}]") if t.mc_n else "–"
        pc = "/".join(str(t.predictions[k]) for k in "ABCD")
        p = t.mcnemar_p_vs_federated
        lines.append(f"| {t.label} | {_fmt(t.eval_loss)} | "
                     + " | ".join(_fmt(t.eval_loss_by_site.get(n)) for n in names)
                     + f" | {acc} | {pc} | {_fmt(p, 2) if p is not None else '–'} |")
    n_items = max((t.mc_n for t in table), default=0)
    if n_items:
        lo, hi = table[0].mc_ci95
        lines += ["", f"With {n_items} MC items an interval is about ±{(hi - lo) / 2:.2f}: "
                      "accuracy differences smaller than that are not results; the held-out "
                      "loss is the finer measure here."]
    return lines


def _lora_rounds(train_rounds: list[dict], names: list[str]) -> list[str]:
    """The table of training rounds: what each site received, bytes, time, product gap."""
    lines = ["", "## Rounds", "",
             "Loss before = the global adapter of the previous round on the site's eval "
             "rows (what the site received); bytes are adapter tensors, down + up.", "",
             "| round | status | replies used | " + " | ".join(f"loss before {n}"
                                                             for n in names)
             + " | MB down | MB up | seconds | product gap |",
             "|---|---|---|" + "---|" * len(names) + "---|---|---|---|"]
    for r in train_rounds:
        gap = r.get("product_gap")
        lines.append(f"| {r['round']} | {r['status']} | {r['used']}/{r['sent']} | "
                     + " | ".join(_fmt(r["sites"].get(n, {}).get("eval-loss-before"))
                                  for n in names)
                     + f" | {r['bytes_down'] / 1e6:.2f} | {r['bytes_up'] / 1e6:.2f} | "
                       f"{r['seconds']:.1f} | {_fmt(gap, 4) if gap is not None else '–'} |")
    return lines + ["", "Product gap: max over LoRA modules of ‖B̄Ā − mean(BᵢAᵢ)‖/‖mean(BᵢAᵢ)‖, "
                        "how far averaging A and B separately lands from averaging the updates "
                        "(0 with aggregation=ffa)."]


def _lora_wire(wire: dict, sites) -> list[str]:
    """What left the sites: replies, bytes, record names, canaries, long strings."""
    return ["", "## What left the sites", "",
            f"- replies: {wire.get('replies')}, {wire.get('bytes', 0) / 1e6:.2f} MB in all; "
            f"record names {', '.join(wire.get('record_names', []))}",
            f"- planted canaries found in replies: {wire.get('canary_leaks')} "
            f"(of {sum(len(s.canaries) for s in sites)} planted)",
            f"- strings longer than 64 characters: {wire.get('long_strings')}"]


def _write(files: FedFiles, lines: list[str], plot_title: str, report: R) -> R:
    """report.md, then report.json: the record dumped as the reader reads it."""
    lines = [*lines, "", f"![{plot_title}]({files.plot.name})"]
    atomic_write_text(files.report_md, "\n".join(lines) + "\n")
    atomic_write_json(files.report_json, report.model_dump())
    return report


def _plot(path: Path, train_rounds: list[dict], by: dict[str, LoraCondition],
          names: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from workbench.io import atomic_savefig

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, n in enumerate(names):
        xs = [r["round"] - 1 for r in train_rounds if n in r["sites"]
              and "eval-loss-before" in r["sites"][n]]
        ys = [r["sites"][n]["eval-loss-before"] for r in train_rounds if n in r["sites"]
              and "eval-loss-before" in r["sites"][n]]
        fed_final = _loss(by, "federated", n)
        if fed_final is not None and train_rounds:
            xs, ys = xs + [train_rounds[-1]["round"]], ys + [fed_final]
        line, = ax.plot(xs, ys, marker="o", label=f"{n} (global adapter)")
        for cond, style in (("local", ":"), ("central", "--")):
            v = _loss(by, cond, n)
            if v is not None:
                ax.axhline(v, color=line.get_color(), linestyle=style, linewidth=1,
                           label=f"{n} {LABELS[cond]}" if i == 0 else None)
    ax.set_xlabel("round (0 = before training)")
    ax.set_ylabel("held-out loss per token")
    ax.set_title("Each site's held-out loss of the global adapter")
    ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path)
    plt.close(fig)


# --- track B ----------------------------------------------------------------------------------

KCONDS = {"none": "no units", "local": "local-only units", "federated": "federated units"}
POISON_FLOW = ("lookup", ["op=count", "lit=conds:gt"])  # trajsynth.knowledge.POISON


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
    files = FedFiles(out)
    run = _read_knowledge_run(out, fc, rows, summary)
    table = _knowledge_table(run)
    transfer = _transfer(run)
    poison = _poison(files.federation.kb)
    lora_round = 2 * len(run.sites) * adapter_bytes if adapter_bytes else None
    figures = _knowledge_figures(run, table, transfer, poison, lora_round,
                                 len(summary.get("active", [])), seconds)
    how, budget, unit = _agent_description(fc.knowledge)
    lines = [*_knowledge_setup(run, how, budget, seconds),
             *_knowledge_final(run, table, unit), *_knowledge_transfer(transfer),
             *_knowledge_by_round(run), *_knowledge_active(summary.get("active", [])),
             *_knowledge_wire(run, figures, lora_round, poison)]
    _plot_knowledge(files.plot, run.fed_rate, run.local_rate, run.sites)
    report = KnowledgeReport(figures=figures, conditions=table,
                             headline=_knowledge_headline(table))
    return _write(files, lines, "success by round", report)


def _read_knowledge_run(out: Path, fc: FederatedConfig, rows: list[dict],
                        summary: dict) -> _KnowledgeRun:
    fed_rounds = read_rounds(FedFiles(out).federated)
    sites = sorted({r["site"] for r in rows})
    by: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        by[r["condition"]][r["site"]] = r
    local_rate = {s: dict(_rate(read_rounds(FedFiles(out).local / s)).get(s, [])) for s in sites}
    return _KnowledgeRun(fc=fc, sites=sites, meta={r["site"]: r for r in rows}, by=by,
                         fed_rounds=fed_rounds, fed_rate=_rate(fed_rounds),
                         local_rate=local_rate, wire=summary.get("wire", {}))


def _knowledge_table(run: _KnowledgeRun) -> list[KnowledgeCondition]:
    """Per condition: tasks verified with its interval, per site, and the paired test."""
    from workbench.evaluate.stats import mcnemar_exact, wilson_interval

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
    from workbench.evaluate.stats import mcnemar_exact

    listener = next((s for s in run.sites if not run.meta[s]["contributes"]), None)
    if not (listener and "none" in run.by and "federated" in run.by):
        return None
    a, b = run.by["none"][listener]["verified"], run.by["federated"][listener]["verified"]
    return Transfer(site=listener, scaffold=run.meta[listener]["scaffold"],
                    none=(sum(a), len(a)), federated=(sum(b), len(b)),
                    mcnemar_p=mcnemar_exact(a, b))


def _poison(kb_dir: Path) -> _Poison:
    """Was the adversary's workflow ever active, and how many sites voted for and against."""
    from workbench.federated.knowledge import Unit, votes

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
        from workbench import services

        agent = services.knowledge_agent_settings()(ks.prompted)
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
             "## Sites", "", "| site | scaffold | contributes | adversary |", "|---|---|---|---|"]
    return lines + [f"| {s} | {meta[s]['scaffold']} | "
                    f"{'yes' if meta[s]['contributes'] else 'no'} | "
                    f"{'yes' if meta[s]['poison'] else ''} |" for s in run.sites]


def _knowledge_final(run: _KnowledgeRun, table: list[KnowledgeCondition], unit: str
                     ) -> list[str]:
    """The final evaluation: each condition's units on every site's eval slice."""
    sites = run.sites
    lines = ["", "## Final evaluation", "",
             "Wilson 95% intervals; p: exact McNemar against federated units on the same "
             "tasks.", "",
             "| units | verified [95% CI] | " + " | ".join(sites)
             + f" | {unit} | p vs federated |",
             "|---|---|" + "---|" * len(sites) + "---|---|"]
    for t in table:
        lo, hi = t.ci95 or (0, 0)
        p = t.mcnemar_p_vs_federated
        lines.append(f"| {t.label} | {t.verified}/{t.n} = {t.rate:.2f} "
                     f"[{lo:.2f}, {hi:.2f}] | "
                     + " | ".join(f"{a}/{b}" for a, b in (t.by_site[s] for s in sites))
                     + f" | {t.iterations} | {_fmt(p, 3) if p is not None else '–'} |")
    return lines


def _knowledge_transfer(transfer: Transfer | None) -> list[str]:
    if transfer is None:
        return []
    return ["", "## Cross-scaffold transfer", "",
            f"{transfer.site} ({transfer.scaffold}) contributed nothing: with the "
            f"units the other sites' scaffolds evolved it verified "
            f"{transfer.federated[0]}/{transfer.federated[1]} vs "
            f"{transfer.none[0]}/{transfer.none[1]} without (McNemar p "
            f"{transfer.mcnemar_p:.3f})."]


def _knowledge_by_round(run: _KnowledgeRun) -> list[str]:
    """Each round: every site's eval success, federated and local-only, and the wire."""
    sites, lr = run.sites, run.local_rate
    lines = ["", "## By round", "", "Each site's eval success with the view it received "
             "(round 1: no units yet); federated vs local-only.", "",
             "| round | " + " | ".join(f"{s} fed | {s} local" for s in sites) + " | active "
             "units | ops | KB down | KB up |",
             "|---|" + "---|---|" * len(sites) + "---|---|---|---|"]
    for r in run.fed_rounds:
        cells = []
        for s in sites:
            f = dict(run.fed_rate.get(s, [])).get(r["round"])
            cells += [_fmt(f, 2) if f is not None else "–",
                      _fmt(lr[s].get(r["round"]), 2) if lr[s].get(r["round"]) is not None
                      else "–"]
        ops = ", ".join(f"{k} {v}" for k, v in r["ops"].items() if v)
        lines.append(f"| {r['round']} | " + " | ".join(cells) + f" | {r['active']} | "
                     f"{ops or '–'} | {r['bytes_down'] / 1e3:.1f} | {r['bytes_up'] / 1e3:.1f} |")
    return lines


def _knowledge_active(active: list[dict]) -> list[str]:
    return ["", "## Active units", "",
            "| family | unit (workflow or insight) | sites for | against | support (counts) |",
            "|---|---|---|---|---|",
            *(f"| {u['family']} | {u['text']} | {u['sites']} | {u['against']} | "
              f"{u['support']} |" for u in active)]


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

    from workbench.io import atomic_savefig

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
