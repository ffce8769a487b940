"""The `compare` experiment: RF-Agent's comparison for any domain, with one command.

    distil (the distill pipeline) -> index the distilled sections (the rag pipeline)
    -> evaluate base x {none, semantic, keyword, hybrid} -> LoRA SFT on the training split
    (the train pipeline) -> evaluate SFT x {none, best RAG} -> report.md / report.json with
    every accuracy's 95% interval, both OLMES formulations, prediction distributions, and
    paired tests of which differences are significant.

Every stage is hashed by the shared stage runner; a re-run skips the stages whose inputs did
not change, and the model calls of a re-run distillation come from the call cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from workbench.evaluate.benchmark import load_benchmark
from workbench.evaluate.report import (
    SCORING_LABELS, comparisons_markdown, plot_conditions, read_eval_results,
    read_eval_summary, write_eval,
)
from workbench.evaluate.run import evaluate_conditions
from workbench.evaluate.summary import (
    Accuracy, EvalSummary, PairedComparison, compare_runs, summarize_eval,
)
from workbench.io import atomic_write_text
from workbench.registry import PipelineResult
from workbench.runs import RunContext, file_hash, run_pipeline

RAG = ("semantic", "keyword", "hybrid")
ROW_NAMES = {"none": "", "semantic": " + semantic RAG", "keyword": " + keyword RAG",
             "hybrid": " + hybrid RAG"}
REPORT_SCHEMA = 2  # 2: accuracies and comparisons may carry `clusters`


class CompareRow(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str  # "Base" or "SFT"
    condition: str
    name: str
    n: int
    scorings: dict[str, Accuracy] = Field(description="Accuracy with 95% interval per scoring"
                                                      " (letter, cloze, cloze_norm, generate).")
    degenerate: dict[str, str] = Field(default_factory=dict,
                                       description="Scorings flagged degenerate, and why.")
    predictions: dict[str, dict[str, int]] = Field(default_factory=dict)
    headline: str | None = None
    seconds_per_item: float = 0.0

    @property
    def headline_accuracy(self) -> Accuracy | None:
        return self.scorings.get(self.headline) if self.headline else None


class CompareReport(BaseModel):
    """report.json of a compare run."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = REPORT_SCHEMA
    name: str
    seed: int
    model: str
    domain: str
    chance: float
    headline_rule: str
    degenerate_rule: str
    comparison_rule: str
    rows: list[CompareRow]
    comparisons: list[PairedComparison] = Field(default_factory=list)
    best_rag: str | None = None
    hit_vs_miss: dict[str, dict[str, Accuracy]] = Field(default_factory=dict)
    retrieval: dict[str, dict[str, float]] = Field(default_factory=dict)
    distill: dict[str, Any] = Field(default_factory=dict)
    train: dict[str, Any] = Field(default_factory=dict)
    stage_seconds: dict[str, float] = Field(default_factory=dict)
    seconds: float = 0.0


def read_report(run) -> CompareReport:
    """The report of a compare run folder (or report.json path)."""
    from workbench.errors import DataError

    p = Path(run)
    p = p / "report.json" if p.is_dir() else p
    if not p.exists():
        raise DataError("no report.json: run `workbench compare run` first", path=str(p),
                        code="not_found")
    try:
        return CompareReport.model_validate_json(p.read_bytes())
    except ValueError as e:
        raise DataError(f"not a compare report of this workbench version ({str(e)[:200]}); "
                        "re-run the experiment", path=str(p), code="old_schema") from None


@dataclass
class _Job:
    """What the stages of one compare run share. The RAG providers are opened at most once,
    and only when an evaluation has to run (an up-to-date re-run opens nothing)."""

    cfg: Any
    ctx: RunContext
    bench_path: Path
    index_dir: Path
    items: list
    stages: Any
    providers: dict | None = None

    @property
    def lay(self):
        return self.ctx.layout

    def contexts(self, conditions) -> dict[str, Any]:
        if self.providers is None:
            from workbench.rag.api import context_providers  # an experiment composes pipelines

            self.providers = context_providers(self.index_dir, RAG)
        return {c: self.providers[c] for c in conditions if c != "none"}


