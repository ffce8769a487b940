"""The MCTS trajectory explorer: one tree per task, built on `mcts-simple`.

A task becomes a one-player `mcts_simple.Game` whose moves come from an action generator:

- `GrammarGenerator`: the schema-grounded slot grammar (`grammar.Grammar`); the prior over a
  node's options is the bundled model's log-likelihood of each option's text after the
  question, the schema digest and the plan so far (softmax of the per-token mean), so the
  search is guided even by a 135M model. The last move submits the plan as SQL.
- `ModelGenerator`: free-form SQL proposals from a chat model (any backend, e.g. an
  OpenAI-compatible endpoint): each node is one executed statement; its children are the
  distinct statements among `proposals` samples (prior: how many samples proposed each, a
  self-consistency vote) plus "answer with the last result".

Search (`PUCT`, a subclass of mcts-simple's `UCT`): selection by Q + c·P·√N/(1+n), expansion of
every option with its prior, a prior-weighted rollout to a terminal, the reward from the
task's answer check on the executed result (an execution error is a hard zero), and
mcts-simple's backpropagation. A failed terminal leaves a reflection (what ran, what came
back) that later expansions see: the grammar prior discounts the moves of failed plans, the
model generator reads the last reflections in its prompt. Executions go through a per
environment `PrefixTrie` keyed by canonicalised statements, shared across tasks. The trie also
keeps the verified paths of earlier tasks per question shape (`reuse`: the question with its
names and values abstracted); a later task of a similar shape is seeded with them, and a node
on a seeded path takes its prior from the trie instead of a model call.

Same seed, same task, same models → the same tree (statistics and file bytes): priors are
deterministic scores, sampling uses seeded streams, timings stay out of the tree file.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import time
from collections.abc import Sequence
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from mcts_simple import UCT, Game, UCTNode
from pydantic import BaseModel, ConfigDict, Field

from workbench.errors import DataError
from workbench.io import atomic_write_json
from workbench.trajsynth.env import DataEnvironment
from workbench.trajsynth.grammar import Grammar, Move, Plan
from workbench.trajsynth.queries import lit, qi
from workbench.trajsynth.reuse import Shape, question_shape, similarity
from workbench.trajsynth.sandbox import SqlResult
from workbench.trajsynth.tasks import Task, normalise_program

TREE_VERSION = 1
# a similar shape's seed counts similarity² (on the first 40 / all 77 Chinook tasks with the
# uniform prior, power 2 needed the fewest executions: 356 / 1,330, against 390 / 1,373 for
# power 1 and 512 / 1,524 for power 4)
SIMILARITY_POWER = 2


class ExploreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    generator: Literal["grammar", "model"] = Field(
        "grammar", description="Where moves come from: the schema grammar (prior from the "
                               "model's log-likelihood) or free-form SQL from the model.")
    strategy: Literal["mcts", "sample", "greedy"] = Field(
        "mcts", description="mcts: the tree search; sample: independent prior-weighted paths "
                            "from the root (best-of-N, the baseline); greedy: one path of "
                            "the likeliest moves (a single ReAct-style path).")
    prior: Literal["model", "uniform", "choose"] = Field(
        "model", description=(
            "grammar: score options with the model (model), not at all (uniform), or let a "
            "bandit choose per node among uniform, the model and `node_models` (choose)."))
    node_models: list[str] = Field(default_factory=list, description=(
        "prior=choose: more model specs the per-node choice may use, cheap to strong, after "
        "uniform and the arm's model."))
    choose_lam: float = Field(0.5, ge=0, description=(
        "prior=choose: weight of the cost in a node's reward (the probability the scorer put "
        "on the move a verified path took, minus lam x tokens / choose_cost_scale)."))
    choose_cost_scale: float = Field(200.0, gt=0, description=(
        "prior=choose: scored tokens that count as a cost of 1."))
    choose_ucb_c: float = Field(0.3, ge=0, description="prior=choose: exploration weight.")
    choose_escalate_after: int = Field(3, ge=0, description=(
        "prior=choose: after this many failed terminals in a task, its new nodes use the "
        "strongest scorer (0: never escalate)."))
    iterations: int = Field(200, ge=1, description="MCTS iterations per task (at most).")
    stop_after: int = Field(1, ge=0, description=(
        "Stop a task's search once this many distinct verified statements are found "
        "(0: run every iteration)."))
    c_puct: float = Field(1.5, gt=0, description="Exploration weight of the prior.")
    prior_temperature: float = Field(1.0, gt=0, description="Softmax temperature of the "
                                                            "log-likelihood prior.")
    reflection_penalty: float = Field(0.3, ge=0, lt=1, description=(
        "grammar: a move's prior weight is multiplied by (1 - penalty) for each failed "
        "plan it was part of."))
    proposals: int = Field(4, ge=1, le=16, description="model: samples per expansion.")
    temperature: float = Field(0.8, ge=0, description="model: sampling temperature.")
    max_tokens: int = Field(160, ge=16, description="model: tokens per proposal.")
    max_depth: int = Field(4, ge=1, le=12, description="model: statements per path (then "
                                                       "the only move is to answer).")
    reflections: int = Field(3, ge=0, description="model: reflections shown in the prompt.")
    seed_prefixes: int = Field(2, ge=0, description=(
        "model: a new task's root is seeded with the statements that began the verified "
        "paths of at least this many earlier tasks (from the prefix trie), and the model is "
        "asked only for the rest of the root's proposals; 0: off."))
    seed_shapes: int = Field(1, ge=0, description=(
        "grammar: once at least this many other verified tasks have a question of a "
        "similar shape (the wording with names and values abstracted, see seed_similarity), "
        "their verified paths seed the task's tree, names swapped: a node on a seeded path "
        "takes its prior from the trie instead of a model call; 0: off."))
    seed_similarity: float = Field(0.5, gt=0, le=1, description=(
        "grammar: shapes at least this alike (difflib's ratio over the shapes' words) seed "
        "each other, weighted by similarity²; 1: the same shape only."))
    seed_weight: float = Field(0.9, ge=0, lt=1, description=(
        "grammar: the share of a seeded node's prior on the seeded moves, times the "
        "similarity² of the closest seeding shape (the rest is spread evenly over all "
        "options, so every option keeps some prior)."))
    seed: int = 0

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]


class Ledger(BaseModel):
    """What a task's search cost and what the caches saved."""

    model_config = ConfigDict(extra="forbid")

    iterations: int = 0
    terminals: int = 0
    verified: int = 0
    executions: int = 0
    executions_saved: int = 0
    probes: int = 0
    model_calls: int = 0
    model_calls_saved: int = 0
    seeded_nodes: int = 0
    escalated_nodes: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    scored_tokens: int = 0
    sandbox_s: float = 0.0
    model_s: float = 0.0
    wall_s: float = 0.0

    def add(self, other: Ledger) -> None:
        for k, v in other.model_dump().items():
            setattr(self, k, getattr(self, k) + v)

    @property
    def hit_rate(self) -> float:
        total = self.executions + self.executions_saved
        return self.executions_saved / total if total else 0.0


