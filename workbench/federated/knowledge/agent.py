"""Prompted data agents: a chat model works a data task with tools, in one of three scaffolds,
with the site's knowledge units rendered into its prompt.

The agent loop (`workbench.agents.runner`) runs the conversation: the system prompt names the
database's tables, the scaffold's instruction and the workflows of the question's family that
the site holds ("What worked for lookup questions at other sites: look up a value of one
row; a filter: whose <column> is <value>"); the user turn is the question. The tools are `run_sql`
(read-only, shows a few rows) and `answer` (final: the SQL whose result is the answer).

A 135M model cannot write this schema's SQL, so the policy is guided: each turn the agent is
offered calls built from the slot grammar's complete plans (sampled without the units and
without the verifier, so units act only through the prompt), and the model's log-likelihood of
each plan's description, read after the conversation, picks one. Scaffolds:

- react: one call per turn, read the rows, then answer (Yao et al., 2023);
- plan: the model writes a short plan first, then acts (plan-then-execute);
- reflexion: a trial ends in an answer; the task's checker judges it, as Reflexion's evaluator
  does on HotpotQA (Shinn et al., 2023), and a failed task runs again with the lesson of each
  failed trial in its system prompt (the lesson is templated, not model-written; the answer
  it names is not offered again while other plans are left). Its success is therefore
  pass@trials with the checker as evaluator, on every slice: compare scaffolds with that in
  mind.

Outcomes are cached per (task, scaffold, model, prompt): a unit that does not change a task's
prompt does not make the site run that task again, so the A/B gate and peer review pay only
for the tasks a candidate unit touches.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.agents.runner import (
    AgentSetup,
    AgentTask,
    Budget,
    ErrorPolicy,
    GuidedPolicy,
    run_reflexion,
)
from workbench.agents.runner import scaffold as make_scaffold
from workbench.agents.tools import Tool, Toolbox, ToolError
from workbench.datatasks.exploreconfig import ExploreConfig
from workbench.datatasks.generators import GrammarGenerator
from workbench.datatasks.grammar import Move
from workbench.datatasks.normalise import normalise_program
from workbench.datatasks.priors import UniformPrior
from workbench.datatasks.search import Search
from workbench.datatasks.trie import PrefixTrie
from workbench.errors import WorkbenchError
from workbench.federated.config import AgentSettings
from workbench.federated.knowledge.workflows import Outcome, step_text, workflow_of
from workbench.io import append_line
from workbench.records import ToolCall

# bump when sampling, scaffolds or prompts change: cached outcomes of older code are not reused
CACHE_VERSION = "data-agent-2"
# site scaffold -> agent-loop scaffold
LOOP_SCAFFOLD = {"react": "react", "plan": "plan_execute", "reflexion": "reflexion"}


def shown_units(units: Sequence[dict], family: str, limit: int = 3) -> list[dict]:
    """The units of `family` a prompt shows: a unit on trial (the A/B gate's or a peer
    review's candidate, `trial: true`) always, then the most supported, `limit` workflows
    (distinct wording) and `limit` insights."""
    def order(u: dict) -> tuple:
        return (not u.get("trial"), -int(u.get("support", 0)), str(u.get("id", "")))

    mine = sorted((u for u in units if u.get("family") == family), key=order)
    flows: list[dict] = []
    insights: list[dict] = []
    seen: set[str] = set()
    for u in mine:
        if u.get("kind", "workflow") == "workflow" and u.get("steps"):
            text = "; ".join(step_text(s) for s in u["steps"])
            if text not in seen and len(flows) < limit:
                seen.add(text)
                flows.append(u)
        elif u.get("kind") == "insight" and u.get("text") and len(insights) < limit:
            insights.append(u)
    return flows + insights


def render_units(units: Sequence[dict], family: str, limit: int = 3) -> str:
    """The prompt block for a task of `family` (empty when it has no units)."""
    shown = shown_units(units, family, limit)
    if not shown:
        return ""
    lines = [f"What worked for {family.replace('_', ' ')} questions at other sites:"]
    for u in shown:
        lines.append("- " + ("; ".join(step_text(s) for s in u["steps"])
                             if u.get("kind", "workflow") == "workflow" else u["text"]))
    return "\n".join(lines)


@dataclass
class Candidate:
    sql: str
    text: str  # the plan in words (what the model scores)
    moves: list[Move] = field(default_factory=list)


class DataAgent:
    """One site's prompted agent over its environment."""

    def __init__(self, env, model, scaffold: str, settings: AgentSettings | None = None, *,
                 seed: int = 0, cache: str | Path | None = None):
        if scaffold not in LOOP_SCAFFOLD:
            raise ValueError(f"scaffold {scaffold!r}: use {', '.join(LOOP_SCAFFOLD)}")
        if not model.capabilities.score:
            raise WorkbenchError(f"knowledge.prompted.model: {model.identity} cannot score "
                                 "continuations, which the guided agent needs (use a local "
                                 "model or a server that returns prompt logprobs)")
        self.env, self.model, self.scaffold = env, model, scaffold
        self.cfg = settings or AgentSettings()
        self.seed = seed
        self.cache_path = Path(cache) if cache else None
        self._outcomes: dict[str, dict] = {}
        self._cands: dict[str, list[Candidate]] = {}
        self._probes: dict[str, int] = {}
        self._results: dict[str, Any] = {}  # sql -> SqlResult
        self._tasks: dict[str, Any] = {}  # task id -> Task, for the runs under way
        self.model_runs = 0  # trials run through the model (cache misses)
        if self.cache_path and self.cache_path.exists():
            raw = self.cache_path.read_bytes()
            if raw and not raw.endswith(b"\n"):  # a torn last line: end it, so the next
                append_line(self.cache_path, "")  # record starts on a line of its own
            for line in raw.decode("utf-8", "replace").splitlines():
                try:
                    row = json.loads(line)
                    self._outcomes[row["key"]] = row["outcome"]
                except (ValueError, KeyError, TypeError):
                    continue  # a torn last line: that task runs again

    # -- candidates -------------------------------------------------------------------------
    def candidates(self, task) -> list[Candidate]:
        """Distinct complete plans sampled from the grammar under a uniform prior (no units,
        no verifier), in the order found; deterministic per (seed, task)."""
        if task.id in self._cands:
            return self._cands[task.id]
        cfg = ExploreConfig(prior="uniform", iterations=1, stop_after=1, seed=self.seed,
                            seed_shapes=0)
        gen = GrammarGenerator(UniformPrior(), cfg)
        search = Search(task, self.env, gen, PrefixTrie(self.env.profile.content_hash), cfg)
        rng = random.Random(f"{self.seed}:{task.id}")
        found: dict[str, Candidate] = {}
        for _ in range(self.cfg.rollouts):
            path: tuple = ()
            while not search.is_terminal(path):
                moves, w = search.options(path)
                path += (rng.choices(range(len(moves)), weights=w)[0],)
            plan = gen.plan(search, path)
            if not plan.submitted:
                continue
            try:
                sql = plan.sql()
            except (ValueError, TypeError, AttributeError):
                continue
            moves = search.moves(path)
            text = "; ".join(m.text for m in moves if m.slot != "submit")
            found.setdefault(normalise_program(sql), Candidate(sql, text, moves))
            if len(found) >= self.cfg.candidates:
                break
        self._cands[task.id] = list(found.values())
        self._probes[task.id] = search.ledger.executions
        return self._cands[task.id]

    def run_sql(self, sql: str):
        if sql not in self._results:
            self._results[sql] = self.env.run_sql(sql)
        return self._results[sql]

    # -- prompts ----------------------------------------------------------------------------
    def system(self, task, units: Sequence[dict]) -> str:
        tables = ", ".join(self.env.profile.table_names)
        head = (f"You answer questions about a SQLite database (tables: {tables}). Run a query "
                "with run_sql, read its rows, and answer with the query whose result answers "
                "the question.")
        block = render_units(units, task.category)
        return head + (f"\n\n{block}" if block else "")

    def key(self, task, system: str) -> str:
        parts = [CACHE_VERSION, task.id, self.scaffold, self.model.identity,
                 self.cfg.model_dump_json(), self.seed, system]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]

    # -- the loop ---------------------------------------------------------------------------
    def _setup(self):
        def run_sql(sql: str) -> str:
            return self.run_sql(sql).to_observation(max_rows=self.cfg.rows, max_chars=800)

        def answer(sql: str) -> str:
            r = self.run_sql(sql)
            if r.error:
                raise ToolError(f"the query fails: {r.error}")
            return r.to_observation(max_rows=self.cfg.rows, max_chars=800)

        arg = {"type": "object", "properties": {"sql": {"type": "string"}},
               "required": ["sql"], "additionalProperties": False}
        box = Toolbox([
            Tool("run_sql", "Run a read-only SQL query on the database; see its first rows.",
                 arg, run_sql),
            Tool("answer", "Give the final answer: the SQL query whose result answers the "
                           "question.", arg, answer, final=True)])
        texts: dict[str, str] = {}  # sql -> plan text, filled per task by propose

        def propose(state, names):
            cands = self.candidates(self._tasks[state.task.id])
            failed = {f.get("sql") for f in state.task.metadata.get("failed_finals", ())}
            for c in cands:
                texts[c.sql] = c.text
            ran = [a.get("sql") for a in state.calls_made("run_sql")]
            if state.turn + 1 >= self.cfg.max_steps:  # the last turn must answer
                names = [n for n in names if n == "answer"]
            out = []
            if "answer" in names:
                out += [_call("answer", s) for s in dict.fromkeys(ran)
                        if s and s not in failed and _has_rows(self.run_sql(s))]
            if "run_sql" in names:
                out += [_call("run_sql", c.sql) for c in cands
                        if c.sql not in ran and c.sql not in failed]
            if not out:  # nothing left to run or answer: answer blind
                out = [_call("answer", c.sql) for c in cands if c.sql not in failed] or \
                      [_call("answer", c.sql) for c in cands]
            return out

        def describe(call) -> str:
            sql = json.loads(call.function.arguments)["sql"]
            verb = "Answer" if call.function.name == "answer" else "Run"
            return f"{verb}: {texts.get(sql, sql)}"

        return AgentSetup(
            toolbox=box, scaffold=make_scaffold(LOOP_SCAFFOLD[self.scaffold]),
            policy=GuidedPolicy(propose, final_names=box.final_names, describe=describe),
            budget=Budget(max_steps=self.cfg.max_steps, max_tool_calls=self.cfg.max_tool_calls,
                          max_tokens=4096),
            errors=ErrorPolicy(on_error="continue", max_errors=2),
            pack="data_agent", prompt_version=CACHE_VERSION)

    def attempt(self, tasks: Sequence, units: Sequence[dict]) -> list[Outcome]:
        """Each task's outcome with these units in the prompt (cached per prompt)."""
        todo: list[AgentTask] = []
        keys: dict[str, str] = {}
        for t in tasks:
            system = self.system(t, units)
            keys[t.id] = k = self.key(t, system)
            if k in self._outcomes or k in {a.metadata["key"] for a in todo}:
                continue
            if not self.candidates(t):  # the grammar has no complete plan: nothing to offer
                self._store(k, {"verified": False, "turns": 0,
                                "executions": self._probes.get(t.id, 0), "tokens": 0,
                                "trials": 0, "workflow": [], "tried": [], "sql": []})
                continue
            self._tasks[t.id] = t
            todo.append(AgentTask(id=t.id, prompt=t.question, system=system,
                                  metadata={"task_id": t.id, "key": k}))
        if todo:
            self._work(todo, run_reflexion)
        out = []
        for t in tasks:
            row = self._outcomes[keys[t.id]]
            out.append(Outcome(t.id, t.category, bool(row["verified"]), int(row["turns"]),
                               int(row["executions"]), tuple(row["workflow"]),
                               guided=any(u.get("kind", "workflow") == "workflow"
                                          for u in shown_units(units, t.category)),
                               tried=tuple(row.get("tried", ())),
                               texts=[t.question, t.program, *row.get("sql", [])]))
        return out

    def judge(self, traj) -> tuple[bool, str]:
        """Reflexion's evaluator: the task's checker on the answer's rows, and why not."""
        t = self._tasks[traj.task_id]
        sql = (traj.final or {}).get("sql")
        if not sql:
            return False, f"the run stopped ({traj.stop}) without an answer"
        r = self.run_sql(sql)
        if t.check(r):
            return True, ""
        return False, ("the query failed" if r.error else "it returned no rows"
                       if not r.rows else "its rows are not the answer")

    def lesson(self, traj, feedback: str, trial: int) -> str:
        sql = (traj.final or {}).get("sql", "")
        plan = next((c.text for c in self._cands.get(traj.task_id, []) if c.sql == sql), "")
        what = f"the plan ({plan})" if plan else "no answer"
        return f"Trial {trial} answered with {what}; {feedback}. Try another plan."

    def _work(self, todo: list, run_reflexion) -> None:
        run_reflexion(self.model, todo, self._setup(), evaluate=self.judge, lesson=self.lesson,
                      trials=self.cfg.trials if self.scaffold == "reflexion" else 1,
                      desc=f"{self.scaffold} agent", on_task_done=self._record)

    def _record(self, a, trials: list) -> None:
        """Save a settled task's outcome at once (a killed round keeps what it finished)."""
        self.model_runs += len(trials)
        t = self._tasks[a.id]
        sql = (trials[-1].final or {}).get("sql")
        ok = t.check(self.run_sql(sql)) if sql else False
        cand = next((c for c in self.candidates(t) if c.sql == sql), None)
        self._store(a.metadata["key"], {
            "verified": ok, "turns": sum(x.model_turns for x in trials),
            "executions": self._probes.get(t.id, 0)
            + sum(x.tool_calls + (x.final is not None) for x in trials),
            "tokens": sum(x.completion_tokens for x in trials), "trials": len(trials),
            "workflow": list(workflow_of(cand.moves)) if ok and cand else [],
            "tried": list(workflow_of(cand.moves)) if cand else [],
            "sql": [s for x in trials for s in _sqls(x)]})

    def _store(self, key: str, row: dict) -> None:
        self._outcomes[key] = row
        if self.cache_path:
            append_line(self.cache_path, json.dumps({"key": key, "outcome": row}))


def _call(name: str, sql: str):
    return ToolCall.make(name, {"sql": sql})


def _has_rows(r) -> bool:
    return r.ok and bool(r.rows)


def _sqls(traj) -> list[str]:
    return [s.arguments["sql"] for s in traj.steps
            if s.kind in ("tool_call", "final") and isinstance(s.arguments, dict)
            and "sql" in s.arguments]
