"""The main job's protocol (issue 43): distractors that are wrong about the text, the item-
level `seen` benchmark whose questions never reach training, the knowledge-free shortcut
rules, and the oracle context. A scripted teacher writes the questions."""

import json

from workbench.distill.config import AgentModel, DistillConfig
from workbench.distill.pipeline import run_distill
from workbench.distill.quality import jaccard, shingles
from workbench.records import MCItem, Section, read_records

TEACHER = AgentModel(spec="fake", options={"script": "fake_teacher:reply"})


def cfg(**kw):
    base = dict(max_sections=12, verifier={"enabled": False}, benchmark_fraction=0.3,
                corpus="datasets/rf", domain="rf", mode="composed", answer_source="text",
                perspectives=["concepts", "analysis", "design"])
    base.update(kw)
    return DistillConfig(**base)


def test_perturbed_options_form_a_two_by_two_design_false_against_the_section():
    from workbench.distill.perturb import factorial_options, vocabulary

    section = ("A quarter-wave transformer matches a 100 ohm load to a 50 ohm line and is "
               "narrowband. Its impedance is the geometric mean of the two resistances.")
    sentence = "A quarter-wave transformer matches a 100 ohm load to a 50 ohm line and is " \
               "narrowband."
    question = "What does a quarter-wave transformer match?"
    opts = factorial_options(sentence, question, section, vocabulary(section), "seed")
    assert opts is not None and opts[0] == sentence and len(set(opts)) == 4
    for o in opts[1:]:
        assert o not in section  # false against the text
    words = [set(o.split()) for o in opts]
    # each option differs from two others by one change and from the last by two: no
    # option is the centre of the others
    diffs = [sorted(len(words[i] ^ words[j]) for j in range(4) if j != i) for i in range(4)]
    assert len({tuple(d) for d in diffs}) == 1
    asked = set(question.lower().rstrip("?").split())
    assert len({frozenset(w.lower() for w in ws) & asked for ws in words}) == 1


def test_fixed_phrases_and_verb_forms_are_not_perturbed():
    """'no longer' -> 'no shorter' and 'varying' -> 'applying' read wrong without any
    knowledge of the fact: such changes are never made."""
    import random

    from workbench.distill.perturb import sites

    sentence = "The stub is no longer matched at least when each varying load is tuned."
    got = sites(sentence, "What happens?", ["applying", "tuning", "loaded"], random.Random(0))
    changed = {sentence[s.start:s.end].lower() for s in got}
    assert not changed & {"longer", "least", "varying", "matched", "tuned"}


def test_a_sentence_with_fewer_than_two_changes_gives_no_item():
    from workbench.distill.perturb import factorial_options

    assert factorial_options("It is so.", "What is it?", "It is so.", [], "s") is None


def test_seen_items_never_reach_training_and_shortcuts_fail_on_perturbed_items(tmp_path):
    res = run_distill(cfg(seen_fraction=0.5, distractors="perturbed", kinds=["mc", "nd"]),
                      tmp_path / "r", default_model=TEACHER, seed=1)
    run = tmp_path / "r"
    seen = read_records(run / "benchmark_seen.jsonl", MCItem)
    unseen = read_records(run / "benchmark.jsonl", MCItem)
    assert seen and unseen and res.report.accepted.seen_items == len(seen)
    train = [s for s in res.samples if s.split == "train"]
    trained_facts = {s.provenance.fact_hash for s in train}
    sft = [json.loads(x) for x in (run / "sft" / "instruct_mixed.messages.jsonl")
           .read_text().splitlines()]
    prompts = [r["messages"][0]["content"] for r in sft]
    assert len(sft) == len(train)
    for it in seen:
        # the fact is trained (its twin is in the training data) ...
        assert it.provenance.fact_hash in trained_facts
        # ... the question is not, nor anything close to it
        assert not any(it.question in p for p in prompts)
        assert all(jaccard(shingles(it.question), shingles(s.question)) < 0.7 for s in train)
    secs = {s.id: s for s in read_records(run / "sections.jsonl", Section)}
    for it in seen + unseen:  # the answer is the text's sentence; no distractor is
        opts = it.options
        right = opts["ABCD".index(it.answer)]
        assert right in secs[it.provenance.section_id].text
        assert not any(o in secs[it.provenance.section_id].text for o in opts if o != right)

    from workbench.evaluate.shortcuts import shortcut_baselines

    for rows in (shortcut_baselines(seen), shortcut_baselines(unseen)):
        by = {r.rule: r for r in rows}
        assert set(by) == {"question_overlap", "longest", "consensus"}
        for r in rows:
            assert sum(r.predictions.values()) == r.accuracy.n
        # the words of the question are in every option alike, and no option is the centre
        assert by["question_overlap"].accuracy.value <= 0.5
        assert by["consensus"].accuracy.value <= 0.5


