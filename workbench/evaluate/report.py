"""An evaluation folder (`results.jsonl`, `summary.json`, `summary.md`, `accuracy.png`):
written and read back as typed records, rendered as markdown tables and a plot with 95%
intervals that a report can embed."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from workbench.errors import DataError
from workbench.evaluate.summary import SCHEMA_VERSION, EvalSummary, PairedComparison
from workbench.io import atomic_savefig, describe_validation_error
from workbench.records import EvalResult, read_records
from workbench.runs import outputs_at
from workbench.text import (
    accuracy,
    markdown_table,
    p_value,
    percent,
    points_interval,
)

SCORING_LABELS = {"letter": "letter (MCF)", "cloze": "cloze (CF)",
                  "cloze_norm": "cloze, per-char norm. (CF)", "generate": "generation"}


def write_eval(folder: str | Path, results: Sequence[EvalResult], summary: EvalSummary
               ) -> Path:
    """Write the evaluation folder; returns it."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    files = outputs_at("eval", out)
    files.write("results", results)
    files.write("summary", summary)
    files.write("summary_md", summary_markdown(summary))
    plot_conditions(summary, files.path("plot"))
    return out


def read_eval_summary(folder: str | Path) -> EvalSummary:
    """The summary of an evaluation folder (or a summary.json path). Summaries written before
    summary.json had a schema_version are refused with a message saying to re-run."""
    p = Path(folder)
    files = outputs_at("eval", p)
    p = files.path("summary") if p.is_dir() else p
    if not p.exists():
        raise DataError(f"no {files.declared('summary').path}: run the evaluation first",
                        path=str(p), code="not_found")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"bad JSON at line {e.lineno} column {e.colno}: {e.msg}",
                        path=str(p)) from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version is None:
        raise DataError("this summary was written by an older workbench (no schema_version) "
                        "and lacks intervals and distributions; re-run the evaluation to "
                        "rewrite it", path=str(p), code="old_schema")
    if version != SCHEMA_VERSION:
        raise DataError(f"schema_version {version} is not {SCHEMA_VERSION}, the one this "
                        "workbench reads; use the workbench version that wrote it or re-run "
                        "the evaluation", path=str(p), code="schema_version")
    try:
        return EvalSummary.model_validate(data)
    except ValueError as e:
        raise DataError(describe_validation_error(e), path=str(p)) from None


def read_eval_results(folder: str | Path) -> list[EvalResult]:
    """The per-item rows of an evaluation folder (or a results.jsonl path)."""
    p = Path(folder)
    return read_records(outputs_at("eval", p).path("results") if p.is_dir() else p, EvalResult)


def summary_markdown(summary: EvalSummary, *, title: str | None = None) -> str:
    """Accuracy table (95% Wilson intervals), prediction distributions, the headline and its
    rule, and the pairwise comparisons of conditions."""
    s = summary
    scorings = [k for k in SCORING_LABELS
                if any(c.scoring(k) is not None for c in s.conditions.values())]
    head = s.headline.formulation
    lines = [f"## {title or s.model}", "",
             f"Model `{s.model_identity}`, {s.items} items, chance {percent(s.chance)}. "
             "Accuracies with 95% Wilson intervals.", ""]
    if clusters := clusters_of(s):
        lines[-2] += (f" The items form {clusters} independent clusters (items asked for one "
                      "sentence of the text share their correct option): intervals are at "
                      "the effective sample size, and comparisons marked with clusters test "
                      "and resample clusters.")
    cols = [SCORING_LABELS[k] + (" (headline)" if k == head else "") for k in scorings]
    rows = []
    for name, c in s.conditions.items():
        cells = []
        for k in scorings:
            f = c.scoring(k)
            cells.append("-" if f is None else accuracy(f.accuracy) +
                         (" degenerate" if f.degenerate else ""))
        unparsed = percent(c.generation.unparsed) if c.generation else "-"
        rows.append([name, c.n, *cells, unparsed, percent(c.agreement_letter_generation),
                     f"{c.seconds_per_item:.3f}"])
    lines.append(markdown_table(["condition", "n", *cols, "unparsed", "agreement", "s/item"],
                                rows))
    lines += ["", f"**Headline: {SCORING_LABELS.get(head, head) if head else 'none'}**"
              + ("" if head else " (every candidate formulation is degenerate)")
              + f". Rule: {s.headline.rule}"]
    for excluded, why in s.headline.excluded.items():
        lines.append(f"- {SCORING_LABELS.get(excluded, excluded)} left out: {why}")
    lines += ["", s.degenerate_rule, ""]
    letters = list(next(iter(s.conditions.values())).gold) if s.conditions else []
    if letters:
        rows = []
        for name, c in s.conditions.items():
            rows.append([name, "gold", *(c.gold.get(x, 0) for x in letters), ""])
            for k in scorings:
                f = c.scoring(k)
                if f is not None:
                    rows.append([name, SCORING_LABELS[k], *(f.predictions.get(x, 0)
                                                           for x in letters),
                                 f"degenerate: {f.degenerate_reason}" if f.degenerate else ""])
        lines += ["### Predicted letters", "",
                  markdown_table(["condition", "scoring", *letters, "flag"], rows), ""]
    if s.comparisons:
        lines += ["### Conditions compared", "", comparisons_markdown(s.comparisons),
                  "", s.comparison_rule, ""]
    if s.open is not None:
        lines += [f"Open answers: {s.open.n}, accuracy {accuracy(s.open.accuracy)} "
                  f"({s.open.judge}), token F1 {s.open.token_f1:.3f}.", ""]
    return "\n".join(lines)


