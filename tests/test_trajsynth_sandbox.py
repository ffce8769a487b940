"""Data environments and their sandbox (RELIABILITY.md S1-S10, M4): each test measures a figure.

Python runs in a child with OS layers (namespaces, uid drop, rlimits) and an audit hook; where a
test switches the hook off (`audit_hook=False`) it checks that the OS layer holds on its own,
and it is skipped, with the reason, where the kernel does not give that layer.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from workbench.errors import DataError
from workbench.io import sha256_file
from workbench.dataenv.env import Action, DataEnvironment, sample_environment
from workbench.dataenv.profile import content_hash, load_profile
from workbench.dataenv.sandbox import (
    SandboxLimits,
    open_readonly,
    processes_in_group,
    run_python,
    run_sql,
)

CHINOOK_TABLES = {"Album": 347, "Artist": 275, "Customer": 59, "Employee": 8, "Genre": 25,
                  "Invoice": 412, "InvoiceLine": 2240, "MediaType": 5, "Playlist": 18,
                  "PlaylistTrack": 8715, "Track": 3503}
CHINOOK_FKS = {("Album", "ArtistId", "Artist", "ArtistId"),
               ("Customer", "SupportRepId", "Employee", "EmployeeId"),
               ("Employee", "ReportsTo", "Employee", "EmployeeId"),
               ("Invoice", "CustomerId", "Customer", "CustomerId"),
               ("InvoiceLine", "InvoiceId", "Invoice", "InvoiceId"),
               ("InvoiceLine", "TrackId", "Track", "TrackId"),
               ("PlaylistTrack", "PlaylistId", "Playlist", "PlaylistId"),
               ("PlaylistTrack", "TrackId", "Track", "TrackId"),
               ("Track", "AlbumId", "Album", "AlbumId"),
               ("Track", "GenreId", "Genre", "GenreId"),
               ("Track", "MediaTypeId", "MediaType", "MediaTypeId")}
IRIS_MEANS = {"setosa": 1.462, "versicolor": 4.26, "virginica": 5.552}  # petal length, cm


@pytest.fixture
def chinook_copy(tmp_path) -> Path:
    """A private copy in its own folder, so "no file created next to it" can be checked."""
    folder = tmp_path / "db"
    folder.mkdir()
    return Path(shutil.copy(sample_environment("chinook"), folder / "chinook.sqlite"))


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


# --- Python: limits ------------------------------------------------------------------------------


def test_infinite_loop_is_killed_at_the_limit_with_no_zombie():
    gaps: list[float] = []
    stop = threading.Event()

    def heartbeat():
        last = time.monotonic()
        while not stop.wait(0.01):
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    beat = threading.Thread(target=heartbeat)
    beat.start()
    try:
        r = run_python("while True:\n    pass", limits=SandboxLimits(py_timeout_s=2, py_cpu_s=30))
    finally:
        stop.set()
        beat.join()
    left = processes_in_group(r.pid)
    print(f"\nS1: stopped after {r.elapsed_s:.3f} s (limit 2 s); {len(left)} processes left; "
          f"parent heartbeat max gap {max(gaps) * 1000:.0f} ms")
    assert r.error_kind == "timeout", r
    assert 2.0 <= r.elapsed_s <= 2.5
    assert left == []  # zombies included
    assert max(gaps) < 0.25  # the parent stayed responsive
    assert not os.path.exists(r.workdir)


def test_cpu_limit_stops_a_busy_child():
    r = run_python("while True:\n    pass", limits=SandboxLimits(py_cpu_s=1, py_timeout_s=15))
    print(f"\nCPU: stopped after {r.elapsed_s:.2f} s wall, {r.cpu_s:.2f} s CPU (RLIMIT_CPU 1 s)")
    assert r.error_kind == "cpu_limit", r
    assert r.elapsed_s < 5
    assert processes_in_group(r.pid) == []


def test_4gb_allocation_under_512mb_dies_without_hurting_the_parent():
    before = _rss_mb()
    r = run_python("x = bytearray(4 * 1024 ** 3)\nresult = len(x)",
                   limits=SandboxLimits(py_memory_mb=512))
    grew = _rss_mb() - before
    print(f"\nS2: {r.error_kind} after {r.elapsed_s:.2f} s; parent RSS change {grew:+.1f} MB")
    assert r.error_kind in ("memory", "killed"), r
    assert r.result is None
    assert grew < 50
    assert run_sql(sample_environment("chinook"), "SELECT 1").rows == [[1]]  # parent still fine


FORK_BOMB = """
import os, time
n, err = 0, None
try:
    while n < 500:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as e:
    err = type(e).__name__
