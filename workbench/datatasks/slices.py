"""Reading a profile once for the templates (`Slices`): per table a key column, a label
column, measures, categories, dates, lookup targets, the usable many-to-one joins, and which
aggregations each column's role allows."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from workbench.dataenv.profile import (
    ColumnProfile,
    EnvProfile,
    JoinKey,
    TableProfile,
    infer_role,
)
from workbench.datatasks.queries import Group

_KEYLIKE = re.compile(r"(^|[_\s-])(id|key)$", re.IGNORECASE)
_CAMEL_KEY = re.compile(r"[a-z0-9](Id|ID|Key)$")
_LABEL_HINT = re.compile(r"name|title|label|species|cultivar", re.IGNORECASE)
MAX_VALUE_CHARS = 60
# the aggregations a question may ask of a column, by its role (profile.ColumnRole)
AGGS_BY_ROLE = {"amount": {"sum", "avg", "min", "max"}, "measurement": {"avg", "min", "max"},
                "timestamp": {"min", "max"}, "clock": {"min", "max"}, "identifier": set(),
                "category": set(), "text": set(), "angle": set(), "other": {"min", "max"}}


def aggregated_roles(tasks, roles: dict[tuple[str, str], str]) -> dict[str, int]:
    """Kept tasks by the aggregation they ask of a column and that column's role ("avg of a
    measurement": 12); an above-average filter averages its column, an argmax takes a
    maximum. The pool summary's check that no task adds or averages an identifier, a row
    index or an angle."""
    out: Counter[str] = Counter()
    for t in tasks:
        q = t.query
        agg = {"above_avg": "avg", "argmax": "max"}.get(q.op, q.agg)
        if q.column and agg in ("sum", "avg", "min", "max"):
            role = roles.get((q.table, q.column), "measurement")
            out[f"{agg} of {'an' if role[0] in 'aeiou' else 'a'} {role}"] += 1
    return dict(sorted(out.items()))


def is_keylike(name: str) -> bool:
    """`ArtistId`, `flower_id`, `id`, `key` (but not `malic_acid`)."""
    return bool(_KEYLIKE.search(name) or _CAMEL_KEY.search(name))


class Slices:
    """The parts of a schema the templates use."""

    def __init__(self, profile: EnvProfile) -> None:
        self.profile = profile
        join_cols = set()
        for j in profile.joins:
            join_cols |= {(j.from_table, c) for c in j.from_columns}
            join_cols |= {(j.to_table, c) for c in j.to_columns}
        self.keys: dict[str, str] = {}
        self.labels: dict[str, str] = {}
        self.measures: dict[str, list[str]] = {}
        self.categories: dict[str, list[str]] = {}
        self.dates: dict[str, list[str]] = {}
        self.targets: dict[str, list[str]] = {}
        # a column's role: the profile's (a person may have corrected it), else inferred
        self.roles: dict[tuple[str, str], str] = {
            (t.name, c.name): c.role or infer_role(c, t.row_count, t.primary_key)
            for t in profile.tables for c in t.columns}
        self.removed: Counter[str] = Counter()  # rule -> candidate aggregations it removed
        self._refused: set[tuple[str, str, str]] = set()
        for t in profile.tables:
            if t.row_count < 2:
                continue
            key = self._key(t)
            if key:
                self.keys[t.name] = key
            label = self._label(t, join_cols)
            if label:
                self.labels[t.name] = label

            def plain(c: ColumnProfile, t=t) -> bool:
                return not is_keylike(c.name) and (t.name, c.name) not in join_cols \
                    and c.name not in t.primary_key

            self.measures[t.name] = [c.name for c in t.columns if plain(c)
                                     and c.kind in ("integer", "real") and c.distinct_count >= 2
                                     and self.roles[(t.name, c.name)] not in ("identifier",
                                                                              "category")]
            self.categories[t.name] = [c.name for c in t.columns if plain(c)
                                       and self._is_category(c, t)]
            self.dates[t.name] = [c.name for c in t.columns
                                  if c.kind == "datetime" and c.distinct_count >= 2]
            self.targets[t.name] = [c.name for c in t.columns if plain(c) and c.name != label
                                    and c.kind in ("text", "integer", "real", "datetime")
                                    and c.distinct_count >= 2]
        self.joins: list[JoinKey] = []
        for j in profile.joins:
            if len(j.from_columns) != 1 or j.from_table == j.to_table:
                continue
            try:
                to = profile.table(j.to_table).column(j.to_columns[0])
                profile.table(j.from_table).column(j.from_columns[0])
            except KeyError:
                continue
            if to.is_unique:
                self.joins.append(j)

    @staticmethod
    def _key(t: TableProfile) -> str | None:
        if len(t.primary_key) == 1:
            return t.primary_key[0]
        for c in t.columns:
            if c.is_unique and c.kind == "integer" and is_keylike(c.name):
                return c.name
        return None

    @staticmethod
    def _label(t: TableProfile, join_cols: set) -> str | None:
        best = None
        for c in t.columns:
            nonnull = t.row_count - c.null_count
            if c.kind != "text" or is_keylike(c.name) or (t.name, c.name) in join_cols:
                continue
            if nonnull < 0.9 * t.row_count or c.distinct_count < 0.9 * nonnull:
                continue
            rank = (not c.is_unique, not _LABEL_HINT.search(c.name))
            if best is None or rank < best[0]:
                best = (rank, c.name)
        return best[1] if best else None

    @staticmethod
    def _is_category(c: ColumnProfile, t: TableProfile) -> bool:
        if not c.dictionary or c.kind not in ("text", "integer") or c.is_unique:
            return False
        nonnull = t.row_count - c.null_count
        if c.distinct_count < 2 or c.distinct_count > 0.75 * nonnull:
            return False
        if max(v.count for v in c.dictionary) < 2:
            return False
        return all(not isinstance(v.value, str) or 0 < len(v.value) <= MAX_VALUE_CHARS
                   for v in c.dictionary)

    def column(self, table: str, column: str) -> ColumnProfile:
        return self.profile.table(table).column(column)

    def allows(self, table: str, column: str, agg: str) -> bool:
        """Whether `agg` of the column means something for its role; each refusal is counted
        once per rule (`removed`: "sum of a measurement", "avg of a clock"...)."""
        role = self.roles.get((table, column), "measurement")
        if agg in AGGS_BY_ROLE.get(role, set()):
            return True
        if (table, column, agg) not in self._refused:
            self._refused.add((table, column, agg))
            self.removed[f"{agg} of {'an' if role[0] in 'aeiou' else 'a'} {role}"] += 1
        return False

    def dictionary(self, table: str, column: str) -> list[tuple[Any, int]]:
        return [(v.value, v.count) for v in self.column(table, column).dictionary or ()]

    def group_options(self, table: str) -> list[tuple[Group, int]]:
        """Ways to group a table's rows, with how many groups each gives."""
        out = [(Group(kind="column", column=c), self.column(table, c).distinct_count)
               for c in self.categories.get(table, [])]
        for j in self.joins:
            if j.from_table == table and j.to_table in self.labels:
                parent = self.profile.table(j.to_table)
                label = self.labels[j.to_table]
                if parent.column(label).is_unique:
                    out.append((Group(kind="via", column=j.from_columns[0], table=j.to_table,
                                      key=j.to_columns[0], label=label),
                                min(parent.row_count,
                                    self.column(table, j.from_columns[0]).distinct_count)))
        return out