# --- the prefix trie --------------------------------------------------------------------------


def action_key(kind: str, code: str) -> str:
    """The canonical form of an action (whitespace collapsed, case folded outside strings)."""
    return f"{kind}:{normalise_program(code)}"


class PrefixTrie:
    """Per environment: canonical action sequences → observations (the database is read-only,
    so a statement's result does not depend on what ran before; the path is kept for seeding
    and for statistics). Saved as JSON next to the trees."""

    def __init__(self, env_hash: str) -> None:
        self.env_hash = env_hash
        self.results: dict[str, dict[str, Any]] = {}  # action key → SqlResult JSON
        self.paths: dict[str, int] = {}  # "key1\x1fkey2..." → times reached
        # per-node scorer choice: context "env/category/depth" → scorer → task id →
        # [nodes, reward sum] (per task, so a re-run task replaces its own share)
        self.scorers: dict[str, dict[str, dict[str, list[float]]]] = {}
        # question shape → {abstract key path "k1\x1fk2...": ids of the tasks verified so}
        self.shapes: dict[str, dict[str, list[str]]] = {}
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> SqlResult | None:
        r = self.results.get(key)
        if r is None:
            self.misses += 1
            return None
        self.hits += 1
        return SqlResult.model_validate(r)

    def put(self, key: str, result: SqlResult) -> None:
        self.results[key] = result.model_dump(mode="json", exclude={"elapsed_s"})

    def visit(self, keys: Sequence[str]) -> None:
        for i in range(1, len(keys) + 1):
            p = "\x1f".join(keys[:i])
            self.paths[p] = self.paths.get(p, 0) + 1

    def learn(self, shape: str, keys: Sequence[str], task_id: str) -> None:
        """Task `task_id`, of this question shape, was verified along this abstract key path
        (idempotent: a re-run task is not counted twice)."""
        ids = self.shapes.setdefault(shape, {}).setdefault("\x1f".join(keys), [])
        if task_id not in ids:
            ids.append(task_id)
            ids.sort()

    def seeds(self, shape: str, min_count: int = 1, min_similarity: float = 1.0,
              exclude: str | None = None) -> list[tuple[tuple[str, ...], int, float]]:
        """The verified abstract paths of this shape and of shapes at least
        `min_similarity` alike (`reuse.similarity`), as (keys, tasks, similarity), when
        at least `min_count` distinct other tasks (not `exclude`: a task never seeds itself,
        so a re-run of a task after a kill searches as the first run did) verified them."""
        out, tasks = [], set()
        for other, paths in sorted(self.shapes.items()):
            sim = 1.0 if other == shape else similarity(shape, other)
            if sim < min_similarity:
                continue
            for p, ids in sorted(paths.items()):
                mine = [i for i in ids if i != exclude]
                if mine:
                    out.append((tuple(p.split("\x1f")), len(mine), sim))
                    tasks.update(mine)
        if not min_count or len(tasks) < min_count:
            return []
        return out

    def prefixes(self, min_count: int = 2) -> list[list[str]]:
        """Action sequences reached at least `min_count` times (for seeding new trees)."""
        return [p.split("\x1f") for p, n in sorted(self.paths.items()) if n >= min_count]

    def first_statements(self, min_count: int, limit: int) -> list[str]:
        """The SQL that began verified paths of at least `min_count` tasks, most frequent
        first (ties by text)."""
        rows = []
        for p, n in self.paths.items():
            if "\x1f" in p or n < min_count or not p.startswith("sql:"):
                continue
            r = self.results.get(p.removeprefix("sql:"))
            if r and r.get("sql") and r.get("error") is None:
                rows.append((-n, r["sql"]))
        return [sql for _, sql in sorted(rows)[:limit]]

    def save(self, path: str | Path) -> None:
        atomic_write_json(path, {"version": 2, "env_hash": self.env_hash,
                                 "results": self.results, "paths": self.paths,
                                 "shapes": self.shapes, "scorers": self.scorers})

    @classmethod
    def load(cls, path: str | Path, env_hash: str) -> PrefixTrie:
        trie = cls(env_hash)
        p = Path(path)
        if not p.is_file():
            return trie
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return trie  # a cache: a torn file is rebuilt
        if isinstance(data, dict) and data.get("env_hash") == env_hash:
            trie.results = dict(data.get("results") or {})
            trie.paths = {k: int(v) for k, v in (data.get("paths") or {}).items()}
            trie.shapes = {s: {k: sorted(map(str, v)) for k, v in ps.items()
                               if isinstance(v, list)}
                           for s, ps in _dict(data.get("shapes")).items() if isinstance(ps, dict)}
            trie.scorers = {c: {k: {t: [float(nr[0]), float(nr[1])] for t, nr in v.items()
                                    if _pair(nr)}
                                for k, v in d.items() if isinstance(v, dict)}
                            for c, d in _dict(data.get("scorers")).items() if isinstance(d, dict)}
        return trie


