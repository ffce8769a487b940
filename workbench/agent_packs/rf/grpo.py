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
(`workbench.train.grpo_recipe.train_grpo`: checkpoints every step, so a killed run resumes
where it stopped), and the condition runs the tools agent on the base model with the adapter
merged. Opt-in: the bundled model takes tens of minutes per 24 steps on two CPU cores.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def train_config(cfg) -> Any:
    """The training library's config for `agent.grpo`'s settings."""
    from workbench.train.config import TrainConfig

    g = cfg.agent.grpo
    return TrainConfig(method="grpo", max_steps=g.max_steps, learning_rate=g.learning_rate,
                       batch_size=g.batch_size, max_length=g.max_length, warmup_ratio=0.0,
                       scheduler="constant", save_every=1, lora=g.lora, grpo=g.settings)


def adapter(cfg, ctx, split: Split, folder: Path, *, tools_setup: Callable[..., Any],
            task: Callable[[DesignItem], AgentTask], reward: RewardFn, code: Any = ()
            ) -> dict[str, Any]:
    """Train (or find up to date) the tools+grpo adapter in `folder` with the pack's agent
    (`tools_setup(agent_config, temperature=, seed=, max_tokens=)`), tasks and reward (`code`:
    what of the pack's code they depend on, its prompts and penalties, so a change retrains);
    the stage's record of the training: items, steps, the kept step and the dev rewards.

    A killed training resumes from its checkpoints only under the same inputs: the stage's
    hash is kept beside them (`.rf_grpo.key`), and other inputs (or `--fresh`) start over."""
    from workbench.runs import hash_inputs

    tc = train_config(cfg)
    key = ([i.model_dump(mode="json") for i in split.train],
           [i.model_dump(mode="json") for i in split.dev],
           cfg.models.chat.model_dump(mode="json"), cfg.agent.policy,
           cfg.agent.errors.model_dump(mode="json"), tc.model_dump(mode="json"), cfg.seed,
           code)
    marker = folder.parent / f".{folder.name}.key"

    def go() -> dict[str, Any]:
        from workbench.io import atomic_write_text
        from workbench.train.grpo_recipe import train_grpo

        h = hash_inputs(key)
        same = marker.is_file() and marker.read_text(encoding="utf-8") == h
        folder.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(marker, h)

        def agent_setup(smp):
            return tools_setup(cfg.agent, temperature=smp.temperature, seed=smp.seed,
                               max_tokens=smp.max_tokens)

        r = train_grpo(tc, tasks=[task(i) for i in split.train],
                       held_out=[task(i) for i in split.dev],
                       agent_setup=agent_setup, reward=reward, output=folder,
                       model_spec=cfg.models.chat.spec, seed=cfg.seed, log=ctx.log,
                       resume=same and not ctx.fresh)
        return training_info(r.metrics, r.manifest.get("outputs", {}), split)

    rec, _ = ctx.stages("agent").run("rf_grpo", key, go)
    return dict(rec.info or {})


def training_info(metrics: list[dict], outputs: dict[str, Any], split: Split
                  ) -> dict[str, Any]:
    """What the report says about the training: the split, the steps, the kept step, the
    dev reward at the start and at the kept step, the training rollouts' mean reward in the
    first and the last quarter of the steps, and the share of groups with no signal (every
    rollout of a task equally rewarded, so no gradient)."""
    steps = [m for m in metrics if "reward_mean" in m]
    q = max(1, len(steps) // 4)

    def mean(rows: list[dict], key: str) -> float | None:
        vals = [float(r[key]) for r in rows if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    return {"train_items": len(split.train), "dev_items": len(split.dev),
            "test_items": len(split.test), "steps": len(steps),
            "adapter_step": outputs.get("adapter_step"),
            "dev_reward_start": outputs.get("heldout_reward_start"),
            "dev_reward_best": outputs.get("heldout_reward_best"),
            "reward_first_quarter": mean(steps[:q], "reward_mean"),
            "reward_last_quarter": mean(steps[-q:], "reward_mean"),
            "no_signal_share": mean(steps, "groups_no_signal")}


def adapted_model(cfg, folder: Path):
    """The chat model with the tools+grpo adapter merged (the guided policy scores with it)."""
    from workbench.models.factory import open_chat_model

    mc = cfg.models.chat.model_copy(update={"options": {
        **cfg.models.chat.options, "adapter": str(folder), "merge_adapter": True}})
    return open_chat_model(mc, cfg)
