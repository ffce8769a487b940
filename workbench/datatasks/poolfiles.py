"""A pool on disk: the tasks as JSONL with the summary next to it, read back validated, and
the summary as a few lines of text."""

from __future__ import annotations

import os
from pathlib import Path

from workbench.datatasks.pool import PoolConfig, PoolSummary, Task, TaskPool, tally
from workbench.errors import DataError
from workbench.io import atomic_write_json, describe_validation_error, read_jsonl, write_jsonl


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
                              by_category=tally(t.category for t in tasks),
                              by_difficulty=tally(str(t.difficulty) for t in tasks),
                              by_split=tally(t.split for t in tasks),
                              by_template=tally(t.template_id for t in tasks))
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
        f"  aggregations kept, by column role: {row(summary.aggregated_by_role)}",
        f"  pandas cross-check: {summary.python_check}"])
