"""The `agent:` section of an experiment config."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from workbench.agents.runner import SCAFFOLDS, Budget, ErrorPolicy
from workbench.config import ConfigSection, ModelConfig
from workbench.train.config import GRPOSettings, LoraSettings


class TeacherSettings(ConfigSection):
    model: ModelConfig | None = Field(None, description="The teacher (default: models.chat, "
                                                        "exploring by sampling).")
    policy: Literal["guided", "free"] = "guided"
    samples: int = Field(4, ge=1, description="Runs per training claim; the correct one with "
                                              "the fewest searches is kept.")
    temperature: float = Field(0.3, ge=0, description="Sampling temperature over candidate "
                                                      "scores (guided) or tokens (free).")
    max_route_share: float = Field(0.7, gt=0, le=1, description=(
        "Most of the kept trajectories one route (parametric or search) may have, so the "
        "student does not learn to always search (or never)."))


class StudentTraining(ConfigSection):
    max_steps: int = Field(40, ge=1)
    batch_size: int = Field(4, ge=1)
    learning_rate: float = Field(3e-4, gt=0)
    max_length: int = Field(1024, ge=64)
    lora: LoraSettings = Field(default_factory=LoraSettings)


# tools+grpo's measured recipe (BENCHMARKS.md, "GRPO on the RF design pack")
_RECIPE: dict[str, dict[str, Any]] = {
    "lora": {"dropout": 0.0},
    "settings": {"group_size": 4, "tasks_per_step": 2, "temperature": 0.5, "eval_every": 8}}


class GrpoTraining(ConfigSection):
    """The packs' on-policy conditions (`workbench.agent_packs.grpo`): rf's tools+grpo (the
    split of the design items, `workbench.agent_packs.rf.grpo`) and kgv's agent_grpo (the
    training claims, dev_share of them held out to choose; scored on the dev claims), and
    the training of the agent on its own rollouts. The defaults are the recipe measured in
    BENCHMARKS.md ("GRPO on the RF design pack")."""

    test_share: float = Field(0.4, gt=0, lt=1, description=(
        "rf: share of the design items every condition is scored on (the paired tests' "
        "items); never rolled out in training, never used to choose. kgv scores the dev "
        "claims."))
    dev_share: float = Field(0.2, ge=0, lt=1, description=(
        "Share (rf: of the design items; kgv: of the training claims) that chooses the kept "
        "adapter (greedy runs every settings.eval_every steps, best mean reward); 0: the "
        "last step's adapter is kept."))
    max_steps: int = Field(24, ge=1, description="Optimizer steps, each on one rollout batch.")
    learning_rate: float = Field(1e-3, gt=0, le=1, description="Constant learning rate.")
    batch_size: int = Field(4, ge=1, description="Rollouts per micro-batch of the update.")
    max_length: int = Field(2560, ge=64, description=(
        "Tokens per rollout (the RF tool prompt is ~1,600 with the bundled model: a "
        "rollout cut before the policy's first token trains nothing)."))
    lora: LoraSettings = Field(default_factory=lambda: LoraSettings(**_RECIPE["lora"]),
                               description="LoRA (the recipe: no dropout).")
    settings: GRPOSettings = Field(
        default_factory=lambda: GRPOSettings(**_RECIPE["settings"]),
        description="GRPO's own settings (group size, tasks a step, sampling temperature, "
                    "clipping, KL, on-policy distillation), as train.grpo; the recipe's "
                    "group 4, 2 tasks a step, temperature 0.5 and a dev run every 8 steps "
                    "hold for every key not given.")

    @field_validator("lora", "settings", mode="before")
    @classmethod
    def _over_the_recipe(cls, v: Any, info: ValidationInfo) -> Any:
        """Keys given override the recipe's; the others keep it (not the class defaults)."""
        return {**_RECIPE[str(info.field_name)], **v} if isinstance(v, dict) else v

    @model_validator(mode="after")
    def _room_to_train(self) -> GrpoTraining:
        if self.test_share + self.dev_share >= 1:
            raise ValueError("agent.grpo: test_share + dev_share must leave items to train "
                             "on (below 1)")
        return self


