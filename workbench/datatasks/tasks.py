"""The task pool: seeded tasks from a taxonomy × schema slices, verified, deduplicated,
balanced and split.

    env = DataEnvironment.open(sample_environment("chinook"))
    pool = build_pool(env, PoolConfig(seed=0))
    save_pool(pool, "runs/chinook/tasks.jsonl")   # + tasks.summary.json
    task = pool.tasks[0]
    check_answer(task.answer_spec, task.gold, env.run_sql(task.program))  # True

How a pool is built (`TaskSynthesizer`):

1. Seed: every template of `templates.TEMPLATES` turns the profile's slices into queries.
2. Verify: each query's reference SQL (shape A) runs; rule filters drop empty answers, answers
   of the wrong shape or type, answers over the row cap, filters that keep every row, top-k /
   argmax / comparison answers with a tie at the limit; then a second, independently shaped
   SQL (shape B) must give the same answer under the task's own comparison (`check_answer`).
3. Compose: pairs of verified tasks sharing a table build harder tasks (`templates.COMPOSERS`),
   which are verified the same way; round 2 composes again from round-1 results.
4. Cross-check in pandas (optional, one sandboxed Python run for the whole pool): a third
   program, written in pandas, must agree too.
5. Near-duplicates (the same normalised question, or the same normalised program) are removed.
6. Balance: at most `per_category` tasks per category, taken round-robin over difficulty
   levels and templates (and at most `per_difficulty` per level when set).
7. Split: whole templates (or tables) are held out, so held-out tasks are unseen ones.

Every drop is counted by reason in the pool's summary. The same environment, config and seed
give a byte-identical pool file.

The pool's records are in `pool`, its files in `poolfiles`, paraphrasing in `paraphrase`;
they are importable from here too.
"""

from __future__ import annotations

import os
import textwrap
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from workbench.dataenv.env import DataEnvironment
from workbench.dataenv.sandboxlimits import SandboxLimits
from workbench.dataenv.sqlsandbox import run_sql
from workbench.datatasks.altsql import sql_b
from workbench.datatasks.answers import (
    AnswerSpec,
    as_number,
    canonical_gold,
    check_answer,
    shape_problem,
    values_equal,
)
from workbench.datatasks.compose import COMPOSERS, Verified
from workbench.datatasks.normalise import normalise_program, normalise_question
from workbench.datatasks.pandascode import pandas_code
from workbench.datatasks.paraphrase import ParaphraseResult, missing_entities, paraphrase_tasks
from workbench.datatasks.pool import (
    DROP_REASONS,
    PoolConfig,
    PoolSummary,
    Program,
    Task,
    TaskPool,
    tally,
)
from workbench.datatasks.poolfiles import format_summary, load_pool, save_pool, summary_path
from workbench.datatasks.queries import Query, sql_a, sql_argmax_ties, sql_group_measures
from workbench.datatasks.queryfacts import (
    answer_spec,
    columns_used,
    difficulty,
    entities,
    tables_used,
)
from workbench.datatasks.questions import question
from workbench.datatasks.slices import Slices, aggregated_roles
from workbench.datatasks.templates import (
    CATEGORIES,
    TEMPLATES,
    Candidate,
    Context,
    Sampler,
    category_of,
    stream,
)
from workbench.io import sha256_text

# --- verification ----------------------------------------------------------------------------


