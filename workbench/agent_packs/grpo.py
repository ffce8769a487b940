"""What the agent packs' on-policy conditions share (issue 44): the training of a pack's agent
with GRPO on its own rollouts against the pack's reward, as one stage of the agent pipeline,
and the record the reports give of it. rf's `tools+grpo` (`rf.grpo`) and kgv's `agent_grpo`
(`kgv.api`) are made of it; a pack brings its tasks, its agent setup and its reward.

The adapter is trained once per (tasks, model, settings, seed, the pack's code) as the
pack's stage (`workbench.train.grpo_recipe.train_grpo`: a checkpoint every step, so a killed
run resumes where it stopped), the adapter with the best held-out ("dev") reward is kept
(the guard against GRPO's "peak, then collapse" over tool interfaces), and the condition
runs the pack's agent on the base model with the adapter merged.

Beside the adapter folder `<stage>/` the training keeps, in the same agent folder:
`.<stage>.key` (the inputs the checkpoints were made under: other inputs start over),
`.<stage>.checkpoints/` (removed once the adapter is written), `<stage>.rollouts/` (every
step's rollouts, for inspection) and `<stage>.live.jsonl` (one metric row per step, for
the app's live curves and anyone tailing the run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from workbench.agents.rollout import RewardFn
from workbench.agents.runner import AgentSetup, AgentTask
from workbench.io import atomic_write_text
from workbench.models.factory import open_chat_model
from workbench.records import ReportPart
from workbench.runs import hash_inputs
from workbench.text import number, percent
from workbench.train.config import TrainConfig
from workbench.train.grpo_recipe import train_grpo


class TrainedAdapter(ReportPart):
    """How a trained condition's adapter was made (`training_info`): the items it was
    trained on, chosen on and scored on, the steps, the kept step and the rewards."""

    train_items: int
    dev_items: int
    test_items: int
    steps: int
    adapter_step: int | None = None
    dev_reward_start: float | None = None
    dev_reward_best: float | None = None
    reward_first_quarter: float | None = None
    reward_last_quarter: float | None = None
    no_signal_share: float | None = None
    tool_calls_first_quarter: float | None = None
    tool_calls_last_quarter: float | None = None


def train_config(g, *, init_adapter: str | None = None) -> Any:
    """The training library's config for an `agent.grpo` section (`GrpoTraining`)."""
    return TrainConfig(method="grpo", max_steps=g.max_steps, learning_rate=g.learning_rate,
                       batch_size=g.batch_size, max_length=g.max_length, warmup_ratio=0.0,
                       scheduler="constant", save_every=1, lora=g.lora, grpo=g.settings,
                       init_adapter=init_adapter)


def train(cfg, ctx, stage: str, folder: Path, *, train_tasks: Sequence[AgentTask],
          dev_tasks: Sequence[AgentTask], counts: dict[str, int], items_key: tuple,
          agent_setup: Callable[..., AgentSetup], reward: RewardFn, code: Any = (),
          init_adapter: str | None = None) -> dict[str, Any]:
    """Train (or find up to date) the adapter of the pack's stage `stage` in `folder`; the
    stage's record of the training (`training_info`).

    `agent_setup(temperature=, seed=, max_tokens=)` builds the pack's agent with the
    sampling it is given (0: greedy, for the dev runs); `items_key` names the training and
    dev items (a tuple: its parts lead the stage's key), `code` what of the pack's code the tasks and reward depend on (its prompts and
    penalties), so a change of either retrains; `counts` gives the report's train, dev and
    test item counts. A killed training resumes from its checkpoints only under the same
    inputs: the stage's hash is kept beside them (`.<stage>.key`), and other inputs (or
    `--fresh`) start over."""
    tc = train_config(cfg.agent.grpo, init_adapter=init_adapter)
    key = (*items_key, cfg.models.chat.model_dump(mode="json"), cfg.agent.policy,
           cfg.agent.errors.model_dump(mode="json"), tc.model_dump(mode="json"), cfg.seed,
           code)
    marker = folder.parent / f".{folder.name}.key"

    def go() -> dict[str, Any]:
        h = hash_inputs(key)
        same = marker.is_file() and marker.read_text(encoding="utf-8") == h
        folder.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(marker, h)

        def setup(smp) -> AgentSetup:
            return agent_setup(temperature=smp.temperature, seed=smp.seed,
                               max_tokens=smp.max_tokens)

        r = train_grpo(tc, tasks=list(train_tasks), held_out=list(dev_tasks),
                       agent_setup=setup, reward=reward, output=folder,
                       model_spec=cfg.models.chat.spec, seed=cfg.seed, log=ctx.log,
                       resume=same and not ctx.fresh)
        return training_info(r.metrics, r.manifest.get("outputs", {}), counts)

    rec, _ = ctx.stages("agent").run(stage, key, go)
    return dict(rec.info or {})


