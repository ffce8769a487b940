"""Quality gates (workbench.distill.gates): the rules one by one, then a distillation with a
scripted teacher that writes each bad kind of question next to good ones."""

import json
import sys
from pathlib import Path

import pytest

from workbench.distill import gates
from workbench.distill.config import AgentModel, DistillConfig, GatesConfig
from workbench.distill.pipeline import run_distill
from workbench.io import sha256_text
from workbench.records import Section

sys.path.insert(0, str(Path(__file__).parent))

import fake_teacher  # noqa: E402

TEACHER = AgentModel(spec="fake", options={"script": "fake_teacher:gated_reply"})
TITLES = {"bjt": "Bipolar transistors", "diff": "Comparing files", "patch": "Applying patches"}


def sections() -> list[Section]:
    out = []
    for i, (key, title) in enumerate(TITLES.items()):
        text = " ".join(s for k, s, _, _ in fake_teacher.GATED if k == key)
        out.append(Section(id=f"sec-{key}", doc_id="notes", source="notes.md",
                           heading_path=[title], text=text, content_hash=sha256_text(text)[:16],
                           order=i))
    return out


def cfg(**kw) -> DistillConfig:
    base = dict(corpus="(inline)", domain="generic", mode="composed", answer_source="text",
                kinds=["nd"], benchmark_fraction=0.0, verifier={"enabled": False})
    return DistillConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    run = tmp_path_factory.mktemp("g") / "run"
    return run_distill(cfg(), run, default_model=TEACHER, sections=sections(), cache=False)


# --- the rules ---------------------------------------------------------------------------------

def test_echoed_prefixes_are_stripped_or_refused():
    assert gates.echo_prefix("Q: Q: What is a hunk?")[0] == "What is a hunk?"
    assert gates.echo_prefix("Question 3: **Question:** why?")[1].reason == "echo_only"
    q, v = gates.echo_prefix("Here is a question: what does cmp report?")
    assert (q, v.action) == ("What does cmp report?", "strip")
    assert gates.echo_prefix("What is a hunk? A: a group of lines")[1].reason == "echoed_marker"
    assert gates.echo_prefix("Fact: diff compares files. Which tool?")[1].action == "reject"
    assert gates.echo_prefix("Write a question about diff: what is it?")[1].action == "reject"
    assert gates.echo_prefix("What does the Source field name?")[1].action == "pass"


def test_echoed_preambles_are_stripped():
    for pre in ("The correct question is: ", "My question is: ", "The question is - ",
                "Question would be: ", "Sure! Here is the question: "):
        q, v = gates.echo_prefix(pre + "Why are only a few packages part of the base system?")
        assert (q, v.action) == ("Why are only a few packages part of the base system?",
                                 "strip"), pre
    # a question that merely mentions a question is no preamble
    q, v = gates.echo_prefix("What question is the Maintainer field an answer to?")
    assert v.action == "pass"


@pytest.mark.parametrize("question,asks", [
    ("What is a hunk?", True), ("Is the Maintainer field required?", True),
    ("Explain why diff prints context?", True), ("In which format is context shown?", True),
    ("When comparing files, what does diff print?", True),
    ("When should diff use the -u option?", True),
    ("For a 50-ohm line, how large is the reflection?", True),
    ("The unified format: what does it show?", True),
    ("Diff compares two files, doesn't it?", True),
    ("The diff command compares two files line by line?", False),
    ("When comparing files, diff prints hunks?", False),
    ("Diff compares two files, which are named on the command line?", False),
    ("Silicon transistors need 0.7 volts?", False),
    ("What's the 'ignore-trailing-space' option?", True),
    ("What are the options used for?", True),
    ("What is the origin of Heaven and...?", False),  # cut off, a "?" appended
    ("When two people have made changes to a file, they can report changes, and can,?", False),
    ("What does the unified format show around each?", True),
    ("What is the output line after the first line is incomplete, if the second line is?",
     False),  # a clause cut before its complement
    ("What does diff print when a line is?", False),
    ("What does diff print when a line is missing?", True),
])
def test_statements_with_a_question_mark_are_refused(question, asks):
    v = gates.interrogative(question)
    assert (v.action == "pass") is asks, v


