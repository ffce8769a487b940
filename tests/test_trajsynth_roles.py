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


def transit_folder(folder):
    """Five tables as a public relational database comes: two of them samples of larger
    tables (their row index `X` keeps the rows' original numbers, so it has gaps), a numeric
    route number, a bearing in degrees, and a text stop code that is a key in one table and a
    repeated value in another."""
    import csv
    import random

    rnd = random.Random(7)
    folder.mkdir()

    def write(name, header, rows):
        with open(folder / f"{name}.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(header)
            w.writerows(rows)

    routes = [7, 12, 15, 21, 33, 40, 41, 58, 60, 72, 88, 95]
    write("routes", ["X", "route", "route_name", "route_type"],
          [[i + 1, r, f"Line {r} {['North', 'South', 'East'][i % 3]}", i % 3]
           for i, r in enumerate(routes)])
    stops = [f"S{k:03d}" for k in range(1, 17)]
    write("stops", ["X", "stop_code", "stop_name", "zone"],
          [[i + 1, s, f"Stop {s}", 1 + i % 4] for i, s in enumerate(stops)])
    index = sorted(rnd.sample(range(1, 4000), 80))  # a sample of a 4,000-row table
    write("trips_sample", ["X", "route", "stop_code", "order_number", "bearing_deg",
                           "speed_kmh", "passengers"],
          [[ix, rnd.choice(routes), rnd.choice(stops[:10]), 500000 + rnd.randrange(90000),
            round(rnd.uniform(0, 359.9), 1), round(rnd.uniform(12, 60), 1),
            rnd.randrange(0, 80)] for ix in index])
    index = sorted(rnd.sample(range(1, 900), 40))
    write("delays_sample", ["X", "route", "wind_dir", "delay_minutes"],
          [[ix, rnd.choice(routes), rnd.randrange(0, 360), rnd.randrange(0, 30)]
           for ix in index])
    write("zones", ["X", "zone", "fare"], [[i + 1, i + 1, 2.0 + i] for i in range(4)])
    return folder


def test_roles_come_from_the_values_not_the_tables_size(tmp_path):
    env = DataEnvironment.open(transit_folder(tmp_path / "transit"),
                               cache_dir=tmp_path / "cache")
    roles = {(t.name, c.name): c.role for t in env.profile.tables for c in t.columns}
    # the row index: an identifier in every table, sampled (gaps) or not
    assert {t: roles[(t, "X")] for t in ("routes", "stops", "zones", "trips_sample",
                                         "delays_sample")} == dict.fromkeys(
        ("routes", "stops", "zones", "trips_sample", "delays_sample"), "identifier")
    # numbers that name things, and a code whose values join another table's key
    assert roles[("trips_sample", "route")] == roles[("routes", "route")] == "identifier"
    assert roles[("trips_sample", "order_number")] == "identifier"
    assert roles[("trips_sample", "stop_code")] == roles[("stops", "stop_code")] == \
        "identifier"
    # angles are not averaged; real measurements and amounts keep their roles
    assert roles[("trips_sample", "bearing_deg")] == roles[("delays_sample", "wind_dir")] == \
        "angle"
    assert roles[("trips_sample", "speed_kmh")] == "measurement"
    assert roles[("delays_sample", "delay_minutes")] == "amount"
    assert roles[("routes", "route_type")] == "category"


def test_a_pool_never_aggregates_an_identifier_a_row_index_or_an_angle(tmp_path):
    env = DataEnvironment.open(transit_folder(tmp_path / "transit"),
                               cache_dir=tmp_path / "cache")
    pool = build_pool(env, PoolConfig(seed=0, python_check=False))
    slices = Slices(env.profile)
    assert pool.tasks and not _summed_or_averaged(pool, slices)
    kept = pool.summary.aggregated_by_role
    assert kept and not [k for k in kept if k.endswith(("identifier", "angle"))], kept
    assert any(k.endswith("measurement") for k in kept)  # speed is still averaged
    removed = pool.summary.removed_by_role
    assert removed.get("avg of an angle", 0) >= 1, removed
    assert "aggregations kept, by column role: " in format_summary(pool.summary)


def test_angles_and_codes_from_a_column_alone():
    from workbench.dataenv.profile import ColumnProfile, infer_role

    def col(name, kind="real", lo=0, hi=359, unique=False):
        return ColumnProfile(name=name, kind=kind, null_count=0, distinct_count=50,
                             is_unique=unique, min=lo, max=hi)

    assert infer_role(col("heading"), 100, []) == "angle"
    assert infer_role(col("temp_deg_c", lo=-10, hi=40), 100, []) == "measurement"
    assert infer_role(col("direction", lo=0, hi=4000), 100, []) == "measurement"
    assert infer_role(col("route_no", "integer", 1, 99), 100, []) == "identifier"
    assert infer_role(col("route_short_name", "integer", 1, 99), 100, []) == "identifier"
    assert infer_role(col("number_of_stops", "integer", 1, 30), 100, []) != "identifier"
    # a unique integer that rises row by row is a row index, gaps or not
    sampled = col("X", "integer", 3, 3990, unique=True)
    assert infer_role(sampled, 80, []) == "measurement"
    assert infer_role(sampled, 80, [], in_row_order=True) == "identifier"
