"""The distillation pipeline end to end with scripted teachers through the fake backend."""

import hashlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from conftest import REPO
from workbench.distill.config import AgentModel, DistillConfig
from workbench.distill.export import to_chat
from workbench.distill.pipeline import run_distill
from workbench.distill.quality import (
    balance_letters, difficulty, near_duplicates, split_sections,
)
from workbench.errors import WorkbenchError
from workbench.formats import read_dataset
from workbench.records import MCItem, QTSASample, Section, read_records

TEACHER = AgentModel(spec="fake", options={"script": "fake_teacher:reply"})
sys.path.insert(0, str(Path(__file__).parent))


def cfg(**kw):
    base = dict(max_sections=10, verifier={"method": "generate"}, benchmark_fraction=0.3,
                corpus="datasets/rf", domain="rf")
    base.update(kw)
    return DistillConfig(**base)


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    return run_distill(cfg(mode="single"), tmp_path_factory.mktemp("d") / "run",
                       default_model=TEACHER, seed=3)


def test_single_mode_outputs_and_provenance(single_run):
    res = single_run
    assert res.report.accepted.mc > 20 and res.report.accepted.nd > 10
    for s in res.samples:  # provenance on 100% of records
        p = s.provenance
        assert p.section_id and p.span_hash and p.perspective and p.prompt_version
        assert p.models["writer"] == "fake:fake" and p.models["answerer"] == "fake:fake"
        assert p.domain == "rf" and 1 <= s.difficulty <= 5
    mc = read_records(res.run_dir / "mcQTSA.jsonl", QTSASample)
    assert all(len(s.options) == 4 and s.answer in "ABCD" for s in mc)
    bench = read_records(res.run_dir / "benchmark.jsonl", MCItem)
    assert bench and all(b.provenance.section_id for b in bench)
    md = (res.run_dir / "report.md").read_text()
    for needle in ("Yield per stage", "Rejects by reason", "verifier", "gold letters",
                   "difficulty", "per accepted sample"):
        assert needle in md


def test_leakage_guard_zero_overlap(single_run):
    res = single_run
    bench_secs = {b.provenance.section_id for b in read_records(
        res.run_dir / "benchmark.jsonl", MCItem)}
    train = [s for s in res.samples if s.split == "train"]
    assert train and not ({s.provenance.section_id for s in train} & bench_secs)
    sections = read_records(res.run_dir / "sections.jsonl", Section)
    h = {s.id: s.content_hash for s in sections}
    assert not ({h[s.provenance.section_id] for s in train} & {h[x] for x in bench_secs})
    exported = read_dataset(res.run_dir / "sft" / "instruct_mixed.messages.jsonl")
    assert {e.metadata["section_id"] for e in exported}.isdisjoint(bench_secs)


def test_split_removes_repeated_passages():
    secs = [Section(id=f"s{i}", doc_id="d", source="x", text=f"text {i % 5}",
                    content_hash=f"h{i % 5}") for i in range(20)]
    train, bench, removed = split_sections(secs, benchmark_fraction=0.2, seed=0)
    assert {s.id for s in train}.isdisjoint({s.id for s in bench})
    assert {s.content_hash for s in train}.isdisjoint({s.content_hash for s in bench})
    assert removed > 0 and len(train) + len(bench) + removed == 20


def test_letter_balance_near_uniform():
    items = [([f"right {i}", f"w1 {i}", f"w2 {i}", f"w3 {i}"], "A") for i in range(101)]
    out = balance_letters(items, seed=1)
    counts = Counter(g for _, g in out)
    assert max(counts.values()) - min(counts.values()) <= 1
    for (opts, gold), (orig, _) in zip(out, items):
        assert sorted(opts) == sorted(orig) and opts["ABCD".index(gold)] == orig[0]


def test_dedup_minhash_and_embedding(embedder):
    qs = ["What is the characteristic impedance of a lossless coaxial line?",
          "What is the characteristic impedance of a lossless coaxial line ?",
          "Why is the LNA placed right after the antenna?",
          "what is the characteristic impedance of a lossless coaxial line",
          "How does a Doherty amplifier keep efficiency at back-off?"]
    assert near_duplicates(qs, threshold=0.7) == [1, 3]
    assert near_duplicates(qs, threshold=0.95, method="embedding", embedder=embedder) == [1, 3]


def test_difficulty_heuristic():
    assert difficulty("What is Z0?", "It is the line impedance.") == 1
    hard = difficulty(
        "Compute the cascaded noise figure of an LNA with 1.5 dB noise figure and 15 dB gain "
        "followed by a mixer with 10 dB noise figure using the Friis formula, and explain how "
        "the image rejection and phase noise of the receiver change the noise figure budget.",
        "First convert to ratios: F1 = 1.41, G1 = 31.6. Then F = 1.41 + 9/31.6 = 1.70. "
        "Therefore NF = 2.3 dB. " * 3, "First, second, then, therefore.",
        ["noise figure", "friis", "image rejection", "phase noise"])
    assert hard == 5