def training_info(metrics: list[dict], outputs: dict[str, Any], counts: dict[str, int]
                  ) -> dict[str, Any]:
    """What the report says about the training: the item counts (`train_items`,
    `dev_items`, `test_items`), the steps, the kept step, the dev reward at the start and at
    the kept step, the training rollouts' mean reward and tool calls in the first and the
    last quarter of the steps, and the share of groups with no signal (every rollout of a
    task equally rewarded, so no gradient)."""
    steps = [m for m in metrics if "reward_mean" in m]
    q = max(1, len(steps) // 4)

    def mean(rows: list[dict], key: str) -> float | None:
        vals = [float(r[key]) for r in rows if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    return {**counts, "steps": len(steps),
            "adapter_step": outputs.get("adapter_step"),
            "dev_reward_start": outputs.get("heldout_reward_start"),
            "dev_reward_best": outputs.get("heldout_reward_best"),
            "reward_first_quarter": mean(steps[:q], "reward_mean"),
            "reward_last_quarter": mean(steps[-q:], "reward_mean"),
            "no_signal_share": mean(steps, "groups_no_signal"),
            "tool_calls_first_quarter": mean(steps[:q], "tool_calls_per_rollout"),
            "tool_calls_last_quarter": mean(steps[-q:], "tool_calls_per_rollout")}


def adapted_model(cfg, folder: Path):
    """The chat model with the adapter in `folder` merged (a guided policy scores with it)."""
    mc = cfg.models.chat.model_copy(update={"options": {
        **cfg.models.chat.options, "adapter": str(folder), "merge_adapter": True}})
    return open_chat_model(mc, cfg)


def summary_line(name: str, t: TrainedAdapter, *, scored: str = "test items") -> str:
    """The report's paragraph on how the condition's adapter was made (`scored`: what the
    pack calls the items every condition is scored on)."""
    kept = f"the adapter of step {t.adapter_step} is kept (best mean reward on " \
           f"{t.dev_items} dev items: {number(t.dev_reward_start)} at the start, " \
           f"{number(t.dev_reward_best)} kept)" if t.dev_items and \
           t.dev_reward_best is not None else \
           f"the adapter of its last step ({t.adapter_step}) is kept (no dev items chose)"
    calls = "" if t.tool_calls_first_quarter is None else (
        f"; tool calls a rollout {number(t.tool_calls_first_quarter, 2)} in the first "
        f"quarter, {number(t.tool_calls_last_quarter, 2)} in the last")
    return (f"{name}: trained {t.steps} steps on the rollouts of {t.train_items} items; "
            f"{kept}. Every condition above is scored on the {t.test_items} {scored} only. "
            f"Training rollouts' mean reward {number(t.reward_first_quarter)} in the first "
            f"quarter of the steps, {number(t.reward_last_quarter)} in the last{calls}; "
            f"groups with no signal (every rollout of a task rewarded alike): "
            f"{percent(t.no_signal_share)} of them.")
