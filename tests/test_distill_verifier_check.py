"""A person checks the distillation verifier's decisions: the generic sample, ratings and
agreement (workbench.evaluate.agreement) and the verifier's decisions of a real run made
with the scripted teacher (workbench.distill.verifier_check, `distill verifier-check`)."""

import shutil
import sys
from pathlib import Path

import pytest

from workbench.distill.config import AgentModel, DistillConfig
from workbench.distill.pipeline import run_distill
from workbench.errors import DataError, WorkbenchError
from workbench.evaluate.agreement import (
    Decision,
    Rating,
    Shown,
    agreement,
    append_rating,
    check,
    precision,
    read_ratings,
    reading,
    stratified_sample,
)
from workbench.io import sha256_text

sys.path.insert(0, str(Path(__file__).parent))
TEACHER = AgentModel(spec="fake", options={"script": "fake_teacher:reply"})
ALWAYS_D = AgentModel(spec="fake", options={"name": "always-d", "responses": ["D"]})
ENV = {"PYTHONPATH": str(Path(__file__).parent)}


def _cfg(**kw) -> DistillConfig:
    base = {"mode": "single", "max_sections": 10, "benchmark_fraction": 0.3,
            "corpus": "datasets/rf", "domain": "rf"}
    return DistillConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def flag_run(tmp_path_factory) -> Path:
    """A verifier that answers "D" to everything, its disagreements kept and flagged: the
    run holds its yeses and its noes."""
    root = tmp_path_factory.mktemp("vc") / "flag"
    run_distill(_cfg(verifier={"method": "generate", "on_disagree": "flag"},
                     models={"verifier": ALWAYS_D.model_dump()}), root / "distill",
                default_model=TEACHER, seed=3)
    return root


@pytest.fixture(scope="module")
def reject_run(tmp_path_factory) -> Path:
    """The default: disagreements rejected (the run keeps only the verifier's yeses); long
    sections cut into spans."""
    root = tmp_path_factory.mktemp("vc") / "reject"
    run_distill(_cfg(verifier={"method": "generate"}, max_section_chars=700,
                     models={"verifier": ALWAYS_D.model_dump()}), root / "distill",
                default_model=TEACHER, seed=3)
    return root


@pytest.fixture
def run_copy(flag_run, tmp_path) -> Path:
    shutil.copytree(flag_run, tmp_path / "run")
    return tmp_path / "run"


def _items(yes: int, no: int) -> list[Decision]:
    return [Decision(key=f"k{i:03d}", shown=[Shown(label="q", text=f"item {i}")],
                     machine=i < yes, decider="m") for i in range(yes + no)]


def _rating(key: str, verdict: bool | None) -> Rating:
    return Rating(key=key, verdict=verdict, by="ana", at="2026-01-01T00:00:00+00:00")


# --- the generic part -------------------------------------------------------------------------

def test_sample_is_stratified_stable_and_nested():
    items = _items(40, 25)
    s = stratified_sample(items, 20, seed=7)
    assert len(s) == 20 and sum(i.machine for i in s) == 10
    # the same items in the same order whatever the input order; a larger sample holds it
    assert [i.key for i in stratified_sample(items[::-1], 20, seed=7)] == [i.key for i in s]
    assert {i.key for i in s} <= {i.key for i in stratified_sample(items, 30, seed=7)}
    assert [i.key for i in stratified_sample(items, 20, seed=8)] != [i.key for i in s]
    # not enough noes: all of them, the rest yeses; more than there are: all
    few = _items(40, 3)
    s = stratified_sample(few, 20, seed=0)
    assert sum(not i.machine for i in s) == 3 and len(s) == 20
    assert len(stratified_sample(few, 100, seed=0)) == 43
    # the order does not give the verdicts away (not all yeses first)
    flags = [i.machine for i in stratified_sample(items, 20, seed=7)]
    assert flags != sorted(flags) and flags != sorted(flags, reverse=True)


