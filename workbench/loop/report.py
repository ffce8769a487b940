"""What the loop writes for people: each round's `report.md`, and `history.md` with
`history.png` (every round's per-subset deltas)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.io import atomic_savefig, atomic_write_text
from workbench.loop.agreement import agreement_markdown, judge_check
from workbench.loop.evaluator import Evaluator
from workbench.loop.records import JOBS, MODES, Round, round_name
from workbench.loop.store import RoundStore
from workbench.text import markdown_table, p_value, percent, percent_interval, points_interval


def round_markdown(ev: Evaluator, r: Round) -> str:
    p = r.plan
    lines = [f"# Round {r.index}: {p.target}", "",
             f"Status **{r.status}**; started from "
             f"{'the base model' if r.parent is None else 'adapter ' + r.parent[:12]}; "
             f"approved by {r.approved_by or '-'}.", "",
             f"**Plan.** Target `{p.target}`: {p.rationale}. Recipe: "
             + ", ".join(f"{k} {v}" for k, v in p.recipe.items())
             + f". Anchor weightings tried: {', '.join(f'{w:g}' for w in p.weightings)}.", ""]
    f = r.steps.get("failures", {})
    if f:
        lines += ["## Failures (current model: dev items, open questions on dev terms)", "",
                  markdown_table(["mode", "rows", "job"],
                                 [[m, n, MODES[m]] for m, n in sorted(f.get("modes", {}).items())])]
        if f.get("retrieval_hit") is not None:
            lines += ["", f"Tagging: {f.get('tagging')}; the section a failure needs was "
                          f"among those retrieved for {percent(f['retrieval_hit'])} of them."]
    g = r.steps.get("gates")
    if g:
        s = r.steps.get("synth", {})
        lines += ["", "## Data", "", "Synthesised: " + ", ".join(
            f"{j} {s.get(j, 0)}" for j in JOBS)
            + f" (rationales: {s.get('rationales_by_model', 0)} "
            f"by the model, {s.get('rationales_by_template', 0)} from templates; model "
            f"rationales refused: {s.get('rationales_off_answer', 0)} not naming the answer, "
            f"{s.get('rationales_ungrounded', 0)} with claims the section lacks). "
            f"Quality gates kept {g['kept']} of {g['in']}; dropped: "
            + (", ".join(f"{k} {v}" for k, v in g["dropped"].items()) or "none") + "."]
    m = r.steps.get("mixture")
    if m and m.get("probes"):
        lines += ["", "Mixture search (short LoRA runs, accuracy on a held-out dev slice): "
                  + "; ".join(f"anchors x{w}: {percent(v['accuracy'])} of {v['n']} "
                              f"({v['examples']} examples)" for w, v in m["probes"].items())
                  + f". Chosen: x{m['chosen']:g}."]
    if r.deltas:
        lines += ["", "## Per-subset deltas (candidate - current, same items, 95% intervals)",
                  "", markdown_table(
                      ["suite", "subset", "n", "current", "candidate", "delta [95% CI]", "p"],
                      [[d.suite, d.subset + (" (target)" if d.target else ""), d.n,
                        percent_interval(d.before, *d.before_ci),
                        percent_interval(d.after, *d.after_ci),
                        points_interval(d.delta, d.ci_low, d.ci_high), p_value(d.p_value)]
                       for d in r.deltas])]
        lines += ["", "MC subsets: accuracy with Wilson intervals, paired bootstrap interval "
                  "of the delta, exact McNemar p. Open: HealthBench rubric score, bootstrap "
                  "intervals, sign-flip p. A delta whose interval holds 0 is not a result at "
                  "this size; the guards still act on the point estimate, to stop "
                  "regressions early."]
    if r.guards:
        lines += ["", "## Guards", "", markdown_table(
            ["guard", "limit", "passed", "measured"],
            [[x.guard.name, f"{x.guard.limit:g}", "yes" if x.passed else "**NO**", x.detail]
             for x in r.guards])]
    if any(x.guard.kind == "judge_agreement" for x in r.guards):
        lines += agreement_markdown(judge_check(ev))
    if r.recommendation:
        lines += ["", f"The guards recommend **{r.recommendation}**."]
    if r.decision:
        dec = r.decision
        lines += ["", f"## Decision: {dec.choice}", "", f"{dec.reason} (by {dec.by}, {dec.at}). "
                  f"Adapter {str(dec.adapter_before or 'base')[:12]} -> "
                  f"{str(dec.adapter_after or 'base')[:12]}."]
    lines += ["", "## Step times (s)", "",
              markdown_table(["step", "seconds"],
                             [[k, v.get("seconds", "-")] for k, v in r.steps.items()])]
    return "\n".join(lines) + "\n"


def write_round_report(store: RoundStore, ev: Evaluator, r: Round) -> Path:
    p = store.files.path("report", round_name(r.index))
    atomic_write_text(p, round_markdown(ev, r))
    return p


def history_rows(store: RoundStore) -> list[dict[str, Any]]:
    rows = []
    for r in store.rounds():
        row = {"round": r.index, "target": r.plan.target, "status": r.status,
               "decision": r.decision.choice if r.decision else None,
               "by": r.decision.by if r.decision else None,
               "flags": len(r.flagged), "adapter": (r.candidate or "")[:12]}
        for d in r.deltas:
            row[f"{d.suite}/{d.subset}"] = round(100 * d.delta, 1)
        rows.append(row)
    return rows


def write_history(store: RoundStore) -> Path:
    """history.md (a table) and history.png (deltas per subset, round by round)."""
    rows = history_rows(store)
    keys = sorted({k for r in rows for k in r if "/" in k})
    lines = ["# Improvement history", "", "Kept and reverted interventions, with each "
             "subset's delta in points (candidate - current).", "",
             markdown_table(["round", "target", "decision", "by", "flags", *keys],
                            [[r["round"], r["target"], r["decision"] or r["status"], r["by"],
                              r["flags"], *(f"{r[k]:+.1f}" if k in r else "-" for k in keys)]
                             for r in rows])]
    atomic_write_text(store.files.path("history"), "\n".join(lines) + "\n")
    if rows and keys:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(keys)), 3.8))
        width = 0.8 / len(rows)
        for i, r in enumerate(rows):
            xs = [j + i * width for j in range(len(keys))]
            ys = [r.get(k, 0.0) for k in keys]
            kept = r["decision"] in ("keep", "continue", "deploy")
            ax.bar(xs, ys, width, label=f"round {r['round']} ({r['decision'] or r['status']})",
                   color=("tab:green" if kept else "tab:red") if r["decision"] else "tab:grey",
                   alpha=0.5 + 0.5 * (i + 1) / len(rows), edgecolor="black")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))], keys, rotation=30,
                      ha="right", fontsize=8)
        ax.set_ylabel("delta (points)")
        ax.set_title("Evolution map: kept (green) and reverted (red) rounds")
        ax.legend(fontsize=7)
        fig.tight_layout()
        atomic_savefig(fig, store.files.path("history_plot"))
        plt.close(fig)
    return store.files.path("history")