def test_questions_that_point_at_what_the_reader_cannot_see_are_refused():
    for q in ("What does some of these options take?", "Is this a chapter or appendix?",
              "What does the output of the above answer change to?"):
        assert gates.self_contained(q).reason == "points_at_unseen_context", q
    for q in ("Which one should I use for a new package?", "Which ones are required?",
              "What does the following option do?", "Why is the latter preferred?"):
        assert gates.self_contained(q).reason == "points_at_unseen_context", q
    for q in ("What does 'this' mean in C?", "Which option shows three lines of context?",
              "Which one of the two output formats shows context?"):
        assert gates.self_contained(q).action == "pass", q


@pytest.mark.parametrize("question,detail", [
    ("What's the significance of patch patch?", "patch patch"),
    ("What is the package package name?", "package package"),
    ("How does the file name the file name?", "the file name the file name"),
    ("What is the default after the i n s t a l l a t i o n of mpich2?", "i n s t a l l a t i o n"),
    ("What is the difference between two lines of a file with the first line and the last "
     "line?", "'line' 3 times"),
    ("What is the reason for a version number in the Version. field?", "Version. field"),
])
def test_repeated_or_broken_phrases_are_refused(question, detail):
    v = gates.broken_phrases(question)
    assert v.action == "reject" and detail in v.detail, v


@pytest.mark.parametrize("question", [
    "What command compares two files character by character?",
    "What is the base system on a Debian system?",  # a word twice is fine
    "Why does diff convert a carriage return and newline to a plain newline?",
    "Is it true that that option is deprecated?",
    "What does 'diff diff' print?",  # quoted
    "Which tools, e.g. cmp, sdiff etc. also compare files?",  # abbreviations
    "What does the -u option of GNU diff 3.8 print?",
])
def test_sound_wording_passes_the_broken_phrases_gate(question):
    assert gates.broken_phrases(question).action == "pass", gates.broken_phrases(question)


def test_names_a_question_uses():
    assert gates.named_entities("What is the actual distribution of Nginx?") == ["Nginx"]
    assert gates.named_entities("Does the Debian Policy Manual allow it?") == \
        ["Debian Policy Manual"]
    got = gates.named_entities("How does GNU diff3 treat --ignore-case at 2.4 GHz in "
                               "debian/control and 'lao'?")
    assert set(got) == {"GNU", "diff3", "--ignore-case", "2.4 GHz", "debian/control", "lao"}
    # the first word, common words, hyphenated words, single digits and "e.g." are no names
    assert gates.named_entities("Which side-by-side format, e.g. with 2 files, is used?") == []
    assert gates.named_entities("What is the role of the emitter in a BJT?") == ["BJT"]


def test_names_and_words_are_looked_up_in_the_section():
    ctx = gates.Context(section_text="GNU diff compares files. The --ignore-case option "
                                     "ignores case. Patches are applied by patch.",
                        headings="Comparing files", document_stems=gates.stems(
                            "diff compares files; a transistor amplifies current"))
    ok = gates.check("How do GNU patches use --ignore-case?", ctx)
    assert ok.removed_by is None, ok.verdicts
    bad = gates.check("How does Nginx compare files?", ctx).removed_by
    assert (bad.gate, bad.detail) == ("named_entities", "Nginx")
    bad = gates.check("How does a transistor amplify current?", ctx).removed_by
    assert bad.gate == "content_words" and "transistor" in bad.detail
    bad = gates.check("What is the biological basis of diff files?", ctx).removed_by
    assert (bad.gate, bad.reason) == ("foreign_words", "foreign_words")
    assert "biological" in bad.detail
    # the answer vouches for content words, never for names
    ans = gates.Context(section_text="diff compares files.", answer="a transistor amplifies "
                        "current", document_stems=gates.stems("transistor amplify current"))
    assert gates.check("How does a transistor amplify current?", ans).removed_by is None
    assert gates.check("How does the BJT amplify current?", gates.Context(
        section_text="diff compares files.", answer="the BJT amplifies current")).removed_by \
        .gate == "named_entities"


