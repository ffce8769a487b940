"""What an agent run leaves behind: its steps and the conversation they form."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictStr

from workbench.records import Message, Record, ToolSpec

StepKind = Literal["plan", "thought", "tool_call", "observation", "final", "error"]


class AgentStep(Record):
    """One step: the model's plan, thought, tool call or final answer, a tool's observation,
    or an error. A model's mistake (unknown tool, arguments that break the schema, a reply
    with neither a call nor an answer) is an `error` step with `error` set; the run goes on
    or stops by the error policy."""

    index: int
    turn: int  # the model turn it belongs to (observations: the turn whose call they answer)
    kind: StepKind
    content: StrictStr = ""
    tool: StrictStr | None = None
    arguments: dict[str, Any] | StrictStr | None = None
    call_id: StrictStr | None = None
    error: StrictStr | None = None
    tokens: int = 0  # completion tokens of the turn (on its first step)
    # guided turns: the candidates the model chose among, with their scores
    candidates: list[dict[str, Any]] | None = None


class AgentTrajectory(Record):
    """A whole run: the conversation (OpenAI messages, ready for SFT), the typed steps, the
    final answer (the final tool's arguments) and why it stopped."""

    id: StrictStr
    task_id: StrictStr
    pack: StrictStr = ""
    scaffold: StrictStr = ""
    policy: StrictStr = ""
    model: StrictStr = ""
    prompt_version: StrictStr = ""
    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)
    steps: list[AgentStep] = Field(default_factory=list)
    final: dict[str, Any] | None = None
    stop: Literal["final", "max_steps", "max_tool_calls", "max_tokens", "errors",
                  "backend_error"] = "final"
    tool_calls: int = 0
    model_turns: int = 0
    completion_tokens: int = 0
    errors: int = 0
    seconds: float = 0.0
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.stop == "final" and self.final is not None

    def calls_to(self, name: str) -> int:
        return sum(s.kind == "tool_call" and s.tool == name and s.error is None
                   for s in self.steps)
