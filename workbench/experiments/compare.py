"""The `compare` experiment: RF-Agent's comparison for any domain, with one command.

    distil (the distill pipeline) -> index the distilled sections (the rag pipeline)
    -> evaluate base x {none, oracle, semantic, keyword, hybrid} on each benchmark (unseen:
    held-out sections; seen: held-out items of trained sentences) -> LoRA SFT on the training
    split (the train pipeline) -> evaluate SFT x {none, best RAG} on each -> report.md /
    report.json (`compare_report`) with every accuracy's 95% interval, both OLMES
    formulations, prediction distributions, knowledge-free shortcut rules, the oracle bound,
    and paired tests of which differences are significant.

Every stage is hashed by the shared stage runner; a re-run skips the stages whose inputs did
not change, and the model calls of a re-run distillation come from the call cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.distill.report import DistillReport
from workbench.domain_packs import load_pack
from workbench.evaluate.benchmark import load_benchmark
from workbench.evaluate.contexts import OracleContexts
from workbench.evaluate.report import (
    plot_conditions,
    read_eval_results,
    read_eval_summary,
    write_eval,
)
from workbench.evaluate.run import evaluate_conditions
from workbench.evaluate.shortcuts import best as best_shortcut
from workbench.evaluate.shortcuts import shortcut_baselines
from workbench.evaluate.summary import EvalSummary, compare_runs, summarize_eval
from workbench.experiments.compare_report import (  # noqa: F401  (read by the app and tests)
    MEASURES,
    RAG,
    ROW_NAMES,
    BenchmarkInfo,
    CompareReport,
    CompareRow,
    acc_text,
    read_report,
    report_markdown,
)
from workbench.io import atomic_write_json, atomic_write_text
from workbench.models.factory import open_chat_model
from workbench.rag.evaluate import benchmark_retrieval_metrics
from workbench.records import MCItem, Section, read_records
from workbench.registry import PipelineResult
from workbench.retrieval.search import context_providers
from workbench.runs import RunContext, file_hash, run_pipeline
from workbench.text import percent

BASE_CONDITIONS = ("none", "oracle", *RAG)


def stage_name(stage: str, benchmark: str) -> str:
    """A benchmark's evaluation stage (and artifact): unseen keeps the plain name."""
    return stage if benchmark == "unseen" else f"{stage}_{benchmark}"


@dataclass
class _Job:
    """What the stages of one compare run share. The RAG providers are opened at most once,
    and only when an evaluation has to run (an up-to-date re-run opens nothing)."""

    cfg: Any
    ctx: RunContext
    bench_paths: dict[str, Path]
    index_dir: Path
    benches: dict[str, list[MCItem]]
    stages: Any
    providers: dict | None = None
    models: dict[str, Any] = field(default_factory=dict)

    @property
    def lay(self):
        return self.ctx.layout

    def model(self, which: str, mc) -> Any:
        """The base or SFT model, opened once for every benchmark that has to be scored (a
        load, and for SFT an adapter merge, each time was ~10 s of the main job)."""
        if which not in self.models:
            self.models[which] = open_chat_model(mc, self.cfg)
        return self.models[which]

    def close(self, which: str) -> None:
        """Let go of a model the run needs no more (the base before training)."""
        model = self.models.pop(which, None)
        if model is not None:
            model.close()

    def contexts(self, conditions, items: list[MCItem]) -> dict[str, Any]:
        if self.providers is None:
            self.providers = context_providers(self.index_dir, RAG)
        out = {c: self.providers[c] for c in conditions if c in RAG}
        if "oracle" in conditions:
            out["oracle"] = OracleContexts(
                items, read_records(self.lay.artifact("distill", "sections"), Section),
                max_words=self.cfg.eval.oracle_tokens)
        return out