result = {"forks": n, "error": err}
"""


def test_fork_is_blocked_and_a_fork_bomb_is_capped_by_rlimit_nproc():
    r = run_python(FORK_BOMB)
    assert r.result == {"forks": 0, "error": "SandboxViolation"}, r  # the hook stops the 1st
    assert r.blocked == ["os.fork is not allowed in the sandbox"]
    assert processes_in_group(r.pid) == []
    # the OS layer alone (no audit hook): RLIMIT_NPROC stops the bomb
    cap = 8
    r = run_python(FORK_BOMB, audit_hook=False, limits=SandboxLimits(py_max_procs=cap))
    if "not enforced" in r.isolation.get("nproc", ""):
        pytest.skip(f"RLIMIT_NPROC does not bind here: {r.isolation}")
    t_end = time.monotonic()
    while processes_in_group(r.pid) and time.monotonic() - t_end < 2:
        time.sleep(0.01)
    gone_after = time.monotonic() - t_end
    print(f"\nS3: audit hook blocked os.fork; without it {r.result['forks']} forks succeeded "
          f"(cap {cap} tasks above the current count) before {r.result['error']}; all gone "
          f"{gone_after:.3f} s after return; isolation {r.isolation}")
    assert r.ok, r
    assert 0 < r.result["forks"] <= cap
    assert r.result["error"] == "BlockingIOError"
    assert processes_in_group(r.pid) == []


# --- Python: files, network, output ----------------------------------------------------------------


def test_writes_outside_the_workdir_fail_and_the_workdir_is_removed(tmp_path):
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    targets = {"outside": tmp_path / "outside.txt", "ssh": ssh / "x"}
    code = f"""
import os
out = {{"cwd": os.getcwd()}}
for key, path in {json.dumps({k: str(v) for k, v in targets.items()})}.items():
    try:
        with open(path, "w") as fh:
            fh.write("owned")
        out[key] = "written"
    except OSError as e:
        out[key] = f"{{type(e).__name__}}: {{e}}"
with open("inside.txt", "w") as fh:
    fh.write("fine")
out["inside"] = open("inside.txt").read()
result = out
"""
    before = set(os.listdir(tempfile.gettempdir()))
    r = run_python(code)
    print(f"\nS4: outside -> {r.result['outside'][:60]}; ~/.ssh -> {r.result['ssh'][:60]}; "
          f"workdir {r.workdir} exists afterwards: {os.path.exists(r.workdir)}")
    assert r.ok, r
    assert r.result["inside"] == "fine"
    assert r.result["cwd"] == r.workdir
    for key, path in targets.items():
        assert r.result[key] != "written" and not path.exists(), key
    assert not os.path.exists(r.workdir)
    after = set(os.listdir(os.path.dirname(r.workdir)))
    assert not {p for p in after - before if p.startswith("wb-sandbox-")}
    # the OS layers alone (Landlock, or the uid `nobody`): still nothing written outside
    r = run_python(code, audit_hook=False)
    if not (r.isolation.get("uid", "").startswith("dropped")
            or r.isolation.get("filesystem", "").startswith("Landlock")):
        pytest.skip(f"neither Landlock nor a uid to drop to here: {r.isolation}")
    assert r.ok, r
    for key, path in targets.items():
        assert r.result[key].startswith("PermissionError"), r.result
        assert not path.exists()


def test_native_file_io_is_confined_by_landlock():
    """pyarrow opens files in C++, out of the audit hook's sight: the kernel must stop it."""
    probe = Path(tempfile.gettempdir()) / f"wb-landlock-probe-{os.getpid()}.parquet"
    code = f"""
out = {{}}
try:
    pd.DataFrame({{"a": [1]}}).to_parquet({str(probe)!r})
    out["write"] = "written"
except OSError as e:
    out["write"] = type(e).__name__
try:
    out["read"] = open("/etc/passwd").read()[:10]
except OSError as e:
    out["read"] = type(e).__name__
pd.DataFrame({{"a": [1, 2]}}).to_parquet("inside.parquet")
out["inside"] = len(pd.read_parquet("inside.parquet"))
result = out
"""
    r = run_python(code, audit_hook=False)
    print(f"\nS4/S8 native I/O: {r.result} ({r.isolation.get('filesystem')})")
    if not r.isolation.get("filesystem", "").startswith("Landlock"):
        pytest.skip(f"no Landlock here; native file I/O is bounded by the uid only: "
                    f"{r.isolation.get('filesystem')}")
    assert r.ok, r
    assert r.result == {"write": "PermissionError", "read": "PermissionError", "inside": 2}
    assert not probe.exists()


