"""Data environments: a SQLite file or a folder of CSV/TSV/Parquet files, profiled once.

`DataEnvironment` is plain data (paths, the frozen profile, limits and the action history), so
MCTS can deep-copy it at every expansion: connections and processes are opened per execution,
never stored on the object. A folder is loaded once into a SQLite copy (in the cache folder,
keyed by the folder's content hash) for SQL; Python code reads the original files with pandas.

    env = DataEnvironment.open(sample_environment("chinook"))
    obs = env.step(Action(kind="sql", code="SELECT COUNT(*) FROM Track"))
    print(obs.text)
"""

from __future__ import annotations

import copy
import json
import os
import re
import sqlite3
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field

from workbench.dataenv.profile import (
    DATA_SUFFIXES,
    PROFILE_ROLES,
    PROFILE_VERSION,
    EnvProfile,
    content_hash,
    data_files,
    profile_database,
    save_profile,
)
from workbench.dataenv.sandbox import PythonResult, TableSource, run_python
from workbench.dataenv.sandboxlimits import SandboxLimits
from workbench.dataenv.sqlsandbox import SqlResult, run_sql
from workbench.errors import DataError, WorkbenchError
from workbench.io import atomic_path, describe_validation_error
from workbench.models.resolve import workbench_home
from workbench.records import StrictModel

# shipped with the package (a wheel too): rebuilt by `python scripts/build_envs.py`
SAMPLES_DIR = Path(__file__).resolve().parent / "samples"
SAMPLES = {"chinook": "chinook.sqlite", "sklearn_classic": "sklearn_classic"}
SQLITE_MAGIC = b"SQLite format 3\x00"


class Action(StrictModel):
    """One step of an agent: SQL or Python code to run in the sandbox."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["sql", "python"]
    code: str


class Observation(StrictModel):
    """What the agent sees after an action, with the full typed result behind it."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    text: str
    elapsed_s: float
    sql: SqlResult | None = None
    python: PythonResult | None = None


class EnvStep(StrictModel):
    """One action taken in the environment and what it observed (its history)."""

    model_config = ConfigDict(frozen=True)

    action: Action
    observation: Observation


def default_cache_dir() -> Path:
    """`$WB_HOME/trajsynth` (default ~/.cache/workbench/trajsynth)."""
    return workbench_home() / "trajsynth"


def sample_environment(name: str) -> Path:
    """The path of a shipped sample environment: `chinook` (SQLite) or `sklearn_classic`
    (a CSV folder). Rebuild them with `python scripts/build_envs.py`."""
    if name not in SAMPLES:
        raise WorkbenchError(f"unknown sample environment {name!r}; known: "
                             f"{', '.join(sorted(SAMPLES))}")
    path = SAMPLES_DIR / SAMPLES[name]
    if not path.exists():
        raise WorkbenchError(f"{path} is missing; rebuild it with "
                             f"`python scripts/build_envs.py {name}`")
    return path


def open_env(spec: str, cache_dir: str | os.PathLike | None = None) -> DataEnvironment:
    """A sample environment by name (`chinook`, `sklearn_classic`) unless a path of that name
    exists, else the SQLite file or table folder at `spec`."""
    path = sample_environment(spec) if spec in SAMPLES and not Path(spec).exists() else spec
    return DataEnvironment.open(path, cache_dir=cache_dir)


def _table_name(path: Path) -> str:
    name = re.sub(r"\W+", "_", path.stem).strip("_")
    return name if name and not name[0].isdigit() else f"t_{name}"


def _read_file(path: Path):
    import pandas as pd

    fmt = DATA_SUFFIXES[path.suffix.lower()]
    try:
        if fmt == "parquet":
            return pd.read_parquet(path)
        return pd.read_csv(path, sep="\t" if fmt == "tsv" else ",")
    except (ValueError, OSError, ImportError) as e:
        raise DataError(f"cannot read the table: {e}", path=str(path)) from None


