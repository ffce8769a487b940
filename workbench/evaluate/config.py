"""Evaluation settings (the `eval:` section of an experiment config)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CONDITIONS = ("none", "semantic", "keyword", "hybrid")


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    benchmark: str | None = Field(None, description="MCItem JSONL, or a run folder with a "
                                                    "distill/benchmark.jsonl.")
    open_ended: str | None = Field(None, description="ndQTSA JSONL to score open answers.")
    conditions: list[Literal["none", "semantic", "keyword", "hybrid"]] = Field(
        default_factory=lambda: list(CONDITIONS))
    index: str | None = Field(None, description="RAG index folder (for RAG conditions).")
    methods: list[Literal["loglik", "generate"]] = Field(
        default_factory=lambda: ["loglik", "generate"])
    template: Literal["chat", "raw"] = "chat"
    circular: bool = Field(False, description="Rotate options; correct only if all are.")
    max_items: int | None = Field(None, ge=1)
    max_tokens: int = Field(64, ge=1, description="Generation length for answers.")
    hit_vs_miss: bool = Field(True, description="Also score RAG with ranks 4-6 (RF-Agent's "
                                                "check that retrieval quality matters).")
    adapter: str | None = Field(None, description="LoRA adapter folder to evaluate.")
    judge: str | None = Field(None, description="Model spec of a judge for open answers "
                                                "(reference match when unset).")
    output: str | None = Field(None, description="Folder for results; default <run>/eval.")
