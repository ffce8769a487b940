"""The MCTS trajectory explorer (issue 11, part 3) and its exports. Each test prints its
figure."""

from __future__ import annotations

import hashlib
import json
import random

import pytest
from conftest import make_shop

from workbench.errors import DataError
from workbench.trajsynth.api import explore_pool, export, select_tasks, tree_path
from workbench.dataenv.env import DataEnvironment, sample_environment
from workbench.datatasks.explore import (
    ExploreConfig,
    GrammarGenerator,
    ModelGenerator,
    ModelPrior,
    PrefixTrie,
    UniformPrior,
    explore_task,
    extract_sql,
    load_tree,
    save_tree,
    tree_bytes,
)
from workbench.datatasks.grammar import Grammar, Plan, literals, mentions
from workbench.datatasks.queries import lit, qi
from workbench.datatasks.tasks import PoolConfig, build_pool


@pytest.fixture(scope="module")
def pool(chinook):
    return build_pool(chinook, PoolConfig(seed=0))


@pytest.fixture(scope="module")
def toy(trajsynth_cache, tmp_path_factory) -> DataEnvironment:
    """The shop of conftest with one more sale."""
    path = make_shop(tmp_path_factory.mktemp("toy") / "shop.sqlite",
                     "INSERT INTO sale VALUES (8, 3, 'pen', 2.5, '2023-07-01');")
    return DataEnvironment.open(path, cache_dir=trajsynth_cache)


def _agrees(m, q) -> bool:
    """Does grammar move `m` agree with reference query `q`?"""
    v, slot = m.value, m.slot
    if slot == "measure":
        return v[0] == q.agg and (v[0] == "count" or v[1] == q.column)
    if slot == "k":
        return v[0] == q.k
    if slot == "values":
        return list(v[0]) == list(q.values)
    if slot == "lit":
        return v[1] in (q.extra if v[2] == "extra" else q.conds)
    if slot == "direction":
        return v == q.descending
    if slot == "submit":
        return True
    return v == getattr(q, slot)  # op, table, column, target, group


def _gold_path(g: Grammar, q) -> Plan | None:
    """Walk the grammar choosing, at every slot, the option that agrees with the reference
    query (test-only: the explorer never reads it)."""
    plan = Plan()
    while (opts := g.options(plan)):
        pick = next((m for m in opts if _agrees(m, q)), None)
        if pick is None and opts[0].slot == "lit":
            pick = opts[-1]  # the literal is not a filter
        if pick is None:
            return None
        plan = g.apply(plan, pick)
    return plan


def _probe(env):
    def probe(t, c, v):
        r = env.run_sql(f"SELECT 1 FROM {qi(t)} WHERE {qi(c)} = {lit(v)} LIMIT 1")
        return r.ok and bool(r.rows)
    return probe


# --- the grammar ------------------------------------------------------------------------------


def test_literals_and_mentions():
    q = "How many more Track rows does the MediaType Name value 'AAC audio file' have than " \
        "'Guns N' Roses'? Top 5 in 2009, over 1.98"
    got = [(x.text, x.value) for x in literals(q)]
    assert ("AAC audio file", "AAC audio file") in got
    assert ("Guns N' Roses", "Guns N' Roses") in got  # the longer reading is kept too
    assert ("5", 5) in got and ("2009", 2009) in got and ("1.98", 1.98) in got
    assert mentions(q, "MediaType") and mentions("how many media types", "MediaType")
    assert not mentions(q, "Playlist")


@pytest.mark.parametrize("name", ["chinook", "sklearn_classic"])
def test_grammar_reaches_every_task_of_the_pool(name, trajsynth_cache):
    env = DataEnvironment.open(sample_environment(name), cache_dir=trajsynth_cache)
    p = build_pool(env, PoolConfig(seed=0))
    reached = 0
    for t in p.tasks:
        plan = _gold_path(Grammar(env.profile, t.question, probe=_probe(env)), t.query)
        reached += plan is not None and t.check(env.run_sql(plan.sql()))
    print(f"\nG1 {name}: the grammar reaches a verified query for {reached}/{len(p.tasks)} "
          "pool tasks")
    assert reached == len(p.tasks)


