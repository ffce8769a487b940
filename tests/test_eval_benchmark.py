"""Bring your own benchmark: the common multiple-choice layouts load as they come, errors name
the file, line and field, and items without provenance evaluate."""

import json

import pytest

from workbench.errors import DataError
from workbench.evaluate.benchmark import load_benchmark
from workbench.evaluate.config import EvalConfig
from workbench.records import MCItem


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def simple(items):
    return [(it.question, it.options, it.answer) for it in items]


def test_mmlu_style_answer_as_index_or_letter(tmp_path):
    f = jsonl(tmp_path / "mmlu.jsonl", [
        {"question": "2+2?", "choices": ["3", "4", "5", "6"], "answer": 1, "subject": "math"},
        {"question": "Sky?", "choices": ["red", "blue"], "answer": "B"},
        {"question": "Ice?", "options": ["cold", "hot", "warm"], "answer": "(a)"},
        {"question": "Zero?", "choices": ["0", "1", "2"], "answer": "0"},
    ])
    items = load_benchmark(f)
    assert simple(items) == [("2+2?", ["3", "4", "5", "6"], "B"), ("Sky?", ["red", "blue"], "B"),
                             ("Ice?", ["cold", "hot", "warm"], "A"),
                             ("Zero?", ["0", "1", "2"], "A")]
    assert [it.id for it in items] == ["mmlu-1", "mmlu-2", "mmlu-3", "mmlu-4"]
    # MMLU's subject travels as the item's subset (the provenance's document), nothing else
    assert [it.provenance.doc_id if it.provenance else None for it in items] == [
        "math", None, None, None]
    assert len(load_benchmark(f, max_items=2)) == 2


def test_arc_layouts(tmp_path):
    hub = jsonl(tmp_path / "arc_hub.jsonl", [
        {"id": "Mercury_1", "question": "Which is a metal?",
         "choices": {"text": ["wood", "iron", "glass", "paper"], "label": ["A", "B", "C", "D"]},
         "answerKey": "B"},
        {"id": "Mercury_2", "question": "Numbered labels?",
         "choices": {"text": ["one", "two", "three"], "label": ["1", "2", "3"]},
         "answerKey": "3"},
    ])
    assert [(it.id, it.answer) for it in load_benchmark(hub)] == [("Mercury_1", "B"),
                                                                  ("Mercury_2", "C")]
    original = jsonl(tmp_path / "ARC-Easy-Test.jsonl", [
        {"id": "x1", "question": {"stem": "Hot?", "choices": [
            {"text": "ice", "label": "A"}, {"text": "fire", "label": "B"}]}, "answerKey": "B"}])
    it, = load_benchmark(original)
    assert (it.question, it.options, it.answer) == ("Hot?", ["ice", "fire"], "B")


def test_our_mcitems_json_array_option_fields_and_text_answers(tmp_path):
    ours = MCItem(id="q1", question="VSWR of a matched line?", options=["0", "1", "2", "inf"],
                  answer="B", difficulty=2,
                  provenance={"section_id": "s1", "span_hash": "h", "doc_id": "d"})
    f = jsonl(tmp_path / "bench.jsonl", [ours.to_json()])
    assert load_benchmark(f) == [ours] == load_benchmark(f, fmt="mcitem")
    arr = tmp_path / "arr.json"
    arr.write_text(json.dumps([{"question": "Q", "A": "x", "B": "y", "C": "z", "answer": "C"},
                               {"question": "R", "option_a": "p", "option_b": "q",
                                "answer": "q"}]))
    assert simple(load_benchmark(arr)) == [("Q", ["x", "y", "z"], "C"), ("R", ["p", "q"], "B")]


def test_csv_layouts(tmp_path):
    (tmp_path / "letters.csv").write_text(
        "id,question,A,B,C,D,answer\nc1,\"Ohm's law, V = ?\",IR,I/R,R/I,I+R,A\n"
        "c2,Three options,x,y,z,,c\n")
    items = load_benchmark(tmp_path / "letters.csv")
    assert simple(items) == [("Ohm's law, V = ?", ["IR", "I/R", "R/I", "I+R"], "A"),
                             ("Three options", ["x", "y", "z"], "C")]
    assert [it.id for it in items] == ["c1", "c2"]
    (tmp_path / "named.csv").write_text("Question,Option_A,Option_B,Option_C,Answer\n"
                                        "q?,a,b,c,1\n")
    assert simple(load_benchmark(tmp_path / "named.csv")) == [("q?", ["a", "b", "c"], "B")]
    (tmp_path / "numbered.tsv").write_text("stem\tchoice1\tchoice2\tlabel\nq?\ta\tb\tb\n")
    assert simple(load_benchmark(tmp_path / "numbered.tsv")) == [("q?", ["a", "b"], "B")]
    # MMLU's own files have no header: question, A, B, C, D, answer
    (tmp_path / "anatomy_test.csv").write_text("What is 1+1?,1,2,3,4,B\nAnd 2+2?,2,3,4,5,C\n")
    items = load_benchmark(tmp_path / "anatomy_test.csv")
    assert simple(items) == [("What is 1+1?", ["1", "2", "3", "4"], "B"),
                             ("And 2+2?", ["2", "3", "4", "5"], "C")]
    assert items[0].id == "anatomy_test-1"


