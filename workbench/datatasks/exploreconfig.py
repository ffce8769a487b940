"""The explorer's settings: how one task's tree is searched (`ExploreConfig`)."""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import ConfigDict, Field

from workbench.records import StrictModel


class ExploreConfig(StrictModel):
    model_config = ConfigDict(frozen=True)

    generator: Literal["grammar", "model"] = Field(
        "grammar", description="Where moves come from: the schema grammar (prior from the "
                               "model's log-likelihood) or free-form SQL from the model.")
    strategy: Literal["mcts", "sample", "greedy"] = Field(
        "mcts", description="mcts: the tree search; sample: independent prior-weighted paths "
                            "from the root (best-of-N, the baseline); greedy: one path of "
                            "the likeliest moves (a single ReAct-style path).")
    prior: Literal["model", "uniform", "choose"] = Field(
        "model", description=(
            "grammar: score options with the model (model), not at all (uniform), or let a "
            "bandit choose per node among uniform, the model and `node_models` (choose)."))
    node_models: list[str] = Field(default_factory=list, description=(
        "prior=choose: more model specs the per-node choice may use, cheap to strong, after "
        "uniform and the arm's model."))
    choose_lam: float = Field(0.5, ge=0, description=(
        "prior=choose: weight of the cost in a node's reward (the probability the scorer put "
        "on the move a verified path took, minus lam x tokens / choose_cost_scale)."))
    choose_cost_scale: float = Field(200.0, gt=0, description=(
        "prior=choose: scored tokens that count as a cost of 1."))
    choose_ucb_c: float = Field(0.3, ge=0, description="prior=choose: exploration weight.")
    choose_escalate_after: int = Field(3, ge=0, description=(
        "prior=choose: after this many failed terminals in a task, its new nodes use the "
        "strongest scorer (0: never escalate)."))
    iterations: int = Field(200, ge=1, description="MCTS iterations per task (at most).")
    stop_after: int = Field(1, ge=0, description=(
        "Stop a task's search once this many distinct verified statements are found "
        "(0: run every iteration)."))
    c_puct: float = Field(1.5, gt=0, description="Exploration weight of the prior.")
    prior_temperature: float = Field(1.0, gt=0, description="Softmax temperature of the "
                                                            "log-likelihood prior.")
    reflection_penalty: float = Field(0.3, ge=0, lt=1, description=(
        "grammar: a move's prior weight is multiplied by (1 - penalty) for each failed "
        "plan it was part of."))
    proposals: int = Field(4, ge=1, le=16, description="model: samples per expansion.")
    temperature: float = Field(0.8, ge=0, description="model: sampling temperature.")
    max_tokens: int = Field(160, ge=16, description="model: tokens per proposal.")
    max_depth: int = Field(4, ge=1, le=12, description="model: statements per path (then "
                                                       "the only move is to answer).")
    reflections: int = Field(3, ge=0, description="model: reflections shown in the prompt.")
    seed_prefixes: int = Field(2, ge=0, description=(
        "model: a new task's root is seeded with the statements that began the verified "
        "paths of at least this many earlier tasks (from the prefix trie), and the model is "
        "asked only for the rest of the root's proposals; 0: off."))
    seed_shapes: int = Field(1, ge=0, description=(
        "grammar: once at least this many other verified tasks have a question of a "
        "similar shape (the wording with names and values abstracted, see seed_similarity), "
        "their verified paths seed the task's tree, names swapped: a node on a seeded path "
        "takes its prior from the trie instead of a model call; 0: off."))
    seed_similarity: float = Field(0.5, gt=0, le=1, description=(
        "grammar: shapes at least this alike (difflib's ratio over the shapes' words) seed "
        "each other, weighted by similarity²; 1: the same shape only."))
    seed_weight: float = Field(0.9, ge=0, lt=1, description=(
        "grammar: the share of a seeded node's prior on the seeded moves, times the "
        "similarity² of the closest seeding shape (the rest is spread evenly over all "
        "options, so every option keeps some prior)."))
    seed: int = 0

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]
