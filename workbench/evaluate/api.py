"""The eval pipeline's `run` entry: the run's benchmark and index filled in, the
retrieval contexts from `workbench.retrieval`, then `run.run_eval`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.errors import WorkbenchError
from workbench.evaluate.benchmark import load_benchmark
from workbench.evaluate.contexts import OracleContexts
from workbench.records import Section, read_records
from workbench.registry import PipelineResult

if TYPE_CHECKING:
    from workbench.evaluate.contexts import ContextProvider


def resolved(cfg, layout):
    """The eval section with the run's own benchmark and index filled in when unset."""
    ec = cfg.eval
    update = {}
    if not ec.benchmark and layout.has("distill", "benchmark"):
        update["benchmark"] = str(layout.artifact("distill", "benchmark"))
    if not ec.sections and "oracle" in ec.conditions and layout.has("distill", "sections"):
        update["sections"] = str(layout.artifact("distill", "sections"))
    if not ec.index and any(c not in ("none", "oracle") for c in ec.conditions) \
            and layout.has("rag", "manifest"):
        update["index"] = str(layout.folder("rag"))
    if not ec.output:
        update["output"] = str(layout.folder("eval"))
    return cfg.model_copy(update={"eval": ec.model_copy(update=update)})


def context_providers(index: str | None, conditions) -> dict[str, ContextProvider]:
    """Retrieval contexts from the index folder, one provider per retrieval condition."""
    from workbench.retrieval.search import context_providers as index_contexts

    rag_conditions = [c for c in conditions if c not in ("none", "oracle")]
    if not rag_conditions:
        return {}
    if not index:
        raise WorkbenchError(f"conditions {', '.join(rag_conditions)} need eval.index (build "
                             "one with `workbench rag run` or `workbench rag build`)")
    return dict(index_contexts(index, rag_conditions))  # the caller adds the oracle's


def oracle_provider(ec):
    """The oracle condition's contexts for eval.benchmark's items, from eval.sections."""
    if not ec.sections:
        raise WorkbenchError("the oracle condition needs eval.sections: the Section JSONL the "
                             "benchmark was distilled from (a run's distill/sections.jsonl)")
    items = load_benchmark(ec.benchmark, fmt=ec.benchmark_format, mapping=ec.field_map,
                           max_items=ec.max_items)
    return OracleContexts(items, read_records(ec.sections, Section), max_words=ec.oracle_tokens)


def run(cfg, ctx) -> PipelineResult:
    from workbench.evaluate.report import summary_markdown
    from workbench.evaluate.run import run_eval

    cfg = resolved(cfg, ctx.layout)
    providers = context_providers(cfg.eval.index, cfg.eval.conditions)
    if "oracle" in cfg.eval.conditions:
        providers["oracle"] = oracle_provider(cfg.eval)
    out = run_eval(cfg, contexts=providers, log=ctx.log)
    s = out.summary
    return PipelineResult(
        pipeline="eval", run_dir=str(ctx.layout.root), outputs={"eval": str(out.output)},
        figures={"headline": s.headline.formulation,
                 **{c: a.value for c, a in s.headline_accuracy.items()}},
        message=summary_markdown(s) + f"\nresults in {out.output}")