def _dict(x: Any) -> dict:
    return x if isinstance(x, dict) else {}


def _pair(x: Any) -> bool:
    """[nodes, reward sum]: what a scorer statistic must be (a hand-edited trie is a cache:
    anything else is dropped)."""
    return isinstance(x, list) and len(x) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in x)


# --- priors -----------------------------------------------------------------------------------


class Prior(Protocol):
    def weights(self, context: str, texts: Sequence[str], ledger: Ledger, *,
                question: str = "") -> list[float]: ...


class UniformPrior:
    def weights(self, context: str, texts: Sequence[str], ledger: Ledger, *,
                question: str = "") -> list[float]:
        return [1.0 / len(texts)] * len(texts) if texts else []


class ModelPrior:
    """The bundled model's log-likelihood as a prior over a node's options.

    `channel` (default): how likely the question is after each option (log P(question |
    plan so far + option), the noisy-channel direction, which suits a small model: options of
    different lengths compete on the same continuation). `direct`: how likely each option's
    text is after the question (mean per token). Either way a softmax with `temperature`;
    scores are cached per (context, options)."""

    def __init__(self, model, temperature: float = 1.0,
                 mode: Literal["channel", "direct"] = "channel") -> None:
        self.model = model
        self.temperature = temperature
        self.mode = mode
        self._cache: dict[tuple, list[float]] = {}

    def weights(self, context: str, texts: Sequence[str], ledger: Ledger, *,
                question: str = "") -> list[float]:
        from workbench.models.base import ScoreRequest

        if len(texts) <= 1:
            return [1.0] * len(texts)
        key = (self.mode, context, question, tuple(texts))
        if key in self._cache:
            ledger.model_calls_saved += 1
            return self._cache[key]
        t0 = time.perf_counter()
        if self.mode == "channel":
            reqs = [ScoreRequest(prompt=f"{context} {t}.\nQuestion:", continuations=[
                " " + question]) for t in texts]
            scores = [row[0] for row in self.model.score(reqs)]
            logits = [s.logprob / self.temperature for s in scores]
        else:
            scores = self.model.score([ScoreRequest(prompt=f"{context}\nQuestion: {question}"
                                                    "\nNext step:", continuations=[
                                                        " " + t for t in texts])])[0]
            logits = [s.mean_logprob / self.temperature for s in scores]
        ledger.model_s += time.perf_counter() - t0
        ledger.model_calls += 1
        ledger.scored_tokens += sum(s.n_tokens for s in scores)
        w = softmax(logits)
        self._cache[key] = w
        return w


def softmax(xs: Sequence[float]) -> list[float]:
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    s = sum(e)
    return [x / s for x in e]


def _normalised(ws: Sequence[float]) -> list[float]:
    s = sum(ws)
    return [w / s for w in ws] if s > 0 else [1.0 / len(ws)] * len(ws)


