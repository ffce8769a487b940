"""The task pool (issue 11, part 2): seeded, verified, deduplicated, balanced and split tasks,
and the answer check used as the reward. Each test prints its figure."""

from __future__ import annotations

import math
import re
import time
from collections import Counter

import pytest
from conftest import make_shop

from workbench.errors import DataError
from workbench.datatasks.answers import AnswerSpec, check_answer, values_equal
from workbench.dataenv.env import DataEnvironment, sample_environment
from workbench.datatasks.queries import Cond, Group, Query, sql_a
from workbench.dataenv.sandbox import run_sql
from workbench.datatasks.tasks import (
    PoolConfig,
    TaskSynthesizer,
    build_pool,
    format_summary,
    load_pool,
    missing_entities,
    normalise_program,
    normalise_question,
    paraphrase_tasks,
    replay,
    save_pool,
    summary_path,
)
from workbench.datatasks.templates import Candidate


@pytest.fixture(scope="module")
def chinook_pool(chinook):
    t0 = time.monotonic()
    pool = build_pool(chinook, PoolConfig(seed=0))
    pool_s = time.monotonic() - t0
    print(f"\nchinook pool built in {pool_s:.2f} s\n{format_summary(pool.summary)}")
    return pool


@pytest.fixture(scope="module")
def toy(trajsynth_cache, tmp_path_factory) -> DataEnvironment:
    """A tiny shop: regions tie on counts, a value matches two rows."""
    path = make_shop(tmp_path_factory.mktemp("toy") / "shop.sqlite")
    return DataEnvironment.open(path, cache_dir=trajsynth_cache)


# --- the pool on Chinook ---------------------------------------------------------------------


def test_chinook_pool_is_large_verified_and_covers_the_taxonomy(chinook, chinook_pool):
    tasks = chinook_pool.tasks
    cats = Counter(t.category for t in tasks)
    t0 = time.monotonic()
    replayed = sum(replay(t, chinook) for t in tasks)
    replay_s = time.monotonic() - t0
    two_programs = sum(any(p.kind == "sql" for p in t.alt_programs) for t in tasks)
    pandas_ok = sum(any(p.kind == "python" for p in t.alt_programs) for t in tasks)
    print(f"\nT1: {len(tasks)} tasks in {len(cats)} categories {dict(sorted(cats.items()))}; "
          f"reference programs re-executed to their gold answers: {replayed}/{len(tasks)} "
          f"({replay_s:.2f} s); second SQL agreed {two_programs}/{len(tasks)}, pandas "
          f"{pandas_ok}/{len(tasks)}; drops {chinook_pool.summary.drops}")
    assert len(tasks) >= 60
    assert len(cats) >= 7
    assert replayed == len(tasks)  # 100 %
    assert two_programs == len(tasks)
    assert chinook_pool.summary.python_check.startswith("checked")
    assert pandas_ok == len(tasks)
    assert all(t.env_hash == chinook.profile.content_hash for t in tasks)
    assert all(1 <= t.difficulty <= 5 for t in tasks)
    assert {t.answer_spec.kind for t in tasks} == {"scalar", "set", "table"}
    composed = [t for t in tasks if t.category == "composed"]
    assert composed and all(len(t.parents) == 2 for t in composed)
    assert max(t.depth for t in composed) >= 1


def test_same_seed_builds_are_byte_identical(chinook, chinook_pool, tmp_path):
    a = save_pool(chinook_pool, tmp_path / "a" / "tasks.jsonl")
    b = save_pool(build_pool(chinook, PoolConfig(seed=0)), tmp_path / "b" / "tasks.jsonl")
    c = save_pool(build_pool(chinook, PoolConfig(seed=1, python_check=False)),
                  tmp_path / "c" / "tasks.jsonl")
    same = a.read_bytes() == b.read_bytes()
    same_summary = summary_path(a).read_bytes() == summary_path(b).read_bytes()
    ids_a = {t.id for t in chinook_pool.tasks}
    ids_c = {t.id for t in load_pool(c).tasks}
    print(f"\nT2: seed 0 twice: pool files identical {same} ({a.stat().st_size} bytes), "
          f"summaries identical {same_summary}; seed 1 shares {len(ids_a & ids_c)} of "
          f"{len(ids_a)} task ids")
    assert same and same_summary
    assert ids_a != ids_c