def test_statement_items_cover_every_perturbable_sentence_without_a_model_call(tmp_path):
    """benchmark_items: statement. The unseen benchmark holds every held-out sentence that can
    be perturbed (no writer call, so no writer loss); the seen benchmark asks about the
    sentences accepted training samples answer, under a question no training row has."""
    from workbench.distill.perturb import factorial_options, vocabulary
    from workbench.distill.pipeline import Span
    from workbench.distill.tasks import facts

    res = run_distill(cfg(seen_fraction=1.0, distractors="perturbed", kinds=["mc", "nd"],
                          benchmark_items="statement"), tmp_path / "r", default_model=TEACHER,
                      seed=1)
    run = tmp_path / "r"
    unseen = read_records(run / "benchmark.jsonl", MCItem)
    seen = read_records(run / "benchmark_seen.jsonl", MCItem)
    secs = {s.id: s for s in read_records(run / "sections.jsonl", Section)}
    held = {it.provenance.section_id for it in unseen}
    train = [s for s in res.samples if s.split == "train"]
    assert held and not held & {s.provenance.section_id for s in train}
    # every perturbable sentence of a held-out section is an item (one span per section here)
    want = 0
    for sid in held:
        sec = secs[sid]
        voc = vocabulary(sec.text, *(x.text for x in secs.values() if x.doc_id == sec.doc_id))
        want += sum(factorial_options(f, "", sec.text, voc, "x") is not None
                    for f in facts(Span(sid, sec, sec.text.strip(), ""), 1))
    assert len(unseen) >= want - 2  # a title word can rule out a site
    trained = {s.provenance.fact_hash for s in train}
    sft = (run / "sft" / "instruct_mixed.messages.jsonl").read_text()
    assert seen and len({it.provenance.fact_hash for it in seen}) == len(seen)
    for it in seen + unseen:
        assert it.question.startswith("Which statement about ") and it.question not in sft
        text = secs[it.provenance.section_id].text
        right = it.options["ABCD".index(it.answer)]
        assert right in text and not any(o in text for o in it.options if o != right)
    assert all(it.provenance.fact_hash in trained for it in seen)
    assert sorted({it.answer for it in unseen}) == list("ABCD")  # letters balanced
    calls = res.report.model_calls.made
    res2 = run_distill(cfg(seen_fraction=1.0, distractors="perturbed", kinds=["mc", "nd"],
                           benchmark_items="statement", benchmark_fraction=0.6),
                       tmp_path / "r2", default_model=TEACHER, seed=1)
    assert res2.report.model_calls.made < calls  # held-out sections cost no call


def test_sibling_distractors_are_solved_by_a_shortcut(tmp_path):
    """What the old items did, measured the same way: their answer shares the question's
    words, and the rule finds it far above chance."""
    from workbench.evaluate.shortcuts import shortcut_baselines

    run_distill(cfg(), tmp_path / "s", default_model=TEACHER, seed=1)
    items = read_records(tmp_path / "s" / "benchmark.jsonl", MCItem)
    by = {r.rule: r for r in shortcut_baselines(items)}
    assert by["question_overlap"].accuracy.value > 0.5