# --- in the pipeline ---------------------------------------------------------------------------

def test_gates_remove_exactly_the_bad_questions_and_the_report_lists_them(gated):
    rep = gated.report
    g = rep.gates
    bad = {q: gate for _, _, q, gate in fake_teacher.GATED if gate not in (None, "strip")}
    good = [q for _, _, q, gate in fake_teacher.GATED if gate in (None, "strip")]
    assert rep.stages["parsed_and_answered"] == len(fake_teacher.GATED)
    assert g.checked == len(fake_teacher.GATED) and g.removed == len(bad) and g.stripped == 1
    removed = {e.question: x.name for x in g.gates for e in x.examples}
    assert removed == bad
    by_gate = {x.name: x.removed for x in g.gates}
    assert by_gate == {"echo_prefix": 1, "interrogative": 2, "self_contained": 0,
                       "broken_phrases": 0, "named_entities": 2, "content_words": 1,
                       "foreign_words": 1, "likelihood": 0}
    ids = {s.id for s in sections()}
    assert all(e.section_id in ids and e.reason and e.detail for x in g.gates
               for e in x.examples)
    # the good ones are the accepted samples, the echoed prefix stripped
    accepted = sorted(s.question for s in gated.samples)
    assert accepted == sorted(q.replace("Q: Q: Q: ", "") for q in good)
    stripped = [s for s in gated.samples if "stripped_prefix" in s.flags]
    assert [s.question for s in stripped] == ["What voltage must a silicon transistor see "
                                              "between base and emitter before it conducts?"]
    # the reasons are counted with the other rejects
    assert rep.rejects["absent_name"] == 2 and rep.rejects["statement_with_question_mark"] == 2
    # the markdown report lists every removed question under its gate, with its rule
    md = (gated.run_dir / "report.md").read_text()
    assert "## Quality gates" in md and "### Kept (a few)" in md
    for q, gate in bad.items():
        assert f"### Removed by {gate}" in md and repr(q) in md
    assert gates.rule_text("named_entities") in md
    # gates.jsonl: every question, every gate's verdict, what became of it
    rows = [json.loads(x) for x in (gated.run_dir / "gates.jsonl").read_text().splitlines()]
    assert len(rows) == len(fake_teacher.GATED)
    # every rule judges every question; the likelihood gate scores the ones the rules kept
    assert all(set(r["verdicts"]) == set(gates.RULE_GATES) | ({"likelihood"} if r["removed_by"]
                                                               is None else set())
               for r in rows)
    assert all(("likelihood" in r) == ("likelihood" in r["verdicts"]) for r in rows)
    assert sum(r["final"] == "accepted" for r in rows) == len(good)
    nginx = next(r for r in rows if "Nginx" in r["question"])
    assert nginx["removed_by"] == "named_entities" and nginx["final"] == "absent_name"
    off_topic = next(r for r in rows if "transistor amplify" in r["question"])
    assert off_topic["verdicts"]["content_words"]["action"] == "reject"
    assert off_topic["verdicts"]["foreign_words"]["action"] == "pass"  # the document has them


def test_gates_off_keep_everything_and_a_gate_can_be_turned_off(tmp_path):
    off = run_distill(cfg(gates={"enabled": False}), tmp_path / "off", default_model=TEACHER,
                      sections=sections(), cache=False)
    assert off.report.accepted.total == len(fake_teacher.GATED)
    assert off.report.gates.enabled is False
    assert "Off (distill.gates.enabled: false)" in (tmp_path / "off" / "report.md").read_text()
    some = run_distill(cfg(gates={"named_entities": False, "foreign_words": False}),
                       tmp_path / "some", default_model=TEACHER, sections=sections(),
                       cache=False)
    g = {x.name: x for x in some.report.gates.gates}
    assert not g["named_entities"].enabled and g["named_entities"].checked == 0
    # the Nginx question now passes (its other words are in its section), the cmp one too
    kept = {s.question for s in some.samples}
    assert "How does Nginx compare two files line by line?" in kept
    assert "What is the biological basis of a bipolar transistor?" in kept