def test_network_connect_fails():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    port = server.getsockname()[1]
    code = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
            "result = 'connected'")
    try:
        r = run_python(code)
        assert r.error_kind == "blocked" and "socket" in r.error, r
        net = run_python(code, audit_hook=False)  # the namespace alone
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
    print(f"\nS5: with the hook: {r.error[:70]}; namespace only: {net.error!s:.70}; "
          f"0 connections accepted ({net.isolation.get('network')})")
    if net.isolation.get("network") != "network namespace":
        pytest.skip("no network namespace here (the audit hook is the only network barrier): "
                    f"{net.isolation.get('network')}")
    assert net.error_kind == "exception" and "unreachable" in net.error.lower(), net


def test_100mb_of_output_is_truncated_with_a_marker():
    code = ("import os\nline = 'x' * 1_000_000\nfor _ in range(100):\n    print(line)\n"
            "for _ in range(100):\n    os.write(1, b'y' * 1_000_000)\nresult = 'done'")
    cap = 65_536
    r = run_python(code, limits=SandboxLimits(output_cap_chars=cap))
    print(f"\nS6: 200 MB printed -> output {len(r.output)} chars, raw {len(r.raw_output)} chars "
          f"in {r.elapsed_s:.2f} s; marker: {r.output.splitlines()[-1]!r}")
    assert r.ok and r.result == "done", r
    assert r.output_truncated and r.raw_output_truncated
    assert len(r.output) <= cap + 80 and len(r.raw_output) <= cap + 80
    assert "truncated: 99934564 more characters" in r.output  # 100 MB + 100 newlines - cap
    assert "truncated: 99934464 more characters" in r.raw_output
    assert r.elapsed_s < 10


def test_os_system_system_files_and_pickle_are_blocked_in_the_child(tmp_path):
    marker = tmp_path / "marker"
    code = f"""
import os, pickle
out = {{}}
def attempt(name, fn):
    try:
        out[name] = "ran: " + repr(fn())[:40]
    except Exception as e:
        out[name] = f"{{type(e).__name__}}: {{e}}"
attempt("system", lambda: os.system("touch {marker}"))
attempt("passwd", lambda: open("/etc/passwd").read())
pd.DataFrame({{"a": [1]}}).to_pickle("frame.pkl")
attempt("read_pickle", lambda: pd.read_pickle("frame.pkl"))
class Payload:
    def __reduce__(self):
        return (os.system, ("touch {marker}",))
attempt("pickle_loads", lambda: pickle.loads(pickle.dumps(Payload())))
import subprocess
attempt("subprocess", lambda: subprocess.run(["id"]))
result = out
"""
    r = run_python(code)
    print("\nS8: " + "; ".join(f"{k}: {v[:50]}" for k, v in (r.result or {}).items()))
    assert r.ok, r
    for key in ("system", "passwd", "read_pickle", "pickle_loads", "subprocess"):
        assert r.result[key].startswith("SandboxViolation") and "not allowed" in r.result[key]
    assert not marker.exists()