def test_oracle_contexts_hold_the_answer_sentence_within_the_budget():
    from workbench.evaluate.contexts import OracleContexts
    from workbench.records import Provenance

    text = " ".join(f"Sentence {i} says something about topic {i}." for i in range(200))
    sec = Section(id="s1", doc_id="d", source="d.md", heading_path=["T"], text=text,
                  content_hash="h")
    right = "Sentence 150 says something about topic 150."
    item = MCItem(id="i", question="What does sentence 150 say?",
                  options=["Sentence 150 says nothing.", right, "x", "y"], answer="B",
                  provenance=Provenance(section_id="s1", span_hash="h"))
    ctx = OracleContexts([item], [sec], max_words=60)
    out = ctx([item.question])[0]
    assert right in out and len(out.split()) <= 60 + 6
    assert ctx([item.question], (2, 3)) == [""]  # no "ranks below" the source passage
    # statement items share their question: each gets the window around its own sentence
    first = "Sentence 3 says something about topic 3."
    twin = item.model_copy(update={"id": "j", "options": [first, "x", "y", "z"],
                                   "answer": "A"})
    a, b = OracleContexts([item, twin], [sec], max_words=60)([item.question] * 2)
    assert right in a and first not in a and first in b and right not in b


def test_mc_training_replies_start_with_the_letter_the_scoring_reads():
    """The letter scoring reads the reply's first token: training must teach that token
    (a reply starting "The correct answer is" never did), and the answer parser reads what
    a trained model then writes."""
    from workbench.distill.export import to_chat
    from workbench.evaluate.mc import extract_letter
    from workbench.records import Provenance, QTSASample

    s = QTSASample(id="q", kind="mc", question="Which?", options=["w", "x", "y", "z"],
                   thinking="Because.", solution="The correct option is C: y", answer="C",
                   provenance=Provenance(section_id="s", span_hash="h"))
    for style in ("instruct", "thinking"):
        reply = to_chat(s, style).messages[-1].content
        assert reply.startswith("C) y\n\n") and reply.endswith("<answer>C</answer>")
        assert extract_letter(reply) == "C"
    for text, letter in (("The correct answer is: C) y", "C"), ("answer is: B)", "B"),
                         ("The answer is (D).", "D"), ("A) w", "A")):
        assert extract_letter(text) == letter


def test_recall_samples_teach_every_unanswered_training_sentence_and_get_seen_items(tmp_path):
    """distill.recall_samples: each answer-sized sentence of a training section that no
    written sample answers becomes a training sample (no model call), the seen benchmark then
    asks about those sentences too, and no held-out section's sentence is ever trained."""
    from workbench.distill.pipeline import Span
    from workbench.distill.tasks import facts

    kw = dict(seen_fraction=1.0, distractors="perturbed", kinds=["mc", "nd"],
              benchmark_items="statement")
    base = run_distill(cfg(**kw), tmp_path / "a", default_model=TEACHER, seed=1)
    res = run_distill(cfg(**kw, recall_samples=True), tmp_path / "b", default_model=TEACHER,
                      seed=1)
    assert res.report.model_calls.made == base.report.model_calls.made
    run = tmp_path / "b"
    secs = {s.id: s for s in read_records(run / "sections.jsonl", Section)}
    train = [s for s in res.samples if s.split == "train"]
    recall = [s for s in train if "recall" in s.flags]
    assert recall and res.report.stages["recall_samples"] == len(recall)
    train_secs = {s.provenance.section_id for s in train}
    want = {f for sid in train_secs
            for f in facts(Span(sid, secs[sid], secs[sid].text.strip(), ""), 1)}
    taught = {s.solution for s in recall} | {s.answer for s in train if "recall" not in s.flags}
    assert {sha(f) for f in want} <= {s.provenance.fact_hash for s in train}
    assert all(s.kind == "nd" and s.question.startswith("What does the text say about ")
               and s.solution in secs[s.provenance.section_id].text for s in recall)
    assert len({s.solution for s in recall}) == len(recall) and taught
    held = {it.provenance.section_id for it in read_records(run / "benchmark.jsonl", MCItem)}
    assert not held & train_secs
    seen = read_records(run / "benchmark_seen.jsonl", MCItem)
    seen0 = read_records(tmp_path / "a" / "benchmark_seen.jsonl", MCItem)
    assert len(seen) > len(seen0)
    sft = [json.loads(x) for x in (run / "sft" / "instruct_mixed.messages.jsonl")
           .read_text().splitlines()]
    asked = {r["messages"][0]["content"] for r in sft}
    assert not asked & {it.question for it in seen}
    assert sum(r["messages"][0]["content"].startswith("What does the text say about ")
               for r in sft) == len(recall)


def sha(text):
    from workbench.io import sha256_text

    return sha256_text(text)[:16]