def test_kappa_matches_a_hand_computation():
    # machine/person: yes/yes 4, yes/no 1, no/yes 2, no/no 3. Observed agreement 7/10;
    # machine yes 5/10, person yes 6/10, chance 0.5*0.6 + 0.5*0.4 = 0.5;
    # kappa = (0.7 - 0.5) / (1 - 0.5) = 0.4
    items = _items(5, 5)
    said = [True, True, True, True, False, True, True, False, False, False]
    ratings = {i.key: _rating(i.key, v) for i, v in zip(items, said, strict=True)}
    a = agreement(items, ratings, seed=0)
    assert a.n == 10 and a.kappa == pytest.approx(0.4)
    assert a.observed == pytest.approx(0.7) and a.expected == pytest.approx(0.5)
    assert a.confusion == {"yes/yes": 4, "yes/no": 1, "no/yes": 2, "no/no": 3}
    assert a.ci_low <= 0.4 <= a.ci_high
    # a skip does not count; items that are not decisions do not either
    ratings[items[0].key] = _rating(items[0].key, None)
    ratings["elsewhere"] = _rating("elsewhere", True)
    assert agreement(items, ratings).n == 9
    p = precision(items, ratings)  # of the machine's 4 rated yeses the person agreed to 3
    assert (p.n, p.agreed) == (4, 3) and p.ci_low < 0.75 < p.ci_high


def test_skips_are_replaced_and_the_reading_says_when_to_trust():
    items = _items(30, 30)
    ratings: dict[str, Rating] = {}
    c = check(items, ratings, 10, seed=1)
    assert c.mode == "kappa" and len(c.sample) == 10 and c.progress == (0, 10)
    r = reading(c)
    assert r.trusted is None and r.more == 20 and "rate 20 more" in r.text
    ratings[c.sample[0].key] = _rating(c.sample[0].key, None)  # skipped: another comes in
    c = check(items, ratings, 10, seed=1)
    assert len(c.sample) == 11 and c.progress == (0, 10) and c.next.key != c.sample[0].key
    agree = {i.key: _rating(i.key, i.machine) for i in items[:12] + items[30:42]}
    r = reading(check(items, agree, 24, seed=1), what="the verifier")
    assert r.trusted is True and r.text.startswith("the verifier can be trusted")
    against = {i.key: _rating(i.key, not i.machine) for i in items[:12] + items[30:42]}
    r = reading(check(items, against, 24, seed=1))
    assert r.trusted is False and r.more == 0 and "cannot be trusted" in r.text
    # only yeses: precision, trusted when its interval's lower end reaches 80%
    yes_only = _items(40, 0)
    right = {i.key: _rating(i.key, True) for i in yes_only[:30]}
    c = check(yes_only, right, 30)
    assert c.mode == "precision" and c.agreement.kappa is None
    assert reading(c).trusted is True
    mixed = {**right, **{i.key: _rating(i.key, False) for i in yes_only[:5]}}
    r = reading(check(yes_only, mixed, 30))  # 25/30 = 83%, interval reaches down to 66%
    assert r.trusted is False and r.more > 0 and "rate about" in r.text


def test_ratings_append_and_the_last_counts(tmp_path):
    f = tmp_path / "ratings.jsonl"
    assert read_ratings(f) == {}
    append_rating(f, "a", True, by="ana")
    append_rating(f, "b", None, by="ana")
    append_rating(f, "a", False, by=" bo ")
    assert len(f.read_text().splitlines()) == 3
    got = read_ratings(f)
    assert got["a"].verdict is False and got["a"].by == "bo" and got["b"].verdict is None
    with pytest.raises(WorkbenchError, match="name of the person"):
        append_rating(f, "a", True, by="  ")
    # the rubric judge's rows (`met`) read the same; a torn last line is skipped
    with open(f, "a") as fh:
        fh.write('{"key": "c", "met": true, "by": "x", "at": "t"}\n{"key": "d", "ver')
    got = read_ratings(f)
    assert got["c"].verdict is True and "d" not in got