def test_no_configured_secret_reaches_the_child(monkeypatch):
    secrets = {"OPENAI_API_KEY": "sk-test-9f3c1e", "WB_API_KEY": "wb-test-77aa01",
               "HF_TOKEN": "hf_test_c0ffee", "AWS_SECRET_ACCESS_KEY": "aws-test-5e5e"}
    for k, v in secrets.items():
        monkeypatch.setenv(k, v)
    r = run_python("import os\nresult = dict(os.environ)")
    assert r.ok, r
    dumped = json.dumps(r.model_dump())
    print(f"\nS9: child environment has {len(r.result)} names: {sorted(r.result)}")
    assert not set(secrets) & set(r.result)
    assert not any(v in dumped for v in secrets.values())
    assert set(r.result) <= {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "OPENBLAS_NUM_THREADS",
                             "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_MAX_THREADS",
                             "ARROW_IO_THREADS", "ARROW_DEFAULT_MEMORY_POOL", "MPLBACKEND"}


def test_result_must_be_json():
    cases = {"result = object()": "non_json", "result = float('nan')": "non_json",
             "result = pd.DataFrame({'a': [1]})": "non_json", "x = 1": "no_result",
             "result = {'n': np.int64(3), 'v': np.arange(3)}": None}
    from concurrent.futures import ThreadPoolExecutor

    big_code = "result = 'x' * 200_000"
    with ThreadPoolExecutor(3) as pool:  # sandboxes run side by side from threads
        runs = dict(zip([*cases, big_code], pool.map(run_python, [*cases, big_code]),
                        strict=True))
    kinds = {code: runs[code].error_kind for code in cases}
    big = runs[big_code]
    print(f"\nS10: {kinds}; 200 kB result -> truncated={big.result_truncated}, preview "
          f"{len(big.result_preview or '')} chars")
    assert kinds == cases
    assert big.ok and big.result is None and big.result_truncated
    assert big.result_preview.endswith("more characters]")
    assert len(big.result_preview) <= 65_536 + 60


def test_code_that_lists_the_import_path_is_not_refused():
    """The child finds its own modules through its folder, then takes the folder off sys.path:
    in a checkout it lies outside what the worker may read, and listing it (pkgutil,
    importlib.metadata, a refreshed import cache) was refused, a false "blocked" line."""
    code = ("import importlib, importlib.metadata, pkgutil, sys; importlib.invalidate_caches();"
            " mods = {m.name for m in pkgutil.iter_modules()};"
            " dists = len(list(importlib.metadata.distributions()));"
            " result = ['pandas' in mods, dists > 0,"
            " any(p.rstrip('/').endswith('dataenv/child') for p in sys.path)]")
    r = run_python(code)
    assert r.ok, r.error
    assert r.blocked == []
    assert r.result == [True, True, False]


# --- SQL -----------------------------------------------------------------------------------------


