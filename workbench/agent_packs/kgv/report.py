"""The KGV report: every condition side by side, overall and by seen vs long-tail predicates,
each figure with its 95% interval and the prediction distribution behind it; paired exact
McNemar tests against single-turn RAG; a plot of macro-F1 with intervals.

`report.json` is a `KgvReport` (schema version 1): `write_report` builds it and writes it,
`read_report` is its one reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import field_serializer, field_validator

from workbench.agent_packs.grpo import TrainedAdapter, summary_line
from workbench.agent_packs.kgv.metrics import FORMS, by_split, prediction
from workbench.agent_packs.reports import (
    SCHEMA_VERSION,
    Interval,
    ReportPart,
    read_report_file,
    report_file,
    report_json,
)
from workbench.agent_packs.spec import PIPELINE
from workbench.agents.steps import AgentTrajectory
from workbench.evaluate.stats import bootstrap_interval, holm, mcnemar_exact, sign_flip_p
from workbench.io import atomic_write_text
from workbench.runs import RunLayout, outputs_at
from workbench.text import (
    markdown_table,
    number,
    number_interval,
    p_value,
    percent,
    percent_interval,
    points,
)

NAMES = {"closed_book": "closed book (no search)", "rag": "single-turn RAG",
         "agent": "agent", "agent_sft": "agent after SFT (student)",
         "agent_grpo": "agent after GRPO"}
TRAINED = ("agent_sft", "agent_grpo")  # compared with the agent they were trained from
# the file names are the agent spec's declared outputs
REPORT_JSON, REPORT_MD, REPORT_PNG = (PIPELINE.artifact(n).path
                                     for n in ("kgv_report", "kgv_report_md", "kgv_plot"))


class PredictionCounts(ReportPart):
    """Claims called SUPPORTED, REFUTED, or left without a verdict."""

    SUPPORTED: int
    REFUTED: int
    none: int


class RouteFigures(ReportPart):
    n: int
    rate: float
    accuracy: float | None
    accuracy_ci95: Interval


class Routes(ReportPart):
    parametric: RouteFigures
    search: RouteFigures


class EvidenceHit(ReportPart):
    """Correct SUPPORTED verdicts that cite the entry stating the fact."""

    n: int
    rate: float | None
    ci95: Interval


class KgvMetrics(ReportPart):
    """One condition on one group of claims (all, seen, longtail, or a claim form)."""

    n: int
    accuracy: float
    accuracy_ci95: Interval
    macro_f1: float
    macro_f1_ci95: Interval
    pos_f1_true: float
    pos_f1_true_ci95: Interval
    pos_f1_error: float
    pos_f1_error_ci95: Interval
    predictions: PredictionCounts
    gold: dict[str, int]
    search_calls_mean: float
    search_calls_ci95: Interval
    model_turns_mean: float
    errors: int
    stops: dict[str, int]
    latency_seconds_mean: float
    routes: Routes
    evidence_hit: EvidenceHit


class PairedTest(ReportPart):
    """A condition against single-turn RAG on the same claims (exact McNemar)."""

    vs: str
    n: int
    delta_accuracy: float
    only_base: int
    only_this: int
    p: float
    p_holm: float


class TrainedVsAgent(PairedTest):
    """A trained condition against the agent on the same claims: accuracy (exact McNemar)
    and search calls per claim (mean difference, bootstrap interval over claims, exact
    sign-flip test): AgentKGV's "fewer searches, accuracy kept"."""

    delta_search_calls: float
    delta_search_calls_ci95: Interval
    p_search_calls: float


class StudentInfo(ReportPart):
    steps: int
    first_loss: float | None
    last_loss: float | None


class TeacherInfo(ReportPart):
    runs: int
    kept: int
    routes: dict[str, int]
    student: StudentInfo


class KgvReport(ReportPart):
    """report.json of a KGV evaluation."""

    schema_version: int = SCHEMA_VERSION
    dev_claims: int
    train_claims: int
    model: str
    conditions: dict[str, dict[str, KgvMetrics]]
    paired_vs_rag: dict[str, PairedTest]
    teacher: TeacherInfo | None = None  # None (written {}): no teacher, no student
    seconds_per_claim: dict[str, float]
    # what the agent searched, in words (a prebuilt index, documents, the graph's facts);
    # reports written before it was recorded have none
    evidence: str | None = None
    # agent_sft and agent_grpo against the agent; how agent_grpo's adapter was made (both
    # only in reports with a trained condition)
    paired_vs_agent: dict[str, TrainedVsAgent] | None = None
    training: dict[str, TrainedAdapter] | None = None
    omit_none: ClassVar[tuple[str, ...]] = ("evidence", "paired_vs_agent", "training")

    @field_validator("conditions")
    @classmethod
    def _all_claims(cls, v: dict[str, dict[str, KgvMetrics]]):
        missing = [c for c, splits in v.items() if "all" not in splits]
        if missing:
            raise ValueError(f"condition {missing[0]!r} has no figures for all claims")
        return v

    @field_validator("teacher", mode="before")
    @classmethod
    def _no_teacher(cls, v):
        return None if v == {} else v

    @field_serializer("teacher", mode="wrap")
    def _teacher_json(self, v, handler):
        return {} if v is None else handler(v)

    def macro_f1(self) -> dict[str, float]:
        """Macro-F1 on all dev claims, per condition (the figures the job returns)."""
        return {c: r["all"].macro_f1 for c, r in self.conditions.items()}