def test_a_bad_ratings_line_is_named_by_file_and_line(tmp_path):
    f = tmp_path / "ratings.jsonl"
    f.write_text('{"key": "a", "verdict": true, "by": "ana", "at": "t"}\n'
                 '{"key": "b", "verdict": "perhaps", "by": "ana", "at": "t"}\n'
                 '{"key": "c", "verdict": true, "by": "ana", "at": "t"}\n')
    with pytest.raises(DataError, match=rf"{f}:2: verdict"):
        read_ratings(f)
    f.write_text('{"key": "a", "verdict": true, "by": "ana", "at": "t"}\nnot json\n')
    with pytest.raises(DataError, match=rf"{f}:2: bad JSON"):
        read_ratings(f)
    f.unlink()
    f.mkdir()
    with pytest.raises(DataError, match="not a regular file"):
        read_ratings(f)
    link = tmp_path / "link.jsonl"
    link.symlink_to(tmp_path / "elsewhere.jsonl")
    with pytest.raises(DataError, match="not a regular file"):
        read_ratings(link)


# --- the verifier's decisions in a run ------------------------------------------------------

def test_the_verifier_decisions_show_what_it_saw_and_hide_its_verdict(flag_run, reject_run):
    from workbench.distill.api import load_samples
    from workbench.distill.verifier_check import verifier_check, verifier_decisions

    d = verifier_decisions(flag_run)
    samples = {s.id: s for s in load_samples(flag_run, reviewed=False)}
    assert d.folder == flag_run / "distill" and d.on_disagree == "flag" and d.not_kept == 0
    assert d.verifier == "fake:always-d (generate)"
    # every verified MC sample, and nothing else: yes unless flagged verifier_disagrees
    mc = [s for s in samples.values() if s.kind == "mc"]
    assert {i.key for i in d.items} == {s.id for s in mc}
    assert all(i.machine == ("verifier_disagrees" not in samples[i.key].flags)
               for i in d.items)
    assert 0 < sum(i.machine for i in d.items) < len(d.items)
    item = d.items[0]
    s = samples[item.key]
    shown = {f.label: f.text for f in item.shown}
    assert list(shown) == ["section", "text", "question", "options", "keyed answer"]
    assert shown["question"] == s.question and s.options[0] in shown["options"]
    assert shown["keyed answer"] == f"{s.answer}) {s.options['ABCD'.index(s.answer)]}"
    assert not any("verifier" in f.text or "disagree" in f.text for f in item.shown)
    # the sample: stratified, the same after a reload
    c = verifier_check(flag_run, n=12).check
    assert sum(i.machine for i in c.sample) == 6 and c.mode == "kappa"
    assert [i.key for i in verifier_check(flag_run / "distill", n=12).check.sample] == \
        [i.key for i in c.sample]
    # under on_disagree=reject the rejections are kept in verifier.jsonl: yes and no, kappa
    r = verifier_decisions(reject_run)
    rejected = [i for i in r.items if not i.machine]
    assert r.not_kept == 0 and rejected and any(i.machine for i in r.items)
    assert len(rejected) == r.checked - sum(i.machine for i in r.items)
    assert verifier_check(reject_run).check.mode == "kappa"
    shown = {f.label: f.text for f in rejected[0].shown}
    assert list(shown) == ["section", "text", "question", "options", "keyed answer"]
    assert shown["keyed answer"] and not any("verifier" in t for t in shown.values())
    # a long section was cut into spans: the text shown is the span the verifier read
    rs = {s.id: s for s in load_samples(reject_run, reviewed=False)}
    texts = {i.key: next(f.text for f in i.shown if f.label == "text") for i in r.items
             if i.machine}
    cut = [k for k, t in texts.items() if sha256_text(t)[:16] == rs[k].provenance.span_hash]
    assert cut and all(len(texts[k]) <= 700 for k in cut)
    assert all(len(next(f.text for f in i.shown if f.label == "text")) <= 700
               for i in rejected)


