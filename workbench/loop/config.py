"""The `loop:` section of an experiment config (the improvement loop, Cura)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from workbench.config import ConfigSection, ModelConfig
from workbench.train.config import LoraSettings


class SuitesSettings(ConfigSection):
    data: str = Field("datasets/health", description=(
        "The domain's folder: dev.jsonl (failure mining), test.jsonl (guards and deltas), "
        "open.jsonl (open questions with rubrics) and corpus/ (the knowledge source)."))
    retention: str | None = Field("datasets/rf_distilled/benchmark.jsonl", description=(
        "MC items of another domain that must not get worse (one subset, 'retention')."))
    retention_data: str | None = Field("datasets/rf_distilled/mcQTSA.jsonl", description=(
        "QTSA samples of that domain mixed in as retention anchors."))
    max_items_per_subset: int | None = Field(15, ge=2, description=(
        "Items per subset of dev and test (seeded choice, balanced); None: all."))
    open_items: int | None = Field(12, ge=1, description=(
        "Open questions of each split (dev terms: mined; test terms: judged)."))
    scoring: Literal["cloze_norm", "cloze", "letter"] = Field("cloze_norm", description=(
        "The MC formulation every accuracy uses (log-likelihood; cloze_norm suits small "
        "models, letter suits instruction-tuned ones)."))
    open_max_tokens: int = Field(64, ge=8, description="Token limit of open answers.")
    judge: Literal["keyword", "model"] = Field("keyword", description=(
        "Who judges rubric items: each item's keywords, or a judge model answering yes/no "
        "per item (log-likelihood of the two answers)."))
    judge_model: ModelConfig | None = Field(None, description="The judge (default: "
                                                              "models.chat).")


class SynthSettings(ConfigSection):
    knowledge_per_failure: int = Field(2, ge=0, le=4, description=(
        "QTSA samples per missing-knowledge failure, from the sections retrieval finds."))
    retrieve_k: int = Field(2, ge=1, le=5, description="Sections retrieved per failure.")
    reasoning_per_failure: int = Field(1, ge=0, le=2)
    model_rationales: bool = Field(True, description=(
        "Let the model write reasoning corrections (kept when they name the right option "
        "and are grounded; a template from the section otherwise)."))
    rationale_grounding: float = Field(0.75, ge=0, le=1, description=(
        "Least share of a model rationale's content words found in the question, the "
        "answer and its section: a small model's rationale adds claims the source lacks."))
    anchor_ratio: float = Field(1.0, ge=0, description=(
        "Retention anchors per targeted sample (items the current model gets right, and "
        "the retention domain's samples)."))
    max_samples: int = Field(120, ge=1, description="Cap on targeted samples per round.")


class GateSettings(ConfigSection):
    ngram: int = Field(8, ge=3, description="Word n-gram length of the leak check.")
    max_leak_overlap: float = Field(0.5, gt=0, le=1, description=(
        "A sample leaks when this share of a test question's n-grams is in its prompt (or "
        "the question is in it verbatim)."))
    max_duplicate: float = Field(0.8, gt=0, le=1, description=(
        "Jaccard of word 3-grams above which a sample duplicates one kept before."))


class TrainSettings(ConfigSection):
    steps: int = Field(8, ge=1, description="LoRA steps of the candidate.")
    mixture_steps: int = Field(3, ge=1, description="LoRA steps of each mixture probe.")
    batch_size: int = Field(2, ge=1)
    max_length: int = Field(384, ge=64)
    learning_rate: float = Field(3e-4, gt=0)
    lora: LoraSettings = Field(default_factory=lambda: LoraSettings(r=8, alpha=16))


class GuardSettings(ConfigSection):
    subset_drop: float = Field(0.10, ge=0, le=1, description=(
        "Most accuracy (0-1) a test subset may lose before the guard trips."))
    retention_drop: float = Field(0.05, ge=0, le=1)
    open_drop: float = Field(0.15, ge=0, le=1, description="Most rubric score the open "
                                                           "questions may lose.")
    length_blowup: float = Field(1.5, gt=1, description="Most ratio of mean open-answer "
                                                        "length, candidate / current.")
    non_termination: float = Field(0.25, ge=0, le=1, description=(
        "Most rise in the share of open answers that run to the token limit (candidate "
        "minus current)."))
    min_gain: float = Field(0.0, description="Least target-subset gain for the guards to "
                                             "recommend keeping.")
    judge_kappa_min: float = Field(0.2, ge=-1, le=1, description=(
        "Least lower end of the judge-person kappa interval for the open questions' rubric "
        "delta to count (0.2: agreement beyond chance, at least 'fair', with confidence)."))
    judge_min_items: int = Field(20, ge=2, description=(
        "Judged items a person must rate before the agreement guard is measured."))
    judge_sample: int = Field(30, ge=2, le=500, description=(
        "Judged items offered to a person to rate (half the judge said were met)."))


class LoopConfig(ConfigSection):
    pack: str = Field("health", description="The domain pack whose `pipelines.loop` "
                                            "settings hold the synthesis templates.")
    suites: SuitesSettings = Field(default_factory=SuitesSettings)
    synth: SynthSettings = Field(default_factory=SynthSettings)
    gates: GateSettings = Field(default_factory=GateSettings)
    train: TrainSettings = Field(default_factory=TrainSettings)
    weightings: list[float] = Field(default_factory=lambda: [0.5, 1.5], min_length=1,
                                    description="Anchor weights the mixture search tries.")
    guards: GuardSettings = Field(default_factory=GuardSettings)
    target: str | None = Field(None, description="Force the target subset (default: the "
                                                 "plan picks the weakest dev subset).")
    rounds: int = Field(2, ge=1, le=20, description="Rounds `loop run --auto` runs.")
    mode: Literal["auto", "plan", "run"] = Field("auto", description=(
        "What a job of this pipeline does: auto (rounds unattended, the guards decide), "
        "plan (plan the next round), run (run the approved round up to the decision)."))
    review_data: bool = Field(False, description=(
        "Stop after the quality gates until a person has reviewed the synthesised data "
        "(accept / edit / reject in the app, or `loop approve --data`)."))
    trainer: str = Field("workbench.loop.train:lora", description=(
        "module:function that trains a candidate (tests script one)."))
