"""Trajectory search strategies side by side on one task pool and one budget.

MCTS (PUCT over the slot grammar) vs best-of-N (independent prior-weighted paths from the
root, N = the iteration budget) vs one greedy path (the likeliest move at every slot, a
single ReAct-style path), each with the bundled model's log-likelihood prior; plus the
uniform prior (no model) and the prefix trie on vs off, with either prior. Every strategy
gets a fresh prior cache; the trie is shared across tasks (executions answered from it, and
later trees seeded with the verified paths of earlier tasks of a similar question shape)
except in the "trie off" runs, which give every task a fresh one.

    python benchmarks/bench_trajsynth.py --tasks 40 --json bench_trajsynth.json

Reports per strategy: tasks verified (Wilson 95% interval), model calls, sandbox executions,
CPU seconds, verified tasks per 1,000 model calls and per CPU-minute.
"""

from __future__ import annotations

import argparse
import json
import time

from workbench.evaluate.stats import wilson_interval
from workbench.trajsynth.api import make_generator, open_env
from workbench.datatasks.explore import (
    ExploreConfig,
    GrammarGenerator,
    Ledger,
    ModelPrior,
    PrefixTrie,
    UniformPrior,
    explore_task,
)
from workbench.datatasks.tasks import PoolConfig, build_pool


def run(name, env, tasks, cfg, prior_factory, shared_trie: bool, model=None) -> dict:
    gen = make_generator(cfg, model) if cfg.prior == "choose" else \
        GrammarGenerator(prior_factory(), cfg)
    trie = PrefixTrie(env.profile.content_hash)
    total, found = Ledger(), 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for t in tasks:
        _, search = explore_task(t, env, gen, config=cfg,
                                 trie=trie if shared_trie else PrefixTrie(t.env_hash))
        total.add(search.ledger)
        found += bool(search.verified_sql)
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    lo, hi = wilson_interval(found, len(tasks))
    row = {"strategy": name, "tasks": len(tasks), "verified": found,
           "ci95": [round(lo, 3), round(hi, 3)], "iterations": total.iterations,
           "model_calls": total.model_calls, "executions": total.executions,
           "executions_saved": total.executions_saved, "probes": total.probes,
           "seeded_nodes": total.seeded_nodes,
           "escalated_nodes": total.escalated_nodes,
           "model_calls_saved": total.model_calls_saved, "cpu_s": round(cpu, 1),
           "wall_s": round(wall, 1),
           "verified_per_1000_calls": round(1000 * found / total.model_calls, 1)
           if total.model_calls else None,
           "verified_per_cpu_min": round(60 * found / cpu, 1) if cpu else None}
    print(json.dumps(row), flush=True)
    return row


def adaptive(env, tasks, model, iterations: int) -> list[dict]:
    """Adaptive selection (escalate: greedy first, MCTS after a failure or after greedy
    failed twice in a context) vs always-cheap (greedy) vs always-strong (MCTS), all with
    the model prior: cost per verified task in model tokens."""
    import tempfile

    from workbench.trajsynth.api import explore_pool
    from workbench.trajsynth.select import Arm, SelectionConfig

    cheap = Arm(name="greedy", rank=0, explore=ExploreConfig(strategy="greedy"))
    strong = Arm(name="mcts", rank=1, explore=ExploreConfig(iterations=iterations))
    out = []
    for name, arms, sel in [
            ("always cheap (greedy)", [cheap], SelectionConfig(max_attempts=1)),
            ("always strong (mcts)", [strong], SelectionConfig(max_attempts=1)),
            ("adaptive (escalate)", [cheap, strong],
             SelectionConfig(policy="escalate", escalate_after=2, max_attempts=2))]:
        cpu0 = time.process_time()
        with tempfile.TemporaryDirectory() as d:
            s = explore_pool(env, tasks, d, arms[0].explore, model=model, arms=arms,
                             selection=sel, log=lambda m: None)
        cpu = time.process_time() - cpu0
        tokens = sum(v["tokens"] for v in s["arms"].values())
        lo, hi = s["yield_ci95"]
        row = {"strategy": name, "tasks": s["tasks"], "verified": s["tasks_verified"],
               "ci95": [round(lo, 3), round(hi, 3)], "tokens": tokens,
               "tokens_per_verified": round(tokens / s["tasks_verified"], 1)
               if s["tasks_verified"] else None,
               "model_calls": s["ledger"]["model_calls"], "cpu_s": round(cpu, 1),
               "escalations": s["escalations"]}
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="chinook")
    ap.add_argument("--tasks", type=int, default=40, help="First N tasks of the pool.")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    from workbench.models import load_model

    env = open_env(a.env)
    pool = build_pool(env, PoolConfig(seed=0))
    tasks = pool.tasks[:a.tasks]
    model = load_model("default", batch_size=8)
    base = {"iterations": a.iterations, "stop_after": 1}
    rows = [
        run("mcts, model prior", env, tasks, ExploreConfig(**base), lambda: ModelPrior(model),
            True),
        run("mcts, model prior, trie off", env, tasks, ExploreConfig(**base),
            lambda: ModelPrior(model), False),
        run("mcts, per-node choice (uniform | model)", env, tasks,
            ExploreConfig(prior="choose", **base), None, True, model=model),
        run("best-of-N, model prior", env, tasks, ExploreConfig(strategy="sample", **base),
            lambda: ModelPrior(model), True),
        run("greedy path, model prior", env, tasks, ExploreConfig(strategy="greedy", **base),
            lambda: ModelPrior(model), True),
        run("mcts, uniform prior", env, tasks, ExploreConfig(prior="uniform", **base),
            UniformPrior, True),
        run("best-of-N, uniform prior", env, tasks,
            ExploreConfig(prior="uniform", strategy="sample", **base), UniformPrior, True),
        run("mcts, uniform, trie off", env, tasks, ExploreConfig(prior="uniform", **base),
            UniformPrior, False),
    ]
    rows += adaptive(env, tasks, model, a.iterations)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"env": a.env, "tasks": len(tasks), "iterations": a.iterations,
                       "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
