"""The agent loop: every task runs in lockstep with the others, so each model turn is one
batched call (a CPU model or a vLLM server sees batches, not single prompts).

A run is a conversation in OpenAI form. Each turn the scaffold may ask for a plan (text, no
tools); otherwise the policy produces an assistant turn that calls tools: `FreePolicy` lets
the model write its calls (native tool calls on servers and templates that have them, the
Hermes `<tool_call>` syntax otherwise), `GuidedPolicy` asks the pack for candidate calls and
lets the model's log-likelihood choose, which keeps a 135M model on valid actions. Tool
results come back as `tool` turns. The run ends when a final tool is called with valid
arguments, or a budget is spent, or the model has made more mistakes than the error policy
allows.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from workbench.agents.steps import AgentStep, AgentTrajectory
from workbench.agents.tools import Toolbox
from workbench.errors import WorkbenchError
from workbench.models.base import ChatModel, Generation, GenerationParams, ScoreRequest
from workbench.models.tools import TemplateTools, template_messages, tool_call_text
from workbench.plugins import Registry
from workbench.progress import progress
from workbench.records import Message, StrictModel, ToolCall


class Budget(StrictModel):
    max_steps: int = Field(6, ge=1, description="Model turns per run (a plan counts).")
    max_tool_calls: int = Field(4, ge=0, description="Calls to non-final tools per run; after "
                                                     "that only the final tool is offered.")
    max_tokens: int = Field(2048, ge=1, description="Completion tokens per run.")


class ErrorPolicy(StrictModel):
    on_error: Literal["continue", "stop"] = Field(
        "continue", description="After a model mistake: show it the error and go on, or stop.")
    max_errors: int = Field(2, ge=0, description="Mistakes allowed before the run stops.")


@dataclass
class AgentTask:
    id: str
    prompt: str  # the user turn
    metadata: dict[str, Any] = field(default_factory=dict)
    # a conversation to go on from (a dialogue's earlier turns, system prompt included);
    # None: a new conversation from the scaffold
    history: list[dict[str, Any]] | None = None
    system: str | None = None  # this task's system prompt (None: the setup's)


@dataclass
class AgentState:
    """One live run; packs read it to propose calls (`observations`, `tool_calls`)."""

    task: AgentTask
    messages: list[dict[str, Any]]
    steps: list[AgentStep] = field(default_factory=list)
    turn: int = 0
    tool_calls: int = 0
    tokens: int = 0
    errors: int = 0
    planned: bool = False
    final: dict[str, Any] | None = None
    stop: str | None = None
    started: float = field(default_factory=time.perf_counter)
    observations: list[tuple[str, dict[str, Any], Any]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.stop is not None

    def step(self, kind: str, **kw: Any) -> AgentStep:
        s = AgentStep(index=len(self.steps), turn=self.turn, kind=kind, **kw)
        self.steps.append(s)
        return s

    def calls_made(self, name: str | None = None) -> list[dict[str, Any]]:
        """Arguments of the successful calls so far (to `name`, or all)."""
        return [args for n, args, _ in self.observations if name is None or n == name]


# --- scaffolds -------------------------------------------------------------------------------

class Scaffold:
    """How the conversation is framed; the same loop runs every scaffold."""

    name = "react"
    instruction = ("Work step by step: call one tool at a time, read its result, and when you "
                   "can answer, call {final}.")

    def start(self, task: AgentTask, system: str, final: str) -> list[dict[str, Any]]:
        text = "\n\n".join(x for x in (system, self.instruction.format(final=final)) if x)
        return [{"role": "system", "content": text}, {"role": "user", "content": task.prompt}]

    def wants_plan(self, state: AgentState) -> bool:
        return False

    def after_plan(self, state: AgentState) -> None:
        pass


class ReAct(Scaffold):
    """Reason and act: each turn one tool call, its observation, the next call (Yao et al.,
    2023)."""


class PlanExecute(Scaffold):
    """Plan first (a short numbered plan, no tools), then carry it out with the tools."""

    name = "plan_execute"
    plan_request = ("Before using any tool, write a short numbered plan (at most 3 steps) for "
                    "this request. Do not call tools yet.")
    go = "Now carry out the plan with the tools."

    def start(self, task, system, final):
        msgs = super().start(task, system, final)
        msgs[-1] = {"role": "user", "content": f"{task.prompt}\n\n{self.plan_request}"}
        return msgs

    def wants_plan(self, state):
        return not state.planned

    def after_plan(self, state):
        state.messages.append({"role": "user", "content": self.go})


class Reflexion(ReAct):
    """ReAct whose system prompt carries the lessons of the task's earlier failed trials
    (`task.metadata["lessons"]`); `run_reflexion` runs the trials (Shinn et al., 2023)."""

    name = "reflexion"

    def start(self, task, system, final):
        msgs = super().start(task, system, final)
        lessons = task.metadata.get("lessons") or []
        if lessons:
            msgs[0]["content"] += "\n\nLessons from your earlier trials:\n" + "\n".join(
                f"- {x}" for x in lessons)
        return msgs


# one-run scaffolds (any pack's `scaffold:` setting), and those that need `run_reflexion`;
# registries (`workbench.plugins.Registry`), so code may add one
_UNKNOWN = "unknown {kind} {name!r} (one of {known})"
SCAFFOLDS: Registry[type[Scaffold]] = Registry("scaffold", unknown=_UNKNOWN)
SCAFFOLDS.register("react", ReAct)
SCAFFOLDS.register("plan_execute", PlanExecute)
TRIAL_SCAFFOLDS: Registry[type[Scaffold]] = Registry("scaffold", unknown=_UNKNOWN)
TRIAL_SCAFFOLDS.register("reflexion", Reflexion)


def scaffold(name: str) -> Scaffold:
    if name in TRIAL_SCAFFOLDS:
        return TRIAL_SCAFFOLDS.get(name)()
    return SCAFFOLDS.get(name, known=[*SCAFFOLDS, *TRIAL_SCAFFOLDS])()


# --- policies --------------------------------------------------------------------------------

def allowed_tools(state: AgentState, toolbox: Toolbox, budget: Budget) -> list[str]:
    if state.tool_calls >= budget.max_tool_calls:
        return toolbox.final_names
    return list(toolbox.tools)


class Policy:
    name = "policy"

    def plan(self, model: ChatModel, states: Sequence[AgentState],
             params: GenerationParams) -> list[Generation]:
        if not states:
            return []
        return model.generate([s.messages for s in states], params)

    def act(self, model: ChatModel, states: Sequence[AgentState], toolbox: Toolbox,
            budget: Budget) -> list[Generation | tuple[Generation, list[dict[str, Any]]]]:
        raise NotImplementedError


class FreePolicy(Policy):
    """The model writes its own calls (and may answer in text, read by `parse_final`).

    `constrained` (the default): on a backend that can constrain its output, every step is a
    forced tool call (`tool_choice: "required"`) generated under the tools' JSON schemas, so
    the call always parses and fits its schema; the final answer is then a final tool's call.
    With `constrained=False` (or a backend that cannot), the model writes free text and the
    calls that parse are taken."""

    name = "free"

    def __init__(self, params: GenerationParams | None = None, *, constrained: bool = True):
        self.params = params or GenerationParams(max_tokens=160)
        self.constrained = constrained

    def act(self, model, states, toolbox, budget):
        out: list[Any] = [None] * len(states)
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, s in enumerate(states):
            groups.setdefault(tuple(allowed_tools(s, toolbox, budget)), []).append(i)
        for names, idx in groups.items():
            only_final = set(names) <= set(toolbox.final_names)
            choice: Any = "auto"
            forced = self.constrained and model.capabilities.constrained
            if (only_final or forced) and model.capabilities.tool_calls:
                choice = {"type": "function", "function": {"name": names[0]}} \
                    if len(names) == 1 else "required"
            gens = model.generate([states[i].messages for i in idx], self.params,
                                  tools=toolbox.specs(names), tool_choice=choice)
            for i, g in zip(idx, gens, strict=True):
                out[i] = g
        return out


Proposer = Callable[[AgentState, list[str]], list[ToolCall]]


class GuidedPolicy(Policy):
    """The pack proposes calls (`propose(state, allowed tool names)`); the model scores the
    text it would write for each (`<tool_call>{...}</tool_call>`) after the conversation and
    the best mean log-probability per token wins. With `temperature` > 0 the choice is
    sampled from the softmax of those scores (a teacher exploring); `seed` fixes it.

    `calibrate="batch"` applies batch calibration (Zhou et al., 2024): a small model prefers
    some answers whatever the input (SmolLM2-135M says SUPPORTED to every claim), so each
    candidate's score is taken relative to the mean score of the same kind of candidate
    over the turn's batch: the same tool and, for a final tool, the same values of its
    enumerated arguments (the verdict, not the evidence ids). It uses no labels, only the
    other inputs of the batch; kinds seen in fewer than `min_batch` runs are left as they
    are."""

    name = "guided"

    def __init__(self, propose: Proposer, *, temperature: float = 0.0, seed: int = 0,
                 calibrate: Literal["none", "batch"] = "none", min_batch: int = 4,
                 final_names: Sequence[str] = (),
                 describe: Callable[[ToolCall], str] | None = None):
        self.propose = propose
        # the text scored for a candidate (default: the call as the model would write it);
        # a pack whose calls are long (a whole workflow) may score a short description
        self.describe = describe
        self.temperature = temperature
        self.rng = random.Random(seed)
        self.calibrate, self.min_batch = calibrate, min_batch
        self.final_names = set(final_names)
        self.enums: dict[str, list[str]] = {}  # tool -> its enumerated arguments

    def _kind(self, call: ToolCall) -> str:
        name = call.function.name
        if name not in self.final_names:
            return name
        try:
            args = json.loads(call.function.arguments)
        except ValueError:
            return name
        keys = self.enums.get(name)
        picked = {k: v for k, v in args.items() if keys is None or k in keys}
        return f"{name}:{json.dumps(picked, sort_keys=True)}"

    def _offsets(self, rows: list[tuple[list[ToolCall], list[float]]]) -> dict[str, float]:
        """Per kind, the mean over the runs offering it of that run's mean score for it;
        only kinds offered by at least `min_batch` runs."""
        if self.calibrate != "batch":
            return {}
        seen: dict[str, list[float]] = {}
        for calls, means in rows:
            per_run: dict[str, list[float]] = {}
            for c, m in zip(calls, means, strict=True):
                per_run.setdefault(self._kind(c), []).append(m)
            for k, v in per_run.items():
                seen.setdefault(k, []).append(sum(v) / len(v))
        return {k: sum(v) / len(v) for k, v in seen.items() if len(v) >= self.min_batch}

    def act(self, model, states, toolbox, budget):
        if not model.capabilities.score:
            raise WorkbenchError(f"guided policy: backend {model.backend_name!r} cannot score "
                                 "continuations (use policy: free)")
        generic = TemplateTools.of(None)
        for name, tool in toolbox.tools.items():
            props = tool.parameters.get("properties") or {}
            self.enums.setdefault(name, [k for k, v in props.items()
                                         if isinstance(v, dict) and "enum" in v])
        requests, cands, single = [], [], {}
        for n, s in enumerate(states):
            names = allowed_tools(s, toolbox, budget)
            calls = [c for c in self.propose(s, names) if c.function.name in names]
            if not calls:
                raise WorkbenchError(f"guided policy: the pack proposed no call for task "
                                     f"{s.task.id} (allowed: {', '.join(names)})")
            texts = [self.describe(c) if self.describe else
                     tool_call_text([c.model_dump(mode="json")]) for c in calls]
            if len(calls) == 1:  # nothing to choose: no model call
                single[n] = calls[0]
                continue
            prompt = template_messages(s.messages, generic, toolbox.specs(names))
            requests.append(ScoreRequest(prompt=prompt, continuations=texts))
            cands.append(calls)
        scored = list(zip(cands, _score_unique(model, requests), strict=True))
        offsets = self._offsets([(calls, [sc.mean_logprob for sc in row])
                                 for calls, row in scored])
        out: list[Any] = []
        it = iter(scored)
        for n in range(len(states)):
            if n in single:
                only = single[n]
                out.append((Generation(text="", finish_reason="tool_calls", tool_calls=[only]),
                            [{"call": only.function.name, "arguments": only.function.arguments,
                              "mean_logprob": None}]))
                continue
            calls, row = next(it)
            raw = [sc.mean_logprob for sc in row]
            # a row is calibrated whole or not at all (mixing would favour one kind)
            full = all(self._kind(c) in offsets for c in calls)
            means = [m - offsets[self._kind(c)] if full else m
                     for c, m in zip(calls, raw, strict=True)]
            k = self._choose(means)
            info = [{"call": c.function.name, "arguments": c.function.arguments,
                     "mean_logprob": round(r, 4), "score": round(m, 4)}
                    for c, r, m in zip(calls, raw, means, strict=True)]
            gen = Generation(text="", finish_reason="tool_calls", tool_calls=[calls[k]],
                             completion_tokens=row[k].n_tokens)
            out.append((gen, info))
        return out

    def _choose(self, means: list[float]) -> int:
        if self.temperature <= 0:
            return max(range(len(means)), key=lambda i: (means[i], -i))
        top = max(means)
        weights = [math.exp((m - top) / self.temperature) for m in means]
        return self.rng.choices(range(len(means)), weights=weights)[0]


def _score_unique(model: ChatModel, requests: list[ScoreRequest]) -> list:
    """`model.score(requests)` with each distinct request scored once: the G rollouts of a
    task (on-policy training) ask the same first question G times."""
    if not requests:
        return []
    keys = [json.dumps([r.prompt, list(r.continuations)], sort_keys=True) for r in requests]
    first: dict[str, int] = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    if len(first) == len(requests):
        return model.score(requests)
    unique = model.score([requests[i] for i in first.values()])
    by_key = dict(zip(first, unique, strict=True))
    return [by_key[k] for k in keys]


# --- the loop --------------------------------------------------------------------------------

@dataclass
class AgentSetup:
    """Everything a run needs besides the model and the tasks."""

    toolbox: Toolbox
    system: str = ""
    scaffold: Scaffold = field(default_factory=ReAct)
    policy: Policy = field(default_factory=FreePolicy)
    budget: Budget = field(default_factory=Budget)
    errors: ErrorPolicy = field(default_factory=ErrorPolicy)
    plan_params: GenerationParams = field(
        default_factory=lambda: GenerationParams(max_tokens=96))
    # reads a final answer from a reply that calls no tool (None: such a reply is a mistake)
    parse_final: Callable[[str], dict[str, Any] | None] | None = None
    pack: str = ""
    prompt_version: str = ""


def run_agents(model: ChatModel, tasks: Sequence[AgentTask], setup: AgentSetup, *,
               desc: str = "agent", on_done: Callable[[AgentTrajectory], None] | None = None
               ) -> list[AgentTrajectory]:
    """Run every task to its end; trajectories come back in task order (and, one by one, to
    `on_done` as each finishes, so a caller can append them to a file as it goes)."""
    final = setup.toolbox.final_names[0]
    states = [AgentState(t, [dict(m) for m in t.history], planned=True) if t.history is not None
              else AgentState(t, setup.scaffold.start(
                  t, setup.system if t.system is None else t.system, final)) for t in tasks]
    out: dict[int, AgentTrajectory] = {}
    bar = iter(progress(range(len(states)), desc=desc, total=len(states)))

    def finish(i: int) -> None:
        out[i] = _trajectory(states[i], setup, model)
        if on_done is not None:
            on_done(out[i])
        next(bar, None)

    while True:
        live = [i for i, s in enumerate(states) if not s.done]
        if not live:
            break
        planning = [i for i in live if setup.scaffold.wants_plan(states[i])]
        acting = [i for i in live if i not in set(planning)]
        for i, g in zip(planning, setup.policy.plan(model, [states[i] for i in planning],
                                                    setup.plan_params), strict=True):
            _apply_plan(states[i], g, setup)
        results = setup.policy.act(model, [states[i] for i in acting], setup.toolbox,
                                   setup.budget) if acting else []
        for i, r in zip(acting, results, strict=True):
            gen, info = r if isinstance(r, tuple) else (r, None)
            _apply_turn(states[i], gen, info, setup)
        for i in live:
            s = states[i]
            if not s.done:
                _check_budgets(s, setup)
            if s.done:
                finish(i)
    return [out[i] for i in range(len(states))]


def default_lesson(traj: AgentTrajectory, feedback: str, trial: int) -> str:
    answer = json.dumps(traj.final, ensure_ascii=False) if traj.final else "no answer"
    return f"Trial {trial} answered {answer}, which was wrong: {feedback}. Do not repeat it."


def run_reflexion(model: ChatModel, tasks: Sequence[AgentTask], setup: AgentSetup, *,
                  evaluate: Callable[[AgentTrajectory], tuple[bool, str]], trials: int = 2,
                  lesson: Callable[[AgentTrajectory, str, int], str] = default_lesson,
                  desc: str = "agent",
                  on_task_done: Callable[[AgentTask, list[AgentTrajectory]], None] | None
                  = None) -> list[list[AgentTrajectory]]:
    """Reflexion's outer loop: run every task; `evaluate` judges each finished run (ok,
    feedback); a failed task runs again, in lockstep with the other failed ones, with one
    lesson per failed trial in `metadata["lessons"]` (the `Reflexion` scaffold shows them)
    and the final arguments it gave in `metadata["failed_finals"]` (a guided pack can stop
    offering them). `on_task_done(task, trials)` hears of each task as soon as it is settled
    (right, or out of trials), so a caller can save as it goes. Returns each task's trials,
    in task order. With trials=1 this is `run_agents`."""
    from dataclasses import replace

    runs: dict[str, list[AgentTrajectory]] = {t.id: [] for t in tasks}
    verdict: dict[str, tuple[bool, str]] = {}
    live = list(tasks)
    for k in range(1, trials + 1):
        by_id = {t.id: t for t in live}

        def settle(traj: AgentTrajectory, k: int = k, by_id: dict = by_id) -> None:
            runs[traj.task_id].append(traj)
            verdict[traj.task_id] = evaluate(traj)
            if (verdict[traj.task_id][0] or k == trials) and on_task_done is not None:
                on_task_done(by_id[traj.task_id], runs[traj.task_id])

        run_agents(model, live, setup, on_done=settle,
                   desc=desc if trials == 1 else f"{desc}, trial {k}/{trials}")
        again = []
        for t in live:
            ok, feedback = verdict[t.id]
            if ok or k == trials:
                continue
            traj = runs[t.id][-1]
            meta = dict(t.metadata)
            meta["lessons"] = [*meta.get("lessons", []), lesson(traj, feedback, k)]
            meta["failed_finals"] = [*meta.get("failed_finals", []),
                                     *([traj.final] if traj.final else [])]
            again.append(replace(t, metadata=meta))
        live = again
        if not live:
            break
    return [runs[t.id] for t in tasks]


def _apply_plan(s: AgentState, gen: Generation, setup: AgentSetup) -> None:
    s.turn += 1
    s.tokens += gen.completion_tokens
    s.planned = True
    if gen.error:
        s.step("error", error=f"backend: {gen.error}")
        s.stop = "backend_error"
        return
    s.messages.append({"role": "assistant", "content": gen.text})
    s.step("plan", content=gen.text, tokens=gen.completion_tokens)
    setup.scaffold.after_plan(s)


def _apply_turn(s: AgentState, gen: Generation, info: list[dict[str, Any]] | None,
                setup: AgentSetup) -> None:
    s.turn += 1
    s.tokens += gen.completion_tokens
    if gen.error:
        s.step("error", error=f"backend: {gen.error}")
        s.stop = "backend_error"
        return
    box = setup.toolbox
    if not gen.tool_calls:
        s.messages.append({"role": "assistant", "content": gen.text})
        answer = setup.parse_final(gen.text) if setup.parse_final else None
        if answer is not None:
            s.step("final", content=gen.text, arguments=answer, tokens=gen.completion_tokens)
            s.final, s.stop = answer, "final"
            return
        s.step("error", content=gen.text, tokens=gen.completion_tokens,
               error="the reply calls no tool and gives no answer")
        s.errors += 1
        s.messages.append({"role": "user", "content": f"Call one of the tools, or give your "
                                                      f"answer by calling {box.final_names[0]}."})
        return
    calls = list(gen.tool_calls)
    finals = [c for c in calls if box.is_final(c.function.name)]
    if finals and len(calls) > 1:
        # a turn that answers does nothing else: the other calls are dropped unrun, so every
        # call in the conversation has its reply and the run ends on the answer
        s.step("error", error=f"{len(calls) - 1} other call(s) in the answering turn dropped")
        calls = finals[:1]
    msg = gen.message()
    kept: list[ToolCall] = []
    replies: list[dict[str, Any]] = []
    first = True
    for call in calls:
        kept.append(call)
        name = call.function.name
        tokens = gen.completion_tokens if first else 0
        cand = info if first else None
        first = False
        if box.is_final(name):
            obs = box.call(call)  # a final tool may refuse its arguments (ToolError)
            err = obs.error
            if err is None:
                s.step("final", content=gen.text, tool=name, arguments=obs.arguments,
                       call_id=call.id, tokens=tokens, candidates=cand)
                s.final, s.stop = obs.arguments, "final"
                break
            s.step("tool_call", content=gen.text, tool=name, arguments=call.function.arguments,
                   call_id=call.id, error=err, tokens=tokens, candidates=cand)
            s.errors += 1
            replies.append(_tool_msg(call, f"Error: {err}"))
            continue
        if s.tool_calls >= setup.budget.max_tool_calls:
            err = (f"the tool-call budget ({setup.budget.max_tool_calls}) is spent; answer "
                   f"now with {box.final_names[0]}")
            s.step("tool_call", content=gen.text, tool=name, arguments=call.function.arguments,
                   call_id=call.id, error=err, tokens=tokens, candidates=cand)
            replies.append(_tool_msg(call, f"Error: {err}"))
            continue
        obs = box.call(call)
        s.tool_calls += 1
        s.step("tool_call", content=gen.text, tool=name,
               arguments=obs.arguments if obs.arguments is not None
               else call.function.arguments, call_id=call.id, error=obs.error, tokens=tokens,
               candidates=cand)
        s.step("observation", content=obs.text, tool=name, call_id=call.id, error=obs.error)
        if obs.error:
            s.errors += 1
        else:
            s.observations.append((name, obs.arguments or {}, obs.value))
        replies.append(_tool_msg(call, obs.text))
    msg["tool_calls"] = [c.model_dump(mode="json") for c in kept]
    s.messages.append(msg)
    if s.stop != "final":
        s.messages.extend(replies)


def _tool_msg(call: ToolCall, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.id, "name": call.function.name,
            "content": text}


def _check_budgets(s: AgentState, setup: AgentSetup) -> None:
    e = setup.errors
    if s.errors > e.max_errors or (e.on_error == "stop" and s.errors > 0):
        s.stop = "errors"
    elif s.tokens >= setup.budget.max_tokens:
        s.stop = "max_tokens"
    elif s.turn >= setup.budget.max_steps:
        s.stop = "max_steps"


def _trajectory(s: AgentState, setup: AgentSetup, model: ChatModel) -> AgentTrajectory:
    return AgentTrajectory(
        id=f"{s.task.id}:{setup.scaffold.name}:{setup.policy.name}", task_id=s.task.id,
        pack=setup.pack, scaffold=setup.scaffold.name, policy=setup.policy.name,
        model=model.identity, prompt_version=setup.prompt_version,
        messages=[Message.model_validate(m) for m in s.messages],
        tools=setup.toolbox.specs(), steps=s.steps, final=s.final, stop=s.stop or "final",
        tool_calls=s.tool_calls, model_turns=s.turn, completion_tokens=s.tokens,
        errors=s.errors, seconds=round(time.perf_counter() - s.started, 3),
        metadata=s.task.metadata)
