"""Multi-turn search dialogues: the agent (or a fixed rule, or the oracle teacher) submits a
workflow each turn; it runs with a memo kept across turns; the simulated user judges the top
results; the conversation grows by the results and the feedback."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from workbench.agent_packs.litsearch import dag as D
from workbench.agent_packs.litsearch.pack import (
    Intent,
    Library,
    SimulatedUser,
    describe,
    edits,
    metrics,
    ranking,
    results_text,
    templates,
    toolbox,
    workflow_call,
)
from workbench.agents.runner import (
    AgentSetup,
    AgentTask,
    Budget,
    ErrorPolicy,
    FreePolicy,
    GuidedPolicy,
    run_agents,
)
from workbench.models.base import GenerationParams


@dataclass
class Dialogue:
    intent: Intent
    user: SimulatedUser
    memo: D.Memo = field(default_factory=D.Memo)
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    workflow: dict[str, Any] | None = None
    feedback: tuple[Sequence[str], Sequence[str]] = ((), ())
    seconds: float = 0.0

    def candidates(self, lib: Library) -> dict[str, dict[str, Any]]:
        if self.workflow is None:
            return templates(self.intent, citations=lib.citations)
        acc, rej = self.feedback
        return edits(self.workflow, list(acc), list(rej), lib.papers)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.intent.id, "turns": self.turns, "messages": self.messages,
                "memo": {"hits": self.memo.hits, "misses": self.memo.misses},
                "seconds": round(self.seconds, 3)}


def _name_of(wf: dict[str, Any], cands: dict[str, dict[str, Any]]) -> str:
    for name, c in cands.items():
        if c == wf:
            return name
    return "written"


def execute(d: Dialogue, lib: Library, wf: dict[str, Any] | None, choice: str,
            error: str | None, call_id: str | None) -> None:
    """Run the turn's workflow, score it, get the user's feedback, extend the conversation."""
    t0 = time.perf_counter()
    ranked: list[str] = []
    if wf is not None and error is None:
        parsed, problems = D.parse(wf)
        if parsed is not None and not problems:
            problems = D.validate(parsed)
        if problems or parsed is None:
            error = "; ".join(map(str, problems)) or "not a workflow"
        else:
            try:
                value, _ = D.run(parsed, lib.ops(), d.memo)
                ranked = ranking(value)
            except D.ExecutionError as e:
                error = str(e)
    m = metrics(ranked, d.intent)
    acc, rej = d.user.feedback(ranked)
    d.turns.append({"turn": len(d.turns) + 1, "choice": choice, "error": error,
                    "workflow": wf, **m, "accepted": acc, "rejected": rej,
                    "memo_hits": d.memo.hits, "memo_misses": d.memo.misses})
    if wf is not None and error is None:
        d.workflow = wf
    d.feedback = (acc, rej)
    if call_id is not None:
        d.messages.append({"role": "tool", "tool_call_id": call_id, "name": "submit_workflow",
                           "content": results_text(ranked, lib.papers) if error is None
                           else f"Error: {error}"})
    d.messages.append({"role": "user", "content": d.user.message(acc, rej)})
    d.seconds += time.perf_counter() - t0


def start(intents: list[Intent], system: str, prompt: str) -> list[Dialogue]:
    out = []
    for it in intents:
        d = Dialogue(it, user=SimulatedUser(it))
        d.messages = [{"role": "system", "content": system},
                      {"role": "user", "content": prompt.format(query=it.query)}]
        out.append(d)
    return out


def rule_turns(dialogues: list[Dialogue], lib: Library, choose) -> None:
    """One turn chosen without a model: `choose(dialogue, candidates) -> name`."""
    for d in dialogues:
        cands = d.candidates(lib)
        name = choose(d, cands)
        call = workflow_call(cands[name])
        d.messages.append({"role": "assistant", "content": "",
                           "tool_calls": [call.model_dump(mode="json")]})
        execute(d, lib, cands[name], name, None, call.id)


def oracle_choice(lib: Library):
    """The teacher: every candidate run against the hidden labels, the best nDCG@10 kept
    (ties: the smaller workflow)."""
    def choose(d: Dialogue, cands: dict[str, dict[str, Any]]) -> str:
        best = None
        for name, wf in cands.items():
            parsed = D.parse(wf)[0]
            if parsed is None:  # a candidate is a workflow the library made: it parses
                continue
            try:
                value, _ = D.run(parsed, lib.ops(), d.memo)
            except D.ExecutionError:
                continue
            ranked, seen = ranking(value), d.user.judged
            fresh = [p for p in ranked if p not in seen] + [p for p in ranked if p in seen]
            score = (metrics(ranked, d.intent)["ndcg10"],
                     metrics(fresh, d.intent)["ndcg10"], -len(wf["nodes"]))
            if best is None or score > best[0]:
                best = (score, name)
        return best[1] if best else next(iter(cands))

    return choose


def model_turns(dialogues: list[Dialogue], lib: Library, model, *, policy: str,
                repairs: int = 2, calibrate: Literal["none", "batch"] = "none") -> None:
    """One turn chosen by the model (guided: among the candidates; free: written), with up
    to `repairs` retries after the validator's errors."""
    box = toolbox()
    by_id = {d.intent.id: d for d in dialogues}

    def propose(state, allowed):
        d = by_id[state.task.id]
        return [workflow_call(wf) for wf in d.candidates(lib).values()]

    pol = GuidedPolicy(propose, calibrate=calibrate, final_names=box.final_names,
                       describe=lambda c: describe(json.loads(c.function.arguments)[
                           "workflow"])) \
        if policy == "guided" else FreePolicy(GenerationParams(max_tokens=400),
                                              constrained=policy == "free")
    setup = AgentSetup(toolbox=box, policy=pol,
                       budget=Budget(max_steps=1 + repairs, max_tool_calls=0),
                       errors=ErrorPolicy(max_errors=repairs), pack="litsearch")
    tasks = [AgentTask(d.intent.id, d.messages[1]["content"], history=d.messages)
             for d in dialogues]
    for d, t in zip(dialogues, run_agents(model, tasks, setup, desc="litsearch turn"),
                    strict=True):
        d.messages = [m.model_dump(mode="json", exclude_none=True) for m in t.messages]
        if t.ok and t.final is not None:  # an ok run ends in its final call
            wf = t.final["workflow"]
            call_id = d.messages[-1]["tool_calls"][-1]["id"]
            execute(d, lib, wf, _name_of(wf, d.candidates(lib)), None, call_id)
        else:
            last = d.messages[-1]
            call_id = last["tool_calls"][-1]["id"] if last.get("tool_calls") else None
            if last["role"] == "tool":  # the refused call was already answered
                call_id = None
            execute(d, lib, None, "failed", f"no valid workflow after {repairs} repairs "
                    f"({t.stop})", call_id)


def last_assistant(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation cut after its last assistant turn (an SFT example ends there)."""
    k = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return messages[:k + 1]