def test_verifier_rejects_or_flags_wrong_gold(tmp_path):
    # a verifier that always answers "D" disagrees with most gold letters
    wrong = AgentModel(spec="fake", options={"name": "always-d", "responses": ["D"]})
    c = cfg(mode="single", models={"verifier": wrong.model_dump()})
    res = run_distill(c, tmp_path / "r", default_model=TEACHER)
    v = res.report.verifier.model_dump()
    assert v["checked"] > 0 and 0 < v["agreed"] < v["checked"]
    assert {s.answer for s in res.samples if s.kind == "mc"} == {"D"}
    assert res.report.rejects["verifier_disagrees"] == v["checked"] - v["agreed"]
    c2 = cfg(mode="single", verifier={"method": "generate", "on_disagree": "flag"},
             models={"verifier": wrong.model_dump()})
    res2 = run_distill(c2, tmp_path / "r2", default_model=TEACHER)
    assert "verifier_disagrees" not in res2.report.rejects
    assert sum("verifier_disagrees" in s.flags for s in res2.samples) > 0


def test_composed_mode_builds_valid_items(tmp_path):
    res = run_distill(cfg(mode="composed", verifier={"enabled": False}), tmp_path / "c",
                      default_model=TEACHER)
    mc = [s for s in res.samples if s.kind == "mc"]
    assert mc and all(len(set(s.options)) == 4 for s in mc)
    assert all(s.solution.startswith(f"The correct option is {s.answer}") for s in mc)


def test_garbage_model_and_bad_input_are_counted_not_crashes(tmp_path):
    bad = AgentModel(spec="fake", options={"script": "fake_teacher:garbage"})
    res = run_distill(cfg(mode="single"), tmp_path / "g", default_model=bad)
    assert res.report.accepted.total == 0
    assert sum(res.report.rejects.values()) == res.report.stages["tasks"]
    assert (tmp_path / "g" / "report.md").exists()
    secs = [Section(id="short", doc_id="d", source="x", text="Too short.", content_hash="a"),
            Section(id="long", doc_id="d", source="x", content_hash="b",
                    text="\n\n".join(["A paragraph about reflection and VSWR. " * 8] * 30))]
    res = run_distill(cfg(mode="single", max_section_chars=1000, benchmark_fraction=0.0),
                      tmp_path / "s", default_model=TEACHER, sections=secs)
    assert res.report.rejects["section_too_short"] == 1
    assert res.report.stages["spans"] > 3 and res.report.stages["sections_split"] == 1
    with pytest.raises(WorkbenchError, match="no sections"):
        run_distill(cfg(), tmp_path / "e", default_model=TEACHER, sections=[])
    with pytest.raises(WorkbenchError, match="no perspective 'nope'"):
        run_distill(cfg(perspectives=["nope"]), tmp_path / "p", default_model=TEACHER)


@pytest.mark.parametrize("fmt", ["messages", "sharegpt", "alpaca"])
@pytest.mark.parametrize("style", ["instruct", "thinking"])
def test_exports_round_trip(single_run, tmp_path, fmt, style):
    from workbench.distill.api import export_run

    out = tmp_path / f"x.{fmt}.jsonl"
    n = export_run(single_run.run_dir, out, fmt=fmt, style=style)
    back = read_dataset(out, fmt)
    want = [to_chat(s, style) for s in single_run.samples if s.split == "train"]
    assert n == len(back) == len(want)
    assert sorted(back, key=lambda e: e.id) == sorted(want, key=lambda e: e.id)
    if style == "thinking":
        assert all(e.messages[-1].reasoning_content for e in back)


JOB = """
import sys, json
sys.path.insert(0, {tests!r})
from workbench.distill.config import AgentModel, DistillConfig
from workbench.distill.pipeline import run_distill
die = int(sys.argv[2]) if len(sys.argv) > 2 else None
opts = {{"script": "fake_teacher:reply", "batch_size": 4}}
if die is not None:
    opts["die_after"] = die
cfg = DistillConfig(mode="single", max_sections=8, verifier={{"method": "generate"}},
                    benchmark_fraction=0.25, corpus="datasets/rf", domain="rf")
res = run_distill(cfg, sys.argv[1], default_model=AgentModel(spec="fake", options=opts))
print(res.report.model_calls.model_dump_json())
"""


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.glob("*.jsonl"))}


