import json
import random
import string

import pytest

from workbench.errors import DataError
from workbench.formats import (
    from_alpaca, from_sharegpt, read_dataset, to_alpaca, to_messages, to_sharegpt,
    validate_dataset, write_dataset,
)
from workbench.io import atomic_write_text, read_jsonl, sha256_file, write_jsonl
from workbench.records import ChatExample, MCItem, QTSASample, Section, read_records


def good(i=0, **kw):
    return {"messages": [{"role": "user", "content": f"q{i}"},
                         {"role": "assistant", "content": f"a{i}"}], **kw}


def write_lines(path, lines):
    path.write_bytes(b"".join(x if isinstance(x, bytes) else (x + "\n").encode() for x in lines))


def test_bad_json_names_line_and_column_and_writes_nothing(tmp_path):
    src = tmp_path / "in.jsonl"
    lines = [json.dumps(good(i)) for i in range(5)]
    lines[2] = '{"messages": [ {"role": "user", "content": "x"}'
    write_lines(src, lines)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DataError) as e:
        examples = read_dataset(src)
        write_dataset(out / "x.jsonl", examples)
    assert "line 3" in str(e.value) or ":3:" in str(e.value)
    assert "column" in str(e.value)
    assert e.value.line == 3 and e.value.code == "bad_json"
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("record,code", [
    ({"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]},
     "unknown_role"),
    ({"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "y"}]},
     "wrong_type"),
    ({"messages": [{"role": "user", "content": "x"}]}, "no_assistant"),
    ({"messages": []}, "empty_messages"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "s"},
                   {"role": "assistant", "content": "y"}]}, "system_not_first"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
                   {"role": "user", "content": "z"}]}, "last_not_assistant"),
    ({"messages": [{"role": "user"}, {"role": "assistant", "content": "y"}]}, "missing_field"),
])
def test_schema_violations_have_codes_and_lines(tmp_path, record, code):
    src = tmp_path / "in.jsonl"
    write_lines(src, [json.dumps(good(0)), json.dumps(record), json.dumps(good(2))])
    with pytest.raises(DataError) as e:
        read_dataset(src, "messages")
    assert e.value.line == 2, str(e.value)
    assert e.value.code == code, str(e.value)


def test_validate_counts_every_problem(tmp_path):
    src = tmp_path / "in.jsonl"
    rows = [json.dumps(good(i)) for i in range(10)]
    rows[1] = json.dumps({"messages": [{"role": "user", "content": 5},
                                       {"role": "assistant", "content": "y"}]})
    rows[4] = "{not json"
    rows[7] = json.dumps({"messages": [{"role": "user", "content": "x"}]})
    write_lines(src, rows)
    n_good, problems = validate_dataset(src)
    assert n_good == 7
    assert [(p.line, p.code) for p in problems] == [(2, "wrong_type"), (5, "bad_json"),
                                                     (8, "no_assistant")]


def test_encodings_bom_crlf_ok_invalid_byte_named(tmp_path):
    src = tmp_path / "in.jsonl"
    body = "\r\n".join(json.dumps(good(i)) for i in range(9)).encode()
    src.write_bytes(b"\xef\xbb\xbf" + body + b"\r\n")
    assert len(read_dataset(src)) == 9
    lines = [json.dumps(good(i)).encode() for i in range(9)]
    lines[6] = lines[6].replace(b"q6", b"q\xff6")
    src.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(DataError) as e:
        read_dataset(src)
    assert e.value.line == 7 and e.value.code == "bad_encoding"


def _random_example(rng: random.Random, i: int) -> ChatExample:
    def text():
        return "".join(rng.choice(string.ascii_letters + " \n\"é中") for _ in range(rng.randint(1, 40)))

    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": text()})
    for _ in range(rng.randint(1, 3)):
        msgs.append({"role": "user", "content": text()})
        a = {"role": "assistant", "content": text()}
        if rng.random() < 0.4:
            a["reasoning_content"] = text()
        msgs.append(a)
    meta = {"source": f"s{i}"} if rng.random() < 0.3 else None
    return ChatExample.model_validate({"messages": msgs, "id": f"ex{i}", "metadata": meta})


def test_format_round_trips_100_records(tmp_path):
    rng = random.Random(0)
    examples = [_random_example(rng, i) for i in range(100)]
    for fmt, fwd, back in [("sharegpt", to_sharegpt, from_sharegpt),
                           ("alpaca", to_alpaca, from_alpaca)]:
        assert [back(fwd(e)) for e in examples] == examples, fmt
        # and through files
        path = tmp_path / f"{fmt}.jsonl"
        write_dataset(path, examples, fmt)
        assert read_dataset(path, fmt) == examples
        assert read_dataset(path, "auto") == examples
        # X -> messages -> X identity on the file level
        rows = read_jsonl(path)
        assert [fwd(back(r)) for r in rows] == rows
    path = tmp_path / "m.jsonl"
    write_dataset(path, examples, "messages")
    assert read_dataset(path) == examples
    assert [to_messages(e) for e in read_dataset(path)] == read_jsonl(path)


