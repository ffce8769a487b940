"""The per-environment prefix trie: executions cached by canonical statement, shared across
tasks, with the verified paths of earlier tasks per question shape and the node scorers'
statistics. Saved as JSON next to the trees."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench.dataenv.sqlsandbox import SqlResult
from workbench.datatasks.normalise import normalise_program
from workbench.datatasks.reuse import similarity
from workbench.io import atomic_write_json


def action_key(kind: str, code: str) -> str:
    """The canonical form of an action (whitespace collapsed, case folded outside strings)."""
    return f"{kind}:{normalise_program(code)}"


class PrefixTrie:
    """Per environment: canonical action sequences → observations (the database is read-only,
    so a statement's result does not depend on what ran before; the path is kept for seeding
    and for statistics). Saved as JSON next to the trees."""

    def __init__(self, env_hash: str) -> None:
        self.env_hash = env_hash
        self.results: dict[str, dict[str, Any]] = {}  # action key → SqlResult JSON
        self.paths: dict[str, int] = {}  # "key1\x1fkey2..." → times reached
        # per-node scorer choice: context "env/category/depth" → scorer → task id →
        # [nodes, reward sum] (per task, so a re-run task replaces its own share)
        self.scorers: dict[str, dict[str, dict[str, list[float]]]] = {}
        # question shape → {abstract key path "k1\x1fk2...": ids of the tasks verified so}
        self.shapes: dict[str, dict[str, list[str]]] = {}
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> SqlResult | None:
        r = self.results.get(key)
        if r is None:
            self.misses += 1
            return None
        self.hits += 1
        return SqlResult.model_validate(r)

    def put(self, key: str, result: SqlResult) -> None:
        self.results[key] = result.model_dump(mode="json", exclude={"elapsed_s"})

    def visit(self, keys: Sequence[str]) -> None:
        for i in range(1, len(keys) + 1):
            p = "\x1f".join(keys[:i])
            self.paths[p] = self.paths.get(p, 0) + 1

    def learn(self, shape: str, keys: Sequence[str], task_id: str) -> None:
        """Task `task_id`, of this question shape, was verified along this abstract key path
        (idempotent: a re-run task is not counted twice)."""
        ids = self.shapes.setdefault(shape, {}).setdefault("\x1f".join(keys), [])
        if task_id not in ids:
            ids.append(task_id)
            ids.sort()

    def seeds(self, shape: str, min_count: int = 1, min_similarity: float = 1.0,
              exclude: str | None = None) -> list[tuple[tuple[str, ...], int, float]]:
        """The verified abstract paths of this shape and of shapes at least
        `min_similarity` alike (`reuse.similarity`), as (keys, tasks, similarity), when
        at least `min_count` distinct other tasks (not `exclude`: a task never seeds itself,
        so a re-run of a task after a kill searches as the first run did) verified them."""
        out, tasks = [], set()
        for other, paths in sorted(self.shapes.items()):
            sim = 1.0 if other == shape else similarity(shape, other)
            if sim < min_similarity:
                continue
            for p, ids in sorted(paths.items()):
                mine = [i for i in ids if i != exclude]
                if mine:
                    out.append((tuple(p.split("\x1f")), len(mine), sim))
                    tasks.update(mine)
        if not min_count or len(tasks) < min_count:
            return []
        return out

    def prefixes(self, min_count: int = 2) -> list[list[str]]:
        """Action sequences reached at least `min_count` times (for seeding new trees)."""
        return [p.split("\x1f") for p, n in sorted(self.paths.items()) if n >= min_count]

    def first_statements(self, min_count: int, limit: int) -> list[str]:
        """The SQL that began verified paths of at least `min_count` tasks, most frequent
        first (ties by text)."""
        rows = []
        for p, n in self.paths.items():
            if "\x1f" in p or n < min_count or not p.startswith("sql:"):
                continue
            r = self.results.get(p.removeprefix("sql:"))
            if r and r.get("sql") and r.get("error") is None:
                rows.append((-n, r["sql"]))
        return [sql for _, sql in sorted(rows)[:limit]]

    def save(self, path: str | Path) -> None:
        atomic_write_json(path, {"version": 2, "env_hash": self.env_hash,
                                 "results": self.results, "paths": self.paths,
                                 "shapes": self.shapes, "scorers": self.scorers})

    @classmethod
    def load(cls, path: str | Path, env_hash: str) -> PrefixTrie:
        trie = cls(env_hash)
        p = Path(path)
        if not p.is_file():
            return trie
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return trie  # a cache: a torn file is rebuilt
        if isinstance(data, dict) and data.get("env_hash") == env_hash:
            trie.results = dict(data.get("results") or {})
            trie.paths = {k: int(v) for k, v in (data.get("paths") or {}).items()}
            trie.shapes = {s: {k: sorted(map(str, v)) for k, v in ps.items()
                               if isinstance(v, list)}
                           for s, ps in _dict(data.get("shapes")).items() if isinstance(ps, dict)}
            trie.scorers = {c: {k: {t: [float(nr[0]), float(nr[1])] for t, nr in v.items()
                                    if _pair(nr)}
                                for k, v in d.items() if isinstance(v, dict)}
                            for c, d in _dict(data.get("scorers")).items() if isinstance(d, dict)}
        return trie


def _dict(x: Any) -> dict:
    return x if isinstance(x, dict) else {}


def _pair(x: Any) -> bool:
    """[nodes, reward sum]: what a scorer statistic must be (a hand-edited trie is a cache:
    anything else is dropped)."""
    return isinstance(x, list) and len(x) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in x)