def test_every_path_terminates(chinook, pool):
    """Random walks end (submitted, or at a slot with no option: a failed terminal) within
    the slot bound."""
    rng = random.Random(0)
    longest, dead, walks = 0, 0, 0
    for t in pool.tasks[::5]:
        g = Grammar(chinook.profile, t.question, probe=_probe(chinook))
        for _ in range(40):
            plan, depth = Plan(), 0
            while (opts := g.options(plan)):
                plan = g.apply(plan, rng.choice(opts))
                depth += 1
                assert depth <= 8 + len(g.lits)
            longest = max(longest, depth)
            dead += not plan.submitted
            walks += 1
    print(f"\nG2: {walks} random walks all ended; {dead} at a dead end ({100 * dead / walks:.1f}"
          f"%), longest path {longest} moves")
    assert dead / walks < 0.1


# --- the search -------------------------------------------------------------------------------


def _hardest(pool, n=3):
    return sorted(pool.tasks, key=lambda t: (-t.difficulty, t.id))[:n]


def test_same_seed_same_tree_and_round_trip(chinook, pool, tmp_path):
    cfg = ExploreConfig(prior="uniform", iterations=150, stop_after=0, seed=3)
    task = next(t for t in pool.tasks if t.category == "comparison")
    runs = []
    for _ in range(2):
        tree, _search = explore_task(task, chinook, GrammarGenerator(UniformPrior(), cfg),
                                    config=cfg, trie=PrefixTrie(chinook.profile.content_hash))
        runs.append(tree)
    h = [hashlib.sha256(tree_bytes(t)).hexdigest() for t in runs]
    # mcts-simple counts wins on the nodes below the root
    root = [(t.nodes[0].visits, sum(n.wins for n in t.nodes if n.parent == 0), len(t.nodes))
            for t in runs]
    print(f"\nM1: same seed twice -> root (visits, wins, nodes) {root[0]} / {root[1]}, tree "
          f"sha256 {h[0][:12]} / {h[1][:12]}")
    assert h[0] == h[1] and root[0] == root[1]
    assert root[0][0] == 150 and root[0][1] > 0
    path = save_tree(runs[0], tmp_path / "t.json")
    again = load_tree(path)
    assert tree_bytes(again) == tree_bytes(runs[0])
    assert json.loads(path.read_text())["version"] == 1  # JSON, never pickle
    path.write_text(path.read_text()[:200])
    with pytest.raises(DataError, match="t.json"):
        load_tree(path)


def test_grammar_search_finds_the_known_query_in_9_of_10_seeds(toy, bundled_model):
    """On a toy environment, with the bundled model's log-likelihood as the prior."""
    p = build_pool(toy, PoolConfig(seed=0, python_check=False))
    tasks = _hardest(p, 3)
    prior = ModelPrior(bundled_model)  # one prior for all seeds: its scores are cached
    rows = []
    for task in tasks:
        found, iters = 0, []
        for seed in range(10):
            cfg = ExploreConfig(iterations=300, seed=seed)
            _tree, search = explore_task(task, toy, GrammarGenerator(prior, cfg), config=cfg)
            found += bool(search.verified_sql)
            iters.append(search.ledger.iterations)
        rows.append((task.question, found, sorted(iters)[5]))
        assert found >= 9, task.question
    print("\nM2: seeds (of 10) finding a verified query within 300 iterations, median "
          "iterations:\n" + "\n".join(f"  {f}/10, {m} it: {q}" for q, f, m in rows))


def test_reflections_and_trie(chinook, pool):
    cfg = ExploreConfig(prior="uniform", iterations=60)
    trie = PrefixTrie(chinook.profile.content_hash)
    tasks = pool.tasks
    ledgers = []
    for t in tasks:
        tree, search = explore_task(t, chinook, GrammarGenerator(UniformPrior(), cfg),
                                    config=cfg, trie=trie)
        ledgers.append(search.ledger)
        assert all(r["reason"] for r in tree.reflections)
        if tree.reflections:
            assert any(n.terminal and n.verified is False and n.reason for n in tree.nodes)
    saved = sum(x.executions_saved for x in ledgers)
    runs = sum(x.executions for x in ledgers)
    print(f"\nM3: {len(tasks)} tasks, <= 60 iterations each: {runs} executions, {saved} "
          f"answered by the shared trie ({100 * saved / (runs + saved):.0f}%)")
    assert saved > 0


