"""Evaluation as a registered pipeline (data only: `api.run` is its entry, and
`report` reads the evaluation folder's file names from this table)."""

from __future__ import annotations

from workbench.registry import Artifact, Pipeline, Stage

PIPELINE = Pipeline(
    name="eval",
    help="Score models.chat (+ eval.adapter) on a multiple-choice benchmark (ours, or MMLU/ARC"
         "-style JSONL or CSV as it comes) under each retrieval condition, with 95% intervals "
         "and paired significance tests.",
    config="workbench.evaluate.config:EvalConfig",
    run="workbench.evaluate.api:run",
    cli="workbench.evaluate.cli:register",
    stages=(Stage("eval", help="per-item results, summary with intervals, plot", outputs=(
        Artifact("results", "results.jsonl", "EvalResult"),
        Artifact("summary", "summary.json", "workbench.evaluate.summary:EvalSummary"),
        Artifact("summary_md", "summary.md"),
        Artifact("plot", "accuracy.png", required=False))),),
    order=50,
)