def test_no_near_duplicates(chinook_pool):
    tasks = chinook_pool.tasks
    qs = Counter(normalise_question(t.question) for t in tasks)
    ps = Counter(normalise_program(t.program) for t in tasks)
    ids = Counter(t.id for t in tasks)
    print(f"\nT3: {len(tasks)} tasks, {len(qs)} distinct normalised questions, {len(ps)} "
          f"distinct programs, {len(ids)} ids; duplicates dropped: "
          f"{chinook_pool.summary.drops.get('duplicate', 0)}")
    assert len(qs) == len(ps) == len(ids) == len(tasks)


def test_balance_and_held_out_split(chinook, chinook_pool):
    s = chinook_pool.summary
    train = chinook_pool.split("train")
    held = chinook_pool.split("held_out")
    held_out = set(s.held_out)
    print(f"\nT4: per category {s.by_category} (target {s.config.per_category}); difficulty "
          f"{s.by_difficulty}; train {len(train)} / held-out {len(held)} on templates "
          f"{sorted(held_out)} (and the compositions built on them)")
    assert max(s.by_category.values()) <= s.config.per_category
    assert len(s.by_difficulty) >= 4
    assert held and held_out
    assert all(held_out & set(t.lineage) for t in held)
    assert not any(held_out & set(t.lineage) for t in train)  # unseen, even inside compositions
    assert all(t.template_id in t.lineage for t in chinook_pool.tasks)
    assert 0.1 <= len(held) / len(chinook_pool.tasks) <= 0.4
    assert {t.category for t in train} == {t.category for t in chinook_pool.tasks}
    # by table: no training task reads a held-out table
    pool = build_pool(chinook, PoolConfig(holdout="table", python_check=False))
    held_tables = set(pool.summary.held_out)
    leaked = [t.id for t in pool.split("train") if held_tables & set(t.tables)]
    print(f"    by table: held-out tables {sorted(held_tables)}; "
          f"{len(pool.split('held_out'))} held-out tasks, {len(leaked)} training tasks on them")
    assert held_tables and pool.split("held_out") and not leaked
    # tighter targets: every category at most 5, every difficulty level at most 12
    small = build_pool(chinook, PoolConfig(per_category=5, per_difficulty=12,
                                           python_check=False))
    print(f"    per_category=5, per_difficulty=12: {small.summary.by_category}, "
          f"{small.summary.by_difficulty}, over_target {small.summary.drops['over_target']}")
    assert max(small.summary.by_category.values()) <= 5
    assert max(small.summary.by_difficulty.values()) <= 12


def test_save_load_round_trip(chinook_pool, tmp_path):
    path = save_pool(chinook_pool, tmp_path / "pool" / "tasks.jsonl")
    back = load_pool(path)
    leftovers = [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    print(f"\nT5: {len(back.tasks)} tasks and the summary read back; files "
          f"{sorted(p.name for p in path.parent.iterdir())}; temp files left {leftovers}")
    assert back.tasks == chinook_pool.tasks
    assert back.summary == chinook_pool.summary
    assert not leftovers
    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text().splitlines()[0] + "\n{\"id\": 1}\n")
    with pytest.raises(DataError) as e:
        load_pool(bad)
    assert e.value.line == 2 and "bad.jsonl:2" in str(e.value)


# --- a second environment, no code change -------------------------------------------------------


def test_csv_environment_gives_tasks_with_no_code_change(trajsynth_cache):
    env = DataEnvironment.open(sample_environment("sklearn_classic"), cache_dir=trajsynth_cache)
    t0 = time.monotonic()
    pool = build_pool(env, PoolConfig(seed=0))
    took = time.monotonic() - t0
    replayed = sum(replay(t, env) for t in pool.tasks)
    print(f"\nT6: sklearn_classic (CSV folder) in {took:.2f} s\n{format_summary(pool.summary)}\n"
          f"    replayed {replayed}/{len(pool.tasks)}")
    assert len(pool.tasks) >= 15
    assert replayed == len(pool.tasks)
    assert len(pool.summary.by_category) >= 5


# --- verification and rule filters ------------------------------------------------------------