def test_model_generator_through_the_chat_protocol(chinook, pool):
    """Free-form SQL proposals from a scripted model (same interface as the real backends):
    proposals are executed, votes become priors, the wrong statement's reflection reaches the
    next prompt, the answer move ends the path."""
    from workbench.models import load_model

    task = next(t for t in pool.tasks if t.query.op == "count" and len(t.query.conds) == 1
                and t.query.conds[0].op == "eq")
    good = f"```sql\n{task.program}\n```"
    bad = "```sql\nSELECT COUNT(*) FROM Track\n```"
    model = load_model("fake", backend="fake", responses=[bad, good, "I think SELECT 1", good])
    cfg = ExploreConfig(generator="model", iterations=30, proposals=4, seed=0)
    _tree, search = explore_task(task, chinook, ModelGenerator(model, cfg), config=cfg)
    print(f"\nM4: scripted model: {search.ledger.model_calls} proposals, verified "
          f"{len(search.verified_sql)}, reflections {len(search.reflections)}")
    assert search.verified_sql
    assert search.ledger.model_calls >= 4
    assert extract_sql("Sure:\n```sql\nSELECT 1;\n```") == "SELECT 1"
    assert extract_sql("no sql here") is None
    if search.reflections:
        assert any("Earlier attempts" in m["content"] for conv in model.seen for m in conv)


# --- the pipeline and the exports ---------------------------------------------------------------


def test_explore_pool_resumes_and_exports(chinook, pool, tmp_path, bundled_model):
    from workbench.records import ChatExample
    from workbench.train.data import IGNORE, tokenize_example

    cfg = ExploreConfig(prior="uniform", iterations=100)
    tasks = select_tasks(pool, "train", 8)
    logs: list[str] = []
    whole = tmp_path / "whole"
    s1 = explore_pool(chinook, tasks, whole, cfg, log=logs.append)

    def nodes(out):  # the trees; ledgers differ (a re-run's executions come from the trie)
        return {t.id: [n.model_dump() for n in load_tree(tree_path(out, t)).nodes]
                for t in tasks}

    # killed after 5 tasks, the 5th tree torn (the trie already knows that task): the re-run
    # searches the rest as the uninterrupted run did (a task never seeds itself)
    explore_pool(chinook, tasks[:5], tmp_path, cfg, log=logs.append)
    tree_path(tmp_path, tasks[4]).write_text("{torn")
    s2 = explore_pool(chinook, tasks, tmp_path, cfg, log=logs.append)
    assert any("4 of 8 trees already searched; 4 to go" in m for m in logs), logs
    assert nodes(tmp_path) == nodes(whole)
    assert s2["tasks_verified"] == s1["tasks_verified"]
    ex = export(tmp_path, tasks, chinook)
    print(f"\nE1: {s1['tasks_verified']}/8 verified; killed after 5 of 8 and resumed: "
          f"identical nodes; exports {ex}")
    assert ex["sft"] >= 6
    rows = [json.loads(x) for x in (tmp_path / "sft.messages.jsonl").read_text().splitlines()]
    tok = bundled_model.tokenizer
    for r in rows:
        ex_ = ChatExample.model_validate(r)
        assert r["metadata"]["env_hash"] == chinook.profile.content_hash
        t = tokenize_example(tok, ex_)
        trained = tok.decode([i for i, lab in zip(t.input_ids, t.labels, strict=True)
                              if lab != IGNORE])
        assert "run_sql" in trained  # the call is trained
        tool_text = r["messages"][3]["content"]
        assert tool_text.splitlines()[-1] not in trained  # "(1 rows)": the result is masked
    prefs = [json.loads(x) for x in (tmp_path / "preferences.jsonl").read_text().splitlines()]
    assert prefs and all(p["chosen"] != p["rejected"] for p in prefs)
    from workbench.formats import read_preferences

    assert len(read_preferences(tmp_path / "preferences.jsonl")) == len(prefs)
    icl = (tmp_path / "icl_bank.jsonl").read_text().splitlines()
    assert len(icl) == ex["icl"] and "SQL: SELECT" in json.loads(icl[0])["text"]
    # the ICL bank as a retrieval index: a task's own question finds its demonstration
    from workbench.retrieval.search import query_index

    first = json.loads(icl[0])
    hits = query_index(ex["icl_index"], first["question"], k=1)
    assert hits and first["id"] in hits[0].heading_path


# --- adaptive selection and the cost model ------------------------------------------------------


