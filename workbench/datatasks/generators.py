"""Where a node's moves come from: the schema grammar (`GrammarGenerator`, priors from a
`Prior`, seeded paths or a `NodeChooser`) or free-form SQL from a chat model
(`ModelGenerator`, priors by self-consistency vote)."""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

from workbench.dataenv.sqlsandbox import SqlResult
from workbench.datatasks.exploreconfig import ExploreConfig
from workbench.datatasks.grammar import Grammar, Move, Plan
from workbench.datatasks.priors import ModelPrior, NodeChooser, Prior, normalised
from workbench.datatasks.queries import lit, qi
from workbench.datatasks.reuse import Shape, question_shape
from workbench.datatasks.search import Search, Terminal, failure_reason
from workbench.datatasks.trie import action_key
from workbench.models.base import GenerationParams

# a similar shape's seed counts similarity² (on the first 40 / all 77 Chinook tasks with the
# uniform prior, power 2 needed the fewest executions: 356 / 1,330, against 390 / 1,373 for
# power 1 and 512 / 1,524 for power 4)
SIMILARITY_POWER = 2


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
        return normalised(w)

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
                        "" if verified else failure_reason(r))

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
            found = extract_sql(g.text or "")
            if found:
                k = action_key("sql", found)
                counts.setdefault(k, [found, 0])[1] += 1
        moves = [Move("sql", k, sql, sql) for k, (sql, _) in counts.items()]
        self._votes[(search.task.id, path)] = {m.key: counts[m.key][1] for m in moves}
        return moves + answer

    def priors(self, search: Search, path: tuple, moves: list[Move]) -> list[float]:
        votes = self._votes.get((search.task.id, path), {})
        return normalised([votes.get(m.key, 1) for m in moves])

    def is_terminal(self, search: Search, path: tuple) -> bool:
        return bool(path) and search.moves(path)[-1].slot == "answer"

    def finish(self, search: Search, path: tuple) -> Terminal:
        sqls = self._sqls(search, path)
        if not sqls:
            return Terminal(None, False, False, "", "no statement ran")
        r = search.run(sqls[-1])
        verified = r.ok and search.task.check(r)
        return Terminal(sqls[-1], r.ok, verified, r.to_observation(),
                        "" if verified else failure_reason(r))

    def steps(self, search: Search, path: tuple) -> list[tuple[str, SqlResult]]:
        return [(s, search.run(s)) for s in self._sqls(search, path)]
