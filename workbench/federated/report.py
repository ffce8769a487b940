"""The federated report: conditions x sites (held-out loss, MC accuracy with intervals,
prediction distributions, paired tests against the federation), rounds (per-site loss of the
global adapter, bytes, time, failures), what left the sites, and a plot.

`report.json` is a typed record (`federated.results`): the writers here build it and dump it;
`read_report` is its one reader."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TypeVar

from workbench.evaluate.stats import mcnemar_exact, prediction_counts, wilson_interval
from workbench.federated.config import FederatedConfig
from workbench.federated.results import (
    FedReport,
    KnowledgeReport,
    LoraCondition,
    LoraFigures,
    LoraReport,
    read_report,
)
from workbench.federated.server import read_rounds
from workbench.io import atomic_savefig, atomic_write_json, atomic_write_text
from workbench.runs import Outputs, outputs_at
from workbench.text import MISSING, markdown_table, number, p_value, percent_interval, points

__all__ = [
    "FedReport",
    "KnowledgeReport",
    "LoraReport",
    "read_report",
    "write_files",
    "write_report",
]

ORDER = ["initial", "local", "federated", "central"]
LABELS = {"initial": "no training", "local": "local-only", "federated": "federated",
          "central": "centralised"}
R = TypeVar("R", LoraReport, KnowledgeReport)


# --- track A ------------------------------------------------------------------------------------

def _mean_loss(rows: list[dict]) -> float | None:
    num = sum(r["eval_loss"] * r["n_eval"] for r in rows if r.get("eval_loss") is not None)
    den = sum(r["n_eval"] for r in rows if r.get("eval_loss") is not None)
    return num / den if den else None


def condition_table(rows: list[dict]) -> list[LoraCondition]:
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
    files = outputs_at("fed", out)
    train_rounds = [r for r in read_rounds(files.path("federation")) if r["kind"] == "train"]
    table = condition_table(rows)
    by: dict[str, LoraCondition] = {t.condition: t for t in table}
    wire = summary.get("wire", {})
    names = [s.name for s in sites]
    figures = _lora_figures(fc, sites, by, train_rounds, wire, seconds)
    lines = [*_lora_setup(fc, sites, seconds), *_lora_conditions(table, names),
             *_lora_rounds(train_rounds, names), *_lora_wire(wire, sites)]
    _plot(files.path("plot"), train_rounds, by, names)
    report = LoraReport(figures=figures, conditions=table, headline=_lora_headline(by))
    return write_files(files, lines, "loss by round", report)


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
    return (f"held-out loss federated {number(_loss(by, 'federated'))} vs local-only "
            f"{number(_loss(by, 'local'))} vs centralised {number(_loss(by, 'central'))}")


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
             "## Sites", "",
             markdown_table(["site", "train rows", "eval rows", "MC items"],
                            [[s.name, len(s.train), len(s.eval), len(s.benchmark)]
                             for s in sites])]
    return lines


def _lora_conditions(table: list[LoraCondition], names: list[str]) -> list[str]:
    """The table of conditions (loss per site, MC accuracy, predictions, paired test)."""
    lines = ["", "## Conditions", "",
             "Held-out loss is per labelled token on each site's own eval rows (pooled: "
             "weighted by rows). MC accuracy is cloze (length-normalised log-likelihood) over "
             "every site's benchmark items; the interval is Wilson 95%, p is the exact "
             "McNemar test against the federated adapter on the same items.", ""]
    rows = []
    for t in table:
        ci = t.mc_ci95
        acc = (f"{t.mc_correct}/{t.mc_n} = {percent_interval(t.mc_accuracy, *ci)}"
               if t.mc_n and ci is not None else MISSING)
        rows.append([t.label, number(t.eval_loss),
                     *(number(t.eval_loss_by_site.get(n)) for n in names), acc,
                     "/".join(str(t.predictions[k]) for k in "ABCD"),
                     p_value(t.mcnemar_p_vs_federated)])
    lines.append(markdown_table(["condition", "pooled loss", *(f"loss {n}" for n in names),
                                 "MC acc [95% CI]", "predictions A/B/C/D", "p vs federated"],
                                rows))
    n_items = max((t.mc_n for t in table), default=0)
    if n_items and (ci0 := table[0].mc_ci95) is not None:
        lo, hi = ci0
        lines += ["", f"With {n_items} MC items an interval is about "
                      f"±{points((hi - lo) / 2, signed=False)} points: "
                      "accuracy differences smaller than that are not results; the held-out "
                      "loss is the finer measure here."]
    return lines


def _lora_rounds(train_rounds: list[dict], names: list[str]) -> list[str]:
    """The table of training rounds: what each site received, bytes, time, product gap."""
    lines = ["", "## Rounds", "",
             "Loss before = the global adapter of the previous round on the site's eval "
             "rows (what the site received); bytes are adapter tensors, down + up.", "",
             markdown_table(
                 ["round", "status", "replies used", *(f"loss before {n}" for n in names),
                  "MB down", "MB up", "seconds", "product gap"],
                 [[r["round"], r["status"], f"{r['used']}/{r['sent']}",
                   *(number(r["sites"].get(n, {}).get("eval-loss-before")) for n in names),
                   number(r["bytes_down"] / 1e6, 2), number(r["bytes_up"] / 1e6, 2),
                   number(r["seconds"], 1), number(r.get("product_gap"), 4)]
                  for r in train_rounds])]
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


def write_files(files: Outputs, lines: list[str], plot_title: str, report: R) -> R:
    """report.md, then report.json: the record dumped as the reader reads it."""
    lines = [*lines, "", f"![{plot_title}]({files.path('plot').name})"]
    atomic_write_text(files.path("report_md"), "\n".join(lines) + "\n")
    atomic_write_json(files.path("report"), report.model_dump())
    return report


def _plot(path: Path, train_rounds: list[dict], by: dict[str, LoraCondition],
          names: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
