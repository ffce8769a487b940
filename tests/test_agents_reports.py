"""The domain-agent packs' reports as typed records: each pack's report JSON validates against
its model and round-trips byte for byte; a report written before `schema_version` reads; a
broken, foreign or linked report is refused in one line naming the file; one reader per pack
and one dispatcher over the run layout."""

import json
import os

import pytest

from workbench.agent_packs.api import read_report, report_packs, report_path
from workbench.agent_packs.kgv.report import KgvReport
from workbench.agent_packs.kgv.report import read_report as read_kgv
from workbench.agent_packs.kgv.report import trajectory_files
from workbench.agent_packs.kgv.report import write_report as write_kgv
from workbench.agent_packs.litsearch.report import LitsearchReport, dialogues_file
from workbench.agent_packs.litsearch.report import read_report as read_litsearch
from workbench.agent_packs.reports import SCHEMA_VERSION, report_json
from workbench.agent_packs.rf.report import RfReport, condition_rows
from workbench.agent_packs.rf.report import read_report as read_rf
from workbench.errors import DataError, WorkbenchError


def _traj(cid, gold, pred, searches, split="seen"):
    from workbench.agents.steps import AgentStep, AgentTrajectory

    steps = [AgentStep(index=i, turn=i + 1, kind="tool_call", tool="search",
                       arguments={"query": "q"}) for i in range(searches)]
    return AgentTrajectory(id=cid, task_id=cid, messages=[{"role": "user", "content": "q"}],
                           steps=steps, final={"label": pred, "evidence": ["wn-x"]}
                           if pred else None, stop="final" if pred else "max_steps",
                           metadata={"claim": {"label": gold, "split": split,
                                               "evidence": ["wn-x"]}})


def _kgv_results():
    base = [("a", "SUPPORTED", "SUPPORTED", 0, "seen"), ("b", "REFUTED", "SUPPORTED", 1, "seen"),
            ("c", "REFUTED", "REFUTED", 2, "longtail"), ("d", "SUPPORTED", None, 3, "longtail")]
    flip = {"closed_book": set(), "rag": {"b"}, "agent": {"b", "d"}, "agent_sft": {"d"}}
    return {cond: [_traj(i, g, g if i in right else p, s, sp) for i, g, p, s, sp in base]
            for cond, right in flip.items()}


TEACHER = {"runs": 8, "kept": 3, "routes": {"parametric": 1, "search": 2},
           "student": {"steps": 2, "first_loss": 2.5, "last_loss": None}}


def kgv_run(run, teacher=TEACHER):
    out = run / "agent"
    (out / "trajectories").mkdir(parents=True)
    (out / "trajectories" / "rag.timing.json").write_text('{"seconds": 3.0, "claims": 4}')
    results = _kgv_results() if teacher else {
        c: t for c, t in _kgv_results().items() if c != "agent_sft"}
    return write_kgv(out, results, teacher, dev=4, train=8, model="m", searches=6)


def rf_run(run):
    from workbench.agent_packs.rf.api import rf_report
    from workbench.agent_packs.rf.bench import DesignItem

    out = run / "agent"
    out.mkdir(parents=True)
    items = [DesignItem(id=f"i{k}", question="q", answer=10.0, quantity="x", tool="t",
                        family="f") for k in range(4)]
    rows = {"alone": [{"id": f"i{k}", "family": "f", "prediction": p, "tool_calls": 0,
                       "errors": 0} for k, p in enumerate([10.1, 12.0, None, 9.0])],
            "tools": [{"id": f"i{k}", "family": "f", "prediction": 10.0, "tool_calls": 1,
                       "errors": 0, "tool": None if k == 0 else "t"} for k in range(4)]}
    return rf_report(out, items, rows, {"alone": 4.0, "tools": 8.0}, model="m")


def _dialogue(i, ndcg, error=None):
    turns = [{"turn": t, "hit5": 1.0, "mrr": 0.5, "ndcg10": ndcg + 0.1 * t, "error": error,
              "memo_hits": 2 * t, "memo_misses": 3, "choice": "hybrid" if t == 1 else "keep"}
             for t in (1, 2)]
    return {"id": f"ls-{i}", "turns": turns, "seconds": 0.5}


