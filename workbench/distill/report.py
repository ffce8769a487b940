"""The distillation report as a typed record (`report.json`, schema version 1)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Accepted(_Part):
    total: int
    mc: int
    nd: int
    train: int = Field(description="Samples of training sections (the SFT data).")
    benchmark_items: int = Field(description="MC items of held-out sections.")


class VerifierStats(_Part):
    checked: int
    agreed: int
    agreement: float | None
    method: str
    on_disagree: str


class ModelCalls(_Part):
    made: int
    from_cache: int
    prompt_tokens: int
    completion_tokens: int
    calls_per_accepted: float | None
    tokens_per_accepted: float | None


class DistillReport(_Part):
    schema_version: Literal[1] = SCHEMA_VERSION
    domain: str
    prompt_version: str
    mode: str
    seed: int
    models: dict[str, str] = Field(description="Model identity per agent.")
    sections: int
    sections_skipped_by_ingest: list[list[str]] = Field(default_factory=list)
    benchmark_overlap_removed: int = 0
    stages: dict[str, int] = Field(description="Yield per stage.")
    rejects: dict[str, int] = Field(description="Rejected tasks by reason.")
    accepted: Accepted
    verifier: VerifierStats
    dedup_removed: int = 0
    letter_balance: dict[str, int]
    difficulty_histogram: dict[str, int]
    model_calls: ModelCalls
    seconds: float

    def summary(self) -> dict[str, Any]:
        """The parts a comparison report quotes."""
        return self.model_dump(include={"accepted", "stages", "rejects", "verifier",
                                        "letter_balance", "model_calls"}, mode="json")
