"""The trajectory-synthesis pipeline: task pool → MCTS trees → SFT / ICL / preference exports.

Run folder (`<run>/trajsynth/`):

    tasks.jsonl, tasks.summary.json   the verified task pool
    trees/<task id>.json              one search tree per task (JSON; resumable: a tree whose
                                      config and environment match is not searched again)
    trie.json                         the environment's prefix trie (executions shared across
                                      tasks)
    explore.json                      yield, cost ledger, prefix-hit rate, per category
    sft.messages.jsonl, icl_bank.jsonl, preferences.jsonl
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from workbench.errors import WorkbenchError
from workbench.io import atomic_write_json
from workbench.trajsynth.env import SAMPLES, DataEnvironment, sample_environment
from workbench.trajsynth.explore import (
    ExploreConfig,
    GrammarGenerator,
    Ledger,
    ModelGenerator,
    ModelPrior,
    PrefixTrie,
    UniformPrior,
    explore_task,
    load_tree,
    save_tree,
)
from workbench.trajsynth.tasks import PoolConfig, Task, TaskPool, build_pool, load_pool, save_pool


class TrajsynthConfig(BaseModel):
    """Trajectory synthesis settings (the `trajsynth:` section)."""

    model_config = ConfigDict(extra="forbid")

    env: str = Field("chinook", description=(
        "The data environment: a SQLite file, a folder of CSV/TSV/Parquet files, or a "
        f"shipped sample ({', '.join(sorted(SAMPLES))})."))
    pool: PoolConfig = Field(default_factory=PoolConfig)
    explore: ExploreConfig = Field(default_factory=ExploreConfig)
    split: Literal["train", "held_out", "all"] = Field(
        "all", description="Which tasks to search (exports use the train split).")
    limit: int | None = Field(None, ge=1, description="Search at most this many tasks.")


def open_env(spec: str, cache_dir: str | os.PathLike | None = None) -> DataEnvironment:
    path = sample_environment(spec) if spec in SAMPLES and not Path(spec).exists() else spec
    return DataEnvironment.open(path, cache_dir=cache_dir)


def tree_path(out: Path, task: Task) -> Path:
    return out / "trees" / f"{task.id}.json"


def _reusable(path: Path, task: Task, config: ExploreConfig) -> bool:
    if not path.is_file():
        return False
    try:
        tree = load_tree(path)
    except Exception:  # noqa: BLE001 - a torn or foreign tree is searched again
        return False
    return tree.config == config and tree.env_hash == task.env_hash and tree.task_id == task.id


def make_generator(config: ExploreConfig, model) -> GrammarGenerator | ModelGenerator:
    if config.generator == "model":
        if model is None:
            raise WorkbenchError("explore.generator=model needs a chat model")
        return ModelGenerator(model, config)
    prior = ModelPrior(model, config.prior_temperature) if config.prior == "model" \
        else UniformPrior()
    if config.prior == "model" and model is None:
        raise WorkbenchError("explore.prior=model needs a chat model")
    return GrammarGenerator(prior, config)


def select_tasks(pool: TaskPool, split: str, limit: int | None) -> list[Task]:
    tasks = pool.tasks if split == "all" else pool.split(split)
    return tasks[:limit] if limit else tasks


def explore_pool(env: DataEnvironment, tasks: list[Task], out: str | Path,
                 config: ExploreConfig, *, model=None, log=print) -> dict[str, Any]:
    """Search every task (skipping those whose tree is already there), save trees and the
    trie after each task, and write explore.json."""
    from workbench.progress import progress

    out = Path(out)
    (out / "trees").mkdir(parents=True, exist_ok=True)
    trie_file = out / "trie.json"
    trie = PrefixTrie.load(trie_file, env.profile.content_hash)
    todo = [t for t in tasks if not _reusable(tree_path(out, t), t, config)]
    if len(todo) < len(tasks):
        log(f"{len(tasks) - len(todo)} of {len(tasks)} trees already searched; "
            f"{len(todo)} to go")
    generator = None
    models = [model.identity] if model is not None and (
        config.generator == "model" or config.prior == "model") else []
    for task in progress(todo, desc="searching tasks"):
        if generator is None:
            generator = make_generator(config, model)
        tree, _ = explore_task(task, env, generator, config=config, trie=trie, models=models)
        save_tree(tree, tree_path(out, task))
        trie.save(trie_file)
    trie.save(trie_file)
    return summarise(out, tasks, trie)


def summarise(out: Path, tasks: list[Task], trie: PrefixTrie | None = None) -> dict[str, Any]:
    total = Ledger()
    by_cat: dict[str, list[int]] = {}
    found = 0
    for t in tasks:
        tree = load_tree(tree_path(out, t))
        total.add(tree.ledger)
        ok = bool(tree.verified_paths)
        found += ok
        c = by_cat.setdefault(t.category, [0, 0])
        c[0] += ok
        c[1] += 1
    from workbench.evaluate.stats import wilson_interval

    lo, hi = wilson_interval(found, len(tasks))
    summary = {
        "tasks": len(tasks), "tasks_verified": found,
        "yield": found / len(tasks) if tasks else 0.0, "yield_ci95": [lo, hi],
        "by_category": {k: {"verified": v[0], "tasks": v[1]} for k, v in sorted(by_cat.items())},
        "by_split": dict(Counter(t.split for t in tasks)),
        "ledger": total.model_dump(mode="json"),
        "prefix_hit_rate": total.hit_rate,
        "verified_per_1000_model_calls": (1000 * total.verified / total.model_calls
                                          if total.model_calls else None),
        "trie_entries": len(trie.results) if trie else None,
    }
    atomic_write_json(out / "explore.json", summary)
    return summary


def export(out: str | Path, tasks: list[Task], env: DataEnvironment) -> dict[str, Any]:
    from workbench.trajsynth.export import export_trees

    out = Path(out)
    trees = [(load_tree(tree_path(out, t)), t) for t in tasks if tree_path(out, t).is_file()]
    return export_trees(trees, env.name, env.profile.digest(max_values=6), out)


def _load_chat_model(cfg, config: ExploreConfig):
    if config.generator == "grammar" and config.prior == "uniform":
        return None
    from workbench.models import load_model

    chat = cfg.models.chat
    return load_model(chat.spec, backend=chat.backend, **chat.options)


def run(cfg, ctx):
    """The registered pipeline: pool (skipped when unchanged), search (per task, resumable),
    exports."""
    from workbench.registry import PipelineResult
    from workbench.runs import file_hash

    tc: TrajsynthConfig = cfg.trajsynth
    out = ctx.layout.folder("trajsynth")
    env = open_env(tc.env)
    pool_file = out / "tasks.jsonl"

    def make_pool() -> dict[str, Any]:
        pool = build_pool(env, tc.pool)
        save_pool(pool, pool_file)
        return {"tasks": len(pool.tasks)}

    ctx.stages("trajsynth").run("tasks", (env.profile.content_hash, tc.pool.model_dump()),
                                make_pool)
    pool = load_pool(pool_file)
    tasks = select_tasks(pool, tc.split, tc.limit)
    model_spec = cfg.models.chat.model_dump()

    def search() -> dict[str, Any]:
        model = _load_chat_model(cfg, tc.explore)
        s = explore_pool(env, tasks, out, tc.explore, model=model, log=ctx.log)
        return {"verified": s["tasks_verified"], "tasks": s["tasks"]}

    ctx.stages("trajsynth").run("explore", (file_hash(pool_file), tc.explore.model_dump(),
                                            tc.split, tc.limit, model_spec), search)
    summary = summarise(out, tasks)
    ex = export(out, tasks, env)
    lo, hi = summary["yield_ci95"]
    return PipelineResult(
        pipeline="trajsynth", run_dir=str(ctx.layout.root),
        outputs={"tasks": str(pool_file), "sft": str(out / "sft.messages.jsonl"),
                 "icl": str(out / "icl_bank.jsonl"),
                 "preferences": str(out / "preferences.jsonl")},
        figures={"tasks": summary["tasks"], "verified": summary["tasks_verified"],
                 "sft": ex["sft"], "preferences": ex["preferences"],
                 "prefix_hit_rate": round(summary["prefix_hit_rate"], 3)},
        message=(f"{out}: {summary['tasks_verified']}/{summary['tasks']} tasks verified "
                 f"({100 * summary['yield']:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}]), "
                 f"{ex['sft']} SFT conversations, {ex['preferences']} preference pairs, "
                 f"{summary['ledger']['executions']} executions "
                 f"({100 * summary['prefix_hit_rate']:.0f}% answered by the trie), "
                 f"{summary['ledger']['model_calls']} model calls"))
