"""Experiments registered like pipelines (they compose the pipelines above)."""

from workbench.registry import Artifact, Pipeline, Stage

_SUMMARY = "workbench.evaluate.summary:EvalSummary"

PIPELINES = [Pipeline(
    name="compare", kind="experiment",
    help="RF-Agent's comparison for any domain: distil, index, evaluate the base model "
         "without and with each kind of retrieval, LoRA SFT, evaluate the SFT model, report "
         "with 95% intervals and paired significance tests.",
    config="workbench.experiments.config:CompareConfig",
    run="workbench.experiments.compare:run",
    folder="",
    stages=(
        Stage("eval_base", help="base model x {none, oracle, semantic, keyword, hybrid}, on "
                                "the unseen benchmark (held-out sections)",
              outputs=(Artifact("eval_base", "eval_base/summary.json", _SUMMARY),
                       Artifact("eval_base_results", "eval_base/results.jsonl",
                                "EvalResult"))),
        Stage("eval_sft", help="SFT model x {none, best RAG}, on the unseen benchmark",
              outputs=(Artifact("eval_sft", "eval_sft/summary.json", _SUMMARY),
                       Artifact("eval_sft_results", "eval_sft/results.jsonl",
                                "EvalResult"))),
        Stage("eval_base_seen", help="base model x every condition, on the seen benchmark",
              outputs=(Artifact("eval_base_seen", "eval_base_seen/summary.json",
                                _SUMMARY),
                       Artifact("eval_base_seen_results", "eval_base_seen/results.jsonl",
                                "EvalResult"))),
        Stage("eval_sft_seen", help="SFT model x {none, best RAG}, on the seen benchmark",
              outputs=(Artifact("eval_sft_seen", "eval_sft_seen/summary.json", _SUMMARY),
                       Artifact("eval_sft_seen_results", "eval_sft_seen/results.jsonl",
                                "EvalResult"))),
        Stage("report", outputs=(Artifact("report", "report.json", "workbench.experiments.compare_report:CompareReport"),
                                 Artifact("report_md", "report.md"),
                                 Artifact("plot", "comparison.png", required=False))),
    ),
    page="evaluate.py", page_title="Evaluate and compare", page_icon=":material/bar_chart:",
    order=60,
)]