def folder_tables(folder: str | Path) -> dict[str, Path]:
    """Table name → data file for a folder environment (names from the file stems)."""
    files = data_files(folder)
    if not files:
        raise DataError("no .csv, .tsv or .parquet files in the folder", path=str(folder),
                        code="empty")
    out: dict[str, Path] = {}
    for f in files:
        name = _table_name(f)
        if name.lower() in {k.lower() for k in out}:
            raise DataError(f"two files give the table name {name!r}", path=str(f),
                            code="duplicate_table")
        out[name] = f
    return out


def materialise_folder(folder: str | Path, target: str | Path) -> Path:
    """Load a folder's tables into a new SQLite file at `target` (atomically)."""
    target = Path(target)
    tables = folder_tables(folder)
    with atomic_path(target, suffix=".sqlite") as tmp:
        con = sqlite3.connect(tmp)
        try:
            for name, f in tables.items():
                _read_file(f).to_sql(name, con, index=False)
            con.commit()
        finally:
            con.close()
    return target


class DataEnvironment(StrictModel):
    """A data environment and the agent's actions so far. Plain data only."""

    name: str
    kind: Literal["sqlite", "folder"]
    source: str = Field(description="The SQLite file or the data folder the user gave.")
    db_path: str = Field(description="The SQLite file SQL runs on (a copy for a folder).")
    profile: EnvProfile
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    history: list[EnvStep] = Field(default_factory=list)

    # --- building ---------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike, *, name: str | None = None,
             cache_dir: str | os.PathLike | None = None, limits: SandboxLimits | None = None,
             dictionary_max: int = 25, refresh: bool = False) -> DataEnvironment:
        """Open a SQLite file or a data folder; profile it unless a profile for the same
        content is cached (`<cache_dir>/<name>-<hash>/profile.json`)."""
        src = Path(path).expanduser().resolve()
        if not src.exists():
            raise DataError("no such file or folder", path=str(path), code="not_found")
        if src.is_file():
            with open(src, "rb") as fh:
                if fh.read(16) != SQLITE_MAGIC:
                    raise DataError("not a SQLite database (and not a folder of CSV/Parquet "
                                    "files)", path=str(path), code="bad_format")
            kind: Literal["sqlite", "folder"] = "sqlite"
        else:
            kind = "folder"
        name = name or re.sub(r"\W+", "_", src.stem if kind == "sqlite" else src.name)
        digest = content_hash(src)
        cache = Path(cache_dir) if cache_dir else default_cache_dir()
        home = cache / f"{name}-{digest[:16]}"
        db_path = src
        files: dict[str, str] | None = None
        if kind == "folder":
            tables = folder_tables(src)
            files = {t: f.name for t, f in tables.items()}
            db_path = home / "tables.sqlite"
            if refresh or not db_path.is_file():
                materialise_folder(src, db_path)
        profile_path = home / "profile.json"
        profile = None if refresh else _cached_profile(
            profile_path, {"content_hash": digest, "dictionary_max": dictionary_max,
                           "name": name, "profile_version": PROFILE_VERSION}, db_path)
        if profile is None:
            profile = profile_database(db_path, name=name, kind=kind, source=src,
                                       content=digest, dictionary_max=dictionary_max,
                                       source_files=files)
            save_profile(profile, profile_path)
        return cls(name=name, kind=kind, source=str(src), db_path=str(db_path),
                   profile=profile, limits=limits or SandboxLimits())

    # --- copying ----------------------------------------------------------------------------

    def __deepcopy__(self, memo: dict | None = None) -> DataEnvironment:
        """A copy with its own history list; the frozen profile, limits and steps are shared
        (they are immutable), so MCTS expansions stay cheap."""
        return self.model_copy(update={"history": list(self.history)})

    def fork(self) -> DataEnvironment:
        return copy.deepcopy(self)

    # --- acting -----------------------------------------------------------------------------

    @property
    def actions(self) -> list[Action]:
        """The action prefix so far."""
        return [s.action for s in self.history]

    def table_sources(self) -> list[TableSource]:
        """Where the Python sandbox reads each table from."""
        if self.kind == "sqlite":
            return [TableSource(name=t.name, format="sqlite", path=self.db_path, table=t.name)
                    for t in self.profile.tables]
        folder = Path(self.source)
        out = []
        for t in self.profile.tables:
            f = folder / (t.source_file or "")
            out.append(TableSource(name=t.name, format=DATA_SUFFIXES[f.suffix.lower()],
                                   path=str(f)))
        return out

    def run_sql(self, sql: str) -> SqlResult:
        return run_sql(self.db_path, sql, self.limits)

    def run_python(self, code: str, *, require_result: bool = True) -> PythonResult:
        sources = self.table_sources()
        return run_python(code, tables=sources, readable=[s.path for s in sources],
                          limits=self.limits, require_result=require_result)

    def execute(self, action: Action) -> Observation:
        """Run an action without recording it."""
        if action.kind == "sql":
            r = self.run_sql(action.code)
            return Observation(ok=r.ok, text=r.to_observation(), elapsed_s=r.elapsed_s, sql=r)
        p = self.run_python(action.code)
        return Observation(ok=p.ok, text=p.to_observation(), elapsed_s=p.elapsed_s, python=p)

    def step(self, action: Action) -> Observation:
        """Run an action and append it (with its observation) to the history."""
        obs = self.execute(action)
        self.history.append(EnvStep(action=action, observation=obs))
        return obs