def run(cfg, ctx: RunContext) -> PipelineResult:
    t_all = time.perf_counter()
    job = _distil_and_index(cfg, ctx)  # 1-2. the pipelines, each with its own hashed stage
    inputs = {b: _evaluate_base(job, b) for b in job.benches}  # 3. base x every condition
    seed = cfg.eval.bootstrap_seed
    base = {b: _summary(job.lay, stage_name("eval_base", b), seed) for b in job.benches}
    job.close("base")
    _train_sft(job)  # 4. LoRA SFT on the training split (the train pipeline)
    # 5. the SFT model without RAG and with the best RAG (of the base model on unseen items)
    best = _best_rag(base.get("unseen") or next(iter(base.values()), None))
    for b in job.benches:
        _evaluate_sft(job, b, best, inputs[b])
    job.close("sft")
    sft = {b: _summary(job.lay, stage_name("eval_sft", b), seed) for b in job.benches}
    report = build_report(cfg, job, base, sft, best, time.perf_counter() - t_all)  # 6.
    job.stages.mark("report", file_hash(job.lay.artifact("compare", "report")) or "", 0.0)
    ctx.log(f"== report: {job.lay.artifact('compare', 'report_md')}")
    return _pipeline_result(job.lay, report)


def _distil_and_index(cfg, ctx: RunContext) -> _Job:
    """Distil, index the distilled sections, and read the benchmarks' items: unseen (held-out
    sections) and, with distill.seen_fraction, seen (held-out items of trained sentences).
    None at all: evaluation is skipped, with a warning."""
    lay = ctx.layout
    run_pipeline("distill", cfg, ctx)
    run_pipeline("rag", cfg.model_copy(update={"corpus": str(lay.artifact("distill",
                                                                          "sections"))}), ctx)
    paths = {"unseen": lay.artifact("distill", "benchmark"),
             "seen": lay.artifact("distill", "benchmark_seen")}
    benches = {}
    for name, path in paths.items():
        items = load_benchmark(path, max_items=cfg.compare.eval_items) \
            if path.exists() and path.stat().st_size else []
        if items:
            benches[name] = items
    if not benches:
        ctx.log("warning: the distillation produced no benchmark items; evaluation is skipped")
    return _Job(cfg, ctx, paths, lay.folder("rag"), benches, ctx.stages("compare"))


def _evaluate_base(job: _Job, bench: str) -> tuple:
    """The base model on one benchmark under no context, the oracle and every retriever,
    with the retrievers' own metrics; returns the stage's inputs (the SFT stage's key
    includes them)."""
    cfg, lay, items = job.cfg, job.lay, job.benches[bench]
    conds = list(BASE_CONDITIONS) if bench == "unseen" or cfg.compare.seen_conditions is None \
        else [c for c in BASE_CONDITIONS if c in cfg.compare.seen_conditions]
    ec = _eval_settings(cfg, bench, conds)
    base_inputs = (cfg.models.chat.model_dump(), cfg.seed, file_hash(job.bench_paths[bench]),
                   file_hash(lay.artifact("rag", "manifest")),
                   file_hash(lay.artifact("distill", "sections")), ec.model_dump(),
                   cfg.compare.eval_items)

    def eval_base():
        model = job.model("base", cfg.models.chat)
        results, summary = evaluate_conditions(
            model, items, ec, contexts=job.contexts(ec.conditions, items),
            model_name=f"base ({cfg.models.chat.spec})", log=job.ctx.log)

        retrieval = benchmark_retrieval_metrics(
            job.providers["hybrid"].index if job.providers else job.index_dir, items)
        summary = summary.model_copy(update={"retrieval": retrieval})
        write_eval(lay.artifact("compare", stage_name("eval_base", bench)).parent, results,
                   summary)

    job.stages.run(stage_name("eval_base", bench), base_inputs, eval_base)
    return base_inputs


def _eval_settings(cfg, bench: str, conds: list[str]):
    """The evaluation settings of one benchmark: its conditions, and the letter formulation
    only on the benchmarks `compare.letter_benchmarks` names (elsewhere it is a second pass
    as long as the cloze one, for a formulation that reads nothing on a small model)."""
    update: dict[str, Any] = {"conditions": conds}
    if bench not in cfg.compare.letter_benchmarks and set(cfg.eval.formulations) - {"letter"}:
        update["letter_conditions"] = []  # (kept where it is the only formulation)
    return cfg.eval.model_copy(update=update)


