"""Trajectories as training data for the training library.

Turn-level SFT trains each assistant turn t on the context before it, with tool observations
never trained on. One `ChatExample` per trajectory gives exactly that loss: the training
library's chat tokenisation labels every assistant turn and masks every other turn, and under
causal attention turn t sees precisely the context up to t. (Splitting a trajectory into one
example per turn would train the same tokens on the same contexts, only with the shared
prefix encoded once per turn.)
"""

from __future__ import annotations

from collections.abc import Iterable

from workbench.agents.steps import AgentTrajectory
from workbench.records import ChatExample


def to_chat_example(t: AgentTrajectory, *, drop_errors: bool = True) -> ChatExample | None:
    """The trajectory as one SFT example, or None when it did not end with an answer (or,
    with `drop_errors`, when the model made a mistake on the way: a student should not learn
    the mistake)."""
    if not t.ok or (drop_errors and t.errors):
        return None
    return ChatExample(messages=t.messages, tools=t.tools or None, id=t.id,
                       metadata={"task_id": t.task_id, "pack": t.pack, "scaffold": t.scaffold,
                                 "policy": t.policy, "model": t.model,
                                 "prompt_version": t.prompt_version,
                                 "tool_calls": t.tool_calls})


def sft_examples(trajectories: Iterable[AgentTrajectory], **kw) -> list[ChatExample]:
    return [e for t in trajectories if (e := to_chat_example(t, **kw)) is not None]