def test_a_planted_wrong_second_program_is_dropped_as_disagree(chinook):
    planted = []

    def plant(c: Candidate) -> Candidate:
        if c.template_id == "filter.count_eq" and not planted:
            planted.append(sql_a(c.query))
            wrong = sql_a(c.query).replace("COUNT(*)", "COUNT(*) + 1")
            c.alt_program = wrong
        return c

    base = build_pool(chinook, PoolConfig(python_check=False))
    pool = build_pool(chinook, PoolConfig(python_check=False), on_candidate=plant)
    kept = {t.program for t in pool.tasks}
    print(f"\nT7: planted a wrong second program on {planted[0]!r}; drops "
          f"{pool.summary.drops} (without the plant: {base.summary.drops})")
    assert pool.summary.drops.get("disagree", 0) == base.summary.drops.get("disagree", 0) + 1
    assert planted[0] not in kept
    assert pool.summary.drops_by_template["filter.count_eq"]["disagree"] == 1
    # the pandas cross-check catches a gold answer that the SQL programs got wrong
    syn = TaskSynthesizer(chinook, PoolConfig())
    tasks = base.tasks[:5]
    wrong = tasks[0].model_copy(update={"gold": "not the answer"})
    kept = syn.python_check([wrong, *tasks[1:]])
    print(f"    pandas cross-check of 5 tasks, one with a wrong gold: kept {len(kept)}, drops "
          f"{dict(syn.drops)} ({syn.python_status})")
    assert [t.id for t in kept] == [t.id for t in tasks[1:]]
    assert dict(syn.drops) == {"disagree_python": 1}


def test_rule_filters_name_their_reasons(toy):
    syn = TaskSynthesizer(toy, PoolConfig(max_answer_rows=3))
    via = Group(kind="via", column="region_id", table="region", key="region_id", label="name")
    cases = {
        "tie_at_limit": Query(op="top", table="sale", group=via, k=1),  # north 3, south 3
        "empty": Query(op="count", table="sale", conds=[Cond(op="eq", column="item",
                                                             value="hat")]),
        "type_mismatch": Query(op="lookup", table="sale", column="amount",
                               conds=[Cond(op="eq", column="item", value="pen")]),
        "too_large": Query(op="select", table="sale", column="item"),
        "degenerate": Query(op="count", table="sale", conds=[Cond(op="gt", column="amount",
                                                                  value=1.0)]),
    }
    got = {}
    for reason, q in cases.items():
        syn.verify_all([Candidate(template_id="t", category="filter", query=q)])
        got[reason] = syn.drop_log[-1][1]
    bad_alt = Candidate(template_id="t", category="filter", query=Query(
        op="count", table="sale", conds=[Cond(op="eq", column="item", value="pen")]),
        alt_program="SELECT nonsense FROM sale")
    syn.verify_all([bad_alt])
    got["alt_error"] = syn.drop_log[-1][1]
    ok = syn.verify_all([Candidate(template_id="t", category="group_rank", query=Query(
        op="top", table="sale", group=via, k=1, agg="sum", column="amount"))])
    print(f"\nT8: {got}; a clean top-1 (sum) kept: {ok[0].gold!r} from {ok[0].program!r}")
    assert got == {r: r for r in got}
    assert ok and ok[0].gold == "north"  # 12.5 against 11.5 and 9


# --- the answer check ------------------------------------------------------------------------------


