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
    rejects_format: int = Field(0, description="Rejected for their format (a tag, a field, "
                                               "an option or a question mark missing).")
    rejects_content: int = Field(0, description="Rejected for what they say (not "
                                                "self-contained, not grounded, duplicate, "
                                                "disagreeing...).")
    constrained: list[str] = Field(default_factory=list, description="Agents whose shaped "
                                                                     "outputs were generated "
                                                                     "under a grammar.")
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


def report_markdown(report: DistillReport) -> str:
    r = report.model_dump(mode="json")
    lines = [f"# Distillation report ({r['domain']}, {r['mode']} mode)", "",
             f"Prompt version `{r['prompt_version']}`, seed {r['seed']}, "
             f"{r['seconds']} s.", "", "## Yield per stage", "", "| stage | count |",
             "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r["stages"].items()]
    lines += ["", "## Accepted", "", "| | count |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r["accepted"].items()]
    lines += ["", "## Rejects by reason", "", "| reason | count |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r["rejects"].items()] or ["| (none) | 0 |"]
    lines += ["", f"Rejected for their format: {r['rejects_format']}; for their content: "
              f"{r['rejects_content']}. Generated under a grammar: "
              f"{', '.join(r['constrained']) or 'nothing (distill.constrained: false)'}."]
    v = r["verifier"]
    agreement = f"{v['agreement']:.1%}" if v["agreement"] is not None else "n/a"
    lines += ["", "## Quality", "",
              f"- verifier ({v['method']}, {v['on_disagree']}): {v['agreed']}/{v['checked']} "
              f"agreed ({agreement})",
              f"- near-duplicate questions removed: {r['dedup_removed']}",
              f"- benchmark/train overlap removed: {r['benchmark_overlap_removed']} sections",
              "- gold letters: " + ", ".join(f"{k} {n}" for k, n in
                                             r["letter_balance"].items()),
              "- difficulty (1-5): " + ", ".join(f"{k}: {n}" for k, n in
                                                 r["difficulty_histogram"].items()),
              "", "## Model calls", ""]
    c = r["model_calls"]
    lines += [f"- made {c['made']}, from cache {c['from_cache']}; tokens: prompt "
              f"{c['prompt_tokens']}, completion {c['completion_tokens']}"]
    if c["calls_per_accepted"] is not None:
        lines += [f"- per accepted sample: {c['calls_per_accepted']:.1f} calls, "
                  f"{c['tokens_per_accepted']:.0f} tokens"]
    lines += ["", "Models: " + ", ".join(f"{k} `{m}`" for k, m in r["models"].items())]
    return "\n".join(lines) + "\n"