def test_sqlite_writes_attach_and_vacuum_into_are_denied_with_no_file_created(chinook_copy):
    folder = chinook_copy.parent
    digest = sha256_file(chinook_copy)
    statements = [
        "INSERT INTO Genre VALUES (99, 'x')", "UPDATE Genre SET Name = 'x'",
        "DELETE FROM Genre", "DROP TABLE Genre", "CREATE TABLE t(a)", "CREATE TEMP TABLE t(a)",
        "ALTER TABLE Genre ADD COLUMN z", "REPLACE INTO Genre VALUES (1, 'x')",
        "WITH a AS (SELECT 1) DELETE FROM Genre", f"ATTACH '{folder / 'att.db'}' AS x",
        f"VACUUM INTO '{folder / 'vac.db'}'", "VACUUM", "PRAGMA query_only = 0",
        "PRAGMA writable_schema = 1", "PRAGMA journal_mode = WAL", "PRAGMA user_version = 7",
        "SELECT load_extension('/tmp/x')", "BEGIN", "ANALYZE", "REINDEX"]
    results = {s: run_sql(chinook_copy, s) for s in statements}
    print(f"\nS7: {sum(r.error_kind == 'denied' for r in results.values())}/{len(statements)} "
          f"statements denied; files in the folder afterwards: {sorted(os.listdir(folder))}")
    assert {s: r.error_kind for s, r in results.items()} == dict.fromkeys(statements, "denied")
    assert sorted(os.listdir(folder)) == ["chinook.sqlite"]
    assert sha256_file(chinook_copy) == digest
    # each layer on its own, past the keyword check: the authorizer ...
    denied: list[str] = []
    con = open_readonly(chinook_copy, denied=denied)
    for s in ("INSERT INTO Genre VALUES (99, 'x')", f"ATTACH '{folder / 'att.db'}' AS x",
              f"VACUUM INTO '{folder / 'vac.db'}'", "DROP TABLE Genre"):
        with pytest.raises(sqlite3.DatabaseError, match="not authorized|authorization denied"):
            con.execute(s)
    # ... and, with the authorizer removed, SQLITE_LIMIT_ATTACHED=0 and mode=ro
    con.set_authorizer(None)
    for s, msg in ((f"ATTACH '{folder / 'att.db'}' AS x", "too many attached"),
                   (f"VACUUM INTO '{folder / 'vac.db'}'", "too many attached"),
                   ("INSERT INTO Genre VALUES (99, 'x')", "readonly")):
        with pytest.raises(sqlite3.OperationalError, match=msg):
            con.execute(s)
    con.close()
    assert sorted(os.listdir(folder)) == ["chinook.sqlite"]
    assert sha256_file(chinook_copy) == digest


@pytest.mark.parametrize("deadline", [0.5, 1.0])
def test_runaway_recursive_cte_is_interrupted_at_the_deadline(deadline):
    sql = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
           "SELECT COUNT(*) FROM c")
    r = run_sql(sample_environment("chinook"), sql, SandboxLimits(sql_timeout_s=deadline))
    print(f"\nS7: runaway CTE stopped after {r.elapsed_s:.3f} s (deadline {deadline} s)")
    assert r.error_kind == "timeout", r
    assert abs(r.elapsed_s - deadline) <= 0.1


def test_select_returns_typed_rows_with_a_row_cap(chinook):
    r = run_sql(chinook.db_path, "SELECT TrackId, Name, UnitPrice FROM Track ORDER BY TrackId",
                SandboxLimits(sql_max_rows=50))
    assert r.ok and r.columns == ["TrackId", "Name", "UnitPrice"]
    assert len(r.rows) == 50 and r.truncated
    assert r.rows[0] == [1, "For Those About To Rock (We Salute You)", 0.99]
    small = chinook.run_sql("PRAGMA table_info(Genre)")
    assert [row[1] for row in small.rows] == ["GenreId", "Name"] and not small.truncated
    bad = chinook.run_sql("SELECT * FROM Nope")
    assert bad.error_kind == "sql" and "no such table" in bad.to_observation()


# --- profiles and environments -------------------------------------------------------------------


def test_chinook_profile_finds_11_tables_and_their_foreign_keys(chinook, trajsynth_cache):
    p = chinook.profile
    fks = {(j.from_table, j.from_columns[0], j.to_table, j.to_columns[0])
           for j in p.foreign_keys}
    print(f"\nprofile: {len(p.tables)} tables, {len(p.foreign_keys)} foreign keys, "
          f"{len(p.inferred_joins)} inferred joins, hash {p.content_hash[:12]}")
    assert {t.name: t.row_count for t in p.tables} == CHINOOK_TABLES
    assert fks == CHINOOK_FKS
    assert all(j.containment == 1.0 for j in p.foreign_keys)
    assert p.inferred_joins == []  # every join key is declared; none made up
    assert p.content_hash == sha256_file(sample_environment("chinook"))
    media = p.table("MediaType").column("Name")
    assert media.dictionary and len(media.dictionary) == 5
    price = p.table("Track").column("UnitPrice")
    assert price.kind == "real" and {v.value for v in price.dictionary} == {0.99, 1.99}
    assert p.table("Invoice").column("InvoiceDate").kind == "datetime"
    assert p.table("PlaylistTrack").primary_key == ["PlaylistId", "TrackId"]
    # saved once as JSON; reopening reuses it; a fresh profile is byte-identical
    saved = next(trajsynth_cache.glob("chinook-*/profile.json"))
    assert load_profile(saved) == p
    mtime = saved.stat().st_mtime_ns
    again = DataEnvironment.open(sample_environment("chinook"), cache_dir=trajsynth_cache)
    assert again.profile == p and saved.stat().st_mtime_ns == mtime
    fresh = DataEnvironment.open(sample_environment("chinook"), cache_dir=trajsynth_cache, refresh=True)
    assert fresh.profile.model_dump_json() == p.model_dump_json()


