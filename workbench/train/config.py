"""Training settings (the `train:` section of an experiment config)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from workbench.config import ConfigSection


class LoraSettings(ConfigSection):
    r: int = Field(16, ge=1, description="LoRA rank.")
    alpha: int = Field(32, ge=1, description="LoRA alpha (scale = alpha / r).")
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: list[str] | None = Field(
        None, description="Module names to adapt; default per architecture (attention "
                          "projections).")
    freeze_a: bool = Field(False, description="Keep the A matrices at their initialisation "
                                              "and train only B (FFA-LoRA: averaging B across "
                                              "sites is then exactly averaging BA).")


class DomainEvalSettings(ConfigSection):
    benchmark: str | None = Field(None, description="MCItem JSONL to score during training "
                                                    "(logged as domain_accuracy).")
    also: dict[str, str] = Field(default_factory=dict, description="More MCItem JSONL files "
                                 "scored at the same steps, by name: {seen: path} is logged "
                                 "as domain_accuracy_seen.")
    every: int = Field(0, ge=0, description="Steps between domain evaluations (0: at end).")
    max_items: int = Field(50, ge=1)
    skip: int = Field(0, ge=0, description="Items skipped at the start of each benchmark file "
                                           "before max_items are read: the items a later "
                                           "evaluation reports (compare sets it to "
                                           "compare.eval_items), so choosing the adapter "
                                           "does not use them.")
    keep_best: bool = Field(False, description="Export the adapter of the evaluated step "
                                               "with the best mean domain accuracy (over the "
                                               "benchmark and `also`), not the last: the "
                                               "guard against training past the peak.")
    scoring: Literal["cloze_norm", "letter"] = Field(
        "cloze_norm", description="cloze_norm: each option's log-likelihood per character, "
                                  "the evaluation's headline formulation (what the report "
                                  "compares); letter: the log-likelihood of the option "
                                  "letters (degenerate for a small model: one letter for "
                                  "nearly every item).")

    @field_validator("also")
    @classmethod
    def _names(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not re.fullmatch(r"[a-z][a-z0-9_]{0,31}", k)]
        if bad:
            raise ValueError(f"domain_eval.also: names are lower-case words (a-z, 0-9, _): "
                             f"{', '.join(map(repr, bad))}")
        return v


class DPOSettings(ConfigSection):
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


class DistillSettings(ConfigSection):
    """On-policy distillation as a second loss on GRPO's rollouts: the teacher scores the
    policy's own sampled tokens and each token's advantage gains weight x (teacher log p -
    student log p), the per-token reverse KL estimator of on-policy distillation (Agarwal et
    al. 2024, GKD; Lu & Thinking Machines 2025)."""

    weight: float = Field(0.0, ge=0, description="Weight of the distillation advantage "
                                                 "-(log p_student - log p_teacher) per "
                                                 "policy token; 0: off (no teacher pass).")
    teacher: str = Field("self", min_length=1,
                         description="self: the base model with the adapter switched off, "
                                     "reading the privileged context (self-distillation); "
                                     "else a model spec (a bundled name, a folder, a .gguf, "
                                     "a server URL) whose backend returns token log-probs; "
                                     "it must read the student's tokenisation (same "
                                     "tokenizer family) to score the same tokens.")
    privileged: str = Field("", description="Context only the teacher reads, appended to "
                                            "the task's first user turn: a format string "
                                            "over the task's metadata (e.g. 'The answer is "
                                            "{item[answer]}.'); empty: none.")
    reward_weight: float = Field(1.0, ge=0, description="Weight of the reward's group "
                                                        "advantage beside the distillation "
                                                        "term; 0: distillation only.")

    @model_validator(mode="after")
    def _something_to_learn(self) -> DistillSettings:
        if self.weight == 0 and self.reward_weight == 0:
            raise ValueError("reward_weight is 0 with distillation off (weight 0): "
                             "nothing would train")
        return self


class RolloutServerSettings(ConfigSection):
    """GRPO's rollouts generated by an OpenAI-compatible server (vLLM, or `workbench serve
    --lora-dir`) with the adapter being trained: after each step's update the trainer writes
    the adapter as a PEFT folder and the server loads it by name (vLLM's runtime LoRA API),
    so the next rollouts run on it. The loss's log-probs are still the trainer's."""

    url: str = Field(..., min_length=1, description="The server's OpenAI base URL, e.g. "
                                                    "http://127.0.0.1:8000/v1.")
    model: str | None = Field(None, description="The served base model's name; None: the "
                                                "first one /v1/models lists.")
    api_key_env: str | None = Field(None, description="Environment variable holding the "
                                                      "server's API key (None: no key).")
    lora_name: str = Field("grpo", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,40}$",
                           description="Prefix of the adapters' names on the server "
                                       "(<prefix>-s<step>-<hash>).")
    publish_dir: str | None = Field(None, description="Folder the adapters are written to, "
                                    "by a path the server can read (it must be under "
                                    "`workbench serve --lora-dir`); None: `published/` in "
                                    "the run's checkpoint folder.")
    concurrency: int = Field(16, ge=1, le=256, description="Rollout requests in flight at "
                                                           "once.")
    timeout_s: float = Field(300.0, gt=0, description="Per-request timeout.")

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not re.match(r"https?://", v):
            raise ValueError(f"{v!r}: an http:// or https:// URL of the server's /v1")
        return v


class GRPOSettings(ConfigSection):
    group_size: int = Field(4, ge=2, le=64, description="Rollouts per task (G): advantages "
                                                       "are rewards relative to the group.")
    tasks_per_step: int = Field(4, ge=1, description="Tasks rolled out per optimizer step "
                                                     "(the step's rollout batch is "
                                                     "tasks_per_step x group_size).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the "
                                                      "rollouts (over tokens, or over a "
                                                      "guided policy's candidate scores).")
    max_new_tokens: int = Field(160, ge=1, description="Tokens per model turn in a rollout.")
    epsilon: float = Field(0.2, gt=0, lt=1, description="Clip range below 1 of the "
                                                       "probability ratio.")
    epsilon_high: float | None = Field(None, gt=0, description="Clip range above 1 (DAPO's "
                                                               "clip-higher); None: epsilon.")
    beta: float = Field(0.0, ge=0, description="Weight of the KL term to the starting "
                                               "policy (train.init_adapter, or the base "
                                               "model); 0: no reference pass at all.")
    iterations: int = Field(1, ge=1, le=8, description="Updates per rollout batch (GRPO's "
                                                       "mu); above 1 the probability ratio "
                                                       "and its clipping come into play.")
    scale_rewards: Literal["group", "none"] = Field(
        "group", description="group: advantage = (r - group mean) / group std (GRPO); "
                             "none: r - group mean (Dr. GRPO).")
    loss: Literal["token", "sequence"] = Field(
        "token", description="token: mean over every policy token of the step (DAPO, TRL's "
                             "default); sequence: mean per rollout, then over rollouts "
                             "(the GRPO paper).")
    eval_every: int = Field(0, ge=0, description="Steps between held-out evaluations (greedy "
                                                 "rollouts of the held-out tasks; 0: at "
                                                 "the end only).")
    keep_best: bool = Field(True, description="Export the adapter with the best held-out "
                                              "reward (the peak, not a later collapse).")
    distill: DistillSettings = Field(default_factory=DistillSettings,
                                     description="On-policy distillation on the same "
                                                 "rollouts (off by default).")
    rollout_server: RolloutServerSettings | None = Field(
        None, description="Generate the rollouts on an OpenAI-compatible server that loads "
                          "each updated adapter (vLLM's runtime LoRA API); None: in this "
                          "process.")


class TrainConfig(ConfigSection):
    method: Literal["sft", "dpo", "grpo"] = Field(
        "sft", description="sft: imitate the assistant turns of train.data; dpo: prefer the "
                           "chosen over the rejected side of each pair in train.data (a "
                           "preference JSONL: prompt/chosen/rejected, TRL's format); grpo: "
                           "train an agent on its own rollouts against a pack's reward "
                           "(the agent pipeline runs it: tasks, tools and the reward are "
                           "the pack's).")
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
    grpo: GRPOSettings = Field(default_factory=GRPOSettings)
    chat_template: str | None = Field(None, description="Jinja chat template when the "
                                                        "tokenizer has none.")
    device: str = "auto"
    dtype: str = "auto"
    output: str | None = Field(None, description="Adapter folder; default <run>/train.")
