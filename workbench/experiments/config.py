"""The `compare:` section of an experiment config (the compare experiment's settings)."""

from typing import Literal

from pydantic import Field, field_validator

from workbench.config import ConfigSection


class CompareConfig(ConfigSection):
    """The `compare:` section: base vs RAG vs SFT on the distilled benchmark."""

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