def run(cfg, ctx: RunContext) -> PipelineResult:
    t_all = time.perf_counter()
    job = _distil_and_index(cfg, ctx)  # 1-2. the pipelines, each with its own hashed stage
    base_inputs = _evaluate_base(job)  # 3. the base model under every condition
    base = _summary(job.lay, "eval_base", cfg.eval.bootstrap_seed)
    _train_sft(job)  # 4. LoRA SFT on the training split (the train pipeline)
    best = _best_rag(base)  # 5. the SFT model without RAG and with the base's best RAG
    _evaluate_sft(job, best, base_inputs)
    sft = _summary(job.lay, "eval_sft", cfg.eval.bootstrap_seed)
    report = build_report(cfg, job.lay, base, sft, best, time.perf_counter() - t_all)  # 6.
    job.stages.mark("report", file_hash(job.lay.artifact("compare", "report")) or "", 0.0)
    ctx.log(f"== report: {job.lay.artifact('compare', 'report_md')}")
    return _pipeline_result(job.lay, report)


def _distil_and_index(cfg, ctx: RunContext) -> _Job:
    """Distil, index the distilled sections, and read the benchmark items (none: evaluation
    is skipped, with a warning)."""
    lay = ctx.layout
    run_pipeline("distill", cfg, ctx)
    bench_path = lay.artifact("distill", "benchmark")
    run_pipeline("rag", cfg.model_copy(update={"corpus": str(lay.artifact("distill",
                                                                          "sections"))}), ctx)
    index_dir = lay.folder("rag")
    items = load_benchmark(bench_path, max_items=cfg.compare.eval_items) \
        if bench_path.exists() and bench_path.stat().st_size else []
    if not items:
        ctx.log("warning: the distillation produced no benchmark items; evaluation is skipped")
    return _Job(cfg, ctx, bench_path, index_dir, items, ctx.stages("compare"))


def _evaluate_base(job: _Job) -> tuple:
    """The base model under no RAG and every retriever, with the retrievers' own metrics;
    returns the stage's inputs (the SFT stage's key includes them)."""
    from workbench.models.factory import open_chat_model

    cfg, lay = job.cfg, job.lay
    ec = cfg.eval.model_copy(update={"conditions": ["none", *RAG]})
    base_inputs = (cfg.models.chat.model_dump(), cfg.seed, file_hash(job.bench_path),
                   file_hash(lay.artifact("rag", "manifest")), ec.model_dump(),
                   cfg.compare.eval_items)

    def eval_base():
        model = open_chat_model(cfg.models.chat, cfg)
        results, summary = evaluate_conditions(
            model, job.items, ec, contexts=job.contexts(ec.conditions),
            model_name=f"base ({cfg.models.chat.spec})", log=job.ctx.log)
        from workbench.rag.evaluate import benchmark_retrieval_metrics

        retrieval = benchmark_retrieval_metrics(
            job.providers["hybrid"].index if job.providers else job.index_dir, job.items)
        summary = summary.model_copy(update={"retrieval": retrieval})
        write_eval(lay.artifact("compare", "eval_base").parent, results, summary)

    if job.items:
        job.stages.run("eval_base", base_inputs, eval_base)
    return base_inputs


def _train_sft(job: _Job) -> None:
    cfg, lay = job.cfg, job.lay
    tc = cfg.train.model_copy(update={"data": str(lay.artifact("distill", "sft")),
                                      "output": None}, deep=True)
    tc.domain_eval.benchmark = str(job.bench_path) if job.items else None
    run_pipeline("train", cfg.model_copy(update={"train": tc}), job.ctx)