def litsearch_run(run, exports=None, citations=True):
    from workbench.agent_packs.litsearch.api import summarise, write_report

    out = run / "agent"
    out.mkdir(parents=True)
    s = {"query_only": summarise([_dialogue(i, 0.2) for i in range(3)]),
         "fixed": summarise([_dialogue(i, 0.4, "bad node" if i == 0 else None)
                             for i in range(3)])}
    exports = {"sft": 2, "preferences": 9} if exports is None else exports
    return write_report(out, s, exports, dev=3, turns=2, model="m", citations=citations)


PACKS = {"kgv": (kgv_run, KgvReport, read_kgv), "rf": (rf_run, RfReport, read_rf),
         "litsearch": (litsearch_run, LitsearchReport, read_litsearch)}


@pytest.mark.parametrize("pack", list(PACKS))
def test_each_report_is_a_typed_record_that_round_trips(tmp_path, pack):
    """The writer returns the record it wrote; the file validates against the model, reads
    back through the pack's reader and the dispatcher, and dumps to the same bytes."""
    make, model, reader = PACKS[pack]
    run = tmp_path / "run"
    written = make(run)
    path = report_path(run, pack)
    text = path.read_text()
    assert isinstance(written, model) and report_json(written) == text
    data = json.loads(text)
    assert data["schema_version"] == SCHEMA_VERSION
    model.model_validate(data)
    for rep in (reader(run), reader(path), read_report(run, pack)):
        assert isinstance(rep, model) and rep.schema_version == SCHEMA_VERSION
        assert report_json(rep) == text
    assert report_packs(run) == [pack]


def test_typed_fields_of_each_report(tmp_path):
    kgv_run(tmp_path / "k")
    rf_run(tmp_path / "r")
    litsearch_run(tmp_path / "l")
    kgv = read_kgv(tmp_path / "k")
    rag = kgv.conditions["rag"]["all"]
    assert rag.n == 4 and rag.accuracy == 0.75 and 0 <= rag.accuracy_ci95.low <= 0.75
    assert rag.predictions.none == 1 and rag.routes.parametric.n == 1
    assert set(kgv.conditions["agent"]) == {"all", "seen", "longtail"}
    assert kgv.paired_vs_rag["agent"].only_this == 1 and kgv.paired_vs_rag["agent"].vs == "rag"
    assert kgv.teacher.student.last_loss is None and kgv.seconds_per_claim == {"rag": 0.75}
    assert set(kgv.macro_f1()) == {"closed_book", "rag", "agent", "agent_sft"}
    assert [p.stem for p in trajectory_files(tmp_path / "k")] == []  # none written here

    rf = read_rf(tmp_path / "r")
    assert rf.accuracy() == {"alone": 0.25, "tools": 1.0}
    assert rf.conditions["tools"].right_tool == 3 and rf.conditions["alone"].right_tool is None
    assert rf.conditions["tools"].tool_chosen == {"null": 1, "t": 3}  # no tool: JSON null
    assert rf.paired["tools vs alone"].p == 0.25
    assert "right_tool" not in json.loads(report_path(tmp_path / "r", "rf").read_text())[
        "conditions"]["alone"]  # written for the tools condition only, as before
    assert condition_rows(tmp_path / "r", "tools") == tmp_path / "r" / "agent" / "rf_tools.jsonl"

    ls = read_litsearch(tmp_path / "l")
    value, ci = ls.conditions["fixed"].final("ndcg10")
    assert value == pytest.approx(0.6) and ci.low <= value <= ci.high
    assert ls.conditions["fixed"].execution_error_rate == pytest.approx(2 / 6)  # 2 turns
    assert ls.exports.sft == 2 and ls.citations is True and ls.ndcg10()["query_only"] > 0
    assert dialogues_file(tmp_path / "l", "fixed") == \
        tmp_path / "l" / "agent" / "litsearch_fixed.jsonl"