def test_escalation_bandit_and_cost_model(chinook, pool, tmp_path):
    from workbench.trajsynth.api import read_attempts
    from workbench.trajsynth.costmodel import held_out_brier
    from workbench.trajsynth.select import Arm, SelectionConfig

    cheap = Arm(name="greedy", rank=0,
                explore=ExploreConfig(prior="uniform", strategy="greedy"))
    strong = Arm(name="mcts", rank=1, explore=ExploreConfig(prior="uniform", iterations=200))
    # the first 50 of the pool's 77 tasks (measured: 19 escalations, 15 tasks started on
    # mcts, 47 verified against greedy's 16, held-out Brier 0.13 against the base rate's 0.22)
    tasks = pool.tasks[:50]
    sel = SelectionConfig(policy="escalate", escalate_after=2, max_attempts=2)
    s = explore_pool(chinook, tasks, tmp_path / "esc", cheap.explore, arms=[cheap, strong],
                     selection=sel, log=lambda m: None)
    att = read_attempts(tmp_path / "esc" / "attempts.jsonl")
    first = [a for a in att if a.attempt == 0]
    skipped = sum(a.arm == "mcts" and a.reason.startswith("escalated:") for a in first)
    cheap_only = sum(a.verified for a in att if a.arm == "greedy")
    print(f"\nS1 escalate: {s['tasks_verified']}/{len(tasks)} verified (greedy alone "
          f"{cheap_only}); {s['escalations']} escalations after a failure, {skipped} tasks "
          f"started on mcts (greedy failed twice in a row in their context); per arm "
          f"{s['arms']}; cost model {s['cost_model']}")
    assert s["escalations"] > 0 and skipped > 0
    assert s["tasks_verified"] > cheap_only
    assert all(a.reason for a in att)
    b = held_out_brier([a for a in att if a.arm != "-"], ["greedy", "mcts"])
    assert b["brier"] is not None and b["brier"] <= b["base_brier"] + 0.02

    # the bandit, with a cost cap the cost model enforces once fitted
    band = SelectionConfig(policy="bandit", max_attempts=2, refit_every=5)
    s2 = explore_pool(chinook, tasks[:40], tmp_path / "band", cheap.explore,
                      arms=[cheap, strong], selection=band, log=lambda m: None)
    explore_pool(chinook, tasks[:40], tmp_path / "band2", cheap.explore,
                 arms=[cheap, strong], selection=band, log=lambda m: None)

    def decisions(folder):
        return [(a.task_id, a.arm, a.verified, a.reason)
                for a in read_attempts(tmp_path / folder / "attempts.jsonl")]

    assert decisions("band") == decisions("band2")  # deterministic
    capped = SelectionConfig(policy="escalate", max_attempts=2, max_cost_per_verified=1.0,
                             refit_every=5)
    s4 = explore_pool(chinook, tasks, tmp_path / "cap", cheap.explore, arms=[cheap, strong],
                      selection=capped, log=lambda m: None)
    print(f"S2 bandit (40 tasks): per arm {s2['arms']}; cap 1 cost unit per verified: "
          f"{s4['stopped']} tasks stopped, {s4['tasks_verified']} verified")
    assert s4["stopped"] > 0