def test_resume_after_kill_makes_only_missing_calls(tmp_path, kill_injection):
    script = tmp_path / "job.py"
    script.write_text(JOB.format(tests=str(Path(__file__).parent)))

    def run(folder, die=None):
        args = [sys.executable, str(script), str(folder)] + ([str(die)] if die else [])
        return subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=300)

    clean = run(tmp_path / "clean")
    assert clean.returncode == 0, clean.stderr
    total = json.loads(clean.stdout)["made"]
    killed = run(tmp_path / "resumed", die=total // 2 + 1)
    assert killed.returncode == 137
    assert not (tmp_path / "resumed" / "report.json").exists()
    again = run(tmp_path / "resumed")
    calls = json.loads(again.stdout)
    # the kill lost at most one unsaved chunk (4 calls) of the first half
    assert total - total // 2 - 4 <= calls["made"] <= total - total // 2
    assert calls["made"] + calls["from_cache"] == total
    assert _digest(tmp_path / "resumed") == _digest(tmp_path / "clean")


def test_cli_run_export_report(tmp_path, cli):
    conf = tmp_path / "c.yaml"
    conf.write_text(f"""name: d
output_dir: {tmp_path}
models:
  chat:
    spec: fake
    options: {{script: "fake_teacher:reply"}}
distill:
  mode: single
  max_sections: 6
  verifier: {{method: generate}}
""")
    env = {"PYTHONPATH": str(Path(__file__).parent)}
    r = cli("distill", "run", str(conf), env=env)
    assert r.returncode == 0, r.stderr
    assert "samples accepted" in r.stdout
    r = cli("distill", "export", str(tmp_path / "d"), "-o", str(tmp_path / "a.jsonl"),
                "--format", "alpaca", "--kinds", "mc", env=env)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert rows and all("instruction" in x for x in rows)
    r = cli("distill", "report", str(tmp_path / "d"), env=env)
    assert "Yield per stage" in r.stdout
    r = cli("distill", "report", str(tmp_path), env=env)
    assert r.returncode == 1 and "not a finished distillation run" in r.stderr


def test_expert_review_is_recorded_and_export_honours_it(single_run, tmp_path):
    import shutil

    from workbench.distill.api import export_run, load_samples, review_sample

    run = tmp_path / "run"
    shutil.copytree(single_run.run_dir, run)
    train = [s for s in load_samples(run) if s.split == "train"]
    a, b = train[0], train[1]
    review_sample(run, a.id, "reject")
    review_sample(run, b.id, "edit", {"solution": "An expert's better solution."})
    with pytest.raises(WorkbenchError, match="editable fields"):
        review_sample(run, b.id, "edit", {"provenance": {}})
    with pytest.raises(ValueError):
        review_sample(run, a.id, "edit", {"options": ["only one"]}) if a.kind == "mc" else \
            review_sample(run, a.id, "edit", {"question": 5})
    n = export_run(run, tmp_path / "x.jsonl")
    assert n == len(train) - 1
    rows = read_dataset(tmp_path / "x.jsonl")
    assert a.id not in {r.id for r in rows}
    edited = next(r for r in rows if r.id == b.id)
    assert "An expert's better solution." in edited.messages[-1].content
    log = [json.loads(x) for x in (run / "review.jsonl").read_text().splitlines()]
    assert [x["action"] for x in log] == ["reject", "edit"]


def test_composed_mode_with_answers_from_the_text(tmp_path):
    res = run_distill(cfg(mode="composed", answer_source="text", verifier={"enabled": False}),
                      tmp_path / "t", default_model=TEACHER)
    secs = {s.id: s for s in read_records(tmp_path / "t" / "sections.jsonl", Section)}
    mc = [s for s in res.samples if s.kind == "mc"]
    nd = [s for s in res.samples if s.kind == "nd"]
    assert mc and nd
    for s in mc:  # the correct option is a sentence of the source section
        right = s.options["ABCD".index(s.answer)]
        assert right in secs[s.provenance.section_id].text
    for s in nd:
        assert s.solution in secs[s.provenance.section_id].text
    assert res.report.model_calls.made < 3 * res.report.stages["tasks"]


def test_max_train_tasks_cuts_training_tasks_evenly_and_keeps_the_benchmark(tmp_path):
    from workbench.corpus import load_sections
    from workbench.distill.pipeline import Stats, make_spans
    from workbench.distill.tasks import make_tasks

    c = cfg(mode="composed", answer_source="text", perspectives=["concepts", "analysis"])

    secs, _ = load_sections(c.corpus)
    spans = make_spans(secs[:8], c, Stats())
    for i, sp in enumerate(spans):
        sp.split = "benchmark" if i % 4 == 0 else "train"
    every = make_tasks(spans, ["concepts", "analysis"], c, 0)
    capped = make_tasks(spans, ["concepts", "analysis"],
                        c.model_copy(update={"max_train_tasks": 7}), 0)
    bench = [t.id for t in every if t.span.split == "benchmark"]
    assert [t.id for t in capped if t.span.split == "benchmark"] == bench
    train = [t for t in capped if t.span.split == "train"]
    assert len(train) == 7
    groups = Counter((t.perspective, t.kind) for t in train)
    assert len(groups) == 4 and max(groups.values()) - min(groups.values()) <= 1
    assert [t.id for t in capped] == [t.id for t in every if t.id in {x.id for x in capped}]
    again = make_tasks(spans, ["concepts", "analysis"],
                       c.model_copy(update={"max_train_tasks": 7}), 0)
    assert [t.id for t in again] == [t.id for t in capped]  # seeded


def test_benchmark_breadth_per_fact_with_retries_and_no_held_out_rationales(tmp_path):
    """benchmark_per_fact: every sentence of a held-out section answers one item per
    perspective (each starting with its perspective's word); write_attempts re-asks what
    failed; benchmark_rationales=False makes no rationale call for held-out items."""
    import fake_teacher
    from workbench.distill.pipeline import Span
    from workbench.distill.tasks import facts as _facts

    fake_teacher._asked.clear()
    flaky = AgentModel(spec="fake", options={"script": "fake_teacher:flaky_reply"})
    c = cfg(mode="composed", answer_source="text", verifier={"enabled": False},
            perspectives=["concepts", "analysis", "design"], benchmark_per_fact=3,
            write_attempts=2, benchmark_rationales=False)
    res = run_distill(c, tmp_path / "b", default_model=flaky)
    secs = {s.id: s for s in read_records(tmp_path / "b" / "sections.jsonl", Section)}
    held = {s.provenance.section_id for s in res.samples if s.split == "benchmark"}
    n_facts = sum(len(_facts(Span(i, secs[i], secs[i].text.strip(), ""), 0)) for i in held)
    bench = [s for s in res.samples if s.split == "benchmark"]
    assert len(res.benchmark) == len(bench) > n_facts  # more than one item per sentence
    by_answer = Counter(s.options["ABCD".index(s.answer)] for s in bench)
    assert max(by_answer.values()) == 3
    starts = {"concepts": "What", "analysis": "How", "design": "Why"}
    for s in bench:
        assert s.kind == "mc" and s.thinking == "" and "no_rationale" in s.flags
        assert s.question.startswith(starts[s.provenance.perspective])
        assert s.options["ABCD".index(s.answer)] in secs[s.provenance.section_id].text
    assert all(s.thinking for s in res.samples if s.split == "train")
    asked = res.report.stages["tasks"] - res.report.rejects.get("no_fact_left", 0)
    assert res.report.stages["write_retries"] == asked  # each first request failed once
    # a rationale call per training item that passed the quality gates (they run before the
    # rationale calls), none for held-out items
    train = sum(s.split == "train" for s in res.samples)
    gated = [json.loads(x) for x in (tmp_path / "b" / "gates.jsonl").read_text().splitlines()]
    assert any(r["split"] == "train" and r["removed_by"] for r in gated)  # some were saved
    assert res.report.stages["dedup_removed"] == 0
    assert res.report.model_calls.made == asked * 2 + train


def test_benchmark_breadth_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="answer_source: text"):
        cfg(mode="single", benchmark_per_fact=2)
    with pytest.raises(ValueError, match="answer_source: text"):
        cfg(mode="composed", benchmark_rationales=False)
    text = {"mode": "composed", "answer_source": "text"}
    with pytest.raises(WorkbenchError, match="benchmark_per_fact is 3 but only 2"):
        run_distill(cfg(**text, perspectives=["concepts", "design"], benchmark_per_fact=3),
                    tmp_path / "a", default_model=TEACHER)
    with pytest.raises(WorkbenchError, match="distinct question_start"):
        run_distill(cfg(**text, domain="generic", benchmark_per_fact=2), tmp_path / "b",
                    default_model=TEACHER)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # checked first


def test_split_is_a_field_and_old_flag_files_still_read():
    from workbench.records import QTSASample

    base = {"id": "s1", "kind": "nd", "question": "Why?", "thinking": "t", "solution": "s",
            "answer": "a", "provenance": {"section_id": "x", "span_hash": "h"}}
    old = QTSASample.model_validate({**base, "flags": ["benchmark", "verifier_disagrees"]})
    assert old.split == "benchmark" and old.flags == ["verifier_disagrees"]
    assert QTSASample.model_validate(base).split == "train"
    with pytest.raises(ValueError):
        QTSASample.model_validate({**base, "split": "test"})
