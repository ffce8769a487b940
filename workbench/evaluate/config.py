"""Evaluation settings (the `eval:` section of an experiment config)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from workbench.config import ConfigSection

# none: the question alone; semantic, keyword, hybrid: retrieved passages; oracle: the item's
# own source passage (the bound a retriever cannot pass; needs items with provenance)
Condition = Literal["none", "semantic", "keyword", "hybrid", "oracle"]
CONDITIONS: tuple[Condition, ...] = ("none", "semantic", "keyword", "hybrid", "oracle")


class EvalConfig(ConfigSection):
    benchmark: str | None = Field(None, description="Multiple-choice benchmark: MCItem JSONL, "
                                                    "MMLU/ARC-style JSON(L), CSV, or a run "
                                                    "folder with a distill/benchmark.jsonl.")
    benchmark_format: Literal["auto", "mcitem", "mmlu", "csv"] = Field(
        "auto", description="Layout of the benchmark file; auto tells them apart by suffix "
                            "and fields.")
    field_map: dict[str, str | list[str]] | None = Field(
        None, description="Other field names, e.g. {question: stem, choices: opts, answer: "
                          "label, id: qid}; choices may list option columns.")
    open_ended: str | None = Field(None, description="ndQTSA JSONL to score open answers.")
    conditions: list[Condition] = Field(
        default_factory=lambda: list(CONDITIONS[:4]),
        description="none, the retrievers (semantic, keyword, hybrid: need eval.index) and "
                    "oracle (each item's own source passage: needs items with provenance "
                    "and the sections they came from, eval.sections).")
    index: str | None = Field(None, description="RAG index folder; the caller builds one "
                                                "context provider per RAG condition from it.")
    sections: str | None = Field(None, description="Section JSONL the benchmark was distilled "
                                                   "from, for the oracle condition (default: "
                                                   "the run's distill/sections.jsonl).")
    oracle_tokens: int = Field(256, ge=16, description="oracle: the passage around the "
                                                       "item's answer sentence, at most this "
                                                       "many words (a whole section may be "
                                                       "longer than a retriever's context).")
    methods: list[Literal["loglik", "generate"]] = Field(
        default_factory=lambda: list[Literal["loglik", "generate"]](["loglik", "generate"]))
    formulations: list[Literal["letter", "cloze"]] = Field(
        default_factory=lambda: list[Literal["letter", "cloze"]](["letter", "cloze"]),
        description="Log-likelihood formulations (OLMES): letter lists the options and "
                    "scores letters (MCF); cloze asks the question only and scores each "
                    "option's text (CF, acc and length-normalised acc_norm).")
    letter_conditions: list[Condition] | None = Field(
        None, description="Conditions under which the letter formulation is scored (None: "
                          "all of them). A model too small to follow the option list answers "
                          "'A' to nearly every item there: scoring it under one condition "
                          "shows that (the degenerate flag), and the others save a pass each.")
    template: Literal["chat", "raw"] = "chat"
    circular: bool = Field(False, description="Rotate options; correct only if all are.")
    max_items: int | None = Field(None, ge=1)
    max_tokens: int = Field(64, ge=1, description="Generation length for answers.")
    hit_vs_miss: bool = Field(True, description="Also score RAG with the ranks just below the "
                                                "top k (k+1..2k; RF-Agent's check that "
                                                "retrieval quality matters).")
    adapter: str | None = Field(None, description="LoRA adapter folder to evaluate.")
    judge: str | None = Field(None, description="Model spec of a judge for open answers "
                                                "(reference match when unset).")
    bootstrap_seed: int = Field(0, ge=0, lt=2**32, description="Seed of the bootstrap "
                                                             "intervals.")
    output: str | None = Field(None, description="Folder for results; default <run>/eval.")

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        if not self.methods:
            raise ValueError("eval.methods is empty; use loglik, generate or both")
        if "loglik" in self.methods and not self.formulations:
            raise ValueError("eval.formulations is empty but eval.methods has loglik; use "
                             "letter, cloze or both")
        if self.field_map and (bad := set(self.field_map) - {"id", "question", "choices",
                                                             "answer"}):
            raise ValueError(f"eval.field_map has unknown keys {sorted(bad)}; use id, "
                             "question, choices, answer")
        return self
