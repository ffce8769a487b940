"""The mcts-simple adapter: a task as a one-player `Game`, and `PUCT`, mcts-simple's UCT with
priors at expansion and prior-weighted rollouts."""

from __future__ import annotations

import math
import random
from copy import deepcopy
from typing import TYPE_CHECKING

from mcts_simple import UCT, Game, UCTNode

if TYPE_CHECKING:
    from workbench.datatasks.search import Search


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
