"""Profile a data environment once: tables, columns, types, row counts, keys, value dictionaries.

The profile is a frozen pydantic model saved as JSON (atomically); it is plain data, so an
environment that carries it can be deep-copied and pickled. Profiling runs its queries through
the same read-only connection as the agent's SQL (`sandbox.open_readonly`), so it cannot
change the data either.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from pathlib import Path
from typing import Literal, get_args

from pydantic import ConfigDict, Field

from workbench.dataenv.roles import ColumnRole, infer_role, name_tokens
from workbench.dataenv.sqlsandbox import open_readonly, quote_ident
from workbench.errors import DataError
from workbench.io import atomic_write_text, describe_validation_error, sha256_file
from workbench.records import StrictModel

# 2: column roles; 3: angles, row indexes by their order, codes that join by value
PROFILE_VERSION = 3
PROFILE_ROLES = get_args(ColumnRole)  # what a person may write as a column's role
Scalar = str | int | float | bool | None
ColumnKind = Literal["integer", "real", "text", "datetime", "blob", "null", "mixed"]

# A column whose name normalises to one of these is never a join key by name alone.
_GENERIC = {"name", "title", "description", "value", "type", "date", "country", "city", "state",
            "id", "key", "code", "no", "num", "number", "pk", "rowid", "index", "unnamed0"}
_KEYLIKE = re.compile(r"(id|key|code|no|num|number)$")
_DATE = "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]*"


class _Frozen(StrictModel):
    model_config = ConfigDict(frozen=True)


class ValueCount(_Frozen):
    value: Scalar
    count: int


class ColumnProfile(_Frozen):
    """One column: declared and observed type, nulls, distinct values, range, dictionary."""

    name: str
    declared_type: str = ""
    kind: ColumnKind
    null_count: int
    distinct_count: int
    is_unique: bool = Field(description="Non-null values are all distinct and none is null.")
    min: Scalar = None
    max: Scalar = None
    mean: float | None = None
    samples: list[Scalar] = Field(default_factory=list, description="A few distinct values.")
    dictionary: list[ValueCount] | None = Field(
        None, description="Every value with its count (low-cardinality columns only), most "
                          "frequent first.")
    role: ColumnRole | None = Field(
        None, description="What the column is (inferred from its name, type and values when "
                          "profiled; correct it here): identifier, timestamp, clock, amount "
                          "(additive), measurement (intensive), category, text, angle or "
                          "other.")


class TableProfile(_Frozen):
    name: str
    row_count: int
    columns: list[ColumnProfile]
    primary_key: list[str] = Field(default_factory=list)
    source_file: str | None = Field(None, description="The CSV/Parquet file, for a folder env.")

    def column(self, name: str) -> ColumnProfile:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.name}.{name}")


class JoinKey(_Frozen):
    """A foreign key (declared) or a join key inferred from names confirmed by value overlap."""

    from_table: str
    from_columns: list[str]
    to_table: str
    to_columns: list[str]
    source: Literal["declared", "inferred"]
    containment: float | None = Field(
        None, description="Share of distinct non-null from-values found among the to-values.")
    cardinality: Literal["many-to-one", "one-to-one"] = "many-to-one"


class EnvProfile(_Frozen):
    """Everything a task synthesiser or a prompt needs to know about an environment."""

    name: str
    kind: Literal["sqlite", "folder"]
    source: str
    content_hash: str
    tables: list[TableProfile]
    foreign_keys: list[JoinKey] = Field(default_factory=list)
    inferred_joins: list[JoinKey] = Field(default_factory=list)
    dictionary_max: int
    profile_version: int = PROFILE_VERSION

    def table(self, name: str) -> TableProfile:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def table_names(self) -> list[str]:
        return [t.name for t in self.tables]

    @property
    def joins(self) -> list[JoinKey]:
        """Declared foreign keys, then inferred join keys."""
        return [*self.foreign_keys, *self.inferred_joins]

    def digest(self, *, max_values: int = 8) -> str:
        """A compact schema text for prompts: tables, typed columns, keys, short dictionaries."""
        lines = [f"Database {self.name} ({len(self.tables)} tables)"]
        for t in self.tables:
            cols = []
            for c in t.columns:
                s = f"{c.name} {c.kind}"
                if c.name in t.primary_key:
                    s += " PK"
                if c.dictionary and len(c.dictionary) <= max_values and c.kind == "text" \
                        and not c.is_unique:  # categories, not one-off names
                    s += " {" + ", ".join(repr(v.value) for v in c.dictionary) + "}"
                cols.append(s)
            lines.append(f"- {t.name} ({t.row_count} rows): " + ", ".join(cols))
        for j in self.joins:
            lines.append(f"  join {j.from_table}.{'+'.join(j.from_columns)} -> "
                         f"{j.to_table}.{'+'.join(j.to_columns)} ({j.source})")
        return "\n".join(lines)


def save_profile(profile: EnvProfile, path: str | Path) -> Path:
    """Write the profile as JSON through a temporary file and one rename."""
    path = Path(path)
    atomic_write_text(path, profile.model_dump_json(indent=2) + "\n")
    return path


def load_profile(path: str | Path) -> EnvProfile:
    path = Path(path)
    try:
        return EnvProfile.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError("profile not found", path=str(path), code="not_found") from None
    except ValueError as e:
        raise DataError(f"not an environment profile: {describe_validation_error(e)}",
                        path=str(path)) from None


def content_hash(source: str | Path) -> str:
    """sha256 of a SQLite file, or of a folder's data files (names and contents, sorted)."""
    source = Path(source)
    if source.is_file():
        return sha256_file(source)
    h = hashlib.sha256()
    for f in sorted(data_files(source)):
        h.update(f.name.encode("utf-8") + b"\0" + sha256_file(f).encode() + b"\n")
    return h.hexdigest()