def test_csv_environment_profiles_and_runs_a_join(trajsynth_cache):
    env = DataEnvironment.open(sample_environment("sklearn_classic"), cache_dir=trajsynth_cache)
    p = env.profile
    joins = {(j.from_table, j.from_columns[0], j.to_table, j.to_columns[0], j.cardinality)
             for j in p.inferred_joins}
    assert {t.name: t.row_count for t in p.tables} == {
        "iris_flowers": 150, "iris_species": 3, "linnerud_exercise": 20,
        "linnerud_physiological": 20, "wine_cultivars": 3, "wine_samples": 178}
    assert joins == {("iris_flowers", "species_id", "iris_species", "species_id", "many-to-one"),
                     ("wine_samples", "cultivar_id", "wine_cultivars", "cultivar_id",
                      "many-to-one"),
                     ("linnerud_exercise", "athlete_id", "linnerud_physiological", "athlete_id",
                      "one-to-one")}
    assert p.content_hash == content_hash(sample_environment("sklearn_classic"))
    sql = env.step(Action(kind="sql", code=(
        "SELECT s.species, ROUND(AVG(f.petal_length_cm), 3) FROM iris_flowers f "
        "JOIN iris_species s USING (species_id) GROUP BY s.species ORDER BY s.species")))
    py = env.step(Action(kind="python", code=(
        "m = tables['iris_flowers'].merge(tables['iris_species'], on='species_id')\n"
        "result = m.groupby('species').petal_length_cm.mean().round(3).to_dict()")))
    print(f"\nCSV env: {len(p.tables)} tables, {len(joins)} inferred joins; SQL "
          f"{sql.elapsed_s * 1000:.1f} ms, Python {py.elapsed_s:.2f} s; {py.python.result}")
    assert sql.ok and dict(sql.sql.rows) == IRIS_MEANS
    assert py.ok and py.python.result == IRIS_MEANS
    assert [s.action.kind for s in env.history] == ["sql", "python"]


def test_parquet_folder_runs_with_no_code_change(tmp_path, trajsynth_cache):
    import pandas as pd

    folder = tmp_path / "shop"
    folder.mkdir()
    pd.DataFrame({"customer_id": [1, 2, 3], "country": ["FR", "DE", "FR"]}).to_parquet(
        folder / "customers.parquet")
    pd.DataFrame({"order_id": [10, 11, 12, 13], "customer_id": [1, 1, 3, 2],
                  "amount": [5.0, 7.5, 2.5, 4.0]}).to_parquet(folder / "orders.parquet")
    env = DataEnvironment.open(folder, cache_dir=trajsynth_cache)
    assert [(j.from_table, j.to_table) for j in env.profile.inferred_joins] == \
        [("orders", "customers")]
    sql = env.run_sql("SELECT c.country, SUM(o.amount) FROM orders o JOIN customers c "
                      "USING (customer_id) GROUP BY c.country ORDER BY c.country")
    py = env.run_python("m = tables['orders'].merge(tables['customers'], on='customer_id')\n"
                        "result = m.groupby('country').amount.sum().to_dict()")
    assert sql.rows == [["DE", 4.0], ["FR", 15.0]]
    assert py.ok and py.result == {"DE": 4.0, "FR": 15.0}, py


