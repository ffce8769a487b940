"""Cross-task prefix reuse (issue 11, part 5): question shapes, abstract keys, and verified
paths of earlier tasks seeding later trees. Each test prints its figure."""

from __future__ import annotations

import json

import pytest

from workbench.datatasks.explore import (
    ExploreConfig,
    GrammarGenerator,
    Ledger,
    ModelPrior,
    PrefixTrie,
    UniformPrior,
    explore_task,
)
from workbench.datatasks.reuse import question_shape, similarity
from workbench.datatasks.tasks import PoolConfig, build_pool


@pytest.fixture(scope="module")
def pool(chinook):
    return build_pool(chinook, PoolConfig(seed=0))


def test_shapes_and_abstract_keys(chinook):
    a = question_shape("How many Invoice rows have Total greater than 1.98?", chinook.profile)
    b = question_shape("How many Track rows have UnitPrice greater than 0.99?", chinook.profile)
    assert a.text == b.text == "How many ⟨n0⟩ rows have ⟨n1⟩ greater than ⟨v0⟩?"
    assert a.abstract("lit:conds:gt:Total=1.98") == b.abstract("lit:conds:gt:UnitPrice=0.99") \
        == "lit:conds:gt:⟨n1⟩=⟨v0⟩"
    assert a.abstract("table:Invoice") == b.abstract("table:Track") == "table:⟨n0⟩"
    # quoted values (as the grammar's keys write them, repr) and the skip move's raw text
    c = question_shape("What is the Email of the Employee row whose LastName is 'Callahan'?",
                       chinook.profile)
    assert c.text == "What is the ⟨n0⟩ of the ⟨n1⟩ row whose ⟨n2⟩ is '⟨v0⟩'?"
    assert c.abstract("lit:conds:eq:LastName='Callahan'") == "lit:conds:eq:⟨n2⟩=⟨v0⟩"
    assert c.abstract("lit:skip:Callahan") == "lit:skip:⟨v0⟩"
    # a value is replaced only where the grammar writes values, never inside a name; a
    # number as the key writes it (1.50 -> 1.5); not the tail of another number
    f = question_shape("Which distinct Title values do Album rows whose Title is 'A' have?",
                       chinook.profile)
    assert f.abstract("table:Album") == "table:⟨n1⟩"
    assert f.abstract("lit:conds:eq:Title='A'") == "lit:conds:eq:⟨n0⟩=⟨v0⟩"
    g = question_shape("How many Invoice rows have Total greater than 1.50?", chinook.profile)
    assert g.abstract("lit:conds:gt:Total=1.5") == "lit:conds:gt:⟨n1⟩=⟨v0⟩"
    assert g.abstract("lit:conds:gt:Total=-1.5") == "lit:conds:gt:⟨n1⟩=-1.5"
    k = question_shape("List the 5 Country values with the most Customer rows, each with its "
                       "number of rows.", chinook.profile)
    assert k.abstract("k:5") == "k:⟨v0⟩" and k.abstract("k:all") == "k:all"
    # a name the question does not use stays literal: the path transfers only with it
    d = question_shape("How many Invoice rows have BillingState 'NV'?", chinook.profile)
    assert d.abstract("lit:conds:via:Customer.CustomerId:eq:State='NV'") == \
        "lit:conds:via:Customer.CustomerId:eq:State=⟨v0⟩"
    # a value that is also a prefix of another number is not cut out of it
    e = question_shape("How many Track rows have Milliseconds less than 34?", chinook.profile)
    assert e.abstract("lit:conds:lt:Milliseconds=344") == "lit:conds:lt:⟨n1⟩=344"
    assert similarity("What is the total ⟨n0⟩ of ⟨n1⟩ rows?",
                      "What is the maximum ⟨n0⟩ of ⟨n1⟩ rows?") == pytest.approx(0.875)