def _train_sft(job: _Job) -> None:
    cfg, lay = job.cfg, job.lay
    tc = cfg.train.model_copy(update={"data": str(lay.artifact("distill", "sft")),
                                      "output": None}, deep=True)
    bench = "unseen" if "unseen" in job.benches else next(iter(job.benches), None)
    tc.domain_eval.benchmark = str(job.bench_paths[bench]) if bench else None
    # the items the report scores are the files' first eval_items: by-step accuracy (and
    # domain_eval.keep_best's choice) reads the ones after them
    tc.domain_eval.skip = cfg.compare.eval_items or 0
    if tc.domain_eval.keep_best and not cfg.compare.eval_items:
        job.ctx.log("warning: train.domain_eval.keep_best with compare.eval_items unset "
                    "chooses the adapter on the items the report scores")
    if bench == "unseen" and "seen" in job.benches:  # both held-out accuracies by step
        tc.domain_eval.also = {**tc.domain_eval.also, "seen": str(job.bench_paths["seen"])}
    run_pipeline("train", cfg.model_copy(update={"train": tc}), job.ctx)


def _evaluate_sft(job: _Job, bench: str, best: str | None, base_inputs: tuple) -> None:
    """The SFT model on one benchmark without RAG and with the base model's best retriever
    (or under every condition)."""
    cfg, lay, items = job.cfg, job.lay, job.benches[bench]
    conds = list(BASE_CONDITIONS) if cfg.compare.sft_conditions == "all" \
        else ["none"] + ([best] if best else [])
    if bench != "unseen" and cfg.compare.seen_conditions is not None:  # paired with the base's
        conds = [c for c in conds if c in cfg.compare.seen_conditions]
    ec_sft = _eval_settings(cfg, bench, conds).model_copy(update={"hit_vs_miss": False})
    adapter = lay.artifact("train", "adapter")
    sft_inputs = (base_inputs, ec_sft.model_dump(), file_hash(lay.artifact("train",
                                                                           "weights")))

    def eval_sft():
        mc = cfg.models.chat.model_copy(update={"options": {
            **cfg.models.chat.options, "adapter": str(adapter), "merge_adapter": True}})
        model = job.model("sft", mc)
        results, summary = evaluate_conditions(model, items, ec_sft,
                                               contexts=job.contexts(conds, items),
                                               model_name="SFT (LoRA)", log=job.ctx.log)
        write_eval(lay.artifact("compare", stage_name("eval_sft", bench)).parent, results,
                   summary)

    job.stages.run(stage_name("eval_sft", bench), sft_inputs, eval_sft)


def _pipeline_result(lay, report: CompareReport) -> PipelineResult:
    """The headline accuracies, one line per configuration."""
    lines = [f"{r.benchmark:<7} {r.name:<28} " + "  ".join(
        f"{k} {acc_text(r.scorings[k])}" for k in ("letter", "cloze_norm", "generate")
        if k in r.scorings) for r in report.rows]
    return PipelineResult(
        pipeline="compare", run_dir=str(lay.root),
        outputs={"report": str(lay.artifact("compare", "report_md"))},
        figures={f"{r.benchmark}: {r.name}": (r.headline_accuracy.value
                                              if r.headline_accuracy else None)
                 for r in report.rows},
        message="\n".join(lines + [f"report: {lay.artifact('compare', 'report_md')}"]))


def _summary(lay, name: str, seed: int = 0) -> EvalSummary | None:
    """The evaluation's summary, recomputed from its per-item results: a re-run that skips the
    (expensive) scoring still reports with the current statistics."""
    summary = lay.artifact("compare", name)
    if not summary.exists():
        return None
    folder = summary.parent
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


def _rows(who: str, bench: str, summary: EvalSummary | None) -> list[CompareRow]:
    rows: list[CompareRow] = []
    if summary is None:
        return rows
    for cond, s in summary.conditions.items():
        if cond not in ROW_NAMES:
            continue
        scorings = {k: f for k in ("letter", "cloze", "cloze_norm", "generate")
                    if (f := s.scoring(k)) is not None}
        rows.append(CompareRow(
            model=who, condition=cond, name=who + ROW_NAMES[cond], benchmark=bench, n=s.n,
            scorings={k: f.accuracy for k, f in scorings.items()},
            degenerate={k: f.degenerate_reason or "" for k, f in scorings.items()
                        if f.degenerate},
            predictions={"gold": s.gold, **{k: f.predictions for k, f in scorings.items()}},
            headline=summary.headline.formulation, seconds_per_item=s.seconds_per_item,
            context_words=s.context_words))
    return rows


