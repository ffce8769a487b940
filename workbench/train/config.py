"""Training settings (the `train:` section of an experiment config)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraSettings(_Section):
    r: int = Field(16, ge=1, description="LoRA rank.")
    alpha: int = Field(32, ge=1, description="LoRA alpha (scale = alpha / r).")
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: list[str] | None = Field(
        None, description="Module names to adapt; default per architecture (attention "
                          "projections).")
    freeze_a: bool = Field(False, description="Keep the A matrices at their initialisation "
                                              "and train only B (FFA-LoRA: averaging B across "
                                              "sites is then exactly averaging BA).")


class DomainEvalSettings(_Section):
    benchmark: str | None = Field(None, description="MCItem JSONL to score during training.")
    every: int = Field(0, ge=0, description="Steps between domain evaluations (0: at end).")
    max_items: int = Field(50, ge=1)


class DPOSettings(_Section):
    beta: float = Field(0.1, gt=0, le=100, description="Strength of the pull towards the "
                                                       "reference policy (DPO's beta).")
    loss: Literal["sigmoid", "ipo"] = Field("sigmoid", description="sigmoid: DPO; ipo: IPO "
                                                                    "(per-token means).")
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="Conservative DPO: the "
                                                                  "share of flipped labels "
                                                                  "assumed.")
    reference_cache: bool = Field(True, description="Keep the reference log-probabilities "
                                                    "on disk (next to the output) and reuse "
                                                    "them across epochs, resumes and re-runs.")


class TrainConfig(_Section):
    method: Literal["sft", "dpo"] = Field(
        "sft", description="sft: imitate the assistant turns of train.data; dpo: prefer the "
                           "chosen over the rejected side of each pair in train.data (a "
                           "preference JSONL: prompt/chosen/rejected, TRL's format).")
    data: str | None = Field(None, description="ChatExample JSONL (messages, sharegpt or "
                                               "alpaca) or a distillation run folder; with "
                                               "method dpo, preference pairs (JSONL).")
    init_adapter: str | None = Field(None, description="An adapter folder to start from "
                                                       "(e.g. SFT before DPO: it is then the "
                                                       "reference policy); its LoRA settings "
                                                       "must match train.lora.")
    data_format: str = Field("auto", description="messages, sharegpt, alpaca or auto.")
    eval_fraction: float = Field(0.1, ge=0, lt=1, description="Held-out share for eval loss.")
    max_length: int = Field(1024, ge=16, description="Tokens per training sequence.")
    packing: bool = Field(True, description="Pack short examples into full sequences "
                                            "(boundaries respected).")
    batch_size: int = Field(4, ge=1, description="Sequences per micro-batch.")
    grad_accum: int = Field(1, ge=1, description="Micro-batches per optimizer step.")
    learning_rate: float = Field(2e-4, gt=0, le=1,
                                 description="Peak learning rate (above 0, at most 1).")
    weight_decay: float = Field(0.0, ge=0)
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1, description="Stop after this many steps.")
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    scheduler: Literal["cosine", "linear", "constant"] = "cosine"
    max_grad_norm: float = Field(1.0, gt=0)
    gradient_checkpointing: bool = False
    eval_every: int = Field(0, ge=0, description="Steps between eval-loss runs (0: at end).")
    save_every: int = Field(0, ge=0, description="Steps between checkpoints (0: none).")
    save_total_limit: int = Field(2, ge=1)
    log_every: int = Field(1, ge=1)
    lora: LoraSettings = Field(default_factory=LoraSettings)
    domain_eval: DomainEvalSettings = Field(default_factory=DomainEvalSettings)
    dpo: DPOSettings = Field(default_factory=DPOSettings)
    chat_template: str | None = Field(None, description="Jinja chat template when the "
                                                        "tokenizer has none.")
    device: str = "auto"
    dtype: str = "auto"
    output: str | None = Field(None, description="Adapter folder; default <run>/train.")
