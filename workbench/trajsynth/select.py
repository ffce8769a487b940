"""Adaptive model selection: which arm (generator + model + search settings) searches a task.

Arms are ranked cheap → strong. Two policies, both logged attempt by attempt:

- `escalate` (default): the cheapest arm first; the next one after the task's search with it
  failed. The cheap arm is skipped outright in a context (environment, category, difficulty)
  where it failed `escalate_after` times in a row, or where the cost model predicts its
  success below `min_success`.
- `bandit`: per context, arms ordered by an upper confidence bound on reward = verified −
  λ·cost/cost_scale, with the cost model's prediction as a prior worth `prior_weight`
  observations; after a failure the next arm in that order is tried.

With `max_cost_per_verified`, an arm whose predicted cost per verified trajectory (cost /
p(success)) is over the cap is not tried; a task no arm passes is stopped and logged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import ConfigDict, Field

from workbench.datatasks.exploreconfig import ExploreConfig
from workbench.records import StrictModel
from workbench.trajsynth.costmodel import Attempt, CostModel


class Arm(StrictModel):
    model_config = ConfigDict(frozen=True)

    name: str
    explore: ExploreConfig = Field(default_factory=ExploreConfig)
    model: str | None = Field(None, description="Model spec (None: models.chat).")
    rank: int = Field(0, description="Cheap (low) to strong (high): the escalation order.")


class SelectionConfig(StrictModel):
    model_config = ConfigDict(frozen=True)

    policy: Literal["escalate", "bandit"] = "escalate"
    max_attempts: int = Field(2, ge=1, description="Arms tried per task at most.")
    escalate_after: int = Field(3, ge=1, description="escalate: consecutive failures of the "
                                                     "cheap arm in a context before skipping it.")
    min_success: float = Field(0.0, ge=0, le=1, description="escalate: skip an arm predicted "
                                                            "to succeed less often than this.")
    lam: float = Field(0.5, ge=0, description="bandit: weight of the cost in the reward.")
    cost_scale: float = Field(5000.0, gt=0, description="Cost units (tokens + exec_weight x "
                                                        "executions) that count as 1.")
    exec_weight: float = Field(10.0, ge=0, description="Cost units of one sandbox execution.")
    ucb_c: float = Field(0.5, ge=0, description="bandit: exploration weight.")
    prior_weight: float = Field(2.0, ge=0, description="bandit: the cost model's prior counts "
                                                       "as this many observations.")
    max_cost_per_verified: float | None = Field(None, gt=0, description=(
        "Skip an arm whose predicted cost / p(success) is over this (cost units)."))
    refit_every: int = Field(10, ge=1, description="Refit the cost model every N attempts.")


def context_key(ctx: dict[str, Any]) -> str:
    return f"{ctx['env_name']}/{ctx['category']}/{ctx['difficulty']}"


class Selector:
    def __init__(self, arms: Sequence[Arm], config: SelectionConfig,
                 history: Sequence[Attempt] = ()) -> None:
        self.arms = sorted(arms, key=lambda a: (a.rank, a.name))
        self.config = config
        self.model = CostModel([a.name for a in self.arms], exec_weight=config.exec_weight)
        self.history: list[Attempt] = []
        self.stats: dict[tuple[str, str], list[float]] = {}
        self.streak: dict[tuple[str, str], int] = {}
        for a in history:
            self.record(a, refit=False)
        self.model.fit(self.history)
        self._since_fit = 0

    def reward(self, a: Attempt) -> float:
        return float(a.verified) - self.config.lam * a.cost_units(
            self.config.exec_weight) / self.config.cost_scale

    def record(self, a: Attempt, *, refit: bool = True) -> None:
        self.history.append(a)
        key = (context_key(a.model_dump()), a.arm)
        s = self.stats.setdefault(key, [0, 0.0])
        s[0] += 1
        s[1] += self.reward(a)
        self.streak[key] = 0 if a.verified else self.streak.get(key, 0) + 1
        if refit:
            self._since_fit += 1
            if self._since_fit >= self.config.refit_every:
                self.model.fit(self.history)
                self._since_fit = 0

    def predicted(self, ctx: dict[str, Any], arm: Arm) -> dict[str, float] | None:
        return self.model.predict(ctx, arm.name)

    def _ucb(self, ctx: dict[str, Any], arm: Arm) -> float:
        c = self.config
        n, total = self.stats.get((context_key(ctx), arm.name), [0, 0.0])
        pred = self.predicted(ctx, arm)
        prior = pred["success"] - c.lam * pred["cost"] / c.cost_scale if pred else 0.5
        mean = (total + c.prior_weight * prior) / (n + c.prior_weight) if (n or
                                                                          c.prior_weight) \
            else prior
        big_n = sum(v[0] for (k, _), v in self.stats.items() if k == context_key(ctx))
        return mean + c.ucb_c * math.sqrt(math.log(big_n + 1) / (n + 1))

    def plan(self, ctx: dict[str, Any]) -> tuple[list[tuple[Arm, str]], str | None]:
        """The arms to try on a task, in order, each with why; and why the task is stopped
        (None when some arm is tried)."""
        c = self.config
        key = context_key(ctx)
        if c.policy == "bandit":
            scored = sorted(self.arms, key=lambda a: (-self._ucb(ctx, a), a.rank, a.name))
            order = [(a, f"bandit: UCB {self._ucb(ctx, a):.3f} in {key}") for a in scored]
        else:
            order = []
            for i, a in enumerate(self.arms):
                streak = self.streak.get((key, a.name), 0)
                pred = self.predicted(ctx, a)
                last = i == len(self.arms) - 1
                if not last and streak >= c.escalate_after:
                    continue  # repeated errors here: escalate past this arm
                if not last and pred and pred["success"] < c.min_success:
                    continue
                why = "cheapest arm" if not order else "escalation after a failure"
                if i > 0 and not order:
                    why = (f"escalated: {self.arms[i - 1].name} failed {streak} times in a row "
                           f"in {key}" if self.streak.get((key, self.arms[i - 1].name), 0)
                           >= c.escalate_after else
                           f"escalated: {self.arms[i - 1].name} predicted below "
                           f"{c.min_success:.2f}")
                order.append((a, why))
        stopped = None
        if c.max_cost_per_verified is not None:
            kept = []
            for a, why in order:
                pred = self.predicted(ctx, a)
                if pred is None:
                    kept.append((a, why))
                    continue
                per = pred["cost"] / max(pred["success"], 1e-3)
                if per <= c.max_cost_per_verified:
                    kept.append((a, f"{why}; predicted {per:.0f} cost units per verified"))
            if not kept:
                stopped = (f"stopped: every arm's predicted cost per verified trajectory is over "
                           f"{c.max_cost_per_verified:g}")
            order = kept
        return order[:c.max_attempts], stopped