class NodeChooser:
    """Which scorer gives a node its prior (`prior: choose`): a bandit per context
    (environment, task category, depth in the tree) over the scorers, cheap to strong
    (uniform, then the models).

    A node's reward is known once a verified path passes through it: the probability the
    chosen scorer put on the move that path took, minus `choose_lam` x the tokens it scored /
    `choose_cost_scale`. The choice is the highest upper confidence bound (an untried scorer
    first, cheap before strong); after `choose_escalate_after` failed terminals in a task its
    new nodes use the strongest scorer. The statistics live in the environment's trie, so they
    carry across tasks, runs and resumes; every node records its scorer and why."""

    def __init__(self, scorers: dict[str, Prior], config: ExploreConfig) -> None:
        self.scorers = scorers
        self.names = list(scorers)
        self.config = config

    @staticmethod
    def context(search: Search, path: tuple) -> str:
        return f"{search.env.name}/{search.task.category}/{len(path)}"

    def pick(self, search: Search, path: tuple) -> tuple[str, str]:
        c = self.config
        key = self.context(search, path)
        failed = len(search.reflections)
        if c.choose_escalate_after and failed >= c.choose_escalate_after:
            return self.names[-1], f"escalated after {failed} failed terminals"
        stats = {}
        for n, by_task in search.trie.scorers.get(key, {}).items():
            rows = [v for t, v in by_task.items() if t != search.task.id]
            stats[n] = [sum(v[0] for v in rows), sum(v[1] for v in rows)]
        untried = [n for n in self.names if not stats.get(n, [0, 0])[0]]
        if untried:
            return untried[0], f"untried in {key}"
        total = sum(stats[n][0] for n in self.names)

        def ucb(n: str) -> float:
            k, r = stats[n]
            return r / k + c.choose_ucb_c * math.sqrt(math.log(total + 1) / k)

        best = max(self.names, key=lambda n: (ucb(n), -self.names.index(n)))
        return best, f"UCB {ucb(best):.3f} in {key}"

    def learn(self, search: Search) -> None:
        """The task's share of the statistics: every node a scorer was chosen for (not the
        escalated ones) earns the weight it put on the move of the task's first verified
        path through it (0 off that path, or when nothing verified), minus its cost. A
        re-run of the task replaces its whole share."""
        c = self.config
        verified = next(iter(search.verified_sql.values()), None)
        mine: dict[tuple[str, str], list[float]] = {}
        for path, (name, tokens, weights) in sorted(search.node_scorer.items()):
            if search.node_why.get(path, "").startswith("escalated"):
                continue
            on = verified is not None and len(verified) > len(path) and \
                verified[:len(path)] == path
            reward = (weights[verified[len(path)]] if on else 0.0) \
                - c.choose_lam * tokens / c.choose_cost_scale
            k, r = mine.get((self.context(search, path), name), [0, 0.0])
            mine[(self.context(search, path), name)] = [k + 1, r + reward]
        tid = search.task.id
        for by_name in search.trie.scorers.values():
            for by_task in by_name.values():
                by_task.pop(tid, None)
        for (key, name), v in mine.items():
            search.trie.scorers.setdefault(key, {}).setdefault(name, {})[tid] = v


# --- one task's search ------------------------------------------------------------------------


@dataclass
class Terminal:
    """A finished path: the statement it ran (if any), what came back, the reward."""

    sql: str | None
    ok: bool
    verified: bool
    observation: str
    reason: str = ""


class Search:
    """The shared state of one task's tree: options and priors per path, executions, the
    reflections of failed terminals. Paths are tuples of option indices."""

    def __init__(self, task: Task, env: DataEnvironment, generator: Generator,
                 trie: PrefixTrie, config: ExploreConfig) -> None:
        self.task = task
        self.env = env
        self.generator = generator
        self.trie = trie
        self.config = config
        self.ledger = Ledger()
        self.reflections: list[dict[str, Any]] = []
        self.failed_moves: dict[str, int] = {}
        self._options: dict[tuple, tuple[list[Move], list[float]]] = {}
        self._terminal: dict[tuple, Terminal] = {}
        self.verified_sql: dict[str, tuple] = {}  # canonical SQL → first verified path
        # prior=choose: path → (scorer, tokens it scored, its weights); and why it was chosen
        self.node_scorer: dict[tuple, tuple[str, int, list[float]]] = {}
        self.node_why: dict[tuple, str] = {}
        self.seeds: list[tuple[tuple[str, ...], int, float]] | None = None

    # executions (through the trie)
    def run(self, sql: str, *, probe: bool = False) -> SqlResult:
        key = action_key("sql", sql)
        hit = self.trie.get(key)
        if hit is not None:
            self.ledger.executions_saved += 1
            return hit
        t0 = time.perf_counter()
        r = self.env.run_sql(sql)
        self.ledger.sandbox_s += time.perf_counter() - t0
        self.ledger.executions += 1
        self.ledger.probes += probe
        self.trie.put(key, r)
        return r

    def moves(self, path: tuple) -> list[Move]:
        """The moves along a path."""
        out = []
        for i in range(len(path)):
            out.append(self.options(path[:i])[0][path[i]])
        return out

    def options(self, path: tuple) -> tuple[list[Move], list[float]]:
        if path not in self._options:
            moves = self.generator.options(self, path)
            priors = self.generator.priors(self, path, moves) if moves else []
            self._options[path] = (moves, priors)
        return self._options[path]

    def is_terminal(self, path: tuple) -> bool:
        return self.generator.is_terminal(self, path) or not self.options(path)[0]

    def terminal(self, path: tuple) -> Terminal:
        if path not in self._terminal:
            t = self.generator.finish(self, path)
            self._terminal[path] = t
            self.ledger.terminals += 1
            if t.verified:
                key = normalise_program(t.sql or "")
                if key not in self.verified_sql:
                    self.verified_sql[key] = path
                    self.ledger.verified += 1
            else:
                self._reflect(path, t)
        return self._terminal[path]

    def _reflect(self, path: tuple, t: Terminal) -> None:
        moves = self.moves(path)
        for m in moves:
            k = f"{m.slot}:{m.key}"
            self.failed_moves[k] = self.failed_moves.get(k, 0) + 1
        self.reflections.append({"sql": t.sql, "reason": t.reason,
                                 "plan": "; ".join(m.text for m in moves
                                                   if m.slot not in ("submit",))})

    @property
    def done(self) -> bool:
        return bool(self.config.stop_after) and len(self.verified_sql) >= self.config.stop_after