def _cached_profile(path: Path, made_for: dict, db_path: Path) -> EnvProfile | None:
    """The profile saved for this content, as a person may have corrected it (a column's
    role); None when there is none, or it was made for other content, settings or version.
    A file made for this content that is not a valid profile, or names a role, table or
    column the data does not have, is one line naming the file and the field: it is never
    profiled over in silence (the person's corrections would be lost)."""
    if not path.is_file():
        return None
    where: dict[str, Any] = {"path": str(path), "code": "bad_record"}  # DataError's keywords
    hint = "; fix it, or delete the file to profile again"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"not a JSON profile ({e}){hint}", **where) from None
    if not isinstance(raw, dict):
        raise DataError(f"not a profile (a JSON object with tables){hint}", **where)
    if any(raw.get(k) != v for k, v in made_for.items()):
        return None  # made for other content or settings: profiled again
    tables = raw.get("tables")
    if not isinstance(tables, list):
        tables = []
    for i, t in enumerate(tables):
        cols = t.get("columns") if isinstance(t, dict) else None
        for j, c in enumerate(cols if isinstance(cols, list) else []):
            role = c.get("role") if isinstance(c, dict) else None
            if role is not None and role not in PROFILE_ROLES:
                raise DataError(f"tables[{i}].columns[{j}].role ({t.get('name')}."
                                f"{c.get('name')}): {json.dumps(role)[:60]} is not a role "
                                f"(one of {', '.join(PROFILE_ROLES)}){hint}", **where)
    try:
        profile = EnvProfile.model_validate(raw)
    except ValueError as e:  # any other field: named by its path
        raise DataError(f"not an environment profile: {describe_validation_error(e)}{hint}",
                        **where) from None
    _check_columns(profile, db_path, where, hint)
    return profile


def _check_columns(profile: EnvProfile, db_path: Path, where: dict, hint: str) -> None:
    """Every table and column the profile names is in the data, and every column of those
    tables is in the profile."""
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        have = {name for (name,) in con.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
        for i, t in enumerate(profile.tables):
            if t.name not in have:
                raise DataError(f"tables[{i}] {t.name!r}: the data has no such table{hint}",
                                **where)
            quoted = '"' + t.name.replace('"', '""') + '"'
            real = [r[1] for r in con.execute(f"PRAGMA table_info({quoted})")]
            for j, c in enumerate(t.columns):
                if c.name not in real:
                    raise DataError(f"tables[{i}].columns[{j}] {c.name!r}: table {t.name!r} "
                                    f"has no such column{hint}", **where)
            missing = [c for c in real if c not in {c.name for c in t.columns}]
            if missing:
                raise DataError(f"tables[{i}] {t.name!r}: column {missing[0]!r} is missing "
                                f"from the profile{hint}", **where)
    finally:
        con.close()
