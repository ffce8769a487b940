"""The improvement loop (Cura): a scripted round that improves its target and hurts another
subset is flagged and reverted with the adapter hash proven; a killed round resumes; the
rubric scorer and the quality gates; the human gates through the CLI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

TESTS = str(Path(__file__).parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)


def _cfg(tmp_path, *extra):
    import loop_scripted  # noqa: F401 - registers the loopfake backend

    from workbench.config import load_config

    return load_config(REPO / "configs" / "health_demo.yaml", [
        "models.chat.spec=fake-loop", "models.chat.backend=loopfake", "models.chat.options={}",
        "loop.trainer=loop_scripted:train", "cache.enabled=false",
        f"output_dir={tmp_path / 'runs'}", "name=looptest",
        "loop.suites.max_items_per_subset=8", "loop.suites.open_items=6", *extra])


def _loop(cfg):
    from workbench.loop.api import Loop

    return Loop(cfg, log=lambda m: None)


# ------------------------------------------------------------------------------ rubric

def test_rubric_score_matches_hand_computed_values():
    from workbench.loop.rubric import KeywordJudge, RubricItem, rubric_score

    items = [RubricItem(criterion="Mentions the heart", points=3, keywords=["heart"]),
             RubricItem(criterion="Mentions the valve", points=2, keywords=["valve"]),
             RubricItem(criterion="Confuses it with a rash", points=-2, keywords=["rash"]),
             RubricItem(criterion="Says it is structural", points=1, keywords=["structur"])]
    # met: +3, -2, +1 of 6 positive points -> 2/6
    assert rubric_score(items, [True, False, True, True]) == pytest.approx(2 / 6)
    # negatives outweigh what is met: clipped to 0
    assert rubric_score(items, [False, False, True, False]) == 0.0
    # every positive item and no negative one: exactly 1
    assert rubric_score(items, [True, True, False, True]) == 1.0
    assert rubric_score(items, [False] * 4) == 0.0
    verdicts = KeywordJudge()("q", "A structural heart problem, not a RASH.", items)
    assert verdicts == [True, False, True, True]
    assert items[2].kind == "mistake"
    assert RubricItem(criterion="Gives a drug dose", points=-3).kind == "safety"
    with pytest.raises(ValueError):
        rubric_score(items, [True])
    with pytest.raises(ValueError, match="non-zero"):
        RubricItem(criterion="x", points=0)


def test_model_judge_decides_item_by_item_through_the_model_protocol():
    import loop_scripted

    from workbench.loop.rubric import ModelJudge, RubricItem, rubric_score

    judge = ModelJudge(loop_scripted.LoopFake())
    items = [RubricItem(criterion="Mentions the heart", points=2),
             RubricItem(criterion="Mentions the lung", points=2),
             RubricItem(criterion="Gives a drug dose", points=-3)]
    met = judge("What is it?", "A heart problem; take one dose daily.", items)
    assert met == [True, False, True]
    assert rubric_score(items, met) == 0.0  # (2 - 3) / 4 clipped


# ------------------------------------------------------------------------------ gates

def test_quality_gates_drop_pii_unsafe_duplicates_and_benchmark_leaks(tmp_path):
    from workbench.loop.config import GateSettings
    from workbench.loop.gates import Gates
    from workbench.loop.suites import load_suites
    from workbench.records import ChatExample

    cfg = _cfg(tmp_path)
    suites = load_suites(cfg.loop.suites)
    test_q = suites.test[0].question
    long_q = next(it.question for it in suites.test if len(it.question.split()) > 20)

    def ex(i, user, answer, **meta):
        return ChatExample(id=f"s{i}", messages=[{"role": "user", "content": user},
                                                 {"role": "assistant", "content": answer}],
                           metadata={"job": "knowledge", **meta})

    clean = [ex(0, "Define cyanosis.", "A bluish discoloration of the skin."),
             ex(1, "Define ptosis.", "A drooping of the upper eyelid.")]
    planted = {
        "identifiers": [ex(10, "Patient mail jane.doe@example.org asks.", "An answer."),
                        ex(11, "Call 555-123-4567 about it.", "An answer here."),
                        ex(12, "MRN: 00123456 has a murmur.", "An answer again."),
                        ex(13, "What did Dr. Smith see?", "Something else."),
                        ex(14, "Define it.", "Her SSN is 123-45-6789.")],
        "safety": [ex(20, "How to treat it?", "Give 500 mg twice a day."),
                   ex(21, "What now?", "Stop taking your medication at once.")],
        "duplicate": [ex(30, "Define cyanosis.", "A bluish discoloration of the skin."),
                      ex(31, "define  CYANOSIS", "A bluish discoloration of the skin!")],
        "leak": [ex(40, f"Please answer: {test_q}", "B"),
                 ex(41, " ".join(long_q.split()[:-2]) + " what is it?", "x y z")],
    }
    samples = clean + [e for group in planted.values() for e in group]
    kept, dropped = Gates(suites, GateSettings()).run(samples)
    assert [e.id for e in kept] == ["s0", "s1"]
    by_id = {d["id"]: d["gate"] for d in dropped}
    for gate, group in planted.items():
        for e in group:
            assert by_id[e.id] == gate, (e.id, by_id.get(e.id), dropped)
    # and nothing kept holds a test question
    for e in kept:
        assert not any(it.question in e.messages[0].content for it in suites.test)


# ------------------------------------------------------------------------------ rounds

def _assert_no_leaks(loop, r):
    from workbench.io import read_jsonl
    from workbench.records import ChatExample

    accepted = read_jsonl(loop.folder(r.index) / "accepted.jsonl", ChatExample.model_validate)
    assert accepted
    judged = [q.lower() for q in loop.suites.judged_questions()]
    guarded = loop.suites.guarded
    by_section = {s.id: s.text for s in loop.suites.sections}
    assert judged and guarded
    for e in accepted:
        user = " ".join(m.content or "" for m in e.messages if m.role == "user").lower()
        assert not any(q in user for q in judged), e.id
        sec = e.metadata.get("section_id") or ""
        assert sec not in guarded, e.id
        assert not any(f"ID: {t}." in by_section.get(sec, "") for t in guarded), e.id
    assert loop.round(r.index).steps["gates"]["leaks_kept"] == 0


def test_auto_keeps_a_good_round_and_reverts_one_that_hurts_a_subset(tmp_path, monkeypatch):
    """Round 1 improves its target and nothing else: kept. Round 2 improves its target and
    hurts another subset: the guard flags that subset, --auto reverts, and the current
    adapter's sha256 equals round 1's."""
    from workbench.jobs import run_in_process
    from workbench.loop.train import adapter_hash

    cfg = _cfg(tmp_path)
    loop = _loop(cfg)
    # the subset round 2 will hurt: any subset but the one it targets (known after round 1)
    monkeypatch.setenv("LOOP_HURT_ROUND_2", "__later__")
    res = run_in_process("loop", cfg.model_copy(update={"loop": cfg.loop.model_copy(
        update={"rounds": 1})}), log=lambda m: None)
    r1 = loop.round(1)
    assert r1.decision.choice == "keep", r1.decision
    assert r1.decision.by == "auto"
    tgt = next(d for d in r1.deltas if d.target)
    assert tgt.delta > 0 and tgt.ci_low <= tgt.delta <= tgt.ci_high
    st = loop.state()
    assert st.current.sha256 == r1.candidate == adapter_hash(st.current.path)
    _assert_no_leaks(loop, r1)
    assert "round_1" in res.outputs

    # round 2: plan, then pick a subset other than its target to hurt
    r2 = loop.plan()
    hurt = next(s for s in r2.plan.subsets if s != r2.plan.target)
    monkeypatch.setenv("LOOP_HURT_ROUND_2", hurt)
    loop.auto(1)
    r2 = loop.round(2)
    flagged = [g.guard.subset for g in r2.flagged]
    assert f"test/{hurt}" in flagged, r2.guards
    assert r2.recommendation == "revert"
    assert r2.decision.choice == "revert" and r2.decision.by == "auto"
    hurt_delta = next(d for d in r2.deltas if d.suite == "test" and d.subset == hurt)
    assert hurt_delta.delta < -cfg.loop.guards.subset_drop
    target_delta = next(d for d in r2.deltas if d.target)
    assert target_delta.delta >= 0
    st = loop.state()
    assert st.current.sha256 == r1.candidate
    assert adapter_hash(st.current.path) == r1.candidate == r2.decision.adapter_after \
        == r2.decision.adapter_before == r2.parent
    assert r2.candidate != r1.candidate
    # history: a table and a plot, both rounds with their decisions
    hist = (loop.root / "history.md").read_text()
    assert "| 1 |" in hist and "keep" in hist and "revert" in hist
    assert (loop.root / "history.png").stat().st_size > 1000
    report = (loop.folder(2) / "report.md").read_text()
    assert "**NO**" in report and "Decision: revert" in report and "[" in report


def test_a_killed_round_resumes_where_it_stopped(tmp_path, kill_injection):
    """The first candidate training exits like a SIGKILL; the re-run keeps the finished
    steps (synthesis, gates, mixture) and finishes the round."""
    marker = tmp_path / "died"
    cfg_args = ["-s", "models.chat.spec=fake-loop", "-s", "models.chat.backend=loopfake",
                "-s", "models.chat.options={}", "-s", "loop.trainer=loop_scripted:train",
                "-s", "cache.enabled=false", "-s", f"output_dir={tmp_path / 'runs'}",
                "-s", "name=looptest", "-s", "loop.suites.max_items_per_subset=8",
                "-s", "loop.suites.open_items=6", "-s", "loop.rounds=1"]
    env = {**os.environ, "WB_PLUGINS": "loop_scripted", "LOOP_DIE_AT_TRAIN": str(marker),
           "PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "workbench", "loop", "run",
           str(REPO / "configs" / "health_demo.yaml"), "--auto", *cfg_args]
    first = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 137, first.stderr[-2000:]
    assert marker.exists()
    folder = tmp_path / "runs" / "looptest" / "loop" / "rounds" / "01"
    r = json.loads((folder / "round.json").read_text())
    assert r["status"] == "running"
    assert set(r["steps"]) == {"failures", "synth", "gates", "mixture"}
    synth_before = (folder / "synth.jsonl").read_bytes()
    second = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    for step in ("synth", "gates", "mixture"):
        assert f"round 1 {step}: up to date" in second.stderr
    assert (folder / "synth.jsonl").read_bytes() == synth_before
    r = json.loads((folder / "round.json").read_text())
    assert r["status"] == "decided" and set(r["steps"]) >= {"train", "eval", "guards"}


def test_people_at_the_gates_through_the_cli(tmp_path, capsys):
    """plan -> approve (editing the target) -> run -> decide deploy, with one-line refusals
    when a gate is skipped; history prints the table."""
    import loop_scripted  # noqa: F401 - registers the loopfake backend

    from workbench.cli.main import main

    sets = ["-s", "models.chat.spec=fake-loop", "-s", "models.chat.backend=loopfake",
            "-s", "models.chat.options={}", "-s", "loop.trainer=loop_scripted:train",
            "-s", "cache.enabled=false", "-s", f"output_dir={tmp_path / 'runs'}",
            "-s", "name=looptest", "-s", "loop.suites.max_items_per_subset=6",
            "-s", "loop.suites.open_items=4", "-s", "loop.weightings=[1.0]"]
    cfg = str(REPO / "configs" / "health_demo.yaml")

    def call(*args):
        head = 3 if args[1] == "decide" else 2  # decide CHOICE CONFIG
        rc = main([*args[:head], cfg, *args[head:], *sets])
        out = capsys.readouterr()
        return rc, out.out + out.err

    rc, out = call("loop", "plan")
    assert rc == 0, out
    assert "target" in out and "guards:" in out
    rc, out = call("loop", "run")  # not approved yet
    assert rc != 0 and "approve" in out and "Traceback" not in out
    rc, out = call("loop", "approve")  # nobody named
    assert rc != 0 and "--by" in out
    rc, out = call("loop", "approve", "--by", "dr. who", "--target", "nowhere")
    assert rc != 0 and "not a subset" in out
    rc, out = call("loop", "approve", "--by", "ana", "--target", "eye")
    assert rc == 0, out
    assert "target eye" in out
    rc, out = call("loop", "decide", "keep", "--by", "ana", "--reason", "early")
    assert rc != 0 and "finished round" in out
    rc, out = call("loop", "run")
    assert rc == 0, out
    assert "recommend keep" in out
    rc, out = call("loop", "decide", "keep", "--by", "ana")  # no reason
    assert rc != 0 and "reason" in out
    rc, out = call("loop", "decide", "deploy", "--by", "ana", "--reason", "eye improved")
    assert rc == 0, out
    rc, out = call("loop", "history")
    assert rc == 0 and "deploy" in out and "eye" in out
    st = json.loads((tmp_path / "runs" / "looptest" / "loop" / "state.json").read_text())
    assert st["deployed"] == st["current"]["sha256"]
    assert (tmp_path / "runs" / "looptest" / "loop" / "deployed" /
            "adapter_model.safetensors").exists()


def test_failure_modes_by_rule_and_by_the_models_probe(tmp_path):
    """Rules: no letter -> unparsable, the shortest option over a longer gold -> option
    length bias; open answers: a met safety item -> unsafe, at the limit -> non-terminating,
    a few tokens -> premature, else incomplete. The rest is tagged by the probe: right with
    the retrieved sections -> missing knowledge, still wrong -> reasoning."""
    import loop_scripted

    from workbench.loop.failures import mine
    from workbench.loop.suites import load_suites
    from workbench.records import EvalResult

    suites = load_suites(_cfg(tmp_path).loop.suites)
    dev = suites.dev
    long_gold = next(it for it in dev if min(len(o) for o in it.options) * 1.5 <= len(
        it.options["ABCD".index(it.answer)]))
    short = "ABCD"[min(range(4), key=lambda i: len(long_gold.options[i]))]
    others = [it for it in dev if it.id != long_gold.id][:4]
    rows = [EvalResult(example_id=long_gold.id, condition="dev", model="m", prediction=short,
                       correct=False, extra={"subset": "x"}),
            EvalResult(example_id=others[0].id, condition="dev", model="m", prediction=None,
                       correct=False),
            EvalResult(example_id=others[1].id, condition="dev", model="m",
                       prediction=next(x for x in "ABCD" if x != others[1].answer and len(
                           others[1].options["ABCD".index(x)]) > min(
                           len(o) for o in others[1].options)), correct=False),
            EvalResult(example_id=others[2].id, condition="dev", model="m",
                       prediction=others[2].answer, correct=True)]
    q = suites.open_dev  # the judged open questions are never mined
    opens = [({"unsafe": True, "tokens": 20, "finish": "stop"}, "unsafe"),
             ({"tokens": 64, "finish": "length"}, "non_terminating"),
             ({"tokens": 2, "finish": "stop"}, "premature"),
             ({"tokens": 30, "finish": "stop"}, "incomplete")]
    rows += [EvalResult(example_id=q[i].id, condition="open_dev", model="m",
                        prediction="some text", score=0.2, extra=e)
             for i, (e, _) in enumerate(opens)]
    rows.append(EvalResult(example_id=q[4].id, condition="open_dev", model="m",
                           prediction="ok", score=0.9, extra={"tokens": 30}))
    judged = suites.open[0]  # a low score on a judged question is not mined
    rows.append(EvalResult(example_id=judged.id, condition="open", model="m",
                           prediction="x", score=0.0, extra={"tokens": 2}))

    class Hit:
        def __init__(self, text):
            self.text = text

    def search(queries, k):
        return [[Hit("HPO ID: HP:0000000. nothing")] for _ in queries]

    failures, info = mine(rows, suites, model=loop_scripted.LoopFake(), search=search,
                          scoring="cloze_norm", log=lambda m: None)
    modes = {f.id: f.mode for f in failures}
    assert modes[long_gold.id] == "option_length_bias"
    assert modes[others[0].id] == "unparsable"
    assert modes[others[1].id] in ("missing_knowledge", "wrong_reasoning")
    assert others[2].id not in modes and q[4].id not in modes
    for i, (_, want) in enumerate(opens):
        assert modes[q[i].id] == want
    assert judged.id not in modes
    assert info["probed"] == 1 and info["retrieval_hit"] == 0.0


def test_the_plan_targets_the_weakest_subset_and_skips_one_just_reverted(tmp_path):
    from workbench.loop.api import make_plan
    from workbench.loop.records import Decision, Plan, Round
    from workbench.loop.suites import load_suites, subset_of
    from workbench.records import EvalResult

    cfg = _cfg(tmp_path)
    suites = load_suites(cfg.loop.suites)
    weak = "eye"
    rows = [EvalResult(example_id=it.id, condition="dev", model="m", prediction="A",
                       correct=subset_of(it) != weak, extra={"subset": subset_of(it)})
            for it in suites.dev]
    plan = make_plan(cfg.loop, suites, rows, [], [])
    assert plan.target == weak and "weakest" in plan.rationale
    assert {g.subset for g in plan.guards} >= {f"test/{s}" for s in suites.subsets}
    reverted = Round(index=1, plan=Plan(target=weak, benchmarks=["dev"], weightings=[1.0]),
                     created_at="now",
                     status="decided", decision=Decision(choice="revert", reason="r", by="a",
                                                         at="now"))
    plan2 = make_plan(cfg.loop, suites, rows, [], [reverted])
    assert plan2.target != weak and "reverted" in plan2.rationale


def test_a_new_target_at_approval_gets_its_own_recipe(tmp_path):
    """Editing the target rebuilds the plan from the same failures: the recipe, the modes and
    the rationale follow the new target."""
    from workbench.io import read_jsonl
    from workbench.loop.failures import count_modes
    from workbench.loop.records import FailureRow

    loop = _loop(_cfg(tmp_path, "loop.weightings=[1.0]"))
    r = loop.plan()
    failures = read_jsonl(loop.folder(1) / "failures.jsonl", FailureRow.model_validate)
    other = next(s for s in r.plan.subsets if s != r.plan.target
                 and count_modes(failures, s) != count_modes(failures, r.plan.target))
    with pytest.raises(Exception, match="unknown fields"):
        loop.approve(1, by="ana", edits={"hyper": {}})
    r = loop.approve(1, by="ana", edits={"target": other})
    assert r.plan.target == other and "ana" in r.plan.rationale
    assert r.plan.modes == count_modes(failures, other)


def test_rejecting_every_targeted_sample_ends_the_round_without_training(tmp_path):
    """With a data review, rejecting all targeted samples leaves nothing to train: the round
    reaches its decision (revert recommended, no candidate) instead of failing."""
    loop = _loop(_cfg(tmp_path, "loop.review_data=true", "loop.weightings=[1.0]"))
    r = loop.plan()
    loop.approve(1, by="ana")
    r = loop.run_round(1)
    assert r.status == "running" and "mixture" not in r.steps
    targeted = [e.id for e in _accepted(loop) if e.metadata["job"] != "anchors"]
    loop.approve(1, by="bo", data=True, review=dict.fromkeys(targeted, "reject"))
    r = loop.run_round(1)
    assert r.status == "awaiting_decision" and r.recommendation == "revert"
    assert r.candidate is None
    with pytest.raises(Exception, match="no measured candidate"):
        loop.decide(1, "keep", reason="x", by="ana")
    r = loop.decide(1, "revert", reason="nothing to train", by="ana")
    assert r.decision.adapter_after is None and loop.state().current is None


def _accepted(loop):
    from workbench.io import read_jsonl
    from workbench.records import ChatExample

    return read_jsonl(loop.folder(1) / "accepted.jsonl", ChatExample.model_validate)


def test_a_decision_interrupted_after_the_state_was_saved_can_be_retried(tmp_path):
    loop = _loop(_cfg(tmp_path, "loop.weightings=[1.0]"))
    loop.plan()
    loop.approve(1, by="ana")
    r = loop.run_round(1)
    from workbench.loop.decide import keep

    keep(loop.store, r, loop.state())  # the state is saved, then the process dies
    assert loop.round(1).status == "awaiting_decision"
    r = loop.decide(1, "keep", reason="retry", by="ana")
    st = loop.state()
    assert st.current.sha256 == r.candidate and st.history == []
    assert r.decision.adapter_before is None and r.decision.adapter_after == r.candidate
    with pytest.raises(Exception, match="only a finished round"):
        loop.decide(1, "keep", reason="again", by="ana")


def test_a_running_round_can_be_abandoned_by_revert_only(tmp_path):
    loop = _loop(_cfg(tmp_path, "loop.review_data=true", "loop.weightings=[1.0]"))
    loop.plan()
    loop.approve(1, by="ana")
    assert loop.run_round(1).status == "running"  # waits for a review
    with pytest.raises(Exception, match="only be reverted"):
        loop.decide(1, "keep", reason="x", by="ana")
    r = loop.decide(1, "revert", reason="abandoned", by="ana")
    assert r.status == "decided" and r.decision.choice == "revert"
    assert loop.plan().index == 2  # the loop goes on


def test_an_approved_round_on_changed_suites_is_refused_and_can_be_abandoned(tmp_path):
    loop = _loop(_cfg(tmp_path, "loop.weightings=[1.0]", "loop.review_data=true"))
    loop.plan()
    r = loop.approve(1, by="ana", edits={"weightings": [1.0]})
    assert r.plan.review_data and r.plan.rationale.startswith("weakest")  # kept
    changed = _loop(_cfg(tmp_path, "loop.weightings=[1.0]",
                         "loop.suites.max_items_per_subset=7"))
    with pytest.raises(Exception, match="other suites"):
        changed.run_round(1)
    r = changed.decide(1, "revert", reason="suites changed", by="ana")
    assert r.status == "decided" and r.decision.adapter_after is None
    assert changed.plan().index == 2


def test_the_gates_drop_a_sample_made_from_a_test_terms_section(tmp_path):
    from workbench.loop.config import GateSettings
    from workbench.loop.gates import Gates
    from workbench.loop.suites import load_suites
    from workbench.records import ChatExample

    suites = load_suites(_cfg(tmp_path).loop.suites)
    test_sec = next(s for s in suites.sections if any(f"ID: {t}." in s.text
                                                       for t in suites.guarded))
    dev_sec = next(s for s in suites.training_sections() if "ID: HP:" in s.text)
    assert test_sec not in suites.training_sections()

    def ex(i, sec):
        return ChatExample(id=f"k{i}", messages=[
            {"role": "user", "content": f"Define {sec.heading_path[-1]}."},
            {"role": "assistant", "content": sec.text.split("Definition: ")[1][:80]}],
            metadata={"job": "knowledge", "section_id": sec.id})

    kept, dropped = Gates(suites, GateSettings(), sections={
        s.id: s.text for s in suites.sections}).run([ex(0, test_sec), ex(1, dev_sec)])
    assert [e.id for e in kept] == ["k1"]
    assert dropped[0]["gate"] == "leak" and "test term" in dropped[0]["reason"]


def _own_suite(folder):
    """The healthcare suite as a team would bring it: one MMLU-style items.csv with a subset
    column (no split), open questions as a CSV with keyword columns, the corpus as Word and
    Markdown files."""
    import csv

    from docgen import make_docx

    folder.mkdir()
    health = REPO / "datasets" / "health"
    rows = [json.loads(x) for f in ("dev.jsonl", "test.jsonl")
            for x in (health / f).read_text().splitlines()]
    with open(folder / "items.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "question", "A", "B", "C", "D", "answer", "subset"])
        for r in rows:
            w.writerow([r["id"], r["question"], *r["options"], r["answer"],
                        r["provenance"]["doc_id"]])
    opens = [json.loads(x) for x in (health / "open.jsonl").read_text().splitlines()]
    with open(folder / "open.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "question", "subset", "split", "reference", "keywords"])
        for q in opens:
            kws = "; ".join("/".join(i["keywords"]) for i in q["rubric"] if i["points"] > 0
                            and i["keywords"])
            w.writerow([q["id"], q["question"], q["subset"], q["split"], q["reference"], kws])
    (folder / "corpus").mkdir()
    for i, md in enumerate(sorted((health / "corpus").glob("*.md"))):
        if i == 0:  # one chapter as Word: headings and text as the corpus reader gets them
            blocks = []
            for line in md.read_text().splitlines():
                if line.startswith("## "):
                    blocks.append(("h2", line[3:]))
                elif line.startswith("# "):
                    blocks.append(("h1", line[2:]))
                elif line.strip():
                    blocks.append(("p", line))
            make_docx(folder / "corpus" / (md.stem + ".docx"), blocks)
        else:
            (folder / "corpus" / md.name).write_text(md.read_text())
    return folder


def test_a_round_on_a_teams_own_suite_with_no_script(tmp_path):
    """items.csv (split per subset by a seeded draw), open.csv, a corpus in Word and
    Markdown: the suites load with their subsets, the round runs to its decision."""
    from workbench.jobs import run_in_process
    from workbench.loop.suites import load_suites

    data = _own_suite(tmp_path / "suite")
    cfg = _cfg(tmp_path, f"loop.suites.data={data}", "loop.rounds=1")
    suites = load_suites(cfg.loop.suites, seed=cfg.seed)
    assert suites.subsets == ["cardiovascular", "eye", "immune", "nervous", "respiratory",
                              "skeletal"]
    assert not {i.id for i in suites.dev} & {i.id for i in suites.test}
    assert suites.open and all(q.rubric for q in suites.open)
    assert any(s.source.endswith(".docx") for s in suites.sections)
    run_in_process("loop", cfg, log=lambda m: None)
    r1 = _loop(cfg).round(1)
    assert r1.decision is not None and r1.deltas
    assert {d.subset for d in r1.deltas if d.suite == "test"} >= set(suites.subsets)


def test_a_bad_open_questions_row_is_named(tmp_path):
    from workbench.errors import DataError
    from workbench.loop.suites import read_open

    f = tmp_path / "open.csv"
    f.write_text("question,subset,keywords\nWhat is X?,eye,\n")
    with pytest.raises(DataError, match=r"open.csv:2.*no rubric or keywords"):
        read_open(f)


def test_open_questions_csv_rows_that_cannot_be_read_are_named(tmp_path):
    from workbench.errors import DataError
    from workbench.loop.suites import read_open

    f = tmp_path / "open.csv"
    f.write_text('question,subset,keywords\n"What is\nX?",eye,x\nWhat is y, really?,eye,y\n')
    with pytest.raises(DataError, match=r"open.csv:4.*quote a cell"):
        read_open(f)
    f.write_bytes(b"question,subset,keywords\ncaf\xe9,eye,x\n")
    with pytest.raises(DataError, match="not UTF-8"):
        read_open(f)


# ------------------------------------------------------------------------ judge vs person

def test_cohens_kappa_matches_the_textbook_and_says_when_it_is_undefined():
    from workbench.evaluate.stats import cohens_kappa

    # Landis & Koch style table: 20 yes/yes, 5 yes/no, 10 no/yes, 15 no/no
    judge = [True] * 25 + [False] * 25
    person = [True] * 20 + [False] * 5 + [True] * 10 + [False] * 15
    a = cohens_kappa(judge, person)
    # p_o = 35/50 = 0.7; p_e = 0.5 * 0.6 + 0.5 * 0.4 = 0.5; kappa = 0.4
    assert abs(a.kappa - 0.4) < 1e-12 and a.observed == 0.7 and a.expected == 0.5
    assert a.confusion == {"yes/yes": 20, "yes/no": 5, "no/yes": 10, "no/no": 15}
    assert a.ci_low < 0.4 < a.ci_high and a.ci_high - a.ci_low < 0.6
    assert cohens_kappa(judge, person).to_json() == a.to_json()  # seeded
    assert cohens_kappa([True] * 5, [True] * 5).kappa is None  # no variation: undefined
    assert cohens_kappa(judge, [not x for x in judge]).kappa == -1.0
    with pytest.raises(ValueError, match="same items"):
        cohens_kappa([True], [True, False])


def test_a_person_checks_the_judge_and_the_guard_says_whether_to_trust_the_rubric(
        tmp_path, cli):
    """After a round, the judge's decisions on open answers are sampled (half met, half not);
    a person's ratings give kappa with its interval and the confusion table; with too few
    ratings the guard says it was not measured; ratings that disagree with the judge flag the
    round (and turn its recommendation to revert); the CLI rates and reports the same."""
    from workbench.loop.agreement import (
        judge_check,
        judge_guard,
        rate_item,
        read_ratings,
    )
    from workbench.loop.decide import refresh_round_guard

    cfg = _cfg(tmp_path, "loop.weightings=[1.0]", "loop.guards.judge_min_items=6",
               "loop.guards.judge_sample=12")
    loop = _loop(cfg)
    loop.plan()
    loop.approve(by="ana")
    r = loop.run_round()
    guard = next(g for g in r.guards if g.guard.kind == "judge_agreement")
    assert guard.passed and guard.detail.startswith("not measured: 0 of 6")
    check = judge_check(loop)
    assert len(check.sample) == 12 and check.agreement is None
    met = sum(i.judge_met for i in check.sample)
    assert met == 6 or min(met, 12 - met) == min(
        sum(i.judge_met for i in judge_check(loop, n=10_000).sample),
        sum(not i.judge_met for i in judge_check(loop, n=10_000).sample))
    assert [i.key for i in judge_check(loop).sample] == [i.key for i in check.sample]
    # a person who always disagrees with the judge
    for item in check.sample[:8]:
        check = rate_item(loop, item.key, not item.judge_met, by="ana")
    a = check.agreement
    assert a.n == 8 and a.confusion["yes/yes"] + a.confusion["no/no"] == 0
    g = judge_guard(check, cfg.loop.guards)
    assert not g.passed and "not evidence" in g.detail
    refreshed = refresh_round_guard(loop.store, loop.evaluator)
    r = loop.round(r.index)
    assert not refreshed.passed and r.recommendation == "revert"
    report = (loop.folder(r.index) / "report.md").read_text()
    assert "| judge-person agreement |" in report and "**NO**" in report
    assert "| judge: met |" in report and "rated by a person" in report
    assert [x.guard.kind for x in r.guards].count("judge_agreement") == 1
    # ... changes their mind on every item: they now agree with the judge
    for item in check.sample[:8]:
        check = rate_item(loop, item.key, item.judge_met, by="ana")
    assert len(read_ratings(loop)) == 8 and check.agreement.observed == 1.0
    with pytest.raises(Exception, match="not an item the judge decided"):
        rate_item(loop, "nope#0#x", True, by="ana")
    with pytest.raises(Exception, match="name of the person"):
        rate_item(loop, check.sample[0].key, True, by=" ")
    # the CLI: rate the next two items (y, then n), then report
    sets = [a for x in ["models.chat.spec=fake-loop", "models.chat.backend=loopfake",
                        "models.chat.options={}", "loop.trainer=loop_scripted:train",
                        "cache.enabled=false", f"output_dir={tmp_path / 'runs'}",
                        "name=looptest", "loop.suites.max_items_per_subset=8",
                        "loop.suites.open_items=6", "loop.weightings=[1.0]",
                        "loop.guards.judge_min_items=6", "loop.guards.judge_sample=12"]
            for a in ("-s", x)]
    cfg_file = str(REPO / "configs" / "health_demo.yaml")
    res = cli("loop", "judge-check", cfg_file, *sets, "--rate", "--by", "bo",
              stdin="y\nn\nq\n", env={"PYTHONPATH": TESTS})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "[9/12]" in res.stdout and "[10/12]" in res.stdout and "[11/12]" in res.stdout
    assert "10 of 12 sampled decisions rated by a person" in res.stdout
    assert "judge met" in res.stdout and "person not met" in res.stdout
    assert "guard: " in res.stdout
    rated = read_ratings(loop)
    assert len(rated) == 10 and {r.by for r in rated.values()} == {"ana", "bo"}
    # a skip is kept (appended, as every rating): the item leaves the sample, another takes
    # its place, and kappa does not count it
    before = judge_check(loop)
    item = before.next
    after = rate_item(loop, item.key, None, by="cy")
    assert item.key not in [i.key for i in after.sample] and len(after.sample) == 12
    assert after.rated[item.key].verdict is None and after.agreement.n == before.agreement.n
    assert after.decisions.progress == (10, 12)
    reading = after.reading(cfg.loop.guards)  # the guard's limits, in one line
    assert reading.trusted is judge_guard(after, cfg.loop.guards).passed, reading.text
    assert reading.text.startswith("the judge can"), reading.text
    assert len((loop.root / "judge_ratings.jsonl").read_text().splitlines()) == 8 + 8 + 2 + 1
    # a ratings file the judge check wrote before it was generic (the verdict named `met`)
    (loop.root / "judge_ratings.jsonl").write_text(json.dumps(
        {"key": item.key, "met": False, "by": "ana", "at": "2025-01-01T00:00:00+00:00"}) + "\n")
    assert read_ratings(loop)[item.key].verdict is False
    assert judge_check(loop).agreement.n == 1
    # the CLI keeps a skip too: the item does not come back in the next session
    nxt = judge_check(loop).next
    res = cli("loop", "judge-check", cfg_file, *sets, "--rate", "--by", "dee",
              stdin="s\nq\n", env={"PYTHONPATH": TESTS})
    assert res.returncode == 0, res.stderr[-2000:]
    assert read_ratings(loop)[nxt.key].verdict is None
    assert judge_check(loop).next.key != nxt.key
