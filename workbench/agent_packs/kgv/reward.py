"""The KGV pack's reward for on-policy training (AgentKGV's second stage): a correct verdict
earns 1, each search call costs `search_cost`, so the policy learns to search only where
searching pays; each model mistake costs `format_penalty`, and so does a run that ends
without a verdict."""

from __future__ import annotations

from workbench.agent_packs.kgv.metrics import prediction
from workbench.agents.steps import AgentTrajectory

SEARCH_COST = 0.1
FORMAT_PENALTY = 0.1


def reward(trajectory: AgentTrajectory, *, search_cost: float = SEARCH_COST,
           format_penalty: float = FORMAT_PENALTY) -> float:
    """1 for the gold label (the claim rides in the task's metadata, as `KgvAgent.task`
    puts it), minus the search calls' cost and the format penalties."""
    gold = trajectory.metadata["claim"]["label"]
    right = float(trajectory.ok and prediction(trajectory) == gold)
    return right - search_cost * trajectory.calls_to("search") \
        - format_penalty * (trajectory.errors + (not trajectory.ok))
