"""The RF pack's on-policy condition, `tools+grpo` (issue 44): the tools agent trained with
GRPO on its own rollouts against the pack's reward (`rf.api.reward`: right within the item's
tolerance, less a penalty per model mistake), compared with the prompted tools agent on the
same held-out items.

With `tools+grpo` among `agent.conditions` the design items are split by a seeded shuffle
(`cfg.seed`) into
- test items: every condition of the run is scored on them and only them, so the paired
  tests compare the same items;
- dev items (`agent.grpo.dev_share`): run greedily every `agent.grpo.settings.eval_every`
  steps; the adapter with the best dev reward is the one kept (the guard against GRPO's
  "peak, then collapse" over tool interfaces);
- training items: the rest, rolled out `group_size` times each.

The adapter is trained once per (items, model, settings, seed) as the stage `rf_grpo`
(`workbench.agent_packs.grpo`, shared with the other packs' on-policy conditions: checkpoints
every step, so a killed run resumes where it stopped), and the condition runs the tools agent
on the base model with the adapter merged (`agent_packs.grpo.adapted_model`). Opt-in: the
bundled model takes tens of minutes per 24 steps on two CPU cores.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.agent_packs import grpo
from workbench.agent_packs.rf.bench import DesignItem
from workbench.agents.rollout import RewardFn
from workbench.agents.runner import AgentTask
from workbench.errors import ConfigError

CONDITION = "tools+grpo"


@dataclass(frozen=True)
class Split:
    """The design items of a run with `tools+grpo`: scored, choosing, trained on."""

    test: list[DesignItem]
    dev: list[DesignItem]
    train: list[DesignItem]


def split_items(items: list[DesignItem], test_share: float, dev_share: float,
                seed: int, *, limit: int | None = None) -> Split:
    """A seeded shuffle (its first `limit` items, when given) cut into test, dev and
    training items (at least one test and two training items, else a ConfigError saying how
    many there are)."""
    shuffled = list(items)
    random.Random(seed).shuffle(shuffled)
    shuffled = shuffled[:limit] if limit else shuffled
    n_test = max(1, round(len(shuffled) * test_share))
    n_dev = round(len(shuffled) * dev_share)
    if len(shuffled) - n_test - n_dev < 2:
        raise ConfigError([f"agent.grpo: {len(shuffled)} design items leave "
                           f"{len(shuffled) - n_test - n_dev} to train tools+grpo on after "
                           f"{n_test} test and {n_dev} dev items (lower test_share or "
                           "dev_share, raise agent.dev_limit, or generate more items)"])
    return Split(shuffled[:n_test], shuffled[n_test:n_test + n_dev],
                 shuffled[n_test + n_dev:])


def adapter(cfg, ctx, split: Split, folder: Path, *, tools_setup: Callable[..., Any],
            task: Callable[[DesignItem], AgentTask], reward: RewardFn, code: Any = ()
            ) -> dict[str, Any]:
    """Train (or find up to date) the tools+grpo adapter in `folder` as the stage `rf_grpo`
    (`agent_packs.grpo.train`) with the pack's tools agent (`tools_setup(agent_config,
    temperature=, seed=, max_tokens=)`), tasks and reward (`code`: what of the pack's code
    they depend on, its prompts and penalties, so a change retrains); the stage's record of
    the training: items, steps, the kept step and the dev rewards."""
    def setup(**sampling: Any):
        return tools_setup(cfg.agent, **sampling)

    return grpo.train(
        cfg, ctx, "rf_grpo", folder, train_tasks=[task(i) for i in split.train],
        dev_tasks=[task(i) for i in split.dev],
        counts={"train_items": len(split.train), "dev_items": len(split.dev),
                "test_items": len(split.test)},
        items_key=([i.model_dump(mode="json") for i in split.train],
                   [i.model_dump(mode="json") for i in split.dev]),
        agent_setup=setup, reward=reward, code=code)
