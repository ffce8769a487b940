import json
import subprocess
import sys
import textwrap

import pytest

from workbench.models import GenerationParams, ScoreRequest, load_model
from workbench.models.cache import CachedModel, CallCache, generation_key

PROMPTS = [[{"role": "user", "content": f"prompt number {i}"}] for i in range(100)]

JOB = textwrap.dedent("""
    import json, sys
    from workbench.models import load_model, GenerationParams
    from workbench.models.cache import CachedModel, CallCache
    die = int(sys.argv[2]) if len(sys.argv) > 2 else None
    inner = load_model("fake", die_after=die)
    model = CachedModel(inner, CallCache(sys.argv[1]), chunk_size=10)
    prompts = [[{"role": "user", "content": f"prompt number {i}"}] for i in range(100)]
    gens = model.generate(prompts, GenerationParams(max_tokens=50))
    print(json.dumps({"calls": inner.calls, "texts": [g.text for g in gens]}))
""")


def run_job(tmp_path, db, die=None):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    args = [sys.executable, str(script), str(db)] + ([str(die)] if die is not None else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def test_killed_after_60_rerun_makes_exactly_40_calls(tmp_path, kill_injection):
    clean = run_job(tmp_path, tmp_path / "clean.sqlite")
    assert clean.returncode == 0, clean.stderr
    reference = json.loads(clean.stdout)
    assert reference["calls"] == 100

    killed = run_job(tmp_path, tmp_path / "resume.sqlite", die=60)
    assert killed.returncode == 137 and killed.stdout == ""
    rerun = run_job(tmp_path, tmp_path / "resume.sqlite")
    out = json.loads(rerun.stdout)
    assert out["calls"] == 40
    assert out["texts"] == reference["texts"]


def test_key_sensitivity_and_batch_independence(tmp_path):
    cache = CallCache(tmp_path / "c.sqlite")
    base = load_model("fake")
    p = GenerationParams(max_tokens=20, temperature=0.7, seed=1)
    CachedModel(base, cache, chunk_size=4).generate(PROMPTS[:20], p)
    for chunk in (1, 7, 20):  # other batch sizes: all hits
        m = CachedModel(load_model("fake"), cache, chunk_size=chunk)
        m.generate(PROMPTS[:20], p)
        assert m.calls_made == 0
    variants = [
        (load_model("fake", name="other-model"), p),
        (load_model("fake"), p.model_copy(update={"temperature": 0.8})),
        (load_model("fake"), p.model_copy(update={"seed": 2})),
        (load_model("fake"), p.model_copy(update={"max_tokens": 21})),
        (load_model("fake"), p.model_copy(update={"stop": ("x",)})),
    ]
    for inner, params in variants:
        m = CachedModel(inner, cache)
        m.generate(PROMPTS[:20], params)
        assert m.calls_made == 20
    changed = [[{"role": "user", "content": c[0]["content"] + "!"}] for c in PROMPTS[:20]]
    m = CachedModel(load_model("fake"), cache)
    m.generate(changed, p)
    assert m.calls_made == 20
    keys = {generation_key("fake:fake", c, p) for c in PROMPTS}
    assert len(keys) == 100


def test_a_continuously_batching_backend_is_handed_several_batches_at_once(tmp_path):
    """llama.cpp's slots take the next conversation as one is done: cut into lockstep chunks
    of its batch size, each chunk waited for its longest reply, and a lockstep agent turn of
    more dialogues than slots evicted one chunk's dialogues from the slots' caches with the
    next's. A lockstep backend still gets chunks of its batch size."""
    from dataclasses import replace

    from workbench.models.cache import CONCURRENT_CHUNKS

    lockstep = load_model("fake", batch_size=4)
    CachedModel(lockstep, CallCache(tmp_path / "a.sqlite")).generate(PROMPTS[:40])
    assert lockstep.batches == [4] * 10
    slots = load_model("fake", batch_size=4)
    slots.capabilities = replace(slots.capabilities, concurrent=True)
    gens = CachedModel(slots, CallCache(tmp_path / "b.sqlite")).generate(PROMPTS[:40])
    assert CONCURRENT_CHUNKS == 4 and slots.batches == [16, 16, 8]
    assert [g.text for g in gens] == [f"echo: prompt number {i}" for i in range(40)]


def test_failures_are_stored_but_never_served(tmp_path):
    cache = CallCache(tmp_path / "c.sqlite")
    flaky = load_model("fake", fail_every=5)
    m = CachedModel(flaky, cache)
    gens = m.generate(PROMPTS[:20])
    assert sum(not g.ok for g in gens) == 4
    assert cache.stats() == {"ok": 16, "failed": 4}
    healthy = load_model("fake")
    m2 = CachedModel(healthy, cache)
    gens = m2.generate(PROMPTS[:20])
    assert m2.calls_made == 4 and all(g.ok for g in gens)
    assert cache.stats() == {"ok": 20, "failed": 0}


WRITER = textwrap.dedent("""
    import sys
    from workbench.models import load_model, GenerationParams
    from workbench.models.cache import CachedModel, CallCache
    w = int(sys.argv[2])
    model = CachedModel(load_model("fake"), CallCache(sys.argv[1]), chunk_size=1)
    prompts = [[{"role": "user", "content": f"writer {w} prompt {i}"}] for i in range(250)]
    model.generate(prompts)
""")


def test_concurrent_writers(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(WRITER)
    db = tmp_path / "c.sqlite"
    CallCache(db)
    procs = [subprocess.Popen([sys.executable, str(script), str(db), str(w)]) for w in range(4)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0, 0]
    import sqlite3

    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT COUNT(*), COUNT(DISTINCT key) FROM calls").fetchone() == (1000,
                                                                                          1000)
    for (value,) in conn.execute("SELECT value FROM calls"):
        assert json.loads(value)["text"].startswith("echo: writer")


@pytest.mark.parametrize("dup", [True])
def test_duplicate_prompts_in_one_batch_call_once(tmp_path, dup):
    m = CachedModel(load_model("fake"), CallCache(tmp_path / "c.sqlite"))
    gens = m.generate([PROMPTS[0], PROMPTS[1], PROMPTS[0]])
    assert m.calls_made == 2 and gens[0].text == gens[2].text


def test_tools_are_part_of_the_key_and_tool_calls_come_back_from_the_cache(tmp_path):
    from workbench.models.messages import ToolSpec

    weather, clock = ToolSpec.of("get_weather"), ToolSpec.of("get_time")
    reply = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    cache = CallCache(tmp_path / "c.sqlite")
    first = CachedModel(load_model("fake", responses=[reply]), cache)
    g = first.generate(PROMPTS[:1], tools=[weather])[0]
    assert first.calls_made == 1 and g.finish_reason == "tool_calls"
    again = CachedModel(load_model("fake", responses=["never called"]), cache)
    hit = again.generate(PROMPTS[:1], tools=[weather.model_dump()])[0]  # dict form, same key
    assert again.calls_made == 0 and hit.cached
    assert hit.tool_calls == g.tool_calls and hit.finish_reason == "tool_calls"
    for tools, choice in [([weather, clock], None), ([clock], None), ([weather], "required"),
                          (None, None)]:
        m = CachedModel(load_model("fake", responses=[reply]), cache)
        m.generate(PROMPTS[:1], tools=tools, tool_choice=choice)
        assert m.calls_made == 1, (tools, choice)
    # without tools, keys are the ones made before tools existed: old caches still hit
    import hashlib

    p = GenerationParams()
    old = {"kind": "generate", "model": "fake:fake", "messages": PROMPTS[0],
           "params": p.model_dump(mode="json")}
    old_key = hashlib.sha256(json.dumps(old, sort_keys=True, ensure_ascii=False,
                                        separators=(",", ":")).encode()).hexdigest()
    assert generation_key("fake:fake", PROMPTS[0], p) == old_key


def _truncated_cache(path, keep):
    """A real cache of 300 rows, cut to `keep` bytes (a disk full or a copy cut short)."""
    full = path.with_name("full.sqlite")
    cache = CallCache(full)
    for i in range(300):
        cache.put(f"k{i}", "generate", "fake:fake", {"text": "x" * 200})
    cache.close()
    data = full.read_bytes()
    path.write_bytes(data[:keep(len(data))])


@pytest.mark.parametrize("damage", ["random bytes", "text file", "truncated header",
                                    "truncated half"])
def test_corrupt_cache_is_moved_aside_and_a_fresh_one_starts(tmp_path, caplog, damage):
    import logging
    import random
    import re

    db = tmp_path / "calls.sqlite"
    if damage == "random bytes":
        db.write_bytes(random.Random(0).randbytes(10_000))
    elif damage == "text file":
        db.write_text("this is not a database\n" * 50)
    else:
        _truncated_cache(db, (lambda n: 60) if damage == "truncated header" else
                         (lambda n: n // 2))
    (tmp_path / "calls.sqlite-wal").write_bytes(b"stale wal")  # never replayed into the new one
    before = db.read_bytes()
    with caplog.at_level(logging.WARNING, logger="workbench.models.cache"):
        cache = CallCache(db)
    names = sorted(p.name for p in tmp_path.glob("calls.sqlite.corrupt-*")
                   if not p.name.endswith(("-wal", "-shm")))
    assert len(names) == 1 and re.fullmatch(r"calls\.sqlite\.corrupt-\d{8}T\d{6}Z", names[0])
    assert (tmp_path / names[0]).read_bytes() == before  # the bytes kept intact, for a look
    assert cache.moved_aside == [tmp_path / names[0]]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and str(db) in warned[0] and names[0] in warned[0]
    # the fresh cache works: a call is stored, and a later run is answered from it
    first = CachedModel(load_model("fake"), cache)
    first.generate(PROMPTS[:3])
    assert first.calls_made == 3 and cache.stats() == {"ok": 3, "failed": 0}
    cache.close()
    later = CachedModel(load_model("fake"), CallCache(db))
    later.generate(PROMPTS[:3])
    assert later.calls_made == 0
    assert [p.name for p in tmp_path.glob("calls.sqlite.corrupt-*")
            if not p.name.endswith(("-wal", "-shm"))] == names  # nothing more moved aside


def test_only_corruption_moves_a_cache_aside(tmp_path):
    import sqlite3

    from workbench.models.cache import _corrupt

    with pytest.raises(sqlite3.OperationalError) as e:
        sqlite3.connect(tmp_path / "x.sqlite").execute("SELECT * FROM missing")
    assert not _corrupt(e.value)  # a query or lock error is not a damaged file
    db = tmp_path / "garbage.sqlite"
    db.write_bytes(b"\0" * 100 + b"x" * 4000)
    with pytest.raises(sqlite3.DatabaseError) as e:
        sqlite3.connect(db).execute("SELECT 1 FROM sqlite_master")
    assert _corrupt(e.value)


@pytest.mark.parametrize("damage", ["folder", "link to /dev/zero"])
def test_a_cache_name_that_is_not_a_file_is_moved_aside(tmp_path, caplog, damage):
    import logging

    db = tmp_path / "calls.sqlite"
    if damage == "folder":
        db.mkdir()
        (db / "inside.txt").write_text("kept")
    else:
        db.symlink_to("/dev/zero")
    with caplog.at_level(logging.WARNING, logger="workbench.models.cache"):
        cache = CallCache(db)
    aside = [p for p in tmp_path.glob("calls.sqlite.corrupt-*")]
    assert len(aside) == 1 and cache.moved_aside == aside
    if damage == "folder":
        assert (aside[0] / "inside.txt").read_text() == "kept"
    else:
        assert aside[0].is_symlink()  # the link moved, its target untouched
    assert sum("moved aside" in r.getMessage() for r in caplog.records) == 1
    first = CachedModel(load_model("fake"), cache)
    first.generate(PROMPTS[:2])
    assert first.calls_made == 2 and db.is_file()


@pytest.mark.parametrize("stored", ["{not json", '{"unexpected": 1}', "[1, 2]"])
def test_a_damaged_row_is_dropped_and_the_call_made_again(tmp_path, caplog, stored):
    import logging
    import sqlite3

    db = tmp_path / "calls.sqlite"
    first = CachedModel(load_model("fake"), CallCache(db))
    want = first.generate(PROMPTS[:2])
    reqs = [ScoreRequest("q", ["a", "b"])]
    want_scores = first.score(reqs)
    first.cache.close()
    con = sqlite3.connect(db)
    con.execute("UPDATE calls SET value=?", (stored,))
    con.commit()
    con.close()
    with caplog.at_level(logging.WARNING, logger="workbench.models.cache"):
        again = CachedModel(load_model("fake"), CallCache(db))
        got = again.generate(PROMPTS[:2])
        scores = again.score(reqs)
    assert [g.text for g in got] == [g.text for g in want] and again.calls_made == 2 + 2
    assert [[s.logprob for s in r] for r in scores] == [[s.logprob for s in r]
                                                        for r in want_scores]
    assert sum("dropped a damaged entry" in r.getMessage() for r in caplog.records) == 4
    third = CachedModel(load_model("fake"), CallCache(db))
    third.generate(PROMPTS[:2])
    assert third.calls_made == 0  # stored again, whole
