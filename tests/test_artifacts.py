"""The declared artifact is the one, typed way to a run's files (issue 45 item 1): its kind
and record type, and the run layout's `read`, `write` and `find` that validate by them."""

import json
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict

from workbench import registry
from workbench.errors import DataError, WorkbenchError
from workbench.records import MCItem
from workbench.registry import Artifact, Pipeline, Stage, kind_of, record_type
from workbench.runs import RunLayout, locate, outputs_at


class Versioned(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[2] = 2
    n: int


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    n: int = 0


TOY = Pipeline(
    name="artifacts_toy", help="toy", run="tests.test_artifacts:_never",
    stages=(Stage("one", outputs=(
        Artifact("rows", "rows.jsonl", "tests.test_artifacts:Row"),
        Artifact("items", "items.jsonl", "MCItem"),
        Artifact("raw", "raw.jsonl"),
        Artifact("report", "sub/report.json", "tests.test_artifacts:Versioned"),
        Artifact("plain", "sub/plain.json"),
        Artifact("notes", "sub/notes.md"),
        Artifact("sub", "sub"),
        Artifact("weights", "w.safetensors"))),
        Stage("per", per="round", outputs=(
            Artifact("round", "rounds/{value}/round.json", "tests.test_artifacts:Row"),))))


def dumps(rows):
    return [r.model_dump() for r in rows]


@pytest.fixture
def toy():
    registry.register(TOY, replace=True)
    yield TOY
    registry.unregister(TOY.name)


def test_kind_is_told_by_the_suffix_or_given():
    assert [kind_of(p) for p in ("a.jsonl", "a/b.json", "r.md", "log.txt", "c.yaml",
                                 "x.png", "m.safetensors", "calls.sqlite", "index", "s.rollouts")
            ] == ["jsonl", "json", "text", "text", "text", "binary", "binary", "binary",
                  "folder", "folder"]
    assert Artifact("a", "a.jsonl").kind == "jsonl"
    assert Artifact("a", "a.data", kind="binary").kind == "binary"
    with pytest.raises(WorkbenchError, match="kind 'csvish'"):
        Artifact("a", "a", kind="csvish")
    with pytest.raises(WorkbenchError, match="record type belongs to a jsonl or json"):
        Artifact("a", "folder", "MCItem")


def test_record_types_resolve_through_one_lookup():
    assert record_type("MCItem") is MCItem
    assert record_type("tests.test_artifacts:Row").__name__ == "Row"
    with pytest.raises(WorkbenchError, match="'Nope' is not a name in workbench.records"):
        record_type("Nope")
    with pytest.raises(WorkbenchError, match="cannot be loaded"):
        record_type("workbench.records:Nope")
    with pytest.raises(WorkbenchError, match="is not a pydantic model"):
        record_type("workbench.records:LETTERS")


def test_every_declared_record_type_resolves():
    for p in registry.pipelines():
        for s in p.stages:
            for a in s.outputs:
                if a.record:
                    assert issubclass(a.record_type(), BaseModel), (p.name, a.name)
                    assert a.kind in ("jsonl", "json"), (p.name, a.name)


def test_jsonl_rows_are_validated_both_ways(toy, tmp_path):
    run = RunLayout.at(tmp_path)
    path = run.write(toy.name, "rows", [Row(id="a", n=1), {"id": "b"}])
    assert path == tmp_path / toy.name / "rows.jsonl"
    assert path.read_text() == '{"id": "a", "n": 1}\n{"id": "b"}\n'
    assert dumps(run.read(toy.name, "rows")) == [{"id": "a", "n": 1}, {"id": "b", "n": 0}]
    # a bad row: nothing written, one line naming the file and the row
    with pytest.raises(DataError, match=r"rows row 2 is not a Row .*nothing written") as e:
        run.write(toy.name, "rows", [{"id": "c"}, {"id": "d", "n": "many"}])
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    assert len(run.read(toy.name, "rows")) == 2
    path.write_text('{"id": "a"}\n{"id": "b", "extra": 1}\n')
    with pytest.raises(DataError) as e:
        run.read(toy.name, "rows")
    assert e.value.line == 2 and str(path) in str(e.value) and "\n" not in str(e.value)
    # rows without a record type are dicts
    run.write(toy.name, "raw", [{"x": 1}])
    assert run.read(toy.name, "raw") == [{"x": 1}]


def test_json_objects_by_their_schema_version(toy, tmp_path):
    run = RunLayout.at(tmp_path)
    path = run.write(toy.name, "report", Versioned(n=3))
    assert json.loads(path.read_text()) == {"schema_version": 2, "n": 3}
    assert run.read(toy.name, "report").model_dump() == {"schema_version": 2, "n": 3}
    path.write_text('{"schema_version": 1, "n": 3}')
    with pytest.raises(DataError, match="schema_version 1 is not 2"):
        run.read(toy.name, "report")
    path.write_text('{"n": 4}')  # written before schema_version existed: reads as this one
    assert run.read(toy.name, "report").n == 4
    with pytest.raises(DataError, match="is not a Versioned"):
        run.write(toy.name, "report", {"n": "x"})
    run.write(toy.name, "plain", {"a": [1, 2]})
    assert run.read(toy.name, "plain") == {"a": [1, 2]}
    assert (tmp_path / toy.name / "sub/plain.json").read_text() == \
        json.dumps({"a": [1, 2]}, indent=2) + "\n"
    run.write(toy.name, "notes", "# hi\n")
    assert run.read(toy.name, "notes") == "# hi\n"
    with pytest.raises(WorkbenchError, match="is a folder; take its path"):
        run.read(toy.name, "sub")
    with pytest.raises(WorkbenchError, match="is a binary; its writer takes its path"):
        run.write(toy.name, "weights", b"")
    with pytest.raises(WorkbenchError, match="declares no output 'nope'"):
        run.artifact(toy.name, "nope")


def test_per_value_artifacts_and_find(toy, tmp_path):
    run = RunLayout.at(tmp_path)
    with pytest.raises(WorkbenchError, match="declared per value; name the value"):
        run.artifact(toy.name, "round")
    with pytest.raises(WorkbenchError, match="not declared per value"):
        run.artifact(toy.name, "rows", "01")
    with pytest.raises(WorkbenchError, match="not one plain name"):
        run.artifact(toy.name, "round", "../x")
    assert run.find(toy.name, "round") == {}
    for v in ("02", "01"):
        run.write(toy.name, "round", Row(id=v), v)
    (tmp_path / toy.name / "rounds" / "03").mkdir()  # a round folder without its file
    found = run.find(toy.name, "round")
    assert list(found) == ["01", "02"]
    assert found["02"] == tmp_path / toy.name / "rounds/02/round.json"
    assert run.find(toy.name, "rows") == {}
    run.write(toy.name, "rows", [])
    assert run.find(toy.name, "rows") == {"": run.artifact(toy.name, "rows")}


def test_outputs_outside_a_run_and_locate(toy, tmp_path):
    out = outputs_at(toy.name, tmp_path / "elsewhere")
    assert out.path("notes") == tmp_path / "elsewhere/sub/notes.md"
    inner = outputs_at(toy.name, tmp_path / "server", under="sub")
    assert inner.path("notes") == tmp_path / "server/notes.md"
    assert inner.path("sub") == tmp_path / "server"
    with pytest.raises(WorkbenchError, match="is not inside"):
        inner.path("rows")
    run = RunLayout.at(tmp_path / "run")
    f = run.write(toy.name, "plain", {})
    assert locate(toy.name, "plain", run) == f
    assert locate(toy.name, "plain", tmp_path / "run") == f
    assert locate(toy.name, "plain", tmp_path / "run" / toy.name) == f
    assert locate(toy.name, "plain", f) == f