def read_report(run) -> KgvReport:
    """The report of a KGV evaluation: a run folder, its `RunLayout`, or the report.json
    path. A broken or foreign file is a DataError of one line naming it."""
    return read_report_file(report_file(run, REPORT_JSON), KgvReport, "KGV report")


def trajectory_files(run) -> list[Path]:
    """The dev-claim trajectories of each condition the run holds, by name (the layout's
    outputs of the closed_book, rag, agent and agent_sft stages)."""
    lay = run if isinstance(run, RunLayout) else RunLayout.at(run)
    return sorted((lay.artifact("agent", c) for c in NAMES if lay.has("agent", c)),
                  key=lambda p: p.stem)


def paired(results: dict[str, list[AgentTrajectory]], base: str = "rag") -> dict[str, Any]:
    if base not in results:
        return {}
    gold = {t.task_id: t.metadata["claim"]["label"] for t in results[base]}
    ref = {t.task_id: prediction(t) == gold[t.task_id] for t in results[base]}
    out, ps = {}, []
    for cond, trajs in results.items():
        if cond == base:
            continue
        ids = [t.task_id for t in trajs if t.task_id in ref]
        mine = {t.task_id: prediction(t) == gold[t.task_id] for t in trajs}
        a, b = [ref[i] for i in ids], [mine[i] for i in ids]
        p = mcnemar_exact(a, b)
        out[cond] = {"vs": base, "n": len(ids), "delta_accuracy": (sum(b) - sum(a)) / len(ids)
                     if ids else 0.0, "only_base": sum(x and not y for x, y in zip(a, b)),
                     "only_this": sum(y and not x for x, y in zip(a, b)), "p": p}
        ps.append((cond, p))
    for (cond, _), adj in zip(ps, holm([p for _, p in ps]), strict=True):
        out[cond]["p_holm"] = adj
    return out


def paired_vs_agent(results: dict[str, list[AgentTrajectory]]) -> dict[str, Any] | None:
    """Each trained condition against the agent, claim by claim: accuracy as `paired`
    does, and the search calls per claim (after minus before), with a bootstrap interval
    and an exact sign-flip p; None without the agent or a trained condition."""
    trained = {c: results[c] for c in TRAINED if c in results}
    if "agent" not in results or not trained:
        return None
    out = paired({"agent": results["agent"], **trained}, base="agent")
    before = {t.task_id: t.calls_to("search") for t in results["agent"]}
    for cond, trajs in trained.items():
        diffs = [t.calls_to("search") - before[t.task_id] for t in trajs
                 if t.task_id in before]
        out[cond].update(
            delta_search_calls=sum(diffs) / len(diffs) if diffs else 0.0,
            delta_search_calls_ci95=bootstrap_interval(diffs) if diffs else (0.0, 0.0),
            p_search_calls=sign_flip_p(diffs))
    return out


def write_report(out: Path, results: dict[str, list[AgentTrajectory]],
                 teacher: dict[str, Any], *, dev: int, train: int, model: str,
                 searches: int, evidence: str | None = None,
                 training: dict[str, Any] | None = None) -> KgvReport:
    """`report.json` (a `KgvReport`), `report.md` and `report.png` in `out`, from the
    conditions' trajectories; returns the record."""
    timings = {}
    for c in results:
        f = outputs_at("agent", out).path("timing", c)
        if f.exists():
            w = json.loads(f.read_text())
            timings[c] = w["seconds"] / max(w["claims"], 1)
    report = KgvReport(dev_claims=dev, train_claims=train, model=model,
                       conditions={c: by_split(ts) for c, ts in results.items()},
                       paired_vs_rag=paired(results), teacher=teacher,
                       seconds_per_claim=timings, evidence=evidence or None,
                       paired_vs_agent=paired_vs_agent(results), training=training or None)
    atomic_write_text(out / REPORT_JSON, report_json(report))
    atomic_write_text(out / REPORT_MD, report_markdown(report, searches=searches))
    _plot(out / REPORT_PNG, report)
    return report


def _with_ci(v: float, ci: Interval) -> str:
    return percent_interval(v, ci.low, ci.high)


