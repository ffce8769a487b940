"""The trajectory-synthesis pipeline: task pool → MCTS trees → SFT / ICL / preference exports.

Run folder (`<run>/trajsynth/`):

    tasks.jsonl, tasks.summary.json   the verified task pool
    trees/<task id>.json              one search tree per task (JSON; resumable: a tree whose
                                      config and environment match is not searched again)
    trie.json                         the environment's prefix trie (executions shared across
                                      tasks)
    attempts.jsonl                    one row per task searched by one arm
    explore.json                      yield, cost ledger, prefix-hit rate, per category
    sft.messages.jsonl, icl_bank.jsonl, preferences.jsonl, icl_index/

The names are the spec's declared artifacts, found through `runs.outputs_at("trajsynth", out)`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from workbench.config import ConfigSection
from workbench.dataenv.env import SAMPLES, DataEnvironment, open_env
from workbench.datatasks.explore import explore_task
from workbench.datatasks.exploreconfig import ExploreConfig
from workbench.datatasks.generators import GrammarGenerator, ModelGenerator
from workbench.datatasks.ledger import Ledger
from workbench.datatasks.pool import PoolConfig, Task, TaskPool
from workbench.datatasks.poolfiles import load_pool, save_pool
from workbench.datatasks.priors import ModelPrior, NodeChooser, UniformPrior
from workbench.datatasks.tasks import build_pool
from workbench.datatasks.trees import TaskTree, TreeNode, load_tree, save_tree
from workbench.datatasks.trie import PrefixTrie
from workbench.errors import WorkbenchError
from workbench.io import append_line, atomic_write_json, iter_jsonl_raw
from workbench.models import load_model
from workbench.progress import progress
from workbench.registry import PipelineResult
from workbench.runs import file_hash, outputs_at
from workbench.text import percent, percent_interval
from workbench.trajsynth.costmodel import Attempt, held_out_brier
from workbench.trajsynth.export import export_trees
from workbench.trajsynth.select import Arm, SelectionConfig, Selector


class TrajsynthConfig(ConfigSection):
    """Trajectory synthesis settings (the `trajsynth:` section)."""

    env: str = Field("chinook", description=(
        "The data environment: a SQLite file, a folder of CSV/TSV/Parquet files, or a "
        f"shipped sample ({', '.join(sorted(SAMPLES))})."))
    pool: PoolConfig = Field(default_factory=PoolConfig)
    explore: ExploreConfig = Field(default_factory=ExploreConfig)
    arms: list[Arm] = Field(default_factory=list, description=(
        "Several ways to search (generator, model, settings), cheap to strong; empty: one arm "
        "from `explore` and models.chat."))
    selection: SelectionConfig = Field(default_factory=SelectionConfig)
    split: Literal["train", "held_out", "all"] = Field(
        "all", description="Which tasks to search (exports use the train split).")
    limit: int | None = Field(None, ge=1, description="Search at most this many tasks.")


def tree_path(out: Path, task: Task) -> Path:
    return outputs_at("trajsynth", out).path("trees") / f"{task.id}.json"


def _reusable(path: Path, task: Task, configs: list[ExploreConfig]) -> bool:
    if not path.is_file():
        return False
    try:
        tree = load_tree(path)
    except Exception:  # noqa: BLE001 - a torn or foreign tree is searched again
        return False
    return tree.config in configs and tree.env_hash == task.env_hash and tree.task_id == task.id


def make_generator(config: ExploreConfig, model, load_model=None
                   ) -> GrammarGenerator | ModelGenerator:
    """The arm's action generator; `load_model(spec)` serves `explore.node_models`."""
    if config.generator == "model":
        if model is None:
            raise WorkbenchError("explore.generator=model needs a chat model")
        return ModelGenerator(model, config)
    if config.prior in ("model", "choose") and model is None:
        raise WorkbenchError(f"explore.prior={config.prior} needs a chat model")
    if config.prior == "choose":
        scorers: dict = {"uniform": UniformPrior(),
                         model.identity: ModelPrior(model, config.prior_temperature)}
        for spec in config.node_models:
            if load_model is None:
                raise WorkbenchError(f"explore.node_models: no way to load {spec}")
            m = load_model(spec)
            scorers[m.identity] = ModelPrior(m, config.prior_temperature)
        return GrammarGenerator(scorers[model.identity], config,
                                chooser=NodeChooser(scorers, config))
    prior = ModelPrior(model, config.prior_temperature) if config.prior == "model" \
        else UniformPrior()
    return GrammarGenerator(prior, config)