def clusters_of(summary: EvalSummary) -> int | None:
    """How many independent clusters the summary's items form (None: all independent)."""
    for c in summary.conditions.values():
        for k in ("letter", "cloze_norm", "cloze", "generate"):
            if (f := c.scoring(k)) is not None and f.accuracy.clusters:
                return f.accuracy.clusters
    return None


def comparisons_markdown(comparisons: Sequence[PairedComparison]) -> str:
    """One row per paired comparison: accuracies, the difference with its 95% interval, the
    discordant items, McNemar and Holm p-values, and whether it is significant."""
    rows = []
    for c in comparisons:
        scoring = c.formulation_a if c.formulation_a == c.formulation_b else \
            f"{c.formulation_a} / {c.formulation_b}"
        n = f"{c.n} ({c.clusters} clusters)" if c.clusters else str(c.n)
        rows.append([c.a, c.b, scoring, n, percent(c.accuracy_a), percent(c.accuracy_b),
                     points_interval(c.difference, c.difference_ci_low, c.difference_ci_high),
                     f"{c.only_a} / {c.only_b}", p_value(c.p_value), p_value(c.p_holm),
                     "yes" if c.significant else "no"])
    return markdown_table(["a", "b", "scoring", "n", "accuracy a", "accuracy b",
                           "b - a [95% CI]", "only a / only b", "p (McNemar)", "p (Holm)",
                           "significant"], rows)


def plot_conditions(summaries: EvalSummary | Sequence[EvalSummary], path: str | Path, *,
                    title: str = "Multiple-choice accuracy (95% intervals)") -> None:
    """Bars per condition (per model when several), one per scoring, with 95% error bars;
    the headline scoring is outlined, degenerate scorings are hatched and faint."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sums = [summaries] if isinstance(summaries, EvalSummary) else list(summaries)
    groups = [(s, c) for s in sums for c in s.conditions]
    scorings = [k for k in ("letter", "cloze_norm", "generate")
                if any(s.conditions[c].scoring(k) is not None for s, c in groups)]
    if not groups or not scorings:
        return
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(groups)), 3.8))
    width = 0.8 / len(scorings)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for j, k in enumerate(scorings):
        for x, (s, c) in enumerate(groups):
            f = s.conditions[c].scoring(k)
            if f is None:
                continue
            a = f.accuracy
            err = [[max(0.0, a.value - a.ci_low)], [max(0.0, a.ci_high - a.value)]]
            ax.bar(x + (j - (len(scorings) - 1) / 2) * width, a.value, width, yerr=err, capsize=2,
                   color=colours[j % len(colours)], alpha=0.35 if f.degenerate else 1.0,
                   hatch="//" if f.degenerate else None,
                   edgecolor="black" if k == s.headline.formulation else "none",
                   linewidth=1.5, label=SCORING_LABELS[k] if x == 0 else None)
    chance = sum(s.chance for s in sums) / len(sums)
    ax.axhline(chance, color="grey", linestyle=":", linewidth=1, label=f"chance {percent(chance)}")
    names = [c if len(sums) == 1 else f"{s.model}\n{c}" for s, c in groups]
    ax.set_xticks(list(range(len(groups))), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title(title + "; outlined: headline, hatched: degenerate", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()

    atomic_savefig(fig, path, dpi=100)
    plt.close(fig)