def _split_row(report: KgvReport, c: str, s: KgvMetrics) -> list[str]:
    """One condition's row of a split's table: the F1s and accuracy with their intervals,
    searching, the routes, the predicted verdicts and the wall time per claim."""
    rp, rs, pr = s.routes.parametric, s.routes.search, s.predictions
    return [NAMES.get(c, c), _with_ci(s.macro_f1, s.macro_f1_ci95),
            _with_ci(s.pos_f1_true, s.pos_f1_true_ci95),
            _with_ci(s.pos_f1_error, s.pos_f1_error_ci95), _with_ci(s.accuracy, s.accuracy_ci95),
            number(s.search_calls_mean, 2), percent(rp.rate),
            f"{percent(rp.accuracy)} (n={rp.n})", f"{percent(rs.accuracy)} (n={rs.n})",
            f"{pr.SUPPORTED} / {pr.REFUTED} / {pr.none}",
            number(report.seconds_per_claim.get(c, float("nan")), 2)]


def report_markdown(report: KgvReport, *, searches: int) -> str:
    dev, model = report.dev_claims, report.model
    lines = [f"# KG fact verification: {dev} dev claims, model `{model}`", "",
             "Figures in % with 95% intervals (Wilson for proportions, bootstrap over claims "
             "for F1). Pos-F1 (true): positive = a true fact; Pos-F1 (error): positive = a "
             "detected error. Route: parametric = answered without searching.", ""]
    if report.evidence:
        lines += [f"Evidence searched: {report.evidence}.", ""]
    heads = {"triple": "claims given as triples", "wording": "sentences read as triples "
             "(they match a wording)", "sentence": "sentences verified as a whole"}
    for split in ("all", "seen", "longtail", *FORMS):
        rows = [(c, r[split]) for c, r in report.conditions.items() if split in r]
        if not rows:
            continue
        n = rows[0][1].n
        lines += [f"## {heads.get(split, split)} ({n} claims)", "",
                  markdown_table(["condition", "macro-F1", "Pos-F1 (true)", "Pos-F1 (error)",
                                  "accuracy", "searches / claim", "parametric route",
                                  "acc. parametric", "acc. search", "predicted S / R / none",
                                  "s / claim (wall)"],
                                 [_split_row(report, c, s) for c, s in rows]), ""]
    if report.paired_vs_rag:
        lines += ["## Paired against single-turn RAG (exact McNemar, Holm-adjusted)", "",
                  markdown_table(["condition", "Δ accuracy", "only RAG right",
                                  "only this right", "p", "p (Holm)"],
                                 [[NAMES.get(c, c), points(p.delta_accuracy), p.only_base,
                                   p.only_this, p_value(p.p), p_value(p.p_holm)]
                                  for c, p in report.paired_vs_rag.items()]), ""]
    if report.paired_vs_agent:
        lines += ["## Trained against the agent (same claims)", "",
                  "Accuracy: exact McNemar, Holm-adjusted; searches per claim: mean "
                  "difference (after - before) with a bootstrap 95% interval over claims, "
                  "exact sign-flip p.", "",
                  markdown_table(["condition", "Δ accuracy", "only agent right",
                                  "only this right", "p (Holm)", "Δ searches / claim",
                                  "p (searches)"],
                                 [[NAMES.get(c, c), points(p.delta_accuracy), p.only_base,
                                   p.only_this, p_value(p.p_holm),
                                   number_interval(p.delta_search_calls,
                                                   p.delta_search_calls_ci95.low,
                                                   p.delta_search_calls_ci95.high,
                                                   places=2, signed=True),
                                   p_value(p.p_search_calls)]
                                  for c, p in report.paired_vs_agent.items()]), ""]
    for c, tr in (report.training or {}).items():
        lines += [summary_line(NAMES.get(c, c), tr, scored="dev claims"), ""]
    if (t := report.teacher) is not None:
        st = t.student
        lines += ["## Teacher and student", "",
                  f"- teacher runs: {t.runs} on {report.train_claims} training claims; kept "
                  f"{t.kept} correct trajectories (routes: "
                  f"{t.routes})",
                  f"- student LoRA: {st.steps} steps, loss {st.first_loss} -> "
                  f"{st.last_loss}", ""]
    lines += [f"Evidence: a correct SUPPORTED verdict cites the entry that states the fact "
              f"(rate per condition in report.json, `evidence_hit`). Search calls made in "
              f"this process: {searches}.", ""]
    return "\n".join(lines)


def _plot(path: Path, report: KgvReport) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conds = report.conditions
    splits = [s for s in ("all", "seen", "longtail") if any(s in r for r in conds.values())]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / max(len(conds), 1)
    for i, (c, r) in enumerate(conds.items()):
        xs, ys, lo, hi = [], [], [], []
        for j, s in enumerate(splits):
            if s in r:
                v = r[s].macro_f1
                a, b = r[s].macro_f1_ci95.low, r[s].macro_f1_ci95.high
                xs.append(j + i * width)
                ys.append(100 * v)
                lo.append(100 * max(0.0, v - a))
                hi.append(100 * max(0.0, b - v))
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=NAMES.get(c, c))
    ax.set_xticks([j + width * (len(conds) - 1) / 2 for j in range(len(splits))], splits)
    ax.set_ylabel("macro-F1 (%)")
    ax.axhline(50, color="grey", lw=0.8, ls=":")
    ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