def _evaluate_sft(job: _Job, best: str | None, base_inputs: tuple) -> None:
    """The SFT model without RAG and with the base model's best retriever (or with all)."""
    from workbench.models.factory import open_chat_model

    cfg, lay = job.cfg, job.lay
    conds = ["none", *RAG] if cfg.compare.sft_conditions == "all" \
        else ["none"] + ([best] if best else [])
    ec_sft = cfg.eval.model_copy(update={"conditions": conds, "hit_vs_miss": False})
    adapter = lay.artifact("train", "adapter")
    sft_inputs = (base_inputs, ec_sft.model_dump(), file_hash(lay.artifact("train",
                                                                           "weights")))

    def eval_sft():
        mc = cfg.models.chat.model_copy(update={"options": {
            **cfg.models.chat.options, "adapter": str(adapter), "merge_adapter": True}})
        model = open_chat_model(mc, cfg)
        results, summary = evaluate_conditions(model, job.items, ec_sft,
                                               contexts=job.contexts(conds),
                                               model_name="SFT (LoRA)", log=job.ctx.log)
        write_eval(lay.artifact("compare", "eval_sft").parent, results, summary)

    if job.items:
        job.stages.run("eval_sft", sft_inputs, eval_sft)


def _pipeline_result(lay, report: CompareReport) -> PipelineResult:
    """The headline accuracies, one line per configuration."""
    lines = [f"{r.name:<28} " + "  ".join(
        f"{k} {_acc(r.scorings[k])}" for k in ("letter", "cloze_norm", "generate")
        if k in r.scorings) for r in report.rows]
    return PipelineResult(
        pipeline="compare", run_dir=str(lay.root),
        outputs={"report": str(lay.artifact("compare", "report_md"))},
        figures={r.name: (r.headline_accuracy.value if r.headline_accuracy else None)
                 for r in report.rows},
        message="\n".join(lines + [f"report: {lay.artifact('compare', 'report_md')}"]))


def _summary(lay, name: str, seed: int = 0) -> EvalSummary | None:
    """The evaluation's summary, recomputed from its per-item results: a re-run that skips the
    (expensive) scoring still reports with the current statistics."""
    folder = lay.artifact("compare", name).parent
    if not (folder / "summary.json").exists():
        return None
    old = read_eval_summary(folder)
    results = lay.artifact("compare", f"{name}_results")
    if not results.exists():
        return old
    return summarize_eval(read_eval_results(results), model=old.model,
                          model_identity=old.model_identity, chance=old.chance, seed=seed,
                          retrieval=old.retrieval)


def _best_rag(base: EvalSummary | None) -> str | None:
    """The retriever under which the base model scores best in its headline formulation."""
    if base is None:
        return None
    acc = base.headline_accuracy
    scored = [(acc[c].value, c) for c in RAG if c in acc]
    return max(scored)[1] if scored else None


def _rows(who: str, summary: EvalSummary | None) -> list[CompareRow]:
    rows = []
    for cond, s in (summary.conditions.items() if summary else []):
        if cond not in ROW_NAMES:
            continue
        scorings = {k: f for k in ("letter", "cloze", "cloze_norm", "generate")
                    if (f := s.scoring(k)) is not None}
        rows.append(CompareRow(
            model=who, condition=cond, name=who + ROW_NAMES[cond], n=s.n,
            scorings={k: f.accuracy for k, f in scorings.items()},
            degenerate={k: f.degenerate_reason or "" for k, f in scorings.items()
                        if f.degenerate},
            predictions={"gold": s.gold, **{k: f.predictions for k, f in scorings.items()}},
            headline=summary.headline.formulation, seconds_per_item=s.seconds_per_item))
    return rows


