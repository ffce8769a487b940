"""The distillation report as a typed record (`report.json`, schema version 1)."""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import Field

from workbench.records import StrictModel
from workbench.text import markdown_table, percent

SCHEMA_VERSION: Final = 1


class Accepted(StrictModel):
    total: int
    mc: int
    nd: int
    train: int = Field(description="Samples of training sections (the SFT data).")
    benchmark_items: int = Field(description="MC items of held-out sections.")
    seen_items: int = Field(0, description="Held-out MC items about trained sentences "
                                           "(distill.seen_fraction).")


class VerifierStats(StrictModel):
    checked: int
    agreed: int
    agreement: float | None
    method: str
    on_disagree: str


class ModelCalls(StrictModel):
    made: int
    from_cache: int
    prompt_tokens: int
    completion_tokens: int
    calls_per_accepted: float | None
    tokens_per_accepted: float | None


class GateExample(StrictModel):
    question: str
    reason: str
    detail: str = ""
    section_id: str
    section: str = ""
    task: str = ""


class GateStats(StrictModel):
    name: str
    enabled: bool
    rule: str = Field(description="The gate's rule in one sentence.")
    checked: int
    failed: int = Field(description="Questions this gate fails (an earlier gate may have "
                                    "removed them first).")
    removed: int = Field(description="Questions removed by this gate (the first they failed).")
    stripped: int = 0
    examples: list[GateExample] = Field(default_factory=list, description="The removed "
                                                                           "questions.")


class GatesReport(StrictModel):
    enabled: bool
    checked: int
    removed: int
    stripped: int = 0
    accepted_examples: list[str] = Field(default_factory=list, description="A few questions "
                                                                           "that were kept.")
    gates: list[GateStats] = Field(default_factory=list)


class DistillReport(StrictModel):
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
    gates: GatesReport | None = Field(None, description="The quality gates (None in reports "
                                                        "written before they existed).")
    letter_balance: dict[str, int]
    difficulty_histogram: dict[str, int]
    model_calls: ModelCalls
    seconds: float

    def summary(self) -> dict[str, Any]:
        """The parts a comparison report quotes."""
        return self.model_dump(include={"accepted", "stages", "rejects", "verifier",
                                        "letter_balance", "model_calls"}, mode="json")


def _gates_markdown(g: dict) -> list[str]:
    if not g["enabled"]:
        return ["", "## Quality gates", "", "Off (distill.gates.enabled: false): every "
                "question the parsers accepted went on to the verifier."]
    lines = ["", "## Quality gates", "",
             f"{g['checked']} questions checked, {g['removed']} removed, {g['stripped']} "
             "stripped of an echoed prefix and kept. A question is removed by the first gate "
             "it fails; `failed` counts every question a gate fails. Every verdict: "
             "`gates.jsonl`.", "",
             markdown_table(["gate", "rule", "failed", "removed", "stripped"],
                            [[x["name"] + ("" if x["enabled"] else " (off)"), x["rule"],
                              x["failed"], x["removed"], x["stripped"]] for x in g["gates"]])]
    for x in g["gates"]:
        if not x["examples"]:
            continue
        lines += ["", f"### Removed by {x['name']} ({x['removed']})", ""]
        lines += [f"- {e['question']!r}: {e['reason']}"
                  + (f" ({e['detail']})" if e["detail"] else "")
                  + f"; section `{e['section_id']}`"
                  + (f" ({e['section']})" if e["section"] else "") for e in x["examples"]]
        if x["removed"] > len(x["examples"]):
            lines.append(f"- ... and {x['removed'] - len(x['examples'])} more in gates.jsonl")
    if g["accepted_examples"]:
        lines += ["", "### Kept (a few)", ""] + [f"- {q!r}" for q in g["accepted_examples"]]
    return lines


def report_markdown(report: DistillReport) -> str:
    r = report.model_dump(mode="json")
    lines = [f"# Distillation report ({r['domain']}, {r['mode']} mode)", "",
             f"Prompt version `{r['prompt_version']}`, seed {r['seed']}, "
             f"{r['seconds']} s.", "", "## Yield per stage", "",
             markdown_table(["stage", "count"], r["stages"].items()),
             "", "## Accepted", "", markdown_table(["", "count"], r["accepted"].items()),
             "", "## Rejects by reason", "",
             markdown_table(["reason", "count"], r["rejects"].items() or [["(none)", 0]])]
    lines += ["", f"Rejected for their format: {r['rejects_format']}; for their content: "
              f"{r['rejects_content']}. Generated under a grammar: "
              f"{', '.join(r['constrained']) or 'nothing (distill.constrained: false)'}."]
    v = r["verifier"]
    agreement = percent(v["agreement"]) if v["agreement"] is not None else "n/a"
    lines += ["", "## Quality", "",
              f"- verifier ({v['method']}, {v['on_disagree']}): {v['agreed']}/{v['checked']} "
              f"agreed ({agreement})",
              f"- near-duplicate questions removed: {r['dedup_removed']}",
              f"- benchmark/train overlap removed: {r['benchmark_overlap_removed']} sections",
              "- gold letters: " + ", ".join(f"{k} {n}" for k, n in
                                             r["letter_balance"].items()),
              "- difficulty (1-5): " + ", ".join(f"{k}: {n}" for k, n in
                                                 r["difficulty_histogram"].items()),
              ]
    if r.get("gates"):
        lines += _gates_markdown(r["gates"])
    lines += ["", "## Model calls", ""]
    c = r["model_calls"]
    lines += [f"- made {c['made']}, from cache {c['from_cache']}; tokens: prompt "
              f"{c['prompt_tokens']}, completion {c['completion_tokens']}"]
    if c["calls_per_accepted"] is not None:
        lines += [f"- per accepted sample: {c['calls_per_accepted']:.1f} calls, "
                  f"{c['tokens_per_accepted']:.0f} tokens"]
    lines += ["", "Models: " + ", ".join(f"{k} `{m}`" for k, m in r["models"].items())]
    return "\n".join(lines) + "\n"
