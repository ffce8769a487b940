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
"""

from __future__ import annotations

import os
import re
import textwrap
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from workbench.io import atomic_write_json, read_jsonl, sha256_text, write_jsonl
from workbench.trajsynth.answers import (
    AnswerSpec,
    as_number,
    canonical_gold,
    check_answer,
    shape_problem,
    values_equal,
)
from workbench.trajsynth.env import DataEnvironment
from workbench.trajsynth.queries import (
    Query,
    answer_spec,
    columns_used,
    difficulty,
    entities,
    pandas_code,
    question,
    sql_a,
    sql_argmax_ties,
    sql_b,
    sql_group_measures,
    tables_used,
)
from workbench.trajsynth.sandbox import SandboxLimits, run_sql
from workbench.trajsynth.templates import (
    CATEGORIES,
    COMPOSERS,
    TEMPLATES,
    Candidate,
    Context,
    Sampler,
    Slices,
    Verified,
    category_of,
    stream,
)

Category = Literal["lookup", "filter", "aggregation", "join", "group_rank", "time_series",
                   "comparison", "composed"]
Split = Literal["train", "held_out"]
POOL_VERSION = 2  # 2: aggregations chosen by column role

DROP_REASONS = {
    "error": "the reference program failed to run",
    "empty": "no rows, only NULLs, or a zero count",
    "too_large": "more rows than the answer cap",
    "type_mismatch": "the result does not have the spec's shape or type",
    "degenerate": "a filter that keeps every row, fewer groups than k, a share of 0 or 100 %",
    "tie_at_limit": "a tie at the top-k / argmax / comparison boundary makes the answer "
                    "ambiguous",
    "alt_error": "the second program failed to run",
    "disagree": "the two SQL programs gave different answers",
    "python_error": "the pandas cross-check failed to run",
    "disagree_python": "the pandas cross-check gave a different answer",
    "duplicate": "a near-duplicate of a kept task (question or program)",
    "over_target": "over the category / difficulty target when balancing",
}


class Program(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["sql", "python"]
    code: str
    shape: str = Field("", description="How it is built: direct, subquery, pandas.")


class Task(BaseModel):
    """One verified task of a pool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="sha256 of environment hash, template and program (16 hex).")
    env_name: str
    env_hash: str = Field(description="The environment's content hash.")
    category: Category
    template_id: str
    question: str = Field(description="What the agent is asked (possibly paraphrased).")
    template_question: str = Field(description="The question as the template wrote it.")
    paraphrased: bool = False
    program: str = Field(description="The reference SQL; its result is the gold answer.")
    alt_programs: list[Program] = Field(
        default_factory=list, description="Independently built programs that agreed.")
    answer_spec: AnswerSpec
    gold: Any = Field(description="The answer in the spec's canonical form.")
    difficulty: int = Field(ge=1, le=5)
    tables: list[str]
    columns: list[str] = Field(default_factory=list, description="Table.Column names read.")
    entities: list[str] = Field(default_factory=list,
                                description="Values, numbers and names the question states.")
    parents: list[str] = Field(default_factory=list,
                               description="Ids of the tasks a composed task was built from.")
    depth: int = Field(0, description="Composition rounds behind the task (0: a seed).")
    lineage: list[str] = Field(default_factory=list, description=(
        "Its template and every ancestor's: a held-out template holds out all of them."))
    split: Split = "train"
    query: Query = Field(description="The structured query (provenance; an explorer must not "
                                     "read it, it is the answer's recipe).")

    def check(self, predicted: Any) -> bool:
        """The reward: is `predicted` this task's answer?"""
        return check_answer(self.answer_spec, self.gold, predicted)


class PoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = 0
    variants: int = Field(4, ge=1, description="Queries each seed template tries.")
    compose_rounds: int = Field(2, ge=0, le=3, description="Rounds of recursive composition.")
    compose_per_op: int = Field(6, ge=0, description="Tasks each composer builds per round.")
    python_check: bool = Field(True, description="Cross-check every task in pandas (one "
                                                 "sandboxed run).")
    max_answer_rows: int = Field(25, ge=1, description="Larger set/table answers are dropped.")
    per_category: int = Field(12, ge=1, description="Target (at most) tasks per category.")
    per_difficulty: int | None = Field(None, ge=1, description="At most this many per level.")
    holdout: Literal["template", "table", "none"] = "template"
    holdout_fraction: float = Field(0.2, ge=0.0, lt=1.0)
    sql_timeout_s: float = Field(5.0, gt=0)


class PoolSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = POOL_VERSION
    env_name: str
    env_hash: str
    seed: int
    config: PoolConfig
    candidates: int = 0
    composed_candidates: int = 0
    verified: int = 0
    kept: int = 0
    by_category: dict[str, int] = Field(default_factory=dict)
    by_difficulty: dict[str, int] = Field(default_factory=dict)
    by_split: dict[str, int] = Field(default_factory=dict)
    by_template: dict[str, int] = Field(default_factory=dict)
    drops: dict[str, int] = Field(default_factory=dict, description="Reason → count.")
    drops_by_template: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="Template → reason → count (verification drops).")
    held_out: list[str] = Field(default_factory=list, description="Held-out templates/tables.")
    removed_by_role: dict[str, int] = Field(
        default_factory=dict, description="Rule → candidate aggregations the column roles "
                                          "removed before verification (a sum of an intensive "
                                          "measurement, an average of a clock time...).")
    python_check: str = "off"


class TaskPool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: list[Task]
    summary: PoolSummary

    def split(self, name: Split) -> list[Task]:
        return [t for t in self.tasks if t.split == name]

    def by_id(self, task_id: str) -> Task:
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise KeyError(task_id)


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
            by_category=_count(t.category for t in tasks),
            by_difficulty=_count(str(t.difficulty) for t in tasks),
            by_split=_count(t.split for t in tasks),
            by_template=_count(t.template_id for t in tasks),
            drops=dict(sorted(self.drops.items())), held_out=held,
            drops_by_template=self._drops_by_template(),
            removed_by_role=dict(sorted(self.slices.removed.items())),
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


def _count(items) -> dict[str, int]:
    return dict(sorted(Counter(items).items()))


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


def normalise_question(text: str) -> str:
    """Lower case, punctuation and articles removed, whitespace collapsed."""
    words = re.sub(r"[^\w.'/-]+", " ", text.casefold()).split()
    return " ".join(w for w in words if w not in ("a", "an", "the"))


def normalise_program(sql: str) -> str:
    """Whitespace collapsed, case folded outside string literals."""
    parts = re.split(r"('(?:[^']|'')*')", sql)
    return "".join(p if p.startswith("'") else " ".join(p.split()).casefold() for p in parts)


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


# --- files -------------------------------------------------------------------------------------


def summary_path(path: str | os.PathLike) -> Path:
    """`tasks.jsonl` → `tasks.summary.json`."""
    p = Path(path)
    return p.with_name(p.name.removesuffix(".jsonl") + ".summary.json")


def save_pool(pool: TaskPool, path: str | os.PathLike) -> Path:
    """The tasks as JSONL and the summary next to it, each written atomically."""
    path = Path(path)
    write_jsonl(path, pool.tasks)
    atomic_write_json(summary_path(path), pool.summary.model_dump(mode="json"))
    return path


def load_pool(path: str | os.PathLike) -> TaskPool:
    """Read a pool back (tasks validated line by line; errors name the line)."""
    from workbench.errors import DataError
    from workbench.io import describe_validation_error

    tasks = read_jsonl(path, Task.model_validate)
    sp = summary_path(path)
    if sp.is_file():
        try:
            summary = PoolSummary.model_validate_json(sp.read_text(encoding="utf-8"))
        except ValueError as e:
            raise DataError(f"not a pool summary: {describe_validation_error(e)}",
                            path=str(sp)) from None
    else:
        first = tasks[0] if tasks else None
        summary = PoolSummary(env_name=first.env_name if first else "", seed=0,
                              env_hash=first.env_hash if first else "", config=PoolConfig(),
                              kept=len(tasks),
                              by_category=_count(t.category for t in tasks),
                              by_difficulty=_count(str(t.difficulty) for t in tasks),
                              by_split=_count(t.split for t in tasks),
                              by_template=_count(t.template_id for t in tasks))
    return TaskPool(tasks=tasks, summary=summary)