def test_trie_keeps_shapes_across_a_save(chinook, tmp_path):
    h = chinook.profile.content_hash
    trie = PrefixTrie(h)
    keys = ["op:count", "table:⟨n0⟩", "submit:submit"]
    trie.learn("How many ⟨n0⟩ rows?", keys, "t1")
    trie.learn("How many ⟨n0⟩ rows?", keys, "t2")
    trie.learn("How many ⟨n0⟩ rows?", keys, "t2")  # a re-run task counts once
    trie.save(tmp_path / "trie.json")
    again = PrefixTrie.load(tmp_path / "trie.json", h)
    assert again.seeds("How many ⟨n0⟩ rows?") == [(tuple(keys), 2, 1.0)]
    assert again.seeds("How many ⟨n0⟩ rows?", min_count=3) == []
    # a task is never seeded by its own earlier verification
    assert again.seeds("How many ⟨n0⟩ rows?", exclude="t2") == [(tuple(keys), 1, 1.0)]
    assert again.seeds("How many ⟨n0⟩ rows?", min_count=2, exclude="t2") == []
    assert again.seeds("Which ⟨n0⟩ is the oldest?", min_similarity=0.5) == []
    # a trie written before shapes existed (version 1) still loads, with none
    data = json.loads((tmp_path / "trie.json").read_text())
    data.pop("shapes")
    data["version"] = 1
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert PrefixTrie.load(tmp_path / "old.json", h).shapes == {}
    # hand-edited entries of the wrong form are dropped, the rest kept
    data["shapes"] = {"A ⟨n0⟩?": {"op:count": ["t1"], "op:agg": 3}, "B": [1]}
    data["scorers"] = {"env/lookup/0": {"uniform": {"t1": [3, 0.5], "t2": [3], "t3": "x"},
                                        "m": 7}, "x": None}
    (tmp_path / "edited.json").write_text(json.dumps(data))
    edited = PrefixTrie.load(tmp_path / "edited.json", h)
    assert edited.shapes == {"A ⟨n0⟩?": {"op:count": ["t1"]}}
    assert edited.scorers == {"env/lookup/0": {"uniform": {"t1": [3.0, 0.5]}}}


def _run(tasks, env, cfg, prior_factory, shared: bool) -> tuple[int, Ledger]:
    trie, total, found = PrefixTrie(env.profile.content_hash), Ledger(), 0
    for t in tasks:
        _, search = explore_task(t, env, GrammarGenerator(prior_factory(), cfg), config=cfg,
                                 trie=trie if shared else PrefixTrie(env.profile.content_hash))
        total.add(search.ledger)
        found += bool(search.verified_sql)
    return found, total


def test_seeded_trees_need_30_percent_fewer_executions_at_equal_yield(chinook, pool):
    """The first 40 tasks of the Chinook pool, MCTS with the uniform prior (no model), 100
    iterations: the trie shared across tasks (seeding on) vs a fresh trie per task."""
    tasks = pool.tasks[:40]
    cfg = ExploreConfig(prior="uniform", iterations=100, stop_after=1)
    on = _run(tasks, chinook, cfg, UniformPrior, True)
    off = _run(tasks, chinook, cfg, UniformPrior, False)
    cache_only = _run(tasks, chinook, cfg.model_copy(update={"seed_shapes": 0}), UniformPrior,
                      True)
    cut = 1 - on[1].executions / off[1].executions
    print(f"\nP2: 40 tasks, trie shared: {on[0]} verified, {on[1].executions} executions "
          f"({on[1].seeded_nodes} seeded nodes); shared but no seeding: {cache_only[0]} "
          f"verified, {cache_only[1].executions} executions; fresh trie per task: {off[0]} "
          f"verified, {off[1].executions} executions -> {100 * cut:.0f}% fewer")
    assert on[0] >= off[0]
    assert cut >= 0.30
    assert on[1].executions < 0.75 * cache_only[1].executions  # seeding, not the cache