DATA_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".pq": "parquet"}


def data_files(folder: str | Path) -> list[Path]:
    """The CSV/TSV/Parquet files directly inside `folder`, sorted by name."""
    return sorted(p for p in Path(folder).iterdir()
                  if p.is_file() and p.suffix.lower() in DATA_SUFFIXES
                  and not p.name.startswith("."))


# --- profiling -----------------------------------------------------------------------------------


def profile_database(db_path: str | Path, *, name: str, kind: Literal["sqlite", "folder"],
                     source: str | Path, content: str, dictionary_max: int = 25,
                     source_files: dict[str, str] | None = None) -> EnvProfile:
    """Profile every table of a SQLite file (read-only) into an EnvProfile."""
    con = open_readonly(db_path)
    try:
        names = [r[0] for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY name")]
        tables = [_profile_table(con, t, dictionary_max, (source_files or {}).get(t))
                  for t in names]
        fks = _declared_fks(con, names)
        by_name = {t.name: t for t in tables}
        fks = [_with_containment(con, fk, by_name) for fk in fks]
        inferred = _infer_joins(con, tables, fks)
        codes = _codes_that_join(con, tables)
    finally:
        con.close()
    keys = {(j.from_table, c) for j in (*fks, *inferred) for c in j.from_columns} | {
        (j.to_table, c) for j in (*fks, *inferred) for c in j.to_columns} | codes
    tables = [t.model_copy(update={"columns": [
        c.model_copy(update={"role": "identifier"}) if (t.name, c.name) in keys else c
        for c in t.columns]}) for t in tables]  # a join key (ReportsTo, a code) is an identifier
    return EnvProfile(name=name, kind=kind, source=str(source), content_hash=content,
                      tables=tables, foreign_keys=fks, inferred_joins=inferred,
                      dictionary_max=dictionary_max)


def _scalar(v) -> Scalar:
    if isinstance(v, bytes):
        return f"<blob {len(v)} bytes>"
    return v


def _profile_table(con: sqlite3.Connection, table: str, dictionary_max: int,
                   source_file: str | None) -> TableProfile:
    q = quote_ident(table)
    info = con.execute(f"PRAGMA table_info({q})").fetchall()  # cid, name, type, notnull, dflt, pk
    rows = con.execute(f"SELECT COUNT(*) FROM {q}").fetchone()[0]
    pk = [r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
    cols = [_profile_column(con, table, r[1], r[2] or "", rows, dictionary_max) for r in info]
    cols = [c.model_copy(update={"role": infer_role(
        c, rows, pk, in_row_order=c.kind == "integer" and c.is_unique
        and _rises(con, table, c.name))}) for c in cols]
    return TableProfile(name=table, row_count=rows, columns=cols, primary_key=pk,
                        source_file=source_file)


def _profile_column(con: sqlite3.Connection, table: str, column: str, declared: str,
                    rows: int, dictionary_max: int) -> ColumnProfile:
    t, c = quote_ident(table), quote_ident(column)
    nonnull, distinct, lo, hi = con.execute(
        f"SELECT COUNT({c}), COUNT(DISTINCT {c}), MIN({c}), MAX({c}) FROM {t}").fetchone()
    types = dict(con.execute(f"SELECT typeof({c}), COUNT(*) FROM {t} WHERE {c} IS NOT NULL "
                             f"GROUP BY 1").fetchall())
    kind: ColumnKind
    if not types:
        kind = "null"
    elif set(types) <= {"integer"}:
        kind = "integer"
    elif set(types) <= {"integer", "real"}:
        kind = "real"
    elif set(types) == {"text"}:
        dated = con.execute(f"SELECT COUNT(*) FROM {t} WHERE {c} GLOB ?", (_DATE,)).fetchone()[0]
        kind = "datetime" if dated == nonnull else "text"
    elif set(types) == {"blob"}:
        kind = "blob"
    else:
        kind = "mixed"
    mean = None
    if kind in ("integer", "real"):
        mean = con.execute(f"SELECT AVG({c}) FROM {t}").fetchone()[0]
    samples = [_scalar(r[0]) for r in con.execute(
        f"SELECT DISTINCT {c} FROM {t} WHERE {c} IS NOT NULL LIMIT 3")]
    dictionary = None
    if 0 < distinct <= dictionary_max and kind not in ("blob", "null"):
        vc = con.execute(f"SELECT {c}, COUNT(*) AS n FROM {t} WHERE {c} IS NOT NULL "
                         f"GROUP BY {c} ORDER BY n DESC, {c} LIMIT ?",
                         (dictionary_max,)).fetchall()
        if all(not isinstance(v, str) or len(v) <= 100 for v, _ in vc):
            dictionary = [ValueCount(value=_scalar(v), count=n) for v, n in vc]
    return ColumnProfile(name=column, declared_type=declared, kind=kind,
                         null_count=rows - nonnull, distinct_count=distinct,
                         is_unique=rows > 0 and nonnull == rows and distinct == rows,
                         min=_scalar(lo), max=_scalar(hi),
                         mean=float(mean) if mean is not None else None,
                         samples=samples, dictionary=dictionary)


def _rises(con: sqlite3.Connection, table: str, column: str) -> bool:
    """Whether the column's values rise row by row, in the order the rows were stored (a row
    index, gaps or not). A table without rowids never counts."""
    t, c = quote_ident(table), quote_ident(column)
    try:
        falls = con.execute(f"SELECT COUNT(*) FROM (SELECT {c} AS v, LAG({c}) OVER (ORDER BY "
                            f"rowid) AS p FROM {t}) WHERE p IS NOT NULL AND v <= p").fetchone()
    except sqlite3.Error:
        return False
    return falls[0] == 0


def _codes_that_join(con: sqlite3.Connection, tables: list[TableProfile],
                     min_containment: float = 0.9) -> set[tuple[str, str]]:
    """Columns whose values are another table's key, both sides: (table, column) pairs.

    A name says which pairs to try (the same name in both tables, whatever it is; or a
    column named after the other table, `route` -> `routes`, pointing at its key); the values
    decide (at least 90% of the distinct values found among the key's), whatever the tables'
    sizes. A name match alone is not enough, nor are values alone (1..n keys of unrelated
    tables overlap)."""
    out: set[tuple[str, str]] = set()
    for ft in tables:
        for fc in ft.columns:
            if fc.kind not in ("integer", "text") or fc.distinct_count < 2:
                continue
            for tt in tables:
                if tt.name == ft.name:
                    continue
                for tc in tt.columns:
                    if tc.kind != fc.kind or not tc.is_unique or \
                            {(tt.name, tc.name), (ft.name, fc.name)} <= out:
                        continue
                    same = _norm(fc.name) == _norm(tc.name)
                    named = _norm(fc.name) in (_singular(tt.name), _norm(tt.name)) and (
                        tc.name in tt.primary_key or set(name_tokens(tc.name)) & {"id", "key",
                                                                                 "code"})
                    if not (same or named):
                        continue
                    share = _containment(con, ft.name, fc.name, tt.name, tc.name)
                    if share is not None and share >= min_containment:
                        out |= {(ft.name, fc.name), (tt.name, tc.name)}
    return out


def _declared_fks(con: sqlite3.Connection, tables: list[str]) -> list[JoinKey]:
    out: list[JoinKey] = []
    for t in tables:
        groups: dict[int, list[tuple]] = {}
        for r in con.execute(f"PRAGMA foreign_key_list({quote_ident(t)})"):
            groups.setdefault(r[0], []).append(r)  # id, seq, table, from, to, ...
        for _, rs in sorted(groups.items()):
            rs.sort(key=lambda r: r[1])
            to_table = rs[0][2]
            to_cols = [r[4] for r in rs]
            if any(c is None for c in to_cols):  # REFERENCES T without columns: T's pk
                pk = [r[1] for r in sorted((r for r in con.execute(
                    f"PRAGMA table_info({quote_ident(to_table)})") if r[5]), key=lambda r: r[5])]
                to_cols = pk
            out.append(JoinKey(from_table=t, from_columns=[r[3] for r in rs], to_table=to_table,
                               to_columns=to_cols, source="declared"))
    return out


def _containment(con: sqlite3.Connection, ft: str, fc: str, tt: str, tc: str) -> float | None:
    f, fcol, t, tcol = quote_ident(ft), quote_ident(fc), quote_ident(tt), quote_ident(tc)
    total, hit = con.execute(
        f"SELECT COUNT(*), COALESCE(SUM(v IN (SELECT {tcol} FROM {t})), 0) FROM "
        f"(SELECT DISTINCT {fcol} AS v FROM {f} WHERE {fcol} IS NOT NULL)").fetchone()
    return round(hit / total, 6) if total else None


def _with_containment(con: sqlite3.Connection, fk: JoinKey,
                      tables: dict[str, TableProfile]) -> JoinKey:
    if len(fk.from_columns) != 1 or fk.to_table not in tables:
        return fk
    share = _containment(con, fk.from_table, fk.from_columns[0], fk.to_table, fk.to_columns[0])
    return fk.model_copy(update={"containment": share})


def _norm(name: str) -> str:
    """`SupportRepId`, `support_rep_id`, `support-rep-id` → `supportrepid`."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _singular(name: str) -> str:
    n = _norm(name)
    for suffix, repl in (("ies", "y"), ("ses", "s"), ("s", "")):
        if n.endswith(suffix) and len(n) > len(suffix) + 1:
            return n[: -len(suffix)] + repl
    return n


def _name_match(ft: str, fc: str, tt: str, tc: ColumnProfile, to_pk: list[str]) -> bool:
    a, b = _norm(fc), _norm(tc.name)
    if a == b:
        return a not in _GENERIC and bool(_KEYLIKE.search(a))
    # artist_id → artists.id (the referenced table named by the column, its key called id)
    return b in ("id", "key", "code") and (to_pk in ([], [tc.name])) and \
        a in (_singular(tt) + b, _norm(tt) + b)


def _infer_joins(con: sqlite3.Connection, tables: list[TableProfile],
                 declared: list[JoinKey], min_containment: float = 0.9) -> list[JoinKey]:
    """Join keys by name (key-like names), kept only when the values overlap.

    Value overlap alone is not enough: surrogate integer ids (1..n) of unrelated tables
    overlap completely, so overlap only confirms a name match.
    """
    seen = {(j.from_table, tuple(j.from_columns), j.to_table, tuple(j.to_columns))
            for j in declared}
    seen |= {(b, bc, a, ac) for a, ac, b, bc in list(seen)}
    out: list[JoinKey] = []
    for ft in tables:
        for fc in ft.columns:
            if fc.kind not in ("integer", "text") or fc.distinct_count == 0:
                continue
            for tt in tables:
                if tt.name == ft.name:
                    continue
                for tc in tt.columns:
                    if not tc.is_unique or tc.kind != fc.kind:
                        continue
                    key = (ft.name, (fc.name,), tt.name, (tc.name,))
                    if key in seen or not _name_match(ft.name, fc.name, tt.name, tc,
                                                      tt.primary_key):
                        continue
                    if fc.is_unique and (tt.name, (tc.name,), ft.name, (fc.name,)) in seen:
                        continue  # one-to-one already recorded the other way round
                    share = _containment(con, ft.name, fc.name, tt.name, tc.name)
                    if share is None or share < min_containment:
                        continue
                    seen.add(key)
                    out.append(JoinKey(from_table=ft.name, from_columns=[fc.name],
                                       to_table=tt.name, to_columns=[tc.name],
                                       source="inferred", containment=share,
                                       cardinality="one-to-one" if fc.is_unique
                                       else "many-to-one"))
    return out