def _failure_reason(r: SqlResult) -> str:
    if not r.ok:
        return f"the statement failed: {r.error}"
    if not r.rows:
        return "it returned no rows"
    return f"it returned {len(r.rows)} row(s) that are not the answer"


class Generator(Protocol):
    name: str

    def options(self, search: Search, path: tuple) -> list[Move]: ...
    def priors(self, search: Search, path: tuple, moves: list[Move]) -> list[float]: ...
    def is_terminal(self, search: Search, path: tuple) -> bool: ...
    def finish(self, search: Search, path: tuple) -> Terminal: ...
    def steps(self, search: Search, path: tuple) -> list[tuple[str, SqlResult]]: ...


class GrammarGenerator:
    """Moves from the slot grammar; the prior from the model's log-likelihood of each option."""

    name = "grammar"

    def __init__(self, prior: Prior, config: ExploreConfig, guide=None,
                 chooser: NodeChooser | None = None) -> None:
        self.prior = prior
        self.config = config
        self.chooser = chooser
        # guide(search, path, moves, weights) -> weights: shared know-how (e.g. federated
        # workflows) reweighting a node's options before the search sees them
        self.guide = guide
        self._grammars: dict[str, Grammar] = {}
        self._plans: dict[tuple, Plan] = {}
        self._shapes: dict[str, Shape] = {}

    def grammar(self, search: Search) -> Grammar:
        t = search.task
        if t.id not in self._grammars:
            def probe(table: str, column: str, value: Any) -> bool:
                r = search.run(f"SELECT 1 FROM {qi(table)} WHERE {qi(column)} = {lit(value)} "
                               "LIMIT 1", probe=True)
                return r.ok and bool(r.rows)

            self._grammars[t.id] = Grammar(search.env.profile, t.question, probe=probe)
        return self._grammars[t.id]

    def plan(self, search: Search, path: tuple) -> Plan:
        key = (search.task.id, path)
        if key not in self._plans:
            if not path:
                self._plans[key] = Plan()
            else:
                parent = self.plan(search, path[:-1])
                move = search.options(path[:-1])[0][path[-1]]
                self._plans[key] = self.grammar(search).apply(parent, move)
        return self._plans[key]

    def options(self, search: Search, path: tuple) -> list[Move]:
        return self.grammar(search).options(self.plan(search, path))

    def context(self, search: Search, path: tuple) -> str:
        """What the prior model reads with an option: the table names and the plan so far
        (short: the full schema digest made each scoring call ~10x slower, and the options
        name their tables and columns)."""
        done = [m.text for m in search.moves(path)]
        tables = ", ".join(search.env.profile.table_names)
        return f"Tables: {tables}\nPlan: " + "; ".join(done) + (";" if done else "")

    def shape(self, search: Search) -> Shape:
        t = search.task
        if t.id not in self._shapes:
            self._shapes[t.id] = question_shape(t.question, search.env.profile)
        return self._shapes[t.id]

    def seeded(self, search: Search, path: tuple, moves: list[Move]) -> list[float] | None:
        """The prior of a node on a verified path of earlier tasks of this question's shape
        (see `reuse`), or None when no seeded path passes through it."""
        if not self.config.seed_shapes:
            return None
        shape = self.shape(search)
        if search.seeds is None:  # the trie learns only between tasks
            search.seeds = search.trie.seeds(shape.text, self.config.seed_shapes,
                                             self.config.seed_similarity,
                                             exclude=search.task.id)
        if not search.seeds:
            return None
        done = tuple(shape.abstract(f"{m.slot}:{m.key}") for m in search.moves(path))
        support: dict[str, float] = {}
        alike: dict[str, float] = {}
        for keys, n, sim in search.seeds:
            if len(keys) > len(done) and keys[:len(done)] == done:
                k = keys[len(done)]
                support[k] = support.get(k, 0.0) + n * sim ** SIMILARITY_POWER
                alike[k] = max(alike.get(k, 0.0), sim ** SIMILARITY_POWER)
        abstract = [shape.abstract(f"{m.slot}:{m.key}") for m in moves]
        hits = [support.get(a, 0.0) for a in abstract]
        total = sum(hits)
        if not total:
            return None
        mix = self.config.seed_weight * max(alike[a] for a in abstract if a in alike)
        return [(1 - mix) / len(moves) + mix * h / total for h in hits]

    def priors(self, search: Search, path: tuple, moves: list[Move]) -> list[float]:
        if len(moves) == 1:
            return [1.0]
        w = self.seeded(search, path, moves)
        if w is not None:
            search.ledger.seeded_nodes += 1
            if self.chooser is None and isinstance(self.prior, ModelPrior):
                search.ledger.model_calls_saved += 1
        elif self.chooser is not None:
            name, why = self.chooser.pick(search, path)
            before = search.ledger.scored_tokens
            w = self.chooser.scorers[name].weights(
                self.context(search, path), [m.text for m in moves], search.ledger,
                question=search.task.question)
            search.node_scorer[path] = (name, search.ledger.scored_tokens - before, list(w))
            search.node_why[path] = why
            search.ledger.escalated_nodes += why.startswith("escalated")
        else:
            w = self.prior.weights(self.context(search, path), [m.text for m in moves],
                                   search.ledger, question=search.task.question)
        rho = self.config.reflection_penalty
        if rho and search.failed_moves:
            w = [x * (1 - rho) ** search.failed_moves.get(f"{m.slot}:{m.key}", 0)
                 for x, m in zip(w, moves, strict=True)]
        if self.guide is not None:
            w = self.guide(search, path, moves, w)
        return _normalised(w)

    def is_terminal(self, search: Search, path: tuple) -> bool:
        return self.plan(search, path).submitted

    def finish(self, search: Search, path: tuple) -> Terminal:
        plan = self.plan(search, path)
        if not plan.submitted:
            return Terminal(None, False, False, "", "the plan could not be completed")
        try:
            sql = plan.sql()
        except (ValueError, TypeError, AttributeError) as e:
            return Terminal(None, False, False, "", f"the plan has no SQL form ({e})")
        r = search.run(sql)
        ok = r.ok
        verified = ok and search.task.check(r)
        return Terminal(sql, ok, verified, r.to_observation(),
                        "" if verified else _failure_reason(r))

    def steps(self, search: Search, path: tuple) -> list[tuple[str, SqlResult]]:
        t = search.terminal(path)
        return [(t.sql, search.run(t.sql))] if t.sql else []