class Drop(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


_NUMERIC_OPS = ("count", "agg", "count_distinct", "above_avg", "difference", "share")


def _task_id(env_hash: str, template_id: str, program: str) -> str:
    return sha256_text(f"{env_hash}\n{template_id}\n{program}")[:16]


class TaskSynthesizer:
    """Builds a pool for one environment; `build()` runs every stage."""

    def __init__(self, env: DataEnvironment, config: PoolConfig | None = None, *,
                 on_candidate: Callable[[Candidate], Candidate] | None = None) -> None:
        self.env = env
        self.config = config or PoolConfig()
        self.profile = env.profile
        self.slices = Slices(self.profile)
        self.limits = SandboxLimits(sql_timeout_s=self.config.sql_timeout_s,
                                    sql_max_rows=self.config.max_answer_rows + 1)
        self.sampler = Sampler(env.db_path, SandboxLimits(sql_timeout_s=self.config.sql_timeout_s,
                                                          sql_max_rows=1000))
        self.on_candidate = on_candidate
        self.drops: Counter[str] = Counter()
        self.drop_log: list[tuple[str, str, str]] = []  # (template, reason, detail)
        self.candidates = 0
        self.composed_candidates = 0
        self.python_status = "off"

    # -- stages --

    def seed_candidates(self) -> list[Candidate]:
        ctx = Context(self.slices, self.sampler, self.config.variants)
        out = []
        for tid in sorted(TEMPLATES):
            for q in TEMPLATES[tid](ctx, stream(self.config.seed, tid)):
                out.append(Candidate(template_id=tid, category=category_of(tid), query=q))
        return out

    def _run(self, sql: str):
        return run_sql(self.env.db_path, sql, self.limits)

    def _rows(self, sql: str, reason: str) -> list[list[Any]]:
        r = self._run(sql)
        if not r.ok:
            raise Drop(reason, r.error or "")
        if r.truncated:
            raise Drop("too_large", f"over {self.config.max_answer_rows} rows")
        return r.rows

    def verify(self, cand: Candidate) -> Task:
        """The task, or `Drop` with the reason."""
        if self.on_candidate is not None:
            cand = self.on_candidate(cand)
        q = cand.query
        spec = answer_spec(q, self.profile)
        program = cand.program or sql_a(q)
        rows = self._rows(program, "error")
        if not rows or all(v is None for r in rows for v in r):
            raise Drop("empty")
        problem = shape_problem(spec, rows)
        if problem:
            raise Drop("type_mismatch", problem)
        if spec.kind != "scalar" and len(rows) > self.config.max_answer_rows:
            raise Drop("too_large")
        gold = canonical_gold(spec, rows)
        self._rule_checks(q, spec, gold, rows)
        alt = cand.alt_program or sql_b(q)
        alt_result = self._run(alt)
        if not alt_result.ok:
            raise Drop("alt_error", alt_result.error or "")
        if not check_answer(spec, gold, alt_result):
            raise Drop("disagree", f"{gold!r} vs {alt_result.rows[:5]!r}")
        tid = cand.template_id
        d = difficulty(q)
        if cand.parents:
            d = min(5, max(d, cand.parent_difficulty + 1))
        text = question(q)
        return Task(id=_task_id(self.profile.content_hash, tid, program),
                    env_name=self.profile.name, env_hash=self.profile.content_hash,
                    category=cand.category, template_id=tid, question=text,
                    template_question=text, program=program,
                    alt_programs=[Program(kind="sql", code=alt, shape="subquery")],
                    answer_spec=spec, gold=gold, difficulty=d, tables=tables_used(q),
                    columns=columns_used(q), entities=entities(q), parents=cand.parents,
                    depth=0 if not cand.parents else 1,
                    lineage=sorted({tid, *cand.lineage}), query=q)

    def _rule_checks(self, q: Query, spec: AnswerSpec, gold: Any, rows: list) -> None:
        if q.op in _NUMERIC_OPS and as_number(gold) is None:
            raise Drop("type_mismatch", f"{q.op} gave {gold!r}")
        if q.op in ("count", "count_distinct", "above_avg") and gold == 0:
            raise Drop("empty", "zero count")
        if q.op == "count" and q.conds and \
                gold == self.profile.table(q.table).row_count:
            raise Drop("degenerate", "the filter keeps every row")
        if q.op == "share" and (gold <= 1e-9 or gold >= 100 - 1e-9):
            raise Drop("degenerate", f"share {gold}")
        if q.op == "difference" and gold <= 0:
            raise Drop("degenerate", f"difference {gold}")
        if q.op == "group" and not q.k and len(rows) < 2:
            raise Drop("degenerate", "a single group")
        if q.op in ("top", "group") and q.k:
            measures = [r[1] for r in self._rows_unlimited(sql_group_measures(q))]
            if len(measures) <= q.k:
                raise Drop("degenerate", f"{len(measures)} groups for top {q.k}")
            if _same(measures[q.k - 1], measures[q.k]):
                raise Drop("tie_at_limit", f"{measures[q.k - 1]} at ranks {q.k} and {q.k + 1}")
        if q.op == "compare":
            got = {str(r[0]): r[1] for r in self._rows_unlimited(sql_group_measures(q))}
            a, b = (got.get(str(v)) for v in q.values)
            if a is None or b is None:
                raise Drop("empty", "a compared group has no rows")
            if _same(a, b):
                raise Drop("tie_at_limit", f"both {a}")
        if q.op == "argmax":
            n = self._rows_unlimited(sql_argmax_ties(q))[0][0]
            if n != 1:
                raise Drop("tie_at_limit", f"{n} rows share the extreme value")

    def _rows_unlimited(self, sql: str) -> list[list[Any]]:
        r = run_sql(self.env.db_path, sql, self.limits.model_copy(update={"sql_max_rows": 100_000}))
        if not r.ok:
            raise Drop("error", r.error or "")
        return r.rows

    def verify_all(self, cands: Sequence[Candidate]) -> list[Task]:
        out = []
        for c in cands:
            try:
                out.append(self.verify(c))
            except Drop as d:
                self.drops[d.reason] += 1
                self.drop_log.append((c.template_id, d.reason, d.detail[:200]))
        return out

    def compose(self, tasks: list[Task], rounds: int) -> list[Task]:
        """Recursive composition: each round pairs verified tasks (at least one from the
        previous round) and verifies what comes out."""
        made: list[Task] = []
        seen = {t.program for t in tasks}
        frontier = {t.id for t in tasks}
        pool = list(tasks)
        for r in range(1, rounds + 1):
            infos = [Verified(t.id, t.template_id, t.query, t.difficulty, t.depth,
                              tuple(t.lineage)) for t in pool]
            new: list[Task] = []
            for name in sorted(COMPOSERS):
                fn = COMPOSERS[name]
                rng = stream(self.config.seed, f"{name}#{r}")
                pairs = [(a, b) for a in infos for b in infos
                         if a.id in frontier or b.id in frontier]
                rng.shuffle(pairs)
                built = 0
                for a, b in pairs:
                    if built >= self.config.compose_per_op:
                        break
                    q = fn(a, b)
                    if q is None:
                        continue
                    program = sql_a(q)
                    if program in seen:
                        continue
                    seen.add(program)
                    self.composed_candidates += 1
                    cand = Candidate(template_id=name, category="composed", query=q,
                                     parents=[a.id, b.id],
                                     parent_difficulty=max(a.difficulty, b.difficulty),
                                     lineage=sorted({*a.lineage, *b.lineage}))
                    got = self.verify_all([cand])
                    if got:
                        new.append(got[0].model_copy(update={"depth": r}))
                        built += 1
            made += new
            pool += new
            frontier = {t.id for t in new}
            if not new:
                break
        return made

    def python_check(self, tasks: list[Task]) -> list[Task]:
        """One sandboxed pandas run that recomputes every task; disagreeing tasks are dropped."""
        if not tasks:
            self.python_status = "nothing to check"
            return tasks
        programs = {t.id: pandas_code(t.query) for t in tasks}
        code = _batch_program(programs)
        limits = self.env.limits.model_copy(update={
            "py_timeout_s": max(60.0, self.env.limits.py_timeout_s),
            "py_cpu_s": max(60, self.env.limits.py_cpu_s),
            "result_cap_chars": 16_000_000, "output_cap_chars": 65_536})
        env = self.env.model_copy(update={"limits": limits})
        res = env.run_python(code)
        if not res.ok or not isinstance(res.result, dict):
            self.python_status = f"unavailable ({res.error_kind}: {(res.error or '')[:160]})"
            return tasks
        out = []
        for t in tasks:
            got = res.result.get(t.id) or {"error": "missing"}
            if "error" in got:
                self.drops["python_error"] += 1
                self.drop_log.append((t.template_id, "python_error", str(got["error"])[:200]))
            elif not check_answer(t.answer_spec, t.gold, got["value"]):
                self.drops["disagree_python"] += 1
                self.drop_log.append((t.template_id, "disagree_python",
                                      f"{t.gold!r} vs {got['value']!r}"[:200]))
            else:
                out.append(t.model_copy(update={"alt_programs": [
                    *t.alt_programs, Program(kind="python", code=programs[t.id] + "\n",
                                             shape="pandas")]}))
        self.python_status = f"checked {len(tasks)} tasks, {len(out)} agreed"
        return out

    def dedup(self, tasks: list[Task]) -> list[Task]:
        keep, questions, programs = [], set(), set()
        for t in tasks:
            qk, pk = normalise_question(t.question), normalise_program(t.program)
            if qk in questions or pk in programs:
                self.drops["duplicate"] += 1
                continue
            questions.add(qk)
            programs.add(pk)
            keep.append(t)
        return keep

    def balance(self, tasks: list[Task]) -> list[Task]:
        """Round-robin over difficulty levels, then templates, within each category."""
        cfg = self.config
        by_cat: dict[str, list[Task]] = defaultdict(list)
        for t in tasks:
            by_cat[t.category].append(t)
        per_level: Counter[int] = Counter()
        keep: list[Task] = []
        for cat in CATEGORIES:
            order = _round_robin(by_cat.get(cat, []), stream(cfg.seed, f"balance:{cat}"))
            n = 0
            for t in order:
                if n >= cfg.per_category or (cfg.per_difficulty is not None
                                             and per_level[t.difficulty] >= cfg.per_difficulty):
                    self.drops["over_target"] += 1
                    continue
                keep.append(t)
                n += 1
                per_level[t.difficulty] += 1
        return keep

    def split(self, tasks: list[Task]) -> tuple[list[Task], list[str]]:
        cfg = self.config
        if cfg.holdout == "none" or cfg.holdout_fraction <= 0 or not tasks:
            return tasks, []
        held: set[str] = set()
        target = cfg.holdout_fraction * len(tasks)
        if cfg.holdout == "template":
            cats = {t.category for t in tasks}

            def held_by(h: set[str]) -> list[bool]:
                return [bool(h.intersection(t.lineage or [t.template_id])) for t in tasks]

            for tid in sorted({t.template_id for t in tasks},
                              key=lambda x: sha256_text(f"{cfg.seed}:{x}")):
                if sum(held_by(held)) >= target:
                    break
                flags = held_by(held | {tid})
                if sum(flags) > 1.25 * target + 1:
                    continue
                if {t.category for t, f in zip(tasks, flags, strict=True) if not f} != cats:
                    continue  # keep every category in training
                held.add(tid)
            out = [t.model_copy(update={"split": "held_out" if f else "train"})
                   for t, f in zip(tasks, held_by(held), strict=True)]
        else:
            names = sorted({x for t in tasks for x in t.tables},
                           key=lambda x: sha256_text(f"{cfg.seed}:{x}"))
            for name in names:
                if sum(any(x in held for x in t.tables) for t in tasks) >= target:
                    break
                if sum(not any(x in held | {name} for x in t.tables) for t in tasks) == 0:
                    continue  # would leave nothing to train on
                held.add(name)
            out = [t.model_copy(update={"split": "held_out" if any(x in held for x in t.tables)
                                        else "train"}) for t in tasks]
        return out, sorted(held)

    def build(self) -> TaskPool:
        cfg = self.config
        seeds = self.seed_candidates()
        self.candidates = len(seeds)
        tasks = self.verify_all(seeds)
        tasks += self.compose(tasks, cfg.compose_rounds)
        verified = len(tasks)
        if cfg.python_check:
            tasks = self.python_check(tasks)
        tasks = self.dedup(tasks)
        tasks = self.balance(tasks)
        tasks, held = self.split(tasks)
        cat_index = {c: i for i, c in enumerate(CATEGORIES)}
        tasks.sort(key=lambda t: (t.split != "train", cat_index[t.category], t.difficulty,
                                  t.template_id, t.id))
        summary = PoolSummary(
            env_name=self.profile.name, env_hash=self.profile.content_hash, seed=cfg.seed,
            config=cfg, candidates=self.candidates + self.composed_candidates,
            composed_candidates=self.composed_candidates, verified=verified, kept=len(tasks),
            by_category=tally(t.category for t in tasks),
            by_difficulty=tally(str(t.difficulty) for t in tasks),
            by_split=tally(t.split for t in tasks),
            by_template=tally(t.template_id for t in tasks),
            drops=dict(sorted(self.drops.items())), held_out=held,
            drops_by_template=self._drops_by_template(),
            removed_by_role=dict(sorted(self.slices.removed.items())),
            aggregated_by_role=aggregated_roles(tasks, self.slices.roles),
            python_check=self.python_status if cfg.python_check else "off")
        return TaskPool(tasks=tasks, summary=summary)


    def _drops_by_template(self) -> dict[str, dict[str, int]]:
        out: dict[str, Counter[str]] = defaultdict(Counter)
        for tid, reason, _ in self.drop_log:
            out[tid][reason] += 1
        return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def build_pool(env: DataEnvironment | str | os.PathLike, config: PoolConfig | None = None, *,
               on_candidate: Callable[[Candidate], Candidate] | None = None) -> TaskPool:
    """Build a verified, balanced, split task pool for an environment (or its path).

    `on_candidate` may rewrite each candidate before it is verified (tests plant a wrong
    second program with it)."""
    if not isinstance(env, DataEnvironment):
        env = DataEnvironment.open(env)
    return TaskSynthesizer(env, config, on_candidate=on_candidate).build()


def _same(a: Any, b: Any) -> bool:
    return values_equal(a, b, tolerance=True, rel_tol=1e-9, abs_tol=1e-12)


def _round_robin(tasks: list[Task], rng) -> list[Task]:
    """Interleave difficulty levels; within a level, interleave templates (seeded order)."""
    levels: dict[int, dict[str, list[Task]]] = defaultdict(lambda: defaultdict(list))
    for t in sorted(tasks, key=lambda t: t.id):
        levels[t.difficulty][t.template_id].append(t)
    queues = []
    for d in sorted(levels):
        temps = levels[d]
        for tid in temps:
            rng.shuffle(temps[tid])
        names = sorted(temps)
        rng.shuffle(names)
        q = []
        while any(temps[n] for n in names):
            for n in names:
                if temps[n]:
                    q.append(temps[n].pop(0))
        queues.append(q)
    out = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def _batch_program(programs: dict[str, str]) -> str:
    """One pandas program that runs every task's program and collects values or errors."""
    head = textwrap.dedent("""\
        import math

        def _clean(x):
            if hasattr(x, "item") and not isinstance(x, (str, list, dict)):
                x = x.item()
            if isinstance(x, float) and math.isnan(x):
                return None
            if isinstance(x, (list, tuple)):
                return [_clean(v) for v in x]
            return x

        _out = {}
        """)
    body = []
    for i, (tid, code) in enumerate(programs.items()):
        fn = f"_task_{i}"
        inner = textwrap.indent(code + "\nreturn result", "    ")
        body.append(f"def {fn}():\n{inner}\n\n"
                    f"try:\n    _out[{tid!r}] = {{'value': _clean({fn}())}}\n"
                    f"except Exception as e:\n"
                    f"    _out[{tid!r}] = {{'error': type(e).__name__ + ': ' + str(e)[:200]}}\n")
    return head + "\n".join(body) + "\nresult = _out\n"


def replay(task: Task, env: DataEnvironment) -> bool:
    """Re-run a task's reference program and check its gold answer."""
    r = env.run_sql(task.program)
    return r.ok and task.check(r)


__all__ = ["DROP_REASONS", "ParaphraseResult", "PoolConfig", "PoolSummary", "Program", "Task",
           "TaskPool", "TaskSynthesizer", "build_pool", "format_summary", "load_pool",
           "missing_entities", "normalise_program", "normalise_question", "paraphrase_tasks",
           "replay", "save_pool", "summary_path"]