def needs_model(config: ExploreConfig) -> bool:
    return config.generator == "model" or config.prior in ("model", "choose")


def select_tasks(pool: TaskPool, split: Literal["train", "held_out", "all"],
                 limit: int | None) -> list[Task]:
    tasks = pool.tasks if split == "all" else pool.split(split)
    return tasks[:limit] if limit else tasks


def read_attempts(path: Path) -> list[Attempt]:
    if not path.is_file():
        return []
    out = []
    for _, row in iter_jsonl_raw(path, torn_tail=lambda e: None):
        try:
            out.append(Attempt.model_validate(row))
        except ValueError:
            continue  # a row from another version: the log is advisory
    return out


class _ArmModels:
    """The arms' models and generators, each loaded once: `model` serves arms without a model
    spec, `load_model(spec)` loads the others."""

    def __init__(self, model, load_model) -> None:
        self.models: dict[str | None, Any] = {None: model}
        self.generators: dict[str, GrammarGenerator | ModelGenerator] = {}
        self.load_model = load_model

    def model(self, arm: Arm, spec: str | None):
        if spec not in self.models:
            if self.load_model is None:
                raise WorkbenchError(f"arm {arm.name}: no way to load model {spec}")
            self.models[spec] = self.load_model(spec)
        return self.models[spec]

    def generator(self, arm: Arm) -> tuple[GrammarGenerator | ModelGenerator, list[str]]:
        """The arm's generator and the identities of the models it uses."""
        m = self.model(arm, arm.model) if needs_model(arm.explore) else None
        if arm.name not in self.generators:
            def load(spec: str):
                return self.model(arm, spec)

            self.generators[arm.name] = make_generator(arm.explore, m, load)
        return self.generators[arm.name], [m.identity] if m is not None else []


def _search_task(task: Task, env: DataEnvironment, trie: PrefixTrie, selector: Selector,
                 arms: list[Arm], arm_models: _ArmModels, attempts_file: Path) -> TaskTree:
    """One task searched with the arms the selector picks, escalating after a failed search,
    each attempt logged: the verified attempt's tree, else the last, else (stopped by the cost
    cap) an empty tree that records why."""
    n_columns = sum(len(t.columns) for t in env.profile.tables)
    ctx = {"env_name": env.name, "category": task.category, "difficulty": task.difficulty,
           "n_tables": len(env.profile.tables), "n_columns": n_columns, "prev_errors": 0}
    order, stopped = selector.plan(ctx)
    best = None
    for i, (arm, why) in enumerate(order):
        gen, ids = arm_models.generator(arm)
        pred = selector.predicted({**ctx, "prev_errors": i}, arm)
        tree, search = explore_task(task, env, gen, config=arm.explore, trie=trie,
                                    models=ids, arm=arm.name)
        led = search.ledger
        att = Attempt(task_id=task.id, env_name=env.name, category=task.category,
                      difficulty=task.difficulty, n_tables=ctx["n_tables"],
                      n_columns=n_columns, arm=arm.name, attempt=i, prev_errors=i,
                      verified=bool(search.verified_sql),
                      tokens=led.prompt_tokens + led.completion_tokens + led.scored_tokens,
                      executions=led.executions, model_calls=led.model_calls,
                      seconds=round(led.wall_s, 3),
                      predicted_success=round(pred["success"], 4) if pred else None,
                      reason=why)
        append_line(attempts_file, att.model_dump_json())
        selector.record(att)
        best = tree
        if att.verified:
            break
    if best is None:  # stopped by the cost cap: an empty tree records why
        best = TaskTree(task_id=task.id, env_hash=task.env_hash, arm="", generator="",
                        models=[], config=arms[0].explore, ledger=Ledger(),
                        nodes=[TreeNode(id=0, parent=None, action=None, move=None,
                                        prior=1.0, visits=0, wins=0)],
                        reflections=[{"sql": None, "reason": stopped, "plan": ""}])
        append_line(attempts_file, Attempt(
            task_id=task.id, env_name=env.name, category=task.category,
            difficulty=task.difficulty, n_tables=ctx["n_tables"], n_columns=n_columns,
            arm="-", verified=False, reason=stopped or "").model_dump_json())
    return best


