"""Where a node's prior comes from: uniform, a model's log-likelihood of each option
(`ModelPrior`), or a bandit choosing among those scorers per node (`NodeChooser`)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, Protocol

from workbench.datatasks.exploreconfig import ExploreConfig
from workbench.datatasks.ledger import Ledger
from workbench.models.base import ScoreRequest

if TYPE_CHECKING:
    from workbench.datatasks.search import Search


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


def normalised(ws: Sequence[float]) -> list[float]:
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
            # the verified path's next move from this node (None: off that path)
            nxt = verified[len(path)] if verified is not None and len(verified) > len(path) \
                and verified[:len(path)] == path else None
            reward = (weights[nxt] if nxt is not None else 0.0) \
                - c.choose_lam * tokens / c.choose_cost_scale
            k, r = mine.get((self.context(search, path), name), [0, 0.0])
            mine[(self.context(search, path), name)] = [k + 1, r + reward]
        tid = search.task.id
        for by_name in search.trie.scorers.values():
            for by_task in by_name.values():
                by_task.pop(tid, None)
        for (key, name), v in mine.items():
            search.trie.scorers.setdefault(key, {}).setdefault(name, {})[tid] = v