def test_rating_in_a_run_appends_and_the_last_counts(run_copy):
    from workbench.distill.verifier_check import RATINGS, verifier_decisions

    d = verifier_decisions(run_copy)
    yes = next(i for i in d.items if i.machine)
    no = next(i for i in d.items if not i.machine)
    d.rate(yes.key, True, by="ana")
    d.rate(no.key, True, by="ana")
    d.rate(no.key, False, by="bo")  # changes the verdict: the last one counts
    f = run_copy / "distill" / RATINGS
    assert len(f.read_text().splitlines()) == 3
    a = d.check(10).agreement
    assert a.n == 2 and a.confusion["yes/yes"] == 1 and a.confusion["no/no"] == 1
    with pytest.raises(WorkbenchError, match="not an item the verifier decided"):
        d.rate("q-nope", True, by="ana")


def test_cli_rates_with_the_verdict_hidden_and_reports(run_copy, cli):
    from workbench.distill.verifier_check import verifier_check

    before = verifier_check(run_copy, n=6).check.sample
    r = cli("distill", "verifier-check", str(run_copy), "--rate", "--by", "ana",
            "--sample", "6", stdin="y\nn\nmaybe\ns\ny\nq\n", env=ENV)
    assert r.returncode == 0, r.stderr
    assert "Is this sample correct and answerable from the text? [y/n/s/q]" in r.stdout
    assert "keyed answer: " in r.stdout and "question: " in r.stdout
    assert r.stdout.count("[3/6]") == 3  # asked again after "maybe", then a skip
    assert "[4/6]" in r.stdout and "[5/6]" not in r.stdout
    rated = verifier_check(run_copy, n=6).decisions.check(6).rated
    assert [rated[i.key].verdict for i in before[:4]] == [True, False, None, True]
    assert {x.by for x in rated.values()} == {"ana"}
    # without --rate: the agreement, the table and the reading
    r = cli("distill", "verifier-check", str(run_copy), "--sample", "6", env=ENV)
    assert r.returncode == 0, r.stderr
    assert "3 of 6 sampled decisions rated by a person" in r.stdout
    assert "kappa " in r.stdout and "verifier yes" in r.stdout and "person no" in r.stdout
    assert "reading: not yet measured: 3 of 20 items rated; rate 17 more" in r.stdout
    # --rate without --by
    r = cli("distill", "verifier-check", str(run_copy), "--rate", env=ENV)
    assert r.returncode == 2 and "--by" in r.stderr


def test_cli_precision_when_the_run_keeps_only_yeses(reject_run, tmp_path, cli):
    run = tmp_path / "run"
    shutil.copytree(reject_run, run)
    (run / "distill" / "verifier.jsonl").unlink()  # a run made before it was written
    r = cli("distill", "verifier-check", str(run), "--rate", "--by", "ana",
            stdin="y\n" * 3 + "n\nq\n", env=ENV)
    assert r.returncode == 0, r.stderr
    assert "the run keeps no options of the" in r.stdout
    assert "precision 75.0% [" in r.stdout and "3 of 4 accepted samples" in r.stdout


def test_bad_input_is_one_line(run_copy, tmp_path, cli):
    from workbench.distill.verifier_check import RATINGS

    for path, says in ((tmp_path / "nope", "not a run folder (no such folder)"),
                       (tmp_path, "no distillation in it")):
        r = cli("distill", "verifier-check", str(path), env=ENV)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1
        assert lines[0].startswith(f"error: {path}: {says}")
    f = run_copy / "distill" / RATINGS
    f.write_text('{"key": "a", "verdict": true, "by": "ana", "at": "t"}\n{"key": "b"}\n')
    r = cli("distill", "verifier-check", str(run_copy), env=ENV)
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1
    assert f"{f}:2: verdict: missing field" in r.stderr


def test_a_run_without_verifier_decisions_says_so(tmp_path):
    from workbench.distill.verifier_check import verifier_decisions

    run_distill(_cfg(max_sections=3, verifier={"enabled": False}), tmp_path / "r" / "distill",
                default_model=TEACHER)
    with pytest.raises(WorkbenchError, match="the verifier made no decisions"):
        verifier_decisions(tmp_path / "r")