def explore_pool(env: DataEnvironment, tasks: list[Task], out: str | Path,
                 config: ExploreConfig, *, model=None, log=print, arms: list[Arm] | None = None,
                 selection: SelectionConfig | None = None, load_model=None) -> dict[str, Any]:
    """Search every task (skipping those whose tree is already there) with the arms the
    selector picks, escalating after a failed search; save each task's tree (the verified
    attempt, else the last), the trie and the attempt log as it goes; write explore.json.

    `model` serves arms without a model spec; `load_model(spec)` loads the others."""
    out = Path(out)
    files = outputs_at("trajsynth", out)
    files.path("trees").mkdir(parents=True, exist_ok=True)
    arms = arms or [Arm(name="default", explore=config)]
    selection = selection or SelectionConfig(max_attempts=1)
    trie_file = files.path("trie")
    trie = PrefixTrie.load(trie_file, env.profile.content_hash)
    attempts_file = files.path("attempts")
    selector = Selector(arms, selection, read_attempts(attempts_file))
    configs = [a.explore for a in arms]
    todo = [t for t in tasks if not _reusable(tree_path(out, t), t, configs)]
    if len(todo) < len(tasks):
        log(f"{len(tasks) - len(todo)} of {len(tasks)} trees already searched; "
            f"{len(todo)} to go")
    arm_models = _ArmModels(model, load_model)
    for task in progress(todo, desc="searching tasks"):
        best = _search_task(task, env, trie, selector, arms, arm_models, attempts_file)
        # the trie first: a kill between the two leaves a task the trie knows but whose tree
        # is missing, and its re-run ignores its own share (a task never seeds itself)
        trie.save(trie_file)
        save_tree(best, tree_path(out, task))
    trie.save(trie_file)
    return summarise(out, tasks, trie, arms=[a.name for a in arms])


def summarise(out: Path, tasks: list[Task], trie: PrefixTrie | None = None,
              arms: list[str] | None = None) -> dict[str, Any]:
    total = Ledger()
    by_cat: dict[str, list[int]] = {}
    found = 0
    scorers: Counter[str] = Counter()
    for t in tasks:
        tree = load_tree(tree_path(out, t))
        total.add(tree.ledger)
        scorers.update(n.scorer for n in tree.nodes if n.scorer)
        ok = bool(tree.verified_paths)
        found += ok
        c = by_cat.setdefault(t.category, [0, 0])
        c[0] += ok
        c[1] += 1
    from workbench.evaluate.stats import wilson_interval

    lo, hi = wilson_interval(found, len(tasks))
    ids = {t.id for t in tasks}
    files = outputs_at("trajsynth", out)
    attempts = [a for a in read_attempts(files.path("attempts")) if a.task_id in ids]
    per_arm: dict[str, dict[str, Any]] = {}
    for a in attempts:
        d = per_arm.setdefault(a.arm, {"attempts": 0, "verified": 0, "tokens": 0,
                                       "executions": 0, "seconds": 0.0})
        d["attempts"] += 1
        d["verified"] += a.verified
        d["tokens"] += a.tokens
        d["executions"] += a.executions
        d["seconds"] = round(d["seconds"] + a.seconds, 2)
    for d in per_arm.values():
        d["tokens_per_verified"] = round(d["tokens"] / d["verified"], 1) if d["verified"] \
            else None
    arm_names = arms or sorted({a.arm for a in attempts if a.arm != "-"})
    ledger = total.counts()
    ledger["search_seconds"] = round(sum(a.seconds for a in attempts), 1)
    if trie is None and files.path("trie").is_file():
        trie = PrefixTrie.load(files.path("trie"), tasks[0].env_hash) if tasks else None
    summary = {
        "tasks": len(tasks), "tasks_verified": found,
        "yield": found / len(tasks) if tasks else 0.0, "yield_ci95": [lo, hi],
        "by_category": {k: {"verified": v[0], "tasks": v[1]} for k, v in sorted(by_cat.items())},
        "by_split": dict(Counter(t.split for t in tasks)),
        "ledger": ledger,
        "prefix_hit_rate": total.hit_rate,
        "verified_per_1000_model_calls": (1000 * total.verified / total.model_calls
                                          if total.model_calls else None),
        "trie_entries": len(trie.results) if trie else None,
        "trie_shapes": len(trie.shapes) if trie else None,
        "node_scorers": dict(sorted(scorers.items())),
        "arms": per_arm,
        "escalations": sum(a.attempt > 0 for a in attempts),
        "stopped": sum(a.arm == "-" for a in attempts),
        "cost_model": held_out_brier([a for a in attempts if a.arm != "-"], arm_names),
    }
    atomic_write_json(files.path("explore"), summary)
    return summary


