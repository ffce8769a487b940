"""Groups of rollouts for on-policy training: G runs of each task by the current policy, in
lockstep (one batched model call per turn for all tasks and all their samples), tools live,
each run scored by the pack's reward.

    groups = sample_groups(model, tasks, setup, group_size=4, reward=pack.reward)
    stats = group_stats(groups)   # mean reward, within-group spread, groups with no signal

The reward is the pack's (`reward(trajectory) -> float`, reading what it needs from the
trajectory and the task metadata it carries), never the trainer's. The policy samples: a
`FreePolicy` with a temperature above 0 (the model writes its turns), or a `GuidedPolicy`
with a temperature (the model's scores pick among the pack's candidate calls). The model is
anything the models protocol offers: the adapter being trained, wrapped in memory
(`LocalChatModel.wrap`), or a server that hot-loads it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace

from pydantic import StrictStr

from workbench.agents.runner import AgentSetup, AgentTask, run_agents
from workbench.agents.steps import AgentTrajectory
from workbench.models.base import ChatModel
from workbench.records import Record

RewardFn = Callable[[AgentTrajectory], float]
SEP = "#"  # a sample's task id is "<task id>#<sample>"


class Rollout(Record):
    """One sampled run of a task, with the reward the pack gave it."""

    group: StrictStr  # the task's id: rollouts of one task form a group
    sample: int
    reward: float
    trajectory: AgentTrajectory


def sample_groups(model: ChatModel, tasks: Sequence[AgentTask], setup: AgentSetup, *,
                  group_size: int, reward: RewardFn, desc: str = "rollouts",
                  check: Callable[[Sequence[AgentTrajectory]], None] | None = None
                  ) -> list[list[Rollout]]:
    """`group_size` runs of every task, all in one lockstep batch; one group per task, in
    task order, each group's rollouts in sample order. A sample is its task under the id
    `<task id>#<k>` with `metadata["group"]` and `metadata["sample"]` added. `check` sees
    the runs before they are rewarded (a rollout server's failures stop here)."""
    if group_size < 1:
        raise ValueError("group_size must be at least 1")
    copies = [replace(t, id=f"{t.id}{SEP}{k}",
                      metadata={**t.metadata, "group": t.id, "sample": k})
              for t in tasks for k in range(group_size)]
    trajs = run_agents(model, copies, setup, desc=desc)
    if check is not None:
        check(trajs)
    out: list[list[Rollout]] = []
    for i, t in enumerate(tasks):
        out.append([Rollout(group=t.id, sample=k, reward=float(reward(tr)), trajectory=tr)
                    for k, tr in enumerate(trajs[i * group_size:(i + 1) * group_size])])
    return out


def group_stats(groups: Sequence[Sequence[Rollout]]) -> dict[str, float]:
    """What a step's rollouts say about its signal: mean reward, the mean within-group
    standard deviation of rewards, the share of groups whose rewards are all equal (their
    advantages are all 0: no signal), tool calls and model turns per rollout, and the share
    that ended with an answer."""
    flat = [r for g in groups for r in g]
    if not flat:
        return {}
    stds = [statistics.pstdev([r.reward for r in g]) if len(g) > 1 else 0.0 for g in groups]
    return {"reward_mean": statistics.fmean(r.reward for r in flat),
            "reward_std_in_group": statistics.fmean(stds),
            "groups_no_signal": sum(max(r.reward for r in g) == min(r.reward for r in g)
                                    for g in groups) / len(groups),
            "tool_calls_per_rollout": statistics.fmean(r.trajectory.tool_calls for r in flat),
            "turns_per_rollout": statistics.fmean(r.trajectory.model_turns for r in flat),
            "answered": statistics.fmean(r.trajectory.ok for r in flat)}