def test_deep_copied_environment_holds_no_connection(chinook):
    env = copy.deepcopy(chinook)
    env.step(Action(kind="sql", code="SELECT COUNT(*) FROM Genre"))
    t0 = time.perf_counter()
    copies = [copy.deepcopy(env) for _ in range(10_000)]
    per_copy_us = (time.perf_counter() - t0) / len(copies) * 1e6
    copies[0].step(Action(kind="sql", code="SELECT 1"))
    blob = pickle.dumps(env)  # a live sqlite3.Connection cannot be pickled

    def walk(obj, seen):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        assert not isinstance(obj, (sqlite3.Connection, sqlite3.Cursor)), obj
        items = obj.items() if isinstance(obj, dict) else \
            obj if isinstance(obj, (list, tuple, set)) else \
            vars(obj).items() if hasattr(obj, "__dict__") else ()
        for item in items:
            walk(item, seen)

    walk(env, set())
    print(f"\nM4: deepcopy {per_copy_us:.1f} us per copy; pickled env {len(blob)} bytes")
    assert chinook.history == [] and len(env.history) == 1
    assert len(copies[0].history) == 2 and len(copies[1].history) == 1
    assert copies[1].profile is env.profile  # the frozen profile is shared, not copied
    assert pickle.loads(blob).history[0].observation.sql.rows == [[25]]
    assert per_copy_us < 200