def export(out: str | Path, tasks: list[Task], env: DataEnvironment, *, index: bool = True,
           log=print) -> dict[str, Any]:
    """The SFT, ICL and preference files from the saved trees (and the ICL retrieval index
    unless `index=False`)."""
    out = Path(out)
    trees = [(load_tree(tree_path(out, t)), t) for t in tasks if tree_path(out, t).is_file()]
    return export_trees(trees, env.name, env.profile.digest(max_values=6), out, index=index,
                        log=log)


def explore(cfg, env: DataEnvironment, tasks: list[Task], out: Path, *, log=print
            ) -> dict[str, Any]:
    """`explore_pool` with the config's arms, selection and models."""
    tc: TrajsynthConfig = cfg.trajsynth
    chat = cfg.models.chat
    arms = tc.arms or [Arm(name="default", explore=tc.explore)]
    default = None
    if any(needs_model(a.explore) and a.model is None for a in arms):
        default = load_model(chat.spec, backend=chat.backend, **chat.options)
    return explore_pool(env, tasks, out, tc.explore, model=default, log=log, arms=arms,
                        selection=tc.selection if tc.arms else SelectionConfig(max_attempts=1),
                        load_model=lambda spec: load_model(spec))


# --- the steps of a trajsynth folder, as `workbench trajsynth tasks|explore|export` run them


def make_task_pool(env: DataEnvironment, config: PoolConfig, out: str | Path) -> TaskPool:
    """Synthesise and verify `env`'s task pool into OUT/tasks.jsonl (and its summary)."""
    pool = build_pool(env, config)
    save_pool(pool, outputs_at("trajsynth", out).path("tasks"))
    return pool


def folder_tasks(cfg, out: str | Path) -> list[Task]:
    """The tasks of OUT/tasks.jsonl the config selects (`trajsynth.split`, `.limit`)."""
    tc: TrajsynthConfig = cfg.trajsynth
    return select_tasks(load_pool(outputs_at("trajsynth", out).path("tasks")), tc.split,
                        tc.limit)


def explore_folder(cfg, env: DataEnvironment, out: str | Path, *, log=print
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Search the selected tasks of OUT/tasks.jsonl (a re-run searches only what is missing),
    then export: (the search summary, the export counts)."""
    tasks = folder_tasks(cfg, out)
    return explore(cfg, env, tasks, Path(out), log=log), export(out, tasks, env, log=log)


def run(cfg, ctx):
    """The registered pipeline: pool (skipped when unchanged), search (per task, resumable),
    exports."""
    tc: TrajsynthConfig = cfg.trajsynth
    out = ctx.layout.folder("trajsynth")
    env = open_env(tc.env)
    files = outputs_at("trajsynth", out)
    pool_file = files.path("tasks")

    def make_pool() -> dict[str, Any]:
        return {"tasks": len(make_task_pool(env, tc.pool, out).tasks)}

    ctx.stages("trajsynth").run("tasks", (env.profile.content_hash, tc.pool.model_dump()),
                                make_pool)
    tasks = folder_tasks(cfg, out)
    model_spec = cfg.models.chat.model_dump()

    def search() -> dict[str, Any]:
        s = explore(cfg, env, tasks, out, log=ctx.log)
        return {"verified": s["tasks_verified"], "tasks": s["tasks"]}

    ctx.stages("trajsynth").run("explore", (file_hash(pool_file), tc.explore.model_dump(),
                                            [a.model_dump() for a in tc.arms],
                                            tc.selection.model_dump(), tc.split, tc.limit,
                                            model_spec), search)
    summary = summarise(out, tasks)
    ex = export(out, tasks, env, log=ctx.log)
    lo, hi = summary["yield_ci95"]
    return PipelineResult(
        pipeline="trajsynth", run_dir=str(ctx.layout.root),
        outputs={"tasks": str(pool_file), "sft": str(files.path("sft")),
                 "icl": str(files.path("icl_bank")), "icl_index": str(files.path("icl_index")),
                 "preferences": str(files.path("preferences"))},
        figures={"tasks": summary["tasks"], "verified": summary["tasks_verified"],
                 "sft": ex["sft"], "preferences": ex["preferences"],
                 "prefix_hit_rate": round(summary["prefix_hit_rate"], 3)},
        message=(f"{out}: {summary['tasks_verified']}/{summary['tasks']} tasks verified "
                 f"({percent_interval(summary['yield'], lo, hi)}), "
                 f"{ex['sft']} SFT conversations, {ex['preferences']} preference pairs, "
                 f"{summary['ledger']['executions']} executions "
                 f"({percent(summary['prefix_hit_rate'])} answered by the trie), "
                 f"{summary['ledger']['model_calls']} model calls "
                 f"({summary['ledger']['seeded_nodes']} nodes seeded from earlier tasks)"))