def build_report(cfg, lay, base: EvalSummary | None, sft: EvalSummary | None,
                 best: str | None, seconds: float) -> CompareReport:
    import json

    from workbench.domain_packs import load_pack
    from workbench.io import atomic_write_json

    comparisons = list(base.comparisons) if base else []
    if base and sft:
        comparisons += compare_runs(base, read_eval_results(lay.artifact("compare",
                                                                         "eval_base_results")),
                                    sft, read_eval_results(lay.artifact("compare",
                                                                        "eval_sft_results")),
                                    seed=cfg.eval.bootstrap_seed)
    hit_miss = {}
    for cond, s in (base.conditions.items() if base else []):
        if cond not in ROW_NAMES and "_ranks" in cond:
            top = cond.split("_ranks")[0]
            f = s.scoring("letter") or s.scoring("cloze_norm")
            if f and top in base.conditions and base.conditions[top].scoring("letter"):
                hit_miss[top] = {"top": base.conditions[top].scoring("letter").accuracy,
                                 "below": f.accuracy}
    from workbench.distill.report import DistillReport

    distill_report = lay.artifact("distill", "report")
    distill = DistillReport.model_validate_json(distill_report.read_bytes()).summary() \
        if distill_report.exists() else {}
    manifest = lay.artifact("train", "manifest")
    train = json.loads(manifest.read_text()).get("outputs", {}) if manifest.exists() else {}
    state = lay.stages().stages
    ref = base or sft
    report = CompareReport(
        name=cfg.name, seed=cfg.seed, model=cfg.models.chat.spec, domain=cfg.domain,
        chance=ref.chance if ref else load_pack(cfg.domain).eval.chance_level,
        headline_rule=ref.headline.rule if ref else "",
        degenerate_rule=ref.degenerate_rule if ref else "",
        comparison_rule=ref.comparison_rule if ref else "",
        rows=_rows("Base", base) + _rows("SFT", sft), comparisons=comparisons,
        best_rag=best, hit_vs_miss=hit_miss, retrieval=base.retrieval if base else {},
        distill=distill,
        train=train, stage_seconds={k: v.seconds for k, v in state.items()},
        seconds=round(seconds, 1))
    atomic_write_json(lay.artifact("compare", "report"), report.model_dump(mode="json"))
    if base or sft:
        plot_conditions([s for s in (base, sft) if s], lay.artifact("compare", "plot"),
                        title="Base vs RAG vs SFT (95% intervals)")
    atomic_write_text(lay.artifact("compare", "report_md"), report_markdown(report))
    return report


def _acc(a: Accuracy | None) -> str:
    if a is None:
        return "-"
    return f"{100 * a.value:.1f}% [{100 * a.ci_low:.0f}, {100 * a.ci_high:.0f}]"