def test_downstream_check_zero_shot_icl_and_sft(toy, tmp_path, bundled_model, real_training):
    """The three conditions run end to end on the bundled model (a toy environment, a few
    LoRA steps): accuracies with intervals and outcome counts, McNemar against zero-shot."""
    from workbench.trajsynth.downstream import DownstreamConfig, format_downstream, run_downstream

    p = build_pool(toy, PoolConfig(seed=0, python_check=False))
    cfg = ExploreConfig(prior="uniform", iterations=100)
    explore_pool(toy, p.tasks, tmp_path, cfg, log=lambda m: None)
    export(tmp_path, [t.model_copy(update={"split": "train"}) for t in p.tasks], toy)
    res = run_downstream(toy, p.tasks[:3], tmp_path,
                         DownstreamConfig(k=1, max_tokens=48, sft_steps=2, sft_max_length=1024))
    print("\nD1 (toy, 3 tasks, 2 LoRA steps: a plumbing check, not a result)\n"
          + format_downstream(res))
    for name in ("zero_shot", "icl", "sft"):
        s = res["conditions"][name]
        assert s["n"] == 3 and sum(s["outcomes"].values()) == 3
        assert 0 <= s["ci95"][0] <= s["accuracy"] <= s["ci95"][1] <= 1
    assert (tmp_path / "sft_adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((tmp_path / "downstream.json").read_text())["tasks"] == 3


def test_downstream_sft_then_dpo_beside_sft_on_a_tiny_model(toy, tmp_path, tiny_model):
    """The sft_dpo condition: DPO on the exported preference pairs, starting from (and
    referenced to) the SFT adapter, scored on the same tasks as sft, with McNemar against
    sft; the report line says so. A tiny random-init Llama: plumbing, not a result."""
    from workbench.formats import read_preferences
    from workbench.trajsynth.downstream import DownstreamConfig, format_downstream, run_downstream

    p = build_pool(toy, PoolConfig(seed=0, python_check=False))
    tasks = p.tasks[:6]
    explore_pool(toy, tasks, tmp_path, ExploreConfig(prior="uniform", iterations=60),
                 log=lambda m: None)
    export(tmp_path, [t.model_copy(update={"split": "train"}) for t in tasks], toy)
    assert read_preferences(tmp_path / "preferences.jsonl")
    res = run_downstream(toy, tasks[:3], tmp_path, DownstreamConfig(
        conditions=["sft", "sft_dpo"], max_tokens=16, sft_steps=2, dpo_steps=2,
        sft_max_length=512), model_spec=tiny_model, log=lambda m: None)
    assert set(res["conditions"]) == {"sft", "sft_dpo"}
    d = res["conditions"]["sft_dpo"]
    assert d["n"] == 3 and 0 <= d["mcnemar_p_vs_sft"] <= 1
    manifest = json.loads((tmp_path / "sft_dpo_adapter" / "manifest.json").read_text())
    assert manifest["config"]["method"] == "dpo"
    assert manifest["config"]["init_adapter"] == str(tmp_path / "sft_adapter")
    assert "vs sft" in format_downstream(res)
    # no pairs: the condition says it did not run, instead of failing
    (tmp_path / "preferences.jsonl").write_text("")
    res = run_downstream(toy, tasks[:1], tmp_path, DownstreamConfig(
        conditions=["sft_dpo"], max_tokens=16, sft_steps=1, sft_max_length=512),
        model_spec=tiny_model, log=lambda m: None)
    assert res["conditions"] == {} and "no preference pairs" in res["notes"]["sft_dpo"]
    assert "no preference pairs" in format_downstream(res)


def test_prefix_seeding_saves_model_calls_at_equal_yield(chinook, pool):
    """Scripted agent (same protocol as the real backends) that first lists the tables, then
    writes the task's query: after two verified tasks, new roots start from the shared first
    statement without asking the model, at the same yield."""
    from workbench.models import load_model

    tasks = [t for t in pool.tasks if t.query.op == "count"][:8]
    gold = {t.question: t.program for t in tasks}
    first = "SELECT name FROM sqlite_master WHERE type = 'table'"

    def reply(conv):
        user = conv[-1]["content"]
        question = user.split("Question: ", 1)[1].split("\n", 1)[0]
        return f"```sql\n{gold[question] if 'You ran:' in user else first}\n```"

    rows = {}
    for seed_prefixes in (0, 2):
        model = load_model("fake", backend="fake", script=reply)
        cfg = ExploreConfig(generator="model", iterations=20, proposals=2,
                            seed_prefixes=seed_prefixes)
        trie, verified, calls, saved = PrefixTrie(chinook.profile.content_hash), 0, 0, 0
        for t in tasks:
            _, search = explore_task(t, chinook, ModelGenerator(model, cfg), config=cfg,
                                     trie=trie)
            verified += bool(search.verified_sql)
            calls += search.ledger.model_calls
            saved += search.ledger.model_calls_saved
        rows[seed_prefixes] = (verified, calls, saved)
    print(f"\nP1: 8 tasks, seeding off: {rows[0][0]} verified, {rows[0][1]} model calls; on: "
          f"{rows[2][0]} verified, {rows[2][1]} model calls ({rows[2][2]} root proposals from "
          f"the trie, {100 * (1 - rows[2][1] / rows[0][1]):.0f}% fewer calls)")
    assert rows[2][0] == rows[0][0] == len(tasks)
    assert rows[2][1] < rows[0][1] and rows[2][2] > 0