def test_check_answer_cases(chinook):
    scalar = AnswerSpec(kind="scalar")
    tol = AnswerSpec(kind="scalar", comparison="tolerance", rel_tol=1e-4, abs_tol=1e-6)
    sset = AnswerSpec(kind="set", comparison="set")
    table = AnswerSpec(kind="table", columns=["country", "n"])
    ordered = AnswerSpec(kind="table", columns=["year", "n"], ordered=True)
    import numpy as np
    import pandas as pd

    cases = [
        # (spec, gold, predicted, expected)
        (tol, 5.800602409638558, 5.8006, True),
        (tol, 5.800602409638558, 5.80, False),
        (tol, 2328.6, 2328.600000000004, True),
        (scalar, 42, 42.0, True),
        (scalar, 42, "42", True),
        (scalar, 42, 43, False),
        (scalar, 2009, "2009", True),
        (scalar, "Rock", "  rock ", True),
        (scalar, "Rock", "Rock and Roll", False),
        (scalar, "AC/DC", [["AC/DC"]], True),
        (scalar, 7, {"columns": ["n"], "rows": [[7]]}, True),
        (scalar, 7, {"count": 7}, True),
        (scalar, 7, [[7, 8]], False),
        (scalar, 7, [[7], [7]], False),
        (scalar, None, float("nan"), True),
        (scalar, None, None, True),
        (scalar, 0, None, False),
        (scalar, None, "NULL", True),
        (scalar, 3, np.int64(3), True),
        (scalar, "2009-01-01 00:00:00", "2009-01-01", True),
        (sset, ["CA", "ON", "SP"], ["SP", "ca", "ON"], True),
        (sset, ["CA", "ON", "SP"], ["SP", "CA"], False),
        (sset, ["CA", "ON", "SP"], ["SP", "CA", "ON", "ON"], True),
        (sset, ["CA", "ON", "SP"], "SP, CA, ON", True),
        (sset, ["CA", "ON", "SP"], [["SP", 1], ["CA", 2], ["ON", 3]], False),
        (table, [["Brazil", 5], ["USA", 13]], [[13, "USA"], [5, "Brazil"]], True),
        (table, [["Brazil", 5], ["USA", 13]], [["USA", 13], ["Brazil", 5]], True),
        (table, [["Brazil", 5], ["USA", 13]], {"Brazil": 5, "USA": 13}, True),
        (table, [["Brazil", 5], ["USA", 13]], [{"c": "USA", "n": 13}, {"c": "Brazil", "n": 5}],
         True),
        (table, [["Brazil", 5], ["USA", 13]], pd.DataFrame({"c": ["USA", "Brazil"],
                                                             "n": [13, 5]}), True),
        (table, [["Brazil", 5], ["USA", 13]], [["USA", 13]], False),
        (table, [["Brazil", 5], ["USA", 13]], [["USA", 5], ["Brazil", 13]], False),
        (table, [["a", 1], ["a", 1], ["b", 2]], [["a", 1], ["b", 2], ["b", 2]], False),
        (ordered, [[2009, 1], [2010, 2]], [[2010, 2], [2009, 1]], False),
        (ordered, [[2009, 1], [2010, 2]], [["2009", 1.0], [2010, 2]], True),
        (AnswerSpec(kind="table", columns=["x"]), [[5]], 5, True),  # 1x1 table vs scalar
        (scalar, "x", object(), False),
    ]
    results = [check_answer(spec, gold, pred) is want for spec, gold, pred, want in cases]
    sql = run_sql(chinook.db_path, "SELECT COUNT(*) FROM Track")
    from_sql = check_answer(scalar, 3503, sql)
    print(f"\nT9: {sum(results)}/{len(cases)} check_answer cases as expected; a SqlResult "
          f"1x1 vs scalar: {from_sql}")
    assert all(results), [c[:3] for c, ok in zip(cases, results, strict=True) if not ok]
    assert from_sql
    assert values_equal(1e-7, 0.0, tolerance=True) and not values_equal(1e-7, 0.0)
    assert math.isclose(1.0, 1.0)


# --- paraphrase -----------------------------------------------------------------------------------


def _keeps(conv):
    q = conv[-1]["content"]
    return "Tell me this: " + q[0].lower() + q[1:]


def _drops_values(conv):
    q = conv[-1]["content"]
    return re.sub(r"'[^']*'", "that one", re.sub(r"\b\d+(\.\d+)?\b", "some", q))


def test_paraphrase_is_kept_only_when_every_entity_survives(chinook_pool):
    from workbench.models import load_model

    tasks = [t for t in chinook_pool.tasks
             if any(isinstance(e, str) and not e.replace(".", "").isdigit() for e in t.entities)
             and re.search(r"'[^']*'|\d", t.question)][:6]
    good, res_good = paraphrase_tasks(tasks, load_model("fake", script=_keeps))
    bad, res_bad = paraphrase_tasks(tasks, load_model("fake", script=_drops_values))
    acc_good = sum(r.accepted for r in res_good)
    acc_bad = sum(r.accepted for r in res_bad)
    print(f"\nT10: entity-keeping paraphrases accepted {acc_good}/{len(tasks)}; entity-dropping "
          f"accepted {acc_bad}/{len(tasks)} (e.g. {res_bad[0].candidate!r} lost "
          f"{res_bad[0].missing})")
    assert acc_good == len(tasks) and acc_bad == 0
    assert all(t.paraphrased and t.question.startswith("Tell me this") for t in good)
    assert all(not t.paraphrased and t.question == t.template_question for t in bad)
    assert [t.id for t in good] == [t.id for t in tasks]  # ids and answers do not change
    assert missing_entities("How many rows have Total above three?", ["Total", "3"]) == ["3"]
    assert missing_entities("How many invoice lines cost 0.99?", ["InvoiceLine", "0.99"]) == []