def test_the_likelihood_gate_removes_the_questions_its_model_finds_unlikely(tmp_path):
    """The fake model scores a continuation by the share of its words its prompt holds
    (mean log-probability = share - 1): with the floor at -0.4 the questions that reuse
    less than 60% of their section's words go, and gates.jsonl holds every score."""
    res = run_distill(cfg(gates={"min_likelihood": -0.4}), tmp_path / "run",
                      default_model=TEACHER, sections=sections(), cache=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "gates.jsonl").read_text().splitlines()]
    scored = [r for r in rows if "likelihood" in r]
    ruled_out = {q for _, _, q, gate in fake_teacher.GATED if gate not in (None, "strip")}
    assert {r.get("stripped_to", r["question"]) for r in scored} == {
        gates.echo_prefix(q)[0] for _, _, q, _ in fake_teacher.GATED if q not in ruled_out}
    low = [r for r in scored if r["likelihood"]["mean_logprob"] < -0.4]
    assert 0 < len(low) < len(scored)
    assert all(r["removed_by"] == "likelihood" and r["final"] == "unlikely_question"
               and r["verdicts"]["likelihood"]["reason"] == "unlikely_question" for r in low)
    assert {s.question for s in res.samples} == {r.get("stripped_to", r["question"])
                                                 for r in scored if r not in low}
    g = {x.name: x for x in res.report.gates.gates}["likelihood"]
    assert g.removed == len(low) and g.checked == len(scored) and "-0.4" in g.rule
    assert res.report.rejects["unlikely_question"] == len(low)
    # off: nothing scored
    off = run_distill(cfg(gates={"likelihood": False, "min_likelihood": -0.4}),
                      tmp_path / "off", default_model=TEACHER, sections=sections(),
                      cache=False)
    assert len(off.samples) == len(scored)
    assert not any("likelihood" in json.loads(x) for x in
                   (tmp_path / "off" / "gates.jsonl").read_text().splitlines())


def test_questions_of_one_span_share_one_score_request():
    from workbench.distill import likelihood
    from workbench.models.base import ContinuationScore

    class Recorder:
        def __init__(self):
            self.requests: list = []

        def score(self, requests):
            self.requests.extend(requests)
            return [[ContinuationScore(-2.0 * len(c.split()), len(c.split()), len(c))
                     for c in r.continuations] for r in requests]

    rec = Recorder()
    got = likelihood.question_likelihoods(rec, [("Text one.", "What is one?"),
                                                ("Text two.", "What is two?"),
                                                ("Text one.", "Why is one so?")])
    assert [r.prompt for r in rec.requests] == ["Text one.\n\nQuestion:",
                                                "Text two.\n\nQuestion:"]
    assert rec.requests[0].continuations == [" What is one?", " Why is one so?"]
    assert [x.mean for x in got] == [-2.0, -2.0, -2.0] and got[2].n_tokens == 4
    assert likelihood.question_likelihoods(rec, []) == []


def test_a_model_that_cannot_score_passes_every_question_and_says_so():
    from workbench.distill.pipeline import _likelihood_gate
    from workbench.distill.write import Stats

    row: dict = {"verdicts": {}}
    _likelihood_gate([(object(), row)], None, cfg(), Stats())  # type: ignore[list-item]
    assert row["verdicts"]["likelihood"] == {
        "action": "pass", "reason": "not_scored",
        "detail": "the verifier's model cannot score continuations"}


SEEN: list[str] = []


def counting_reply(conv) -> str:
    """`gated_reply`, keeping every prompt it was asked."""
    SEEN.append(conv[-1]["content"])
    return fake_teacher.gated_reply(conv)


def test_no_rationale_call_is_spent_on_a_question_the_gates_remove(tmp_path):
    SEEN.clear()
    teacher = AgentModel(spec="fake", options={"script": "test_distill_gates:counting_reply"})
    res = run_distill(cfg(), tmp_path / "run", default_model=teacher, sections=sections(),
                      cache=False)
    rationale = [p for p in SEEN if "The correct answer is:" in p]
    bad = [q for _, _, q, gate in fake_teacher.GATED if gate not in (None, "strip")]
    assert bad and not [q for q in bad for p in rationale if f"Question: {q}" in p]
    # one rationale call for each kept question, the stripped one with its prefix gone
    assert len(rationale) == len(res.samples) == len(fake_teacher.GATED) - len(bad)
    assert res.report.gates.removed == len(bad)