def test_seeded_nodes_skip_the_model(chinook, pool):
    """With a model prior (the scripted backend's deterministic scores, through the same
    interface as the real ones), a node on a seeded path is answered without a model call."""
    from workbench.models import load_model

    tasks = [t for t in pool.tasks if question_shape(t.question, chinook.profile).text
             == "How many ⟨n0⟩ rows have ⟨n1⟩ greater than ⟨v0⟩?"]
    assert len(tasks) >= 3
    model = load_model("fake", backend="fake")
    rows = {}
    for shapes in (0, 1):
        cfg = ExploreConfig(iterations=60, stop_after=1, seed_shapes=shapes)
        rows[shapes] = _run(tasks, chinook, cfg, lambda: ModelPrior(model), True)
    (f0, off), (f1, on) = rows[0], rows[1]
    print(f"\nP3: {len(tasks)} tasks of one shape, model prior: seeding off {f0} verified, "
          f"{off.model_calls} model calls, {off.executions} executions; on {f1} verified, "
          f"{on.model_calls} model calls ({on.model_calls_saved} saved), {on.executions} "
          "executions")
    assert f1 >= f0 == len(tasks)
    assert on.model_calls < off.model_calls and on.model_calls_saved >= on.seeded_nodes > 0


def test_per_node_scorer_choice_is_logged_learnt_and_kept(chinook, pool, tmp_path):
    """prior=choose: a bandit per (environment, category, depth) picks uniform or the model
    for each node; rewards come from verified paths; the statistics persist in the trie; a
    task with repeated failures escalates to the strongest scorer. The scripted model goes
    through the same interface as the real backends."""
    from workbench.models import load_model
    from workbench.trajsynth.api import make_generator

    tasks = pool.tasks[:40]
    model = load_model("fake", backend="fake")
    rows = {}
    for prior in ("model", "choose"):
        cfg = ExploreConfig(prior=prior, iterations=60, stop_after=1, seed_shapes=0)
        trie, total, found, nodes = PrefixTrie(chinook.profile.content_hash), Ledger(), 0, []
        gen = make_generator(cfg, model)
        for t in tasks:
            tree, search = explore_task(t, chinook, gen, config=cfg, trie=trie)
            total.add(search.ledger)
            found += bool(search.verified_sql)
            nodes += tree.nodes
        rows[prior] = (found, total, nodes, trie)
    found, total, nodes, trie = rows["choose"]
    chosen = [n for n in nodes if n.scorer]
    by = {s: sum(n.scorer == s for n in chosen) for s in ("uniform", "fake:fake")}
    print(f"\nP4: 40 tasks, prior=model: {rows['model'][0]} verified, "
          f"{rows['model'][1].model_calls} model calls; prior=choose: {found} verified, "
          f"{total.model_calls} model calls, nodes scored by {by}, "
          f"{total.escalated_nodes} escalated, {len(trie.scorers)} contexts learnt")
    assert by["uniform"] > 0 and by["fake:fake"] > 0
    assert all(n.scorer_why for n in chosen)
    assert total.escalated_nodes > 0 and all(
        n.scorer == "fake:fake" for n in chosen if n.scorer_why.startswith("escalated"))
    assert total.model_calls < rows["model"][1].model_calls
    # contexts hold both scorers' rewards, per task (a re-run task replaces its share)
    assert any(len(v) == 2 for v in trie.scorers.values())
    # a re-run of a task replaces its whole share (here it sees 39 other tasks' statistics,
    # so it chooses differently from its first run)
    def share(tid):
        return {(c, n): v[tid] for c, d in trie.scorers.items() for n, v in d.items()
                if tid in v}

    first = share(tasks[0].id)
    cfg = ExploreConfig(prior="choose", iterations=60, stop_after=1, seed_shapes=0)
    _, again = explore_task(tasks[0], chinook, make_generator(cfg, model), config=cfg,
                            trie=trie)
    chosen = {(f"{chinook.name}/{tasks[0].category}/{len(p)}", name)
              for p, (name, _, _) in again.node_scorer.items()
              if not again.node_why[p].startswith("escalated")}
    assert set(share(tasks[0].id)) == chosen
    assert share(tasks[0].id) != first or {w for w in again.node_why.values()} != {"untried"}
    trie.save(tmp_path / "trie.json")
    assert PrefixTrie.load(tmp_path / "trie.json", trie.env_hash).scorers == trie.scorers