def test_a_kgv_report_without_a_student_writes_an_empty_teacher(tmp_path):
    rep = kgv_run(tmp_path, teacher={})
    assert rep.teacher is None
    data = json.loads(report_path(tmp_path, "kgv").read_text())
    assert data["teacher"] == {} and "agent_sft" not in data["conditions"]
    assert read_kgv(tmp_path).teacher is None
    assert "## Teacher and student" not in (tmp_path / "agent" / "report.md").read_text()


def test_litsearch_exports_stay_as_written(tmp_path):
    """Exports the stage did not record are left out of the JSON, as before ({} stays {})."""
    litsearch_run(tmp_path, exports={}, citations=False)
    data = json.loads(report_path(tmp_path, "litsearch").read_text())
    assert data["exports"] == {} and data["citations"] is False
    rep = read_litsearch(tmp_path)
    assert rep.exports.sft is None and report_json(rep) == \
        report_path(tmp_path, "litsearch").read_text()


@pytest.mark.parametrize("pack", list(PACKS))
def test_a_report_written_before_schema_version_reads(tmp_path, pack):
    make, model, reader = PACKS[pack]
    make(tmp_path)
    path = report_path(tmp_path, pack)
    data = json.loads(path.read_text())
    del data["schema_version"]
    if pack == "litsearch":
        del data["citations"]  # reports before libraries without citations: citations on
    path.write_text(json.dumps(data, indent=1) + "\n")
    rep = reader(tmp_path)
    assert rep.schema_version == SCHEMA_VERSION
    dumped = json.loads(report_json(rep))
    assert dumped.pop("schema_version") == SCHEMA_VERSION
    if pack == "litsearch":
        assert dumped.pop("citations") is True
    assert dumped == data  # every key and value as the old file has them


BROKEN = {
    "bad JSON": (lambda p: p.write_text('{"items": 4,'), "bad JSON at line 1"),
    "not an object": (lambda p: p.write_text("[1, 2]"), "holds a JSON list"),
    "a newer schema": (lambda p: p.write_text(json.dumps(
        {**json.loads(p.read_text()), "schema_version": 2})), "schema_version 2 is not 1"),
    "a missing field": (lambda p: p.write_text(json.dumps(
        {k: v for k, v in json.loads(p.read_text()).items() if k != "conditions"})),
        "conditions: missing field"),
    "a wrong type": (lambda p: p.write_text(json.dumps(
        {**json.loads(p.read_text()), "model": ["x"]})), "model: Input should be a valid "
                                                           "string"),
    "an unknown field": (lambda p: p.write_text(json.dumps(
        {**json.loads(p.read_text()), "surprise": 1})), "surprise: Extra inputs"),
    "missing": (lambda p: p.unlink(), "no report here"),
    "a folder": (lambda p: (p.unlink(), p.mkdir()), "not a regular file"),
    "a link": (lambda p: (p.rename(p.with_suffix(".real")), p.symlink_to(p.with_suffix(
        ".real"))), "is a link"),
    "a FIFO": (lambda p: (p.unlink(), os.mkfifo(p)), "not a regular file"),
}


@pytest.mark.parametrize("pack", list(PACKS))
@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_report_is_refused_in_one_line_naming_the_file(tmp_path, pack, case):
    make, _, reader = PACKS[pack]
    make(tmp_path)
    path = report_path(tmp_path, pack)
    breaks, expect = BROKEN[case]
    breaks(path)
    for read in (lambda: reader(tmp_path), lambda: read_report(tmp_path, pack)):
        with pytest.raises(DataError) as e:
            read()
        msg = str(e.value)
        assert str(path) in msg and expect in msg and "\n" not in msg, msg


def test_the_dispatcher_names_an_unknown_pack_and_a_run_without_reports(tmp_path):
    with pytest.raises(WorkbenchError, match="unknown agent pack 'nope'"):
        read_report(tmp_path, "nope")
    assert report_packs(tmp_path) == []
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "rf_report.json").symlink_to(tmp_path / "elsewhere.json")
    assert report_packs(tmp_path) == ["rf"]  # listed; its reader refuses the link
    with pytest.raises(DataError, match="is a link"):
        read_report(tmp_path, "rf")