def _benchmark_info(cfg, lay, bench: str, items: list[MCItem], base: EvalSummary | None,
                    sft: EvalSummary | None) -> BenchmarkInfo:
    """A benchmark's shortcut floor (flagged when a rule reaches the base model without
    context) and its paired tests (conditions of the base model, then base vs SFT)."""
    comparisons = list(base.comparisons) if base else []
    if base and sft:
        comparisons += compare_runs(
            base, read_eval_results(lay.artifact("compare",
                                                 stage_name("eval_base", bench) + "_results")),
            sft, read_eval_results(lay.artifact("compare",
                                                stage_name("eval_sft", bench) + "_results")),
            seed=cfg.eval.bootstrap_seed)
    shortcuts = shortcut_baselines(items)
    top = best_shortcut(shortcuts)
    alone = base.headline_accuracy.get("none") if base else None
    flag = None
    if top and alone and top.accuracy.value >= alone.value:
        flag = (f"The rule \"{top.description}\" scores {percent(top.accuracy.value)}, at "
                f"least the base model's {percent(alone.value)} without context: this "
                "benchmark can be solved from the items' wording, so its accuracies say little "
                "about knowledge (distill.distractors: perturbed writes items that need it).")
    return BenchmarkInfo(items=len(items), measures=MEASURES.get(bench, ""),
                         shortcuts=shortcuts, shortcut_flag=flag, comparisons=comparisons,
                         retrieval=base.retrieval if base else {})


def build_report(cfg, job: _Job, base: dict[str, EvalSummary | None],
                 sft: dict[str, EvalSummary | None], best: str | None,
                 seconds: float) -> CompareReport:
    import json

    lay = job.lay
    first = next(iter(job.benches), None)
    hit_miss = {}
    b0 = base.get(first) if first else None
    conditions = b0.conditions if b0 else {}
    for cond, s in conditions.items():
        if cond not in ROW_NAMES and "_ranks" in cond:
            top = cond.split("_ranks")[0]
            f = s.scoring("letter") or s.scoring("cloze_norm")
            if f and top in conditions and (above := conditions[top].scoring("letter")):
                hit_miss[top] = {"top": above.accuracy, "below": f.accuracy}
    distill_report = lay.artifact("distill", "report")
    distill = DistillReport.model_validate_json(distill_report.read_bytes()).summary() \
        if distill_report.exists() else {}
    manifest = lay.artifact("train", "manifest")
    train = json.loads(manifest.read_text()).get("outputs", {}) if manifest.exists() else {}
    state = lay.stages().stages
    ref = next((s for s in [*base.values(), *sft.values()] if s), None)
    rows = [r for b in job.benches for r in _rows("Base", b, base.get(b)) + _rows(
        "SFT", b, sft.get(b))]
    report = CompareReport(
        name=cfg.name, seed=cfg.seed, model=cfg.models.chat.spec, domain=cfg.domain,
        chance=ref.chance if ref else load_pack(cfg.domain).eval.chance_level,
        headline_rule=ref.headline.rule if ref else "",
        degenerate_rule=ref.degenerate_rule if ref else "",
        comparison_rule=ref.comparison_rule if ref else "",
        rows=rows, benchmarks={b: _benchmark_info(cfg, lay, b, items, base.get(b), sft.get(b))
                               for b, items in job.benches.items()},
        best_rag=best, hit_vs_miss=hit_miss, distill=distill,
        train=train, stage_seconds={k: v.seconds for k, v in state.items()},
        seconds=round(seconds, 1))
    atomic_write_json(lay.artifact("compare", "report"), report.model_dump(mode="json"))
    sums = [s for b in job.benches for s in (base.get(b), sft.get(b)) if s]
    if sums:
        plot_conditions(sums, lay.artifact("compare", "plot"),
                        title="Base vs RAG vs SFT (95% intervals)")
    atomic_write_text(lay.artifact("compare", "report_md"), report_markdown(report))
    return report