SQL_BLOCK = re.compile(r"```(?:sql|sqlite)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)
SQL_START = re.compile(r"\b(SELECT|WITH)\b.*", re.DOTALL | re.IGNORECASE)
SYSTEM_PROMPT = ("You answer questions about a SQLite database by writing SQL. Reply with one "
                 "SQL query in a ```sql``` block, or with the word ANSWER when the last "
                 "result already answers the question.")


def extract_sql(text: str) -> str | None:
    """The first SQL statement in a reply (a fenced block, else from SELECT/WITH on)."""
    m = SQL_BLOCK.search(text)
    body = m.group(1) if m else None
    if body is None:
        m2 = SQL_START.search(text)
        body = m2.group(0) if m2 else None
    if not body:
        return None
    body = body.strip().split(";")[0].strip()
    return body or None


class ModelGenerator:
    """Free-form SQL from a chat model; a node is one executed statement."""

    name = "model"

    def __init__(self, model, config: ExploreConfig) -> None:
        self.model = model
        self.config = config
        self._votes: dict[tuple, dict[str, int]] = {}

    def _sqls(self, search: Search, path: tuple) -> list[str]:
        return [m.value for m in search.moves(path) if m.slot == "sql"]

    def conversation(self, search: Search, path: tuple) -> list[dict[str, str]]:
        lines = [search.env.profile.digest(max_values=6), "", f"Question: {search.task.question}"]
        for sql in self._sqls(search, path):
            lines += ["", f"You ran: {sql}", "Result:", search.run(sql).to_observation(8, 800)]
        notes = search.reflections[-self.config.reflections:] if self.config.reflections else []
        if notes:
            lines += ["", "Earlier attempts that were wrong:"]
            lines += [f"- {n['sql']}: {n['reason']}" for n in notes if n.get("sql")]
        return [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": "\n".join(lines)}]

    def options(self, search: Search, path: tuple) -> list[Move]:
        from workbench.models.base import GenerationParams

        sqls = self._sqls(search, path)
        last_ok = bool(sqls) and search.run(sqls[-1]).ok
        answer = [Move("answer", "answer", "answer with the last result")] if last_ok else []
        if path and search.moves(path)[-1].slot == "answer":
            return []
        if len(sqls) >= self.config.max_depth:
            return answer
        counts: dict[str, list] = {}
        wanted = self.config.proposals
        if not path and self.config.seed_prefixes:
            for sql in search.trie.first_statements(self.config.seed_prefixes, wanted):
                counts.setdefault(action_key("sql", sql), [sql, 0])[1] += 1
            search.ledger.model_calls_saved += len(counts)
            wanted -= len(counts)
        gens = []
        if wanted > 0:
            conv = self.conversation(search, path)
            seed = int.from_bytes(hashlib.sha256(
                f"{self.config.seed}:{search.task.id}:{path}".encode()).digest()[:4], "big")
            params = GenerationParams(max_tokens=self.config.max_tokens,
                                      temperature=self.config.temperature, seed=seed)
            t0 = time.perf_counter()
            gens = self.model.generate([conv] * wanted, params)
            search.ledger.model_s += time.perf_counter() - t0
            search.ledger.model_calls += len(gens)
        for g in gens:
            search.ledger.prompt_tokens += g.prompt_tokens or 0
            search.ledger.completion_tokens += g.completion_tokens or 0
            sql = extract_sql(g.text or "")
            if sql:
                k = action_key("sql", sql)
                counts.setdefault(k, [sql, 0])[1] += 1
        moves = [Move("sql", k, sql, sql) for k, (sql, _) in counts.items()]
        self._votes[(search.task.id, path)] = {m.key: counts[m.key][1] for m in moves}
        return moves + answer

    def priors(self, search: Search, path: tuple, moves: list[Move]) -> list[float]:
        votes = self._votes.get((search.task.id, path), {})
        return _normalised([votes.get(m.key, 1) for m in moves])

    def is_terminal(self, search: Search, path: tuple) -> bool:
        return bool(path) and search.moves(path)[-1].slot == "answer"

    def finish(self, search: Search, path: tuple) -> Terminal:
        sqls = self._sqls(search, path)
        if not sqls:
            return Terminal(None, False, False, "", "no statement ran")
        r = search.run(sqls[-1])
        verified = r.ok and search.task.check(r)
        return Terminal(sqls[-1], r.ok, verified, r.to_observation(),
                        "" if verified else _failure_reason(r))

    def steps(self, search: Search, path: tuple) -> list[tuple[str, SqlResult]]:
        return [(s, search.run(s)) for s in self._sqls(search, path)]


# --- mcts-simple glue -------------------------------------------------------------------------


class TaskGame(Game):
    """A task as a one-player game for mcts-simple: actions are option indices, the winner is
    player 0 when the terminal's answer is verified."""

    def __init__(self, search: Search, path: tuple = ()) -> None:
        self.search = search
        self.path = path

    def __deepcopy__(self, memo: dict | None = None) -> TaskGame:
        return TaskGame(self.search, self.path)  # the search is shared, the path is a tuple

    def render(self) -> None:
        pass

    def get_state(self) -> str:
        return ",".join(map(str, self.path))

    def number_of_players(self) -> int:
        return 1

    def current_player(self) -> int:
        return 0

    def possible_actions(self) -> list[int]:
        return list(range(len(self.search.options(self.path)[0])))

    def priors(self) -> list[float]:
        return self.search.options(self.path)[1]

    def take_action(self, action: int) -> None:
        self.path = (*self.path, action)

    def has_outcome(self) -> bool:
        return self.search.is_terminal(self.path)

    def winner(self) -> list[int]:
        return [0] if self.search.terminal(self.path).verified else []


class PUCTNode(UCTNode):
    """mcts-simple's UCT node with a prior: Q + c·P·√N/(1+n) (unvisited Q = 0)."""

    def __init__(self, player, state, prev_node=None, transposition_table=None,
                 rng: random.Random | None = None, c: float = 1.5, prior: float = 1.0) -> None:
        super().__init__(player, state, prev_node, transposition_table,
                         rng or random.Random(0), c)
        self.prior = prior

    def add_child(self, next_player: int, next_state: str, action: int,
                  prior: float = 1.0) -> None:
        if action not in self.children:
            self.children[action] = PUCTNode(next_player, next_state, prev_node=self,
                                             rng=self.rng, c=self.c, prior=prior)

    def choose_best_action(self, training: bool) -> int:
        if not training:
            return max(self.children, key=lambda a: (self.children[a].n, self.children[a].w))
        sq = math.sqrt(max(self.n, 1))

        def score(a: int) -> float:
            ch = self.children[a]
            q = ch.w / ch.n if ch.n else 0.0
            return q + self.c * ch.prior * sq / (1 + ch.n)

        return max(self.children, key=score)


class PUCT(UCT):
    """mcts-simple's UCT with priors at expansion and prior-weighted rollouts."""

    def __init__(self, game: TaskGame, seed: int = 0, c: float = 1.5) -> None:
        self.game = game
        self.copied_game = deepcopy(game)
        self.seed = seed
        self.rng = random.Random(seed)
        self.transposition_table = None
        self.c = c
        self.root = PUCTNode(game.current_player(), str(game.get_state()), rng=self.rng, c=c)
        self.training = True

    def expansion(self, path: list[PUCTNode]) -> list[PUCTNode]:
        game = self.copied_game
        if game.has_outcome():
            path[-1].has_outcome = True
            return path
        node = path[-1]
        if not node.is_expanded:
            for a, p in zip(game.possible_actions(), game.priors(), strict=True):
                child = deepcopy(game)
                child.take_action(a)
                node.add_child(child.current_player(), str(child.get_state()), a, prior=p)
            node.is_expanded = True
            a = node.choose_best_action(True)
            path.append(node.children[a])
            game.take_action(a)
        return path

    def simulation(self, path: list[PUCTNode], greedy: bool = False) -> list[PUCTNode]:
        """A rollout to a terminal: moves drawn by prior (or the likeliest, `greedy`)."""
        game = self.copied_game
        while not game.has_outcome():
            actions, priors = game.possible_actions(), game.priors()
            a = max(actions, key=lambda i: priors[i]) if greedy else \
                self.rng.choices(actions, weights=priors)[0]
            game.take_action(a)
            path[-1].add_child(game.current_player(), str(game.get_state()), a,
                               prior=priors[a])
            path.append(path[-1].children[a])
        return path


# --- exploring a task -------------------------------------------------------------------------


class TreeNode(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: int
    parent: int | None
    action: int | None
    move: dict[str, Any] | None
    prior: float
    visits: int
    wins: float
    terminal: bool = False
    sql: str | None = None
    verified: bool | None = None
    observation: str | None = None
    scorer: str | None = None  # prior=choose: which scorer gave this node's children priors
    scorer_why: str | None = None
    reason: str | None = None


class TaskTree(BaseModel):
    """One task's tree, saved as JSON (never pickle)."""

    model_config = ConfigDict(extra="forbid")

    version: int = TREE_VERSION
    task_id: str
    env_hash: str
    arm: str = Field("", description="The arm (generator + model + settings) that searched.")
    generator: str
    models: list[str]
    config: ExploreConfig
    nodes: list[TreeNode]
    verified_paths: list[list[int]] = Field(default_factory=list)
    reflections: list[dict[str, Any]] = Field(default_factory=list)
    ledger: Ledger

    def node_path(self, node_id: int) -> list[int]:
        """Node ids from the root to `node_id`."""
        return _node_path(self.nodes, node_id)


def _tree_nodes(search: Search, root: PUCTNode) -> tuple[list[TreeNode], dict[tuple, int]]:
    nodes: list[TreeNode] = []
    ids: dict[tuple, int] = {}
    stack: list[tuple[PUCTNode, tuple, int | None]] = [(root, (), None)]
    while stack:
        node, path, parent = stack.pop(0)
        nid = len(nodes)
        ids[path] = nid
        move = search.moves(path)[-1].to_json() if path else None
        tn = TreeNode(id=nid, parent=parent, action=path[-1] if path else None, move=move,
                      prior=round(float(node.prior), 6), visits=node.n, wins=node.w)
        if path in search.node_scorer:
            tn.scorer, tn.scorer_why = search.node_scorer[path][0], search.node_why[path]
        if move and move["slot"] == "sql":
            tn.sql = move["value"]
            tn.observation = search.run(tn.sql).to_observation()[:2000]
        if path in search._terminal:
            t = search._terminal[path]
            tn.terminal, tn.sql, tn.verified = True, t.sql, t.verified
            tn.observation, tn.reason = t.observation[:2000], t.reason or None
        nodes.append(tn)
        for a in sorted(node.children):
            stack.append((node.children[a], (*path, a), nid))
    return nodes, ids


def explore_task(task: Task, env: DataEnvironment, generator: GrammarGenerator | ModelGenerator,
                 *, config: ExploreConfig, trie: PrefixTrie | None = None,
                 models: Sequence[str] = (), arm: str = "") -> tuple[TaskTree, Search]:
    """Search one task; the tree (JSON-ready) and the search state (for trajectories)."""
    if task.env_hash != env.profile.content_hash:
        raise DataError(f"task {task.id} was built on environment {task.env_hash[:12]}, not "
                        f"on {env.name} ({env.profile.content_hash[:12]})")
    trie = trie or PrefixTrie(env.profile.content_hash)
    search = Search(task, env, generator, trie, config)
    seed = int.from_bytes(hashlib.sha256(f"{config.seed}:{task.id}".encode()).digest()[:8],
                          "big")
    mcts = PUCT(TaskGame(search), seed=seed, c=config.c_puct)
    t0 = time.perf_counter()
    budget = 1 if config.strategy == "greedy" else config.iterations
    for _ in range(budget):
        if search.done:
            break
        if config.strategy == "mcts":
            mcts.step()
        else:
            mcts.copied_game = deepcopy(mcts.game)
            mcts.backpropagation(mcts.simulation([mcts.root], greedy=config.strategy == "greedy"))
        search.ledger.iterations += 1
    search.ledger.wall_s = time.perf_counter() - t0
    shape = question_shape(task.question, env.profile)
    for path in search.verified_sql.values():
        keys = [f"{m.slot}:{m.key}" for m in search.moves(path)]
        trie.visit(keys)
        trie.learn(shape.text, [shape.abstract(k) for k in keys], task.id)
    if getattr(generator, "chooser", None) is not None:
        generator.chooser.learn(search)
    nodes, ids = _tree_nodes(search, mcts.root)
    verified = [ids[p] for p in search.verified_sql.values() if p in ids]
    tree = TaskTree(task_id=task.id, env_hash=task.env_hash, arm=arm, generator=generator.name,
                    models=list(models), config=config, nodes=nodes,
                    verified_paths=[_node_path(nodes, v) for v in verified],
                    reflections=search.reflections[:50], ledger=search.ledger)
    return tree, search


def _node_path(nodes: list[TreeNode], node_id: int) -> list[int]:
    by_id = {n.id: n for n in nodes}
    out = [node_id]
    while by_id[out[-1]].parent is not None:
        out.append(by_id[out[-1]].parent)
    return out[::-1]


def tree_bytes(tree: TaskTree) -> bytes:
    """The tree file's bytes, without timings (same seed → same bytes)."""
    data = tree.model_dump(mode="json")
    for k in ("sandbox_s", "model_s", "wall_s"):
        data["ledger"].pop(k, None)
    return (json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode()


def save_tree(tree: TaskTree, path: str | Path) -> Path:
    from workbench.io import atomic_write_bytes

    path = Path(path)
    atomic_write_bytes(path, tree_bytes(tree))
    return path


def load_tree(path: str | Path) -> TaskTree:
    from workbench.io import describe_validation_error

    try:
        return TaskTree.model_validate_json(Path(path).read_bytes())
    except OSError as e:
        raise DataError(f"cannot read the tree: {e.strerror}", path=str(path)) from None
    except ValueError as e:
        raise DataError(f"not a search tree: {describe_validation_error(e)}",
                        path=str(path)) from None