def _fmt(v, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if pct else f"{v:.3f}"


def report_markdown(r: CompareReport) -> str:
    return "\n".join([*_comparison_table(r), *_rules(r), *_prediction_table(r),
                      *_significance(r), *_hit_vs_miss(r), *_retrieval(r), *_data(r),
                      *_training(r), *_stage_times(r)]) + "\n"


def _comparison_table(r: CompareReport) -> list[str]:
    """The title and RF-Agent's table: every configuration under every scoring."""
    scorings = [k for k in ("letter", "cloze_norm", "cloze", "generate")
                if any(k in row.scorings for row in r.rows)]
    lines = [f"# {r.name}: base vs RAG vs SFT", "",
             f"Model `{r.model}`, domain `{r.domain}`, seed {r.seed}, total {r.seconds} s "
             "(stages skipped on a re-run take ~0 s).", "",
             "## The comparison (RF-Agent's table)", "",
             "Accuracy with its 95% Wilson interval; **bold** is each model's headline "
             "scoring, ⚠ marks a degenerate scoring (never headlined).", "",
             "| configuration | items | " + " | ".join(SCORING_LABELS[k] for k in scorings)
             + " | s/item |", "|---|---|" + "---|" * len(scorings) + "---|"]
    for row in r.rows:
        cells = []
        for k in scorings:
            cell = _acc(row.scorings.get(k))
            if k in row.degenerate:
                cell = f"⚠ {cell}"
            cells.append(f"**{cell}**" if k == row.headline else cell)
        lines.append(f"| {row.name} | {row.n} | " + " | ".join(cells)
                     + f" | {_fmt(row.seconds_per_item)} |")
    return lines


def _rules(r: CompareReport) -> list[str]:
    """How the intervals treat clustered items, chance, the headline and degenerate rules,
    and the scorings flagged degenerate."""
    lines = []
    clustered = [(row.n, row.headline_accuracy.clusters) for row in r.rows
                 if row.headline_accuracy and row.headline_accuracy.clusters]
    if clustered:
        n, k = clustered[0]
        lines += ["", f"The {n} items form {k} independent clusters: items asked for one "
                  "sentence of the held-out text share their correct option (and distractors "
                  "come from sibling sentences, so even clusters are not fully independent). "
                  "Each interval is the Wilson interval at the effective sample size (Kish's "
                  "design effect over clusters); comparisons marked with clusters use an exact "
                  "sign-flip test over clusters and a bootstrap over clusters."]
    lines += ["", f"Chance is {r.chance:.0%}. ![comparison](comparison.png)", "",
              f"**Headline rule.** {r.headline_rule}", "",
              f"**Degenerate rule.** {r.degenerate_rule}", ""]
    flagged = [(row.name, k, why) for row in r.rows for k, why in row.degenerate.items()]
    if flagged:
        lines += ["Flagged: " + "; ".join(f"{n} / {SCORING_LABELS[k]}: {why}"
                                          for n, k, why in flagged), ""]
    return lines


def _prediction_table(r: CompareReport) -> list[str]:
    lines = ["## Prediction distributions (how often each letter was predicted)", "",
             "| configuration | scoring | " + " | ".join("ABCD") + " |",
             "|---|---|" + "---|" * 4]
    for row in r.rows:
        for k, dist in row.predictions.items():
            lines.append(f"| {row.name} | {SCORING_LABELS.get(k, k)} | "
                         + " | ".join(str(dist.get(x, 0)) for x in "ABCD") + " |")
    return lines


def _significance(r: CompareReport) -> list[str]:
    """The paired comparisons, and which survive Holm's correction."""
    if not r.comparisons:
        return []
    sig = [c for c in r.comparisons if c.significant]
    return ["", "## Which differences are real (paired, same items)", "",
            comparisons_markdown(r.comparisons), "", r.comparison_rule, "",
            f"{len(sig)} of {len(r.comparisons)} differences are significant at 5% "
            "after Holm's correction" + (": " + "; ".join(
                f"{c.b} vs {c.a} ({100 * c.difference:+.1f} points)" for c in sig)
                if sig else ".")]


def _hit_vs_miss(r: CompareReport) -> list[str]:
    if not r.hit_vs_miss:
        return []
    return ["", "## Does retrieval quality matter? (contexts from the top ranks vs the "
            "ranks just below, letter scoring)", "",
            "| retriever | top ranks | ranks below |", "|---|---|---|",
            *(f"| {k} | {_acc(v['top'])} | {_acc(v['below'])} |"
              for k, v in r.hit_vs_miss.items())]


def _retrieval(r: CompareReport) -> list[str]:
    if not r.retrieval:
        return []
    return ["", "## Retrieval (each benchmark question's source section is its relevant "
            "document)", "", "| retriever | Hit@1 | Hit@3 | Hit@10 | MRR | nDCG@10 |",
            "|---|---|---|---|---|---|",
            *(f"| {k} | {_fmt(m.get('hit@1'))} | {_fmt(m.get('hit@3'))} | "
              f"{_fmt(m.get('hit@10'))} | {_fmt(m.get('mrr'))} | {_fmt(m.get('ndcg@10'))} |"
              for k, m in r.retrieval.items())]


def _data(r: CompareReport) -> list[str]:
    if not r.distill.get("accepted"):
        return []
    a = r.distill["accepted"]
    return ["", "## Data", "", f"- distilled samples: {a['total']} ({a['mc']} multiple-"
            f"choice, {a['nd']} open), {a['train']} for training, "
            f"{a['benchmark_items']} benchmark items from held-out sections",
            "- details: [distill/report.md](distill/report.md)"]


def _training(r: CompareReport) -> list[str]:
    t = r.train
    if not t:
        return []
    fin = t.get("final", {})
    return ["", "## Training", "", f"- {t.get('steps')} steps on "
            f"{t.get('train_examples')} examples, {t.get('device')} {t.get('dtype')}, "
            f"{_fmt(t.get('tokens_per_s'))} tokens/s, padding share "
            f"{_fmt(t.get('padding_share'), True)}",
            f"- final loss {_fmt(fin.get('loss'))}, eval loss "
            f"{_fmt(fin.get('eval_loss'))}, domain accuracy "
            f"{_fmt(fin.get('domain_accuracy'), True)}",
            "- curves: ![training](adapter/training_curves.png)"]


def _stage_times(r: CompareReport) -> list[str]:
    return ["", "## Stage times (s)", "", "| stage | seconds |", "|---|---|",
            *(f"| {k} | {v} |" for k, v in r.stage_seconds.items())]