def test_bad_environments_are_user_errors(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        DataEnvironment.open(tmp_path / "missing.sqlite", cache_dir=tmp_path)
    text = tmp_path / "notes.sqlite"
    text.write_text("hello")
    with pytest.raises(DataError, match="not a SQLite database"):
        DataEnvironment.open(text, cache_dir=tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="no .csv"):
        DataEnvironment.open(empty, cache_dir=tmp_path)
    assert run_sql(tmp_path / "missing.sqlite", "SELECT 1").error_kind == "open"


SQL_BOMBS = {
    "printf-width": "SELECT " + ", ".join(f"length(printf('%.*c', 2000000000, '{c}'))"
                                          for c in "abcdefghij"),
    "printf-literal-width": "SELECT length(format('%2000000000d', 1))",
    "zeroblob-rows": "WITH RECURSIVE r(n, b) AS (SELECT 1, zeroblob(49000000) UNION ALL "
                     "SELECT n + 1, zeroblob(49000000) FROM r WHERE n < 200) "
                     "SELECT n, length(b) FROM r ORDER BY n DESC",
    "big-sort": "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r "
                "WHERE n < 5000000) SELECT n, hex(randomblob(300)) FROM r ORDER BY 2 LIMIT 3",
    "wide-rows": "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r "
                 "WHERE n < 1000) SELECT n, hex(randomblob(400000)) FROM r",
}
SQL_BOMB_CHILD = r"""
import json, sys, time
from workbench.dataenv.sandbox import SandboxLimits, run_sql
db, sql = sys.argv[1], sys.stdin.read()
limits = SandboxLimits(sql_timeout_s=2.0)
t0 = time.monotonic()
r = run_sql(db, sql, limits)
# VmHWM: this process's own peak (ru_maxrss would carry the forking parent's over exec)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status")
           if line.startswith("VmHWM:"))
print(json.dumps({"seconds": time.monotonic() - t0, "kind": r.error_kind, "error": r.error,
                  "rss_mb": hwm / 1024, "rows": len(r.rows)}))
"""


@pytest.mark.parametrize("name", list(SQL_BOMBS))
def test_sql_bombs_stay_within_time_and_memory(chinook_copy, name):
    """Statements whose cost sits inside one SQLite step (padding in printf, huge blobs) or
    in materialised rows: each ends by its 2 s limit + 1 s, the calling process stays under
    300 MB, and nothing but a result or a one-line error comes back."""
    out = subprocess.run([sys.executable, "-c", SQL_BOMB_CHILD, str(chinook_copy)],
                         input=SQL_BOMBS[name], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert r["seconds"] <= 3.0, r
    assert r["rss_mb"] <= 300, r
    assert r["kind"] in (None, "timeout", "denied", "sql"), r
    if r["error"]:
        assert "\n" not in r["error"]


# --- Python: descriptors, the result channel, disk (issue 25) -------------------------------------


@pytest.mark.parametrize("isolate", [False, True])
def test_dir_fd_escapes_are_refused_in_both_isolation_modes(tmp_path, monkeypatch, isolate):
    """A folder's descriptor plus a relative path (`os.open(name, dir_fd=...)`) wrote outside
    the working folder when only the audit hook stood (isolate=False, uid not dropped): the
    hook saw the relative path as if it were inside. Opening a folder outside is refused."""
    from workbench.dataenv import sandbox

    monkeypatch.setattr(sandbox, "_sandbox_user", lambda: None)  # as when no uid can be dropped
    outside = tmp_path / "outside"
    outside.mkdir()
    code = f"""
import os
fd = os.open({str(outside)!r}, os.O_RDONLY)
w = os.open("planted.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fd)
os.write(w, b"owned")
result = "written"
"""
    r = run_python(code, isolate=isolate)
    print(f"\ndir_fd (isolate={isolate}): {r.error_kind}: {r.error}; {r.isolation}")
    assert r.error_kind == "blocked" and "opening a folder outside" in r.error
    assert r.blocked and not (outside / "planted.txt").exists()
    if isolate:  # the kernel alone (no hook): refused, and reported as blocked
        r = run_python(code, isolate=True, audit_hook=False)
        if not r.isolation.get("filesystem", "").startswith("Landlock"):
            pytest.skip(f"no Landlock here: {r.isolation.get('filesystem')}")
        assert r.error_kind == "blocked" and "PermissionError" in r.error, r
        assert not (outside / "planted.txt").exists()


FORGE = """
import json, os
fake = json.dumps({"kind": "final", "token": "guess", "output": "", "result": 42,
                   "error": None, "error_kind": None, "isolation": {"filesystem": "none"},
                   "blocked": []}) + "\\n"
for fd in range(3, 20):
    try:
        os.write(fd, fake.encode())
    except OSError:
        pass
"""


@pytest.mark.parametrize("isolate", [False, True])
@pytest.mark.parametrize("ending", ["os._exit(0)", "result = 1"])
def test_forged_result_envelopes_are_refused(isolate, ending):
    """Code that writes its own result envelope on the inherited descriptor (then exits, or
    goes on normally) gets a `blocked` error, not its forged result; the isolation reported is
    the one sent before the code ran, and a violation the code caught is still reported."""
    code = ("try:\n    open('/etc/passwd')\nexcept Exception:\n    pass\n" + FORGE + ending)
    r = run_python(code, isolate=isolate)
    print(f"\nforged envelope ({ending}, isolate={isolate}): {r.error_kind}: {r.error}")
    assert r.error_kind == "blocked" and "result channel" in r.error
    assert r.result is None
    assert r.isolation.get("filesystem") != "none" and r.isolation.get("uid")
    assert any("/etc/passwd" in b for b in r.blocked)


def test_disk_use_of_the_working_folder_is_capped():
    """Many files under the per-file limit filled the disk (600 MB in 2.8 s): the parent
    measures the folder every 0.1 s and stops the code past `py_max_disk_mb` or
    `py_max_disk_files`."""
    limits = SandboxLimits(py_max_disk_mb=32, py_timeout_s=60)
    code = """
block = b"x" * (8 << 20)
for i in range(200):
    with open(f"f{i}.bin", "wb") as fh:
        fh.write(block)
result = "wrote 1.6 GB"
"""
    r = run_python(code, limits=limits)
    print(f"\ndisk: {r.error_kind} after {r.elapsed_s} s: {r.error}")
    assert r.error_kind == "disk_limit" and "32 MB" in r.error
    assert r.elapsed_s < 30 and not os.path.exists(r.workdir)
    r = run_python("import os\nfor i in range(100000):\n    open(f'e{i}', 'w').close()\n"
                   "result = 1", limits=SandboxLimits(py_max_disk_files=500))
    assert r.error_kind == "disk_limit" and "500 files" in r.error
    r = run_python("open('small.txt', 'w').write('ok')\nresult = open('small.txt').read()",
                   limits=limits)
    assert r.ok and r.result == "ok"