# --- full tier: a real manual and the bundled teacher ------------------------------------------

def test_on_a_real_manual_no_accepted_question_names_what_its_section_lacks(tmp_path,
                                                                            bundled_model):
    """Full tier: the bundled teacher distils 4 sections of the GNU Diffutils manual (the info
    file Debian's `diffutils` ships, as benchmarks/realdocs.py reads it), gates off, then on
    from the same model calls. No question kept with the gates on names anything (a program,
    an option, an acronym, a number) that its section does not; the report lists what each
    gate removed."""
    import importlib.util

    from workbench.records import read_records

    info = Path("/usr/share/info/diffutils.info.gz")
    if not info.exists():
        pytest.skip(f"{info} is missing (Debian's diffutils ships it)")
    spec = importlib.util.spec_from_file_location(
        "realdocs", Path(__file__).parents[1] / "benchmarks" / "realdocs.py")
    realdocs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(realdocs)
    corpus = tmp_path / "manual"
    corpus.mkdir()
    (corpus / "diffutils.md").write_text(realdocs.info_to_markdown(info), encoding="utf-8")
    base = DistillConfig(corpus=str(corpus), domain="generic", mode="composed",
                         answer_source="text", max_sections=4, benchmark_fraction=0.0,
                         perspectives=["concepts", "analysis", "design"], constrained="auto",
                         writer_temperature=0.7, writer_max_tokens=48, answer_max_tokens=64,
                         verifier={"enabled": False})
    run = tmp_path / "run"  # one folder: the second run reuses the first one's calls
    off = run_distill(base.model_copy(update={"gates": GatesConfig(enabled=False)}), run)
    on = run_distill(base, run)
    rows = [json.loads(x) for x in (run / "gates.jsonl").read_text().splitlines()]
    # the same calls, but a question whose echoed prefix was stripped is a new prompt for the
    # calls after the gates (its answer or rationale): at most one each, never more
    restripped = [r for r in rows if "stripped_to" in r and r["removed_by"] is None]
    assert on.report.model_calls.from_cache > 0
    assert on.report.model_calls.made <= len(restripped), restripped
    secs = {s.id: s for s in read_records(run / "sections.jsonl", Section)}

    def absent(question: str, section_id: str) -> list[str]:
        sec = secs[section_id]
        hay = f"{sec.title}\n{sec.text}".lower()
        return [e for e in gates.named_entities(question)
                if not gates.occurs(e, hay, gates.stems(hay))]

    assert [(s.question, absent(s.question, s.provenance.section_id)) for s in on.samples
            if absent(s.question, s.provenance.section_id)] == []
    # what the model writes varies with the platform: the checks below hold whatever it is
    g = on.report.gates
    assert g.enabled and g.checked == on.report.stages["parsed_and_answered"]
    assert g.removed == sum(x.removed for x in g.gates) == len(
        [e for x in g.gates for e in x.examples])
    kept_off = {s.question for s in off.samples}
    assert len(rows) == g.checked and kept_off <= {r["question"] for r in rows}
    assert {s.question for s in on.samples} == {r.get("stripped_to", r["question"])
                                                for r in rows if r["final"] == "accepted"}
    md = (run / "report.md").read_text()
    assert all(f"### Removed by {x.name}" in md for x in g.gates if x.removed)
    # the likelihood gate scored every question the rules kept, and removed those below
    # the floor (gates.jsonl holds the scores)
    floor = base.gates.min_likelihood
    ruled = [r for r in rows if r["removed_by"] not in (None, "likelihood")]
    assert all("likelihood" not in r for r in ruled)
    assert all((r["removed_by"] == "likelihood") == (r["likelihood"]["mean_logprob"] < floor)
               for r in rows if r not in ruled)
