"""One task's search state (`Search`): options and priors per path, executions through the
trie, terminals and the reflections of failed ones; and what a move generator provides."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

from workbench.dataenv.env import DataEnvironment
from workbench.dataenv.sqlsandbox import SqlResult
from workbench.datatasks.exploreconfig import ExploreConfig
from workbench.datatasks.grammar import Move
from workbench.datatasks.ledger import Ledger
from workbench.datatasks.normalise import normalise_program
from workbench.datatasks.pool import Task
from workbench.datatasks.trie import PrefixTrie, action_key


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


def failure_reason(r: SqlResult) -> str:
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
