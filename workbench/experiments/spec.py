"""Experiments registered like pipelines (they compose the pipelines above)."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from workbench.registry import Artifact, Pipeline, Stage


class CompareConfig(BaseModel):
    """The `compare:` section: base vs RAG vs SFT on the distilled benchmark."""

    model_config = ConfigDict(extra="forbid")
    eval_items: int | None = Field(None, ge=1, description="Cap on benchmark items scored.")
    sft_conditions: str = Field("none+best", pattern="^(none\\+best|all)$",
                                description="none+best: SFT without RAG and with the base "
                                            "model's best RAG; all: every condition.")
    seen_conditions: list[Literal["none", "oracle", "semantic", "keyword", "hybrid"]] | None = \
        Field(None, description="The base model's conditions on the seen benchmark (None: all "
                                "five, as on unseen). The seen benchmark asks whether training "
                                "taught the facts, so [none] is enough to read it; each "
                                "retriever is another pass over its items.")
    letter_benchmarks: list[Literal["unseen", "seen"]] = Field(
        ["unseen"], description="The benchmarks on which the letter formulation is scored "
                                "(under eval.letter_conditions). On seen it would be a second "
                                "pass as long as the cloze one; the question there, whether "
                                "training taught the facts, is read in the headline "
                                "formulation.")

    @field_validator("seen_conditions")
    @classmethod
    def _none_first(cls, v):
        if v is not None and "none" not in v:
            raise ValueError("compare.seen_conditions must hold none (the base model the SFT "
                             "model is compared with)")
        return v


_SUMMARY = "workbench.evaluate.summary:EvalSummary"

PIPELINES = [Pipeline(
    name="compare", kind="experiment",
    help="RF-Agent's comparison for any domain: distil, index, evaluate the base model "
         "without and with each kind of retrieval, LoRA SFT, evaluate the SFT model, report "
         "with 95% intervals and paired significance tests.",
    config="workbench.experiments.spec:CompareConfig",
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
