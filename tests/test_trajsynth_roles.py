"""Column roles: a task pool asks only questions an analyst would ask of a column (no sum of
an identifier, a clock time or an intensive measurement); the profile says each column's
role, a person can correct it there, and the pool summary counts what each rule left out."""

import json
import sqlite3

import pytest

from workbench.dataenv.env import DataEnvironment, sample_environment
from workbench.dataenv.profile import load_profile, save_profile
from workbench.datatasks.tasks import PoolConfig, build_pool, format_summary
from workbench.datatasks.templates import AGGS_BY_ROLE, Slices

ROLES = {"flight_id": "identifier", "Unnamed: 0": "identifier", "dep_time": "clock",
         "flight_date": "timestamp", "year": "timestamp", "altitude_ft": "measurement",
         "dew_point": "measurement", "passengers": "measurement", "revenue": "amount",
         "quantity": "amount", "cancelled": "amount", "carrier": "category",
         "cabin_class": "category", "tail_number": "text"}


def mixed_db(path):
    con = sqlite3.connect(path)
    con.execute('CREATE TABLE flights (flight_id INTEGER PRIMARY KEY, "Unnamed: 0" INTEGER, '
                "dep_time INTEGER, flight_date TEXT, year INTEGER, altitude_ft REAL, "
                "dew_point REAL, passengers INTEGER, revenue REAL, quantity INTEGER, "
                "cancelled INTEGER, carrier TEXT, cabin_class INTEGER, tail_number TEXT)")
    rows = []
    for i in range(60):
        rows.append((1000 + i, i, 600 + (i * 37) % 1500, f"2024-0{1 + i % 9}-1{i % 10}",
                     2020 + i % 5, 30000.0 + (i * 113) % 9000, -5.0 + (i * 7) % 30,
                     80 + (i * 13) % 120, 1000.0 + (i * 97) % 5000, 1 + i % 7, i % 2,
                     ["AA", "BA", "LH", "AF"][i % 4], 1 + i % 3, f"N{i:04d}X"))
    con.executemany("INSERT INTO flights VALUES (" + ",".join("?" * 14) + ")", rows)
    con.commit()
    con.close()
    return path


def test_the_profile_names_each_column_role(tmp_path):
    env = DataEnvironment.open(mixed_db(tmp_path / "flights.sqlite"),
                               cache_dir=tmp_path / "cache")
    roles = {c.name: c.role for c in env.profile.table("flights").columns}
    assert roles == ROLES


def _summed_or_averaged(pool, slices):
    """Tasks whose aggregation of a column its role does not allow (an above-average filter
    averages its column; an argmax takes its maximum)."""
    bad = []
    for t in pool.tasks:
        q = t.query
        agg = {"above_avg": "avg", "argmax": "max"}.get(q.op, q.agg)
        if q.column and agg in ("sum", "avg", "min", "max"):
            role = slices.roles[(q.table, q.column)]
            if agg not in AGGS_BY_ROLE[role]:
                bad.append((t.id, q.op, agg, q.table, q.column, role))
    return bad


def test_a_pool_never_sums_an_identifier_a_clock_or_a_measurement(tmp_path):
    env = DataEnvironment.open(mixed_db(tmp_path / "flights.sqlite"),
                               cache_dir=tmp_path / "cache")
    pool = build_pool(env, PoolConfig(seed=0, python_check=False))
    slices = Slices(env.profile)
    assert pool.tasks and not _summed_or_averaged(pool, slices)
    sums = {(t.query.agg, t.query.column) for t in pool.tasks if t.query.op == "agg"}
    assert all(agg != "sum" or col in ("revenue", "quantity", "cancelled") for agg, col in sums)
    removed = pool.summary.removed_by_role
    assert removed.get("sum of a measurement", 0) >= 3  # altitude, dew point, passengers
    assert removed.get("sum of a clock", 0) >= 1 and removed.get("avg of a timestamp", 0) >= 1
    assert "left out by column role: " in format_summary(pool.summary)
    assert "sum of a measurement" in format_summary(pool.summary)


def test_a_role_corrected_in_the_profile_file_is_used(tmp_path):
    cache = tmp_path / "cache"
    db = mixed_db(tmp_path / "flights.sqlite")
    env = DataEnvironment.open(db, cache_dir=cache)
    path = next(cache.rglob("profile.json"))
    prof = load_profile(path)
    assert not Slices(prof).allows("flights", "passengers", "sum")
    data = json.loads(path.read_text())
    for c in data["tables"][0]["columns"]:
        if c["name"] == "passengers":
            c["role"] = "amount"  # a person says: passengers add up
    path.write_text(json.dumps(data))
    again = DataEnvironment.open(db, cache_dir=cache)
    assert Slices(again.profile).allows("flights", "passengers", "sum")
    assert env.profile.content_hash == again.profile.content_hash


@pytest.mark.parametrize("name", ["chinook", "sklearn_classic"])
def test_the_shipped_environments_pools_respect_the_roles(name, trajsynth_cache):
    env = DataEnvironment.open(sample_environment(name), cache_dir=trajsynth_cache)
    pool = build_pool(env, PoolConfig(seed=0, python_check=False))
    slices = Slices(env.profile)
    assert pool.tasks and not _summed_or_averaged(pool, slices)
    summed = {(t.query.table, t.query.column) for t in pool.tasks
              if t.query.op == "agg" and t.query.agg == "sum"}
    assert all(slices.roles[c] == "amount" for c in summed)
    if name == "sklearn_classic":  # petal lengths and wine acidity are not added up
        assert pool.summary.removed_by_role.get("sum of a measurement", 0) >= 5


def test_durations_add_up_and_clock_times_do_not():
    from workbench.dataenv.profile import ColumnProfile, infer_role

    def col(name):
        return ColumnProfile(name=name, kind="integer", null_count=0, distinct_count=50,
                             is_unique=False, min=5, max=900)

    roles = {n: infer_role(col(n), 100, []) for n in (
        "dep_time", "ArrHour", "hours_worked", "AirTime", "ElapsedTime", "length_cm")}
    assert roles == {"dep_time": "clock", "ArrHour": "clock", "hours_worked": "amount",
                     "AirTime": "amount", "ElapsedTime": "amount",
                     "length_cm": "measurement"}


def test_save_profile_keeps_roles(tmp_path):
    env = DataEnvironment.open(mixed_db(tmp_path / "f.sqlite"), cache_dir=tmp_path / "c")
    save_profile(env.profile, tmp_path / "p.json")
    assert {c.name: c.role for c in load_profile(tmp_path / "p.json").table("flights")
            .columns} == ROLES