def test_sharegpt_roles_are_mapped_and_unknown_rejected(tmp_path):
    ex = from_sharegpt({"conversations": [{"from": "system", "value": "s"},
                                          {"from": "human", "value": "q"},
                                          {"from": "gpt", "value": "a"}]})
    assert [m.role for m in ex.messages] == ["system", "user", "assistant"]
    src = tmp_path / "s.jsonl"
    write_lines(src, [json.dumps({"conversations": [{"from": "human", "value": "q"},
                                                    {"from": "gpt", "value": "a"}]}),
                      json.dumps({"conversations": [{"from": "bot", "value": "q"}]})])
    with pytest.raises(DataError) as e:
        read_dataset(src, "sharegpt")
    assert e.value.line == 2 and e.value.code == "unknown_role"


def test_atomic_write_keeps_previous_file_on_failure(tmp_path):
    path = tmp_path / "data.jsonl"
    write_jsonl(path, [{"a": 1}])
    before = sha256_file(path)

    def rows():
        yield {"a": 2}
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        write_jsonl(path, rows())
    assert sha256_file(path) == before
    assert [p.name for p in tmp_path.iterdir()] == ["data.jsonl"]  # no temp file left
    atomic_write_text(path, "x")
    assert path.read_text() == "x"


def test_domain_records_validate(tmp_path):
    prov = {"section_id": "sec-1", "span_hash": "h", "perspective": "concepts",
            "models": {"writer": "local:smollm2"}, "prompt_version": "rf-v1"}
    s = QTSASample.model_validate({"id": "q1", "kind": "mc", "question": "?",
                                   "options": ["a", "b", "c", "d"], "thinking": "t",
                                   "solution": "s", "answer": "c, a", "provenance": prov})
    assert s.answer == "AC"
    with pytest.raises(ValueError):
        QTSASample.model_validate({**s.to_json(), "options": ["a", "b"]})
    with pytest.raises(ValueError):
        MCItem.model_validate({"id": "m", "question": "?", "options": ["a", "b", "c", "d"],
                               "answer": "E"})
    sec = Section(id=Section.make_id("d", ["A", "B"], 0), doc_id="d", source="x.md",
                  heading_path=["A", "B"], text="t", content_hash="h")
    assert sec.id == Section.make_id("d", ["A", "B"], 0)
    write_jsonl(tmp_path / "s.jsonl", [sec])
    assert read_records(tmp_path / "s.jsonl", Section) == [sec]
    (tmp_path / "bad.jsonl").write_text(json.dumps({**sec.to_json(), "txet": "typo"}) + "\n")
    with pytest.raises(DataError) as e:
        read_records(tmp_path / "bad.jsonl", Section)
    assert "txet" in str(e.value) and e.value.line == 1


TOOL_EXAMPLE = {
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "tool_calls": [
            {"id": "call_1_0", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "call_1_0",
         "name": "get_weather"},
        {"role": "assistant", "content": "It is 21C."}],
    "tools": [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
}


def test_tool_calls_and_results_validate_and_round_trip(tmp_path):
    ex = ChatExample.model_validate(TOOL_EXAMPLE)
    assert ex.messages[1].content is None and ex.messages[1].tool_calls[0].id == "call_1_0"
    assert to_messages(ex) == TOOL_EXAMPLE
    # ShareGPT (LLaMA-Factory's tool layout) and back, lossless both ways
    sg = to_sharegpt(ex)
    assert [t["from"] for t in sg["conversations"]] == ["human", "function_call",
                                                        "observation", "gpt"]
    assert json.loads(sg["conversations"][1]["value"]) == {"name": "get_weather",
                                                           "arguments": {"city": "Paris"}}
    assert json.loads(sg["tools"])[0]["name"] == "get_weather"
    assert from_sharegpt(sg) == ex and to_sharegpt(from_sharegpt(sg)) == sg
    path = tmp_path / "t.jsonl"
    write_dataset(path, [ex], "sharegpt")
    assert read_dataset(path) == [ex]
    with pytest.raises(DataError, match="Alpaca cannot hold tools") as e:
        write_dataset(tmp_path / "a.jsonl", [ex], "alpaca")
    assert e.value.code == "unsupported"


def test_sharegpt_parallel_calls_and_observations_pair_in_order():
    ex = from_sharegpt({"conversations": [
        {"from": "human", "value": "q"},
        {"from": "function_call", "value": json.dumps([{"name": "a", "arguments": {}},
                                                       {"name": "b", "arguments": {"x": 1}}])},
        {"from": "observation", "value": "ra"}, {"from": "observation", "value": "rb"},
        {"from": "gpt", "value": "done"}]})
    calls = ex.messages[1].tool_calls
    assert [c.id for c in calls] == ["call_1_0", "call_1_1"]
    assert [(m.tool_call_id, m.name) for m in ex.messages[2:4]] == [("call_1_0", "a"),
                                                                    ("call_1_1", "b")]
    assert len(json.loads(to_sharegpt(ex)["conversations"][1]["value"])) == 2
    mixed = ChatExample.model_validate({"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "c", "function": {"name": "a", "arguments": "{}"}}]},
        {"role": "tool", "content": "r", "tool_call_id": "c"},
        {"role": "assistant", "content": "ok"}]})
    from workbench.records import RecordError

    with pytest.raises(RecordError, match="both text and tool calls"):
        to_sharegpt(mixed)


