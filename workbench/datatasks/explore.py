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

The pieces live in modules of their own: settings (`exploreconfig`), the cost ledger
(`ledger`), the prefix trie (`trie`), priors and the node chooser (`priors`), one task's
search state (`search`), the move generators (`generators`), the mcts-simple adapter (`puct`)
and the tree file (`trees`). Here: searching one task and recording its tree.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from copy import deepcopy

from workbench.dataenv.env import DataEnvironment
from workbench.datatasks.exploreconfig import ExploreConfig
from workbench.datatasks.generators import GrammarGenerator, ModelGenerator, extract_sql
from workbench.datatasks.ledger import Ledger
from workbench.datatasks.pool import Task
from workbench.datatasks.priors import ModelPrior, UniformPrior
from workbench.datatasks.puct import PUCT, PUCTNode, TaskGame
from workbench.datatasks.reuse import question_shape
from workbench.datatasks.search import Search
from workbench.datatasks.trees import (
    TaskTree,
    TreeNode,
    load_tree,
    node_path,
    save_tree,
    tree_bytes,
)
from workbench.datatasks.trie import PrefixTrie
from workbench.errors import DataError

# importable from here too: tests, tests/conftest.py and benchmarks read them from this module
__all__ = ["ExploreConfig", "GrammarGenerator", "Ledger", "ModelGenerator", "ModelPrior",
           "PrefixTrie", "TaskTree", "TreeNode", "UniformPrior", "explore_task", "extract_sql",
           "load_tree", "save_tree", "tree_bytes"]


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
    if (chooser := getattr(generator, "chooser", None)) is not None:
        chooser.learn(search)
    nodes, ids = _tree_nodes(search, mcts.root)
    verified = [ids[p] for p in search.verified_sql.values() if p in ids]
    tree = TaskTree(task_id=task.id, env_hash=task.env_hash, arm=arm, generator=generator.name,
                    models=list(models), config=config, nodes=nodes,
                    verified_paths=[node_path(nodes, v) for v in verified],
                    reflections=search.reflections[:50], ledger=search.ledger)
    return tree, search
