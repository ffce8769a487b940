"""Property-based tests (hypothesis): the JSONL reader, the dataset and record loaders and the
config overrides take arbitrary input and end either in a result or in the repo's own error
(DataError naming a 1-based line, ConfigError on one line), never another exception; valid
files round-trip exactly (docs/reliability.md: the fuzzing rows of issue 10); the server's
checks of request text and caller schemas take any body (issue 46)."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from test_serve_hardening import _encoded, _places, _plant

from workbench.config import experiment_config_model, load_config
from workbench.errors import DataError, WorkbenchError
from workbench.formats import read_dataset, validate_dataset, write_dataset
from workbench.io import iter_jsonl_raw, write_jsonl
from workbench.records import ChatExample, read_records
from workbench.serve.limits import MAX_SCHEMA_DEPTH, unencodable_text
from workbench.serve.schemas import bounded_pattern, bounded_schema

FUZZ = settings(max_examples=250, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

# ------------------------------------------------------------------ JSONL: arbitrary bytes

KEYS = ["messages", "conversations", "instruction", "input", "output", "history", "system",
        "tools", "role", "content", "from", "value", "tool_calls", "tool_call_id", "name",
        "reasoning_content", "id", "metadata", "function", "arguments", "type"]
JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(),
                         st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=12), st.sampled_from(["user", "assistant", "system",
                                                                "tool", "human", "gpt"]))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), inner, max_size=5)),
    max_leaves=20)
LINE_PIECES = st.one_of(
    st.binary(max_size=40),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    JSON_VALUES.map(lambda v: json.dumps(v, ensure_ascii=False).encode()),
    st.sampled_from([b"", b" ", b"\xef\xbb\xbf", b"\r", b"{", b"}", b"\xff\xfe", b"\x00",
                     b'{"messages": [', b"\xc3", b"NaN", b"[]", b"null"]))
FILES = st.one_of(
    st.binary(max_size=400),
    st.lists(st.lists(LINE_PIECES, min_size=1, max_size=3).map(b"".join), max_size=8).map(
        lambda lines: b"\n".join(lines)),
    st.lists(st.lists(LINE_PIECES, min_size=1, max_size=3).map(b"".join), max_size=8).map(
        lambda lines: b"\r\n".join(lines) + b"\r\n"))


def _lines(data: bytes) -> int:
    return data.count(b"\n") + 1


def _check_error(e: DataError, data: bytes, path: Path) -> None:
    assert isinstance(e.line, int) and 1 <= e.line <= _lines(data), (e.line, str(e))
    assert str(e).startswith(f"{path}:{e.line}: ")
    assert len(str(e).splitlines()) == 1, str(e)


@FUZZ
@given(data=FILES, cap=st.sampled_from([None, 8, 64]))
def test_jsonl_reader_takes_any_bytes(tmp_path, data, cap):
    """Every reading mode of `iter_jsonl_raw` on arbitrary bytes: rows or a DataError that
    names a line of the file; `collect` never raises and lists problems in line order."""
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(data)
    try:
        rows = list(iter_jsonl_raw(path, max_line_bytes=cap))
        assert all(1 <= n <= _lines(data) for n, _ in rows)
    except DataError as e:
        _check_error(e, data, path)
    collected = list(iter_jsonl_raw(path, collect=True, max_line_bytes=cap))
    numbers = [n for n, _ in collected]
    assert numbers == sorted(set(numbers))
    for _, v in collected:
        if isinstance(v, DataError):
            _check_error(v, data, path)
    torn: list[DataError] = []
    try:
        list(iter_jsonl_raw(path, torn_tail=torn.append, max_line_bytes=cap))
    except DataError as e:
        _check_error(e, data, path)
    for e in torn:  # only ever the last line, cut short (no newline after it)
        _check_error(e, data, path)
        assert not data.endswith(b"\n") and e.line == _lines(data)


@FUZZ
@given(data=FILES)
def test_dataset_and_record_loaders_take_any_bytes(tmp_path, data):
    """The dataset reader (every format), the validator and the record loader: records, or
    DataErrors naming lines of the file; never another exception."""
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(data)
    for read in (read_dataset, lambda p: read_records(p, ChatExample),
                 lambda p: read_dataset(p, "sharegpt"), lambda p: read_dataset(p, "alpaca")):
        try:
            read(path)
        except DataError as e:
            _check_error(e, data, path)
    # the validator agrees with the reader: a file the reader takes whole has no problems
    # and as many good records; a file it refuses has that line among the problems
    try:
        n, first_bad = len(read_dataset(path)), None
    except DataError as e:
        n, first_bad = None, e.line
    good, problems = validate_dataset(path)
    for e in problems:
        _check_error(e, data, path)
    if first_bad is None:
        assert problems == [] and good == n, (good, n, [str(p) for p in problems])
    else:
        assert min(p.line for p in problems) == first_bad, ([str(p) for p in problems],
                                                             first_bad)
    assert good + len({p.line for p in problems}) <= _lines(data)


# ------------------------------------------------------------------ valid records + junk lines

TEXT = st.text(max_size=30)  # any code point but surrogates: newlines, NUL, emoji, RTL marks


@st.composite
def examples(draw) -> ChatExample:
    turns = []
    if draw(st.booleans()):
        turns.append({"role": "system", "content": draw(TEXT)})
    for _ in range(draw(st.integers(1, 3))):
        turns.append({"role": "user", "content": draw(TEXT)})
        answer = {"role": "assistant", "content": draw(TEXT)}
        if draw(st.booleans()):
            answer["reasoning_content"] = draw(TEXT)
        turns.append(answer)
    row: dict = {"messages": turns}
    if draw(st.booleans()):
        row["id"] = draw(TEXT)
    if draw(st.booleans()):
        row["metadata"] = draw(st.dictionaries(st.text(max_size=8), JSON_SCALARS, max_size=3))
    return ChatExample.model_validate(row)


JUNK = st.one_of(
    st.text(min_size=1, max_size=20).map(lambda t: ("{" + t).replace("\n", " ").encode()),
    st.sampled_from([b"[1, 2]", b"42", b'"just a string"', b"null", b'{"messages": []}',
                     b'{"messages": [{"role": "robot", "content": "x"}]}',
                     b'{"messages": [{"role": "user", "content": "q"}]}',
                     b'{"messages": "not a list"}', b'{"conversations": 5}', b"\xff\xfe{}",
                     b'{"messages": [{"role": "assistant", "content": 7}]}', b"{}"]))


@FUZZ
@given(rows=st.lists(st.one_of(examples(), JUNK, st.just(b"   ")), max_size=10))
def test_valid_records_among_junk_lines(tmp_path, rows):
    """Valid records interleaved with junk (and blank) lines: the reader stops at the first
    junk line by its number, the validator lists exactly the junk lines and counts the good
    ones; without junk the records come back exactly as written."""
    path = tmp_path / "mixed.jsonl"
    lines = [r if isinstance(r, bytes) else
             json.dumps(r.model_dump(mode="json", exclude_none=True), ensure_ascii=False).encode()
             for r in rows]
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    junk = [i for i, r in enumerate(rows, start=1) if isinstance(r, bytes) and r.strip()]
    good = [r for r in rows if isinstance(r, ChatExample)]
    if junk:
        with pytest.raises(DataError) as e:
            read_dataset(path)
        assert e.value.line == junk[0], str(e.value)
    else:
        assert read_dataset(path) == good
    n_good, problems = validate_dataset(path)
    assert n_good == len(good) and [p.line for p in problems] == junk


@FUZZ
@given(records=st.lists(examples(), max_size=6),
       values=st.lists(st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4),
                       max_size=6))
def test_valid_files_round_trip_exactly(tmp_path, monkeypatch, records, values):
    """What the writers write, the readers give back: equal records, equal JSON values, and
    writing the read records again gives the same bytes."""
    import os

    monkeypatch.setattr(os, "fsync", lambda fd: None)  # durability is not under test here
    path = tmp_path / "round.jsonl"
    write_dataset(path, records)
    back = read_dataset(path)
    assert back == records
    first = path.read_bytes()
    write_dataset(path, back)
    assert path.read_bytes() == first
    raw = tmp_path / "values.jsonl"
    assert write_jsonl(raw, values) == len(values)
    assert [v for _, v in iter_jsonl_raw(raw)] == values


# ------------------------------------------------------------------ config overrides

def _key_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        out.append(prefix + name)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.extend(_key_paths(ann, f"{prefix}{name}."))
    return out


KEY_PATHS = _key_paths(experiment_config_model())
SEGMENT = st.one_of(st.sampled_from(sorted({p.split(".")[-1] for p in KEY_PATHS})),
                    st.text(max_size=6))
KEYS_ANY = st.one_of(st.sampled_from(KEY_PATHS), st.text(max_size=15),
                     st.lists(SEGMENT, min_size=1, max_size=4).map(".".join),
                     st.sampled_from(["", ".", "..", " ", "=", "a..b", ".name", "name.",
                                      "models.chat.spec.x", "seed.x"]))
VALUES_ANY = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", "1", "-1", "0", "1e400", "-1e400", ".inf", ".nan", "0x10", "true",
                     "null", "~", "[1, 2]", "{a: 1}", "[", "{", "'", '"', "&a [*a]",
                     "!!python/object/apply:os.system ['true']", "!!binary aGVsbG8=",
                     "2024-01-01", "12:30:00", "9" * 400, "[" * 200, "{a: " * 100,
                     "- a\n- b", "a: b: c", "\x00", "é", "../../etc/passwd", "/abs/path",
                     "x\ny", "%", "@", "`", "[" * 3000 + "]" * 3000, "- " * 3000 + "1",
                     "{a: " * 2000 + "1" + "}" * 2000, "a\u2028b", "\x85", "\x0b"]),
    JSON_VALUES.map(json.dumps))
OVERRIDES = st.lists(st.one_of(st.tuples(KEYS_ANY, VALUES_ANY).map("=".join),
                               st.text(max_size=15)), min_size=1, max_size=3)


@FUZZ
@given(overrides=OVERRIDES)
def test_any_overrides_give_a_config_or_one_line_error(overrides):
    """`-s key=value` with arbitrary keys and values: a valid config, or a WorkbenchError
    whose message is one line; never another exception."""
    try:
        cfg = load_config(None, overrides, environ={})
    except WorkbenchError as e:
        assert len(str(e).splitlines()) == 1, str(e)  # no \n, \r, \x0b, \x85, \u2028 either
    else:
        assert isinstance(cfg, experiment_config_model())


@FUZZ
@given(key=st.sampled_from(KEY_PATHS), value=VALUES_ANY)
def test_overrides_of_real_keys(key, value):
    """Every real key with arbitrary values (the validators of each section see them)."""
    try:
        load_config(None, [f"{key}={value}"], environ={})
    except WorkbenchError as e:
        assert len(str(e).splitlines()) == 1, str(e)


def test_key_paths_cover_the_sections():
    assert {"name", "seed", "models.chat.spec", "generation.max_tokens"} <= set(KEY_PATHS)
    assert any(p.startswith("train.") for p in KEY_PATHS) or len(KEY_PATHS) > 20
    assert all(c in string.printable for p in KEY_PATHS for c in p)


# ------------------------------------------------------------------ server: request text, schemas

def _nest(value, depth: int, kind: int):
    for i in range(depth):
        value = [value] if (kind >> (i % 8)) & 1 else {"k": value}
    return value


@FUZZ
@given(value=JSON_VALUES, depth=st.integers(0, 300), kind=st.integers(0, 255),
       pick=st.integers(0, 10**6), at=st.integers(0, 30),
       char=st.integers(0xD800, 0xDFFF).map(chr),
       how=st.sampled_from(["escaped", "utf-8", "utf-8-sig", "utf-16", "utf-16-le",
                            "utf-16-be", "utf-32"]))
def test_the_server_finds_a_lone_surrogate_anywhere_by_its_path(value, depth, kind, pick, at,
                                                               char, how):
    """`workbench serve`'s one check of request text (issue 46): a JSON body, in any encoding
    the routes read, with a lone surrogate put into any one of its strings or keys at any
    depth, is refused naming exactly that place; the same body without it is not."""
    body = {"prompt": _nest(value, depth, kind), "note": "a\\ud800 is text"}
    assert unencodable_text(_encoded(body, how)) is None
    places = list(_places(body))
    field = _plant(places[pick % len(places)], at, char)
    found = unencodable_text(_encoded(body, how))
    assert found is not None and found[0] == field, (found, field)
    assert "lone UTF-16 surrogate" in found[1] and found[1].isascii()


@FUZZ
@given(value=JSON_VALUES, depth=st.integers(0, 900), kind=st.integers(0, 255),
       text=st.text(max_size=300) | st.builds(lambda a, n: a * n, st.sampled_from(
           ["(", ")", "[", "|", '"', "\\", "[(", "{", "/"]), st.integers(0, 5_000)))
def test_schema_and_pattern_bounds_take_any_input(value, depth, kind, text):
    """The server's bounds on caller schemas, regexes and grammars (issue 46) measure any
    input, however deep, without raising: a problem naming its limit, or None; a schema
    deeper than the depth limit is always refused."""
    schema = _nest(value, depth, kind)
    problem = bounded_schema(schema)
    assert problem is None or "limit of" in problem
    if depth > MAX_SCHEMA_DEPTH:
        assert problem is not None and f"depth limit of {MAX_SCHEMA_DEPTH}" in problem, problem
    for grammar in (False, True):
        problem = bounded_pattern(text, grammar)
        assert problem is None or "limit of" in problem