def test_field_map_for_other_names(tmp_path):
    f = jsonl(tmp_path / "custom.jsonl", [
        {"qid": 7, "body": {"stem": "Which?"}, "opts": ["a", "b", "c"], "gold_idx": 2}])
    it, = load_benchmark(f, mapping={"id": "qid", "question": "body.stem", "choices": "opts",
                                     "answer": "gold_idx"})
    assert (it.id, it.question, it.options, it.answer) == ("7", "Which?", ["a", "b", "c"], "C")
    (tmp_path / "custom.csv").write_text("prompt_text,first,second,right\nq?,a,b,b\n")
    it, = load_benchmark(tmp_path / "custom.csv", mapping={
        "question": "prompt_text", "choices": ["first", "second"], "answer": "right"})
    assert (it.options, it.answer) == (["a", "b"], "B")
    cfg = EvalConfig(benchmark=str(f), benchmark_format="mmlu",
                     field_map={"question": "body.stem", "choices": "opts"})
    assert cfg.field_map["choices"] == "opts"
    with pytest.raises(ValueError, match="field_map has unknown keys"):
        EvalConfig(field_map={"stem": "q"})


@pytest.mark.parametrize("row,field,msg", [
    ({"question": "q", "choices": ["a", "b"], "answer": "E"}, "'answer'", "not one of the 2"),
    ({"question": "q", "choices": ["a", "b"], "answer": 2}, "'answer'", "outside 0..1"),
    ({"question": "q", "choices": ["a"], "answer": 0}, "'choices'", "1 options"),
    ({"question": "q", "choices": [str(i) for i in range(11)], "answer": 0}, "'choices'",
     "11 options"),
    ({"question": "q", "choices": ["a", ""], "answer": 0}, "'choices'", "option 2 is empty"),
    ({"question": "", "choices": ["a", "b"], "answer": 0}, "'question'", "missing or empty"),
    ({"question": "q", "answer": 0}, "'choices'", "missing"),
    ({"question": "q", "options": ["a", "b"]}, "'answer'", "missing"),
])
def test_errors_name_file_line_and_field(tmp_path, row, field, msg):
    f = jsonl(tmp_path / "bad.jsonl", [{"question": "fine", "choices": ["a", "b"],
                                        "answer": "A"}, row])
    with pytest.raises(DataError) as e:
        load_benchmark(f)
    text = str(e.value)
    assert text.startswith(f"{f}:2: ") and field in text and msg in text, text


def test_csv_errors_and_limits(tmp_path):
    (tmp_path / "bad.csv").write_text("question,A,B,answer\nq1,a,b,A\nq2,a,b,Z\n")
    with pytest.raises(DataError, match=r"bad\.csv:3: field 'answer'"):
        load_benchmark(tmp_path / "bad.csv")
    (tmp_path / "noq.csv").write_text("Frage,A,B,answer\nq1,a,b,A\n")
    with pytest.raises(DataError, match=r"noq\.csv:1: field 'question': no column named"):
        load_benchmark(tmp_path / "noq.csv")
    ten = ",".join("ABCDEFGHIJ")
    (tmp_path / "ten.csv").write_text(f"question,{ten},answer\nq,{ten},J\n")
    it, = load_benchmark(tmp_path / "ten.csv")
    assert len(it.options) == 10 and it.answer == "J"
    dup = jsonl(tmp_path / "dup.jsonl", [{"id": "a", "question": "q", "choices": ["x", "y"],
                                          "answer": 0}] * 2)
    with pytest.raises(DataError, match="'a' is used by items 1 and 2"):
        load_benchmark(dup)
    with pytest.raises(DataError, match="no benchmark.jsonl"):
        load_benchmark(tmp_path)
    run = tmp_path / "run" / "distill"
    run.mkdir(parents=True)
    jsonl(run / "benchmark.jsonl", [{"id": "a", "question": "q", "options": ["x", "y"],
                                     "answer": "A"}])
    assert load_benchmark(tmp_path / "run")[0].id == "a"


def test_items_without_provenance_evaluate(tmp_path):
    from workbench.evaluate.run import evaluate_conditions
    from workbench.models import load_model

    (tmp_path / "b.csv").write_text("question,A,B,C,D,answer\n" + "".join(
        f"Is {i} even? yes,no,yes,maybe,never,B\n" for i in range(4)))
    items = load_benchmark(tmp_path / "b.csv")
    rows, summary = evaluate_conditions(load_model("fake", responses=["<answer>B</answer>"]),
                                        items, EvalConfig(conditions=["none"]),
                                        log=lambda m: None)
    assert len(rows) == 4 and summary.conditions["none"].n == 4
    assert summary.conditions["none"].generation.accuracy.value == 1.0


def test_letter_scored_under_some_conditions_only(tmp_path):
    """eval.letter_conditions: the letter pass runs under the named conditions only; the
    other conditions are scored in cloze; the headline never takes a formulation some
    conditions lack, and says why."""
    from workbench.evaluate.run import evaluate_conditions
    from workbench.models import load_model

    (tmp_path / "b.csv").write_text("question,A,B,C,D,answer,subject\n" + "".join(
        f"Which is {i}?,{i},x{i},y{i},z{i},A,maths\n" for i in range(6)))
    items = load_benchmark(tmp_path / "b.csv")
    assert {it.provenance.doc_id for it in items} == {"maths"}  # the subject column travels

    def ctx(questions, ranks=None):
        return ["Some retrieved passage."] * len(questions)

    cfg = EvalConfig(conditions=["none", "semantic"], methods=["loglik"],
                     letter_conditions=["none"], hit_vs_miss=False)
    rows, summary = evaluate_conditions(load_model("fake"), items, cfg,
                                        contexts={"semantic": ctx}, log=lambda m: None)
    by = {c: [r for r in rows if r.condition == c] for c in ("none", "semantic")}
    assert all("letter" in r.scores for r in by["none"])
    assert all("letter" not in r.scores and "cloze_norm" in r.scores for r in by["semantic"])
    assert summary.headline.formulation == "cloze_norm"
    assert summary.headline.excluded["letter"].startswith("scored under none only")