def format_summary(summary: PoolSummary) -> str:
    """A few lines for a terminal or a report."""
    def row(d: dict[str, int]) -> str:
        return ", ".join(f"{k} {v}" for k, v in d.items()) or "-"
    return "\n".join([
        (f"pool for {summary.env_name} (seed {summary.seed}): {summary.kept} tasks kept of "
         f"{summary.verified} verified from {summary.candidates} candidates "
         f"({summary.composed_candidates} composed)"),
        f"  categories: {row(summary.by_category)}",
        f"  difficulty: {row(summary.by_difficulty)}",
        f"  split: {row(summary.by_split)}; held out: {', '.join(summary.held_out) or '-'}",
        f"  dropped: {row(summary.drops)}",
        f"  left out by column role: {row(summary.removed_by_role)}",
        f"  pandas cross-check: {summary.python_check}"])


# --- paraphrase --------------------------------------------------------------------------------

PARAPHRASE_SYSTEM = (
    "You rewrite database questions in natural English. Keep every quoted value, every number "
    "and every table and column name exactly as written. Do not answer the question. Reply "
    "with the rewritten question only, on one line.")


def _loose(s: str) -> str:
    return re.sub(r"[\W_]+", "", s.casefold())


def missing_entities(text: str, ents: Sequence[str]) -> list[str]:
    """The entities a text does not contain. Numbers must appear as numbers (3 ≠ three);
    names and values are compared ignoring case, spaces, punctuation and underscores."""
    numbers = [as_number(m) for m in
               re.findall(r"[-+]?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?", text)]
    loose = _loose(text)
    out = []
    for e in ents:
        n = as_number(e)
        if n is not None:
            if not any(x is not None and values_equal(n, x) for x in numbers):
                out.append(e)
        elif _loose(e) and _loose(e) not in loose:
            out.append(e)
    return out


class ParaphraseResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str
    accepted: bool
    text: str = Field(description="The question kept (the paraphrase or the template text).")
    candidate: str = ""
    reason: str = ""
    missing: list[str] = Field(default_factory=list)


def _clean_paraphrase(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    s = re.sub(r"^(paraphrase|rewritten question|question)\s*:\s*", "", lines[0],
               flags=re.IGNORECASE)
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"`":
        s = s[1:-1].strip()
    return s


def paraphrase_tasks(tasks: Sequence[Task], model, *, params=None
                     ) -> tuple[list[Task], list[ParaphraseResult]]:
    """Ask `model` (a `ChatModel`, through `generate` only) to rewrite each question; keep the
    rewrite only when every entity is still there, otherwise the template text. Ids, programs
    and answers do not change."""
    from workbench.models.base import GenerationParams

    params = params or GenerationParams(max_tokens=96, temperature=0.0)
    convs = [[{"role": "system", "content": PARAPHRASE_SYSTEM},
              {"role": "user", "content": t.template_question}] for t in tasks]
    step = max(1, int(getattr(model, "batch_size", 8) or 8))
    gens = [g for i in range(0, len(convs), step) for g in model.generate(convs[i:i + step],
                                                                          params)]
    out_tasks, results = [], []
    for t, g in zip(tasks, gens, strict=True):
        cand = _clean_paraphrase(g.text) if g.error is None else ""
        reason, missing = "", []
        if g.error is not None:
            reason = f"generation failed: {g.error}"
        elif not cand:
            reason = "empty"
        elif len(cand) > 3 * len(t.template_question) + 40:
            reason = "too long"
        elif normalise_question(cand) == normalise_question(t.template_question):
            reason = "unchanged"
        else:
            missing = missing_entities(cand, t.entities)
            if missing:
                reason = "lost entities"
        ok = not reason
        text = cand if ok else t.template_question
        results.append(ParaphraseResult(task_id=t.id, accepted=ok, text=text, candidate=cand,
                                        reason=reason, missing=missing))
        out_tasks.append(t.model_copy(update={"question": text, "paraphrased": ok}))
    return out_tasks, results


def replay(task: Task, env: DataEnvironment) -> bool:
    """Re-run a task's reference program and check its gold answer."""
    r = env.run_sql(task.program)
    return r.ok and task.check(r)


__all__ = ["DROP_REASONS", "ParaphraseResult", "PoolConfig", "PoolSummary", "Program", "Task",
           "TaskPool", "TaskSynthesizer", "build_pool", "format_summary", "load_pool",
           "missing_entities", "normalise_program", "normalise_question", "paraphrase_tasks",
           "replay", "save_pool", "summary_path"]