@pytest.mark.parametrize("change,code", [
    (lambda m: m[0].update(tool_calls=m[1].pop("tool_calls")), "misplaced_field"),
    (lambda m: m[0].update(tool_call_id="x"), "misplaced_field"),
    (lambda m: m[1].update(tool_calls=[]), "misplaced_field"),
    (lambda m: m[2].update(tool_call_id="call_unknown"), "unknown_tool_call"),
    (lambda m: m[2].pop("content"), "missing_field"),
    (lambda m: m[1]["tool_calls"][0]["function"].pop("name"), "missing_field"),
    (lambda m: m[1]["tool_calls"][0].update(kind="x"), "invalid"),
])
def test_tool_fields_are_checked_with_codes(tmp_path, change, code):
    bad = json.loads(json.dumps(TOOL_EXAMPLE))
    change(bad["messages"])
    src = tmp_path / "in.jsonl"
    write_lines(src, [json.dumps(good(0)), json.dumps(bad)])
    with pytest.raises(DataError) as e:
        read_dataset(src, "messages")
    assert e.value.line == 2 and e.value.code == code, str(e.value)


def test_sharegpt_bad_function_call_is_named():
    with pytest.raises(ValueError, match=r"conversations\.1\.value: a function_call must be"):
        from_sharegpt({"conversations": [{"from": "human", "value": "q"},
                                         {"from": "function_call", "value": "get_weather("}]})


def test_over_long_line_is_reported_with_bounded_memory(tmp_path):
    import tracemalloc

    from workbench.errors import DataError
    from workbench.io import iter_jsonl_raw

    f = tmp_path / "big.jsonl"
    with open(f, "wb") as fh:
        fh.write(b'{"a": 1}\n')
        fh.write(b'{"x": "' + b"y" * (64 * 1024 * 1024) + b'"}\n')
        fh.write(b'{"a": 3}\n')
    tracemalloc.start()
    rows = list(iter_jsonl_raw(f, collect=True, max_line_bytes=1 << 20))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert rows[0] == (1, {"a": 1}) and rows[2] == (3, {"a": 3})
    assert isinstance(rows[1][1], DataError) and rows[1][1].line == 2
    assert peak < 8 * 1024 * 1024  # the 64 MB line is never held whole


def test_torn_last_line_of_a_log_is_skipped_and_reported(tmp_path):
    from workbench.errors import DataError
    from workbench.io import append_line, iter_jsonl_raw

    f = tmp_path / "log.jsonl"
    append_line(f, '{"id": 1}')
    append_line(f, '{"id": 2}')
    with open(f, "ab") as fh:
        fh.write(b'{"id": 3, "act')  # a crash mid-append
    seen = []
    assert [v["id"] for _, v in iter_jsonl_raw(f, torn_tail=seen.append)] == [1, 2]
    assert len(seen) == 1 and seen[0].line == 3
    with pytest.raises(DataError, match=":3:"):  # without the option it is an error
        list(iter_jsonl_raw(f))


def test_a_line_nested_too_deeply_is_one_error_naming_the_file_and_line(tmp_path):
    import pytest

    from workbench.errors import DataError
    from workbench.io import read_jsonl

    p = tmp_path / "deep.jsonl"
    p.write_text('{"a": 1}\n' + "[" * 200_000 + "]" * 200_000 + "\n")
    with pytest.raises(DataError) as e:
        read_jsonl(p)
    assert "line 2" in str(e.value) or e.value.line == 2
    assert "nested too deeply" in str(e.value)