class AgentConfig(ConfigSection):
    pack: str = Field("kgv", description="The agent pack: kgv, rf or litsearch.")
    data: str = Field("datasets/kgv", description="The pack's data folder (kgv: claims.jsonl "
                                                  "and documents.jsonl).")
    index: str | None = Field(None, description=(
        "kgv: a retrieval index made by `workbench rag build` (keyword, semantic or hybrid) "
        "to search instead of the data folder's documents or graph facts; agent.data still "
        "gives the claims. Verdicts cite its passages with their source documents."))
    retriever: Literal["keyword", "semantic", "hybrid"] = "hybrid"
    search_k: int = Field(3, ge=1, le=5, description="Entries per search.")
    scaffold: str = Field("react", description="react or plan_execute.")
    policy: Literal["guided", "free", "free_unconstrained"] = Field("guided", description=(
        "guided: the model's log-likelihood picks among the calls the pack proposes (small "
        "models); free: the model writes its own calls, each generated under the tools' "
        "schemas where the backend can constrain (always valid); free_unconstrained: free "
        "text, the calls that parse are taken."))
    calibrate: Literal["none", "batch"] = Field("batch", description=(
        "guided choices relative to the batch's mean score per kind of call (batch "
        "calibration: removes a small model's fixed preference for one verdict)."))
    budget: Budget = Field(default_factory=lambda: Budget(max_steps=5, max_tool_calls=3))
    errors: ErrorPolicy = Field(default_factory=ErrorPolicy)
    conditions: list[str] | None = Field(None, description=(
        "What to compare; default: all the pack has (kgv: closed_book, rag, agent, "
        "agent_sft; rf: alone, rag, tools; litsearch: query_only, fixed, agent, oracle). "
        "rf also trains on request: tools+grpo (the tools agent trained with GRPO on its "
        "rollouts against the pack's reward, agent.grpo's settings; every condition is then "
        "scored on agent.grpo.test_share of the items); kgv on request: agent_grpo (the "
        "agent trained with GRPO against the pack's reward, a right verdict less a cost per "
        "search, AgentKGV's second stage), reported against the agent with the change in "
        "accuracy and in searches per claim. "
        "litsearch also trains on request: agent+sft (LoRA SFT on the teacher's dialogues, "
        "agent.student's settings) and agent+sft_dpo (then DPO from that adapter on the "
        "corruption pairs), each compared on the same intents with paired tests; both are "
        "off by default (tens of minutes to hours on 2 cores)."))
    adapters: dict[str, str] = Field(default_factory=dict, description=(
        "litsearch: more agent conditions, the agent with each adapter ({name: adapter "
        "folder}, e.g. {sft: A, sft_dpo: B}), reported as agent+NAME beside agent."))
    dev_limit: int | None = Field(60, ge=1, description=(
        "Items evaluated; None: all. kgv: dev claims, balanced over split and label; rf: the "
        "first design items of the file, or with tools+grpo the first of a seeded shuffle, "
        "then split into test, dev and training items."))
    train_limit: int | None = Field(60, ge=1, description="Training claims for the teacher.")
    turns: int = Field(3, ge=1, le=10, description="Dialogue turns (litsearch).")
    chunk: int = Field(16, ge=1, description="Claims run together (one batched call per turn);"
                                             " results are saved after each chunk.")
    teacher: TeacherSettings = Field(default_factory=TeacherSettings)
    student: StudentTraining = Field(default_factory=StudentTraining)
    grpo: GrpoTraining = Field(default_factory=GrpoTraining)

    @field_validator("scaffold")
    @classmethod
    def _known_scaffold(cls, v: str) -> str:
        if v not in SCAFFOLDS:
            raise ValueError(f"unknown scaffold {v!r} (one of {', '.join(SCAFFOLDS)})")
        return v
