"""Summaries that tell conditions apart: both OLMES formulations, distributions, the degenerate
flag, the headline rule, paired comparisons with Holm, typed summary.json, markdown, plot."""

import json
import re

import pytest

from workbench.errors import DataError, WorkbenchError
from workbench.evaluate.config import EvalConfig
from workbench.evaluate.report import (
    plot_conditions, read_eval_results, read_eval_summary, summary_markdown, write_eval,
)
from workbench.evaluate.run import evaluate_conditions
from workbench.evaluate.summary import SCHEMA_VERSION, compare_runs
from workbench.models.base import (
    Capabilities, ChatModel, ContinuationScore, Generation, ScoreRequest,
)
from workbench.records import LETTERS, MCItem

N = 40


def bench(n=N):
    out = []
    for i in range(n):
        k = i % 4
        opts = ["no", "nah", "nope"]
        opts.insert(k, f"the long right answer number {i}")
        out.append(MCItem(id=f"i{i}", question=f"Question {i}: which one?", options=opts,
                          answer=LETTERS[k]))
    return out


class Scripted(ChatModel):
    """A scorer with known habits, through the real ChatModel interface: letters always favour
    "A" (a degenerate letter scorer, like the bundled 135M model); option texts cost 0.1 nats
    per character when right and 0.3 when wrong, except that without reference passages the
    odd-numbered questions are not known (right costs 0.3 too). Raw sums then favour the
    short wrong options; per-character normalisation finds the right one when known."""

    backend_name = "scripted"
    capabilities = Capabilities(score=True)

    def __init__(self, better=False):
        self.better = better  # an "SFT" model that knows every question
        self.score_calls: list[list[ScoreRequest]] = []
        self.prompts: list = []

    @property
    def identity(self):
        return "scripted-sft" if self.better else "scripted"

    def generate(self, conversations, params=None, tools=None, tool_choice=None):
        self.prompts += conversations
        return [Generation(text="I think the answer is B") for _ in conversations]

    def score(self, requests):
        self.score_calls.append(list(requests))
        out = []
        for req in requests:
            text = req.prompt if isinstance(req.prompt, str) else " ".join(
                m["content"] for m in req.prompt)
            i = int(re.search(r"Question (\d+)", text).group(1))
            known = self.better or "Reference passages" in text or i % 2 == 0
            row = []
            for c in req.continuations:
                c = c.strip()
                if len(c) == 1:
                    lp = 0.0 if c == "A" else -1.0
                else:
                    lp = -(0.1 if known and c.startswith("the long right") else 0.3) * len(c)
                row.append(ContinuationScore(logprob=lp, n_tokens=max(1, len(c) // 4),
                                             n_chars=len(c)))
            out.append(row)
        return out


class Passages:
    """A context provider as the RAG side would build one: formatted blocks by rank."""

    def __init__(self, name, top_k=3):
        self.name, self.top_k, self.calls = name, top_k, []

    def __call__(self, questions, ranks=None):
        self.calls.append(ranks)
        lo, hi = ranks or (1, self.top_k)
        return [f"[{lo}] {self.name} passage ranks {lo}-{hi} for {q}" for q in questions]


def run(model, conditions=("none", "semantic"), **cfg):
    providers = {c: Passages(c) for c in conditions if c != "none"}
    rows, summary = evaluate_conditions(model, bench(), EvalConfig(conditions=list(conditions),
                                                                   **cfg),
                                        contexts=providers, log=lambda m: None)
    return rows, summary, providers


def test_formulations_distributions_and_headline():
    model = Scripted()
    rows, s, providers = run(model)
    assert list(s.conditions) == ["none", "semantic", "semantic_ranks4-6"]
    assert providers["semantic"].calls == [None, (4, 6)]
    none = s.conditions["none"]
    letter, cloze, norm = (none.formulations[k] for k in ("letter", "cloze", "cloze_norm"))
    assert letter.predictions == {"A": N, "B": 0, "C": 0, "D": 0} and letter.degenerate
    assert none.gold == {x: N // 4 for x in "ABCD"}
    assert letter.accuracy.value == 0.25 and cloze.accuracy.value == 0.0
    assert norm.accuracy.value == 0.5 and not norm.degenerate
    assert norm.accuracy.ci_low < 0.5 < norm.accuracy.ci_high
    assert s.conditions["semantic"].formulations["cloze_norm"].accuracy.value == 1.0
    gen = none.generation
    assert gen.predictions["B"] == N and gen.degenerate and gen.unparsed == 0.0
    assert none.agreement_letter_generation == 0.0
    # headline: cloze_norm, letter left out as degenerate, and the rule is stated
    assert s.headline.formulation == "cloze_norm"
    assert "degenerate" in s.headline.excluded["letter"]
    assert "better" in s.headline.rule and "OLMES" in s.headline.rule
    # rows follow the headline; every formulation is kept per item
    r = next(r for r in rows if r.condition == "none" and r.example_id == "i1")
    assert r.extra["predictions"] == {"letter": "A", "cloze": "A", "cloze_norm": "A",
                                      "generate": "B"}
    assert r.prediction == r.extra["predictions"]["cloze_norm"] and r.correct is False
    assert set(r.scores) == {"letter", "cloze", "cloze_norm", "generate"}


def test_cloze_prompt_has_no_options_and_passes_stay_few():
    model = Scripted()
    run(model, conditions=("none", "hybrid"), methods=["loglik"])
    # per condition: one letter pass and one cloze pass, one request per item; the
    # ranks 4-6 check adds the same two
    assert [len(c) for c in model.score_calls] == [N] * 6
    letter_req, cloze_req = model.score_calls[0][0], model.score_calls[1][0]
    assert letter_req.continuations == ["A", "B", "C", "D"]
    assert "A) the long right answer number 0" in letter_req.prompt[0]["content"]
    assert cloze_req.prompt == [{"role": "user", "content": "Question 0: which one?"}]
    assert cloze_req.continuations[0] == "the long right answer number 0"
    hybrid = model.score_calls[3][0].prompt[0]["content"]
    assert hybrid.startswith("Use the reference passages to answer.\n\nReference passages:\n"
                             "[1] hybrid passage ranks 1-3")
    raw = Scripted()
    run(raw, conditions=("none",), methods=["loglik"], template="raw")
    assert raw.score_calls[1][0].prompt == "Question: Question 0: which one?\nAnswer:"
    assert raw.score_calls[1][0].continuations[1] == " no"


def test_conditions_compared_pairwise_with_holm():
    _, s, _ = run(Scripted(), conditions=("none", "semantic", "keyword"))
    pairs = {(c.a, c.b): c for c in s.comparisons}
    assert set(pairs) == {("none", "semantic"), ("none", "keyword"), ("semantic", "keyword"),
                          ("semantic", "semantic_ranks4-6"), ("keyword", "keyword_ranks4-6")}
    c = pairs[("none", "semantic")]
    assert (c.formulation_a, c.n, c.only_a, c.only_b) == ("cloze_norm", N, 0, N // 2)
    assert c.difference == pytest.approx(0.5) and c.difference_ci_low > 0
    assert c.p_value == pytest.approx(2 / 2 ** 20) and c.significant
    assert c.p_holm == pytest.approx(min(1.0, 5 * c.p_value))  # smallest of 5 tests
    same = pairs[("semantic", "keyword")]
    assert same.p_value == 1.0 and not same.significant and same.difference == 0.0


def test_missing_provider_is_a_clear_error():
    with pytest.raises(WorkbenchError, match="hybrid need retrieved contexts but no context "
                                             "provider"):
        evaluate_conditions(Scripted(), bench(), EvalConfig(conditions=["none", "hybrid"]),
                            log=lambda m: None)
    with pytest.raises(WorkbenchError, match="providers are for the RAG conditions"):
        evaluate_conditions(Scripted(), bench(), EvalConfig(conditions=["none"]),
                            contexts={"none": Passages("x")}, log=lambda m: None)


def test_no_headline_when_every_candidate_is_degenerate():
    _, s, _ = run(Scripted(), conditions=("none",), formulations=["letter"])
    assert s.headline.formulation is None and s.comparisons == []
    assert "**Headline: none** (every candidate formulation is degenerate)" in summary_markdown(s)


def test_summary_json_round_trip_markdown_and_plot(tmp_path):
    rows, s, _ = run(Scripted())
    out = write_eval(tmp_path / "ev", rows, s)
    data = json.loads((out / "summary.json").read_text())
    assert data["schema_version"] == SCHEMA_VERSION == 1
    assert data["conditions"]["none"]["formulations"]["cloze_norm"]["accuracy"]["value"] == 0.5
    back = read_eval_summary(out)
    assert back == s
    assert read_eval_results(out) == rows
    assert (out / "accuracy.png").stat().st_size > 1000
    md = (out / "summary.md").read_text()
    assert "| none | 40 | 25.0% [" in md and "degenerate" in md
    assert "**Headline: cloze, per-char norm. (CF)**" in md and "Rule: Per model" in md
    assert "| none | semantic | cloze_norm | 40 |" in md and "| yes |" in md
    # an old summary (before schema_version) is refused with a clear message
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "summary.json").write_text(json.dumps(
        {"conditions": {"none": {"n": 3, "acc_loglik_letter": 0.3}}}))
    with pytest.raises(DataError, match="older workbench.*re-run the evaluation"):
        read_eval_summary(tmp_path / "old")
    with pytest.raises(DataError, match="no summary.json"):
        read_eval_summary(tmp_path / "nothing")


def test_compare_runs_base_vs_sft(tmp_path):
    rows_a, a, _ = run(Scripted())
    rows_b, b, _ = run(Scripted(better=True), conditions=("none",))
    b = b.model_copy(update={"model": "SFT"})
    comps = compare_runs(a, rows_a, b, rows_b)
    assert len(comps) == 1  # only the condition both ran
    c = comps[0]
    assert (c.a, c.b) == ("scripted / none", "SFT / none")
    assert (c.accuracy_a, c.accuracy_b, c.only_b) == (0.5, 1.0, N // 2) and c.significant
    plot_conditions([a, b], tmp_path / "both.png")
    assert (tmp_path / "both.png").stat().st_size > 1000


def test_items_of_one_sentence_are_clustered_in_summary_and_comparisons():
    """Items whose provenance shares a source sentence (fact_hash) are one cluster: the
    accuracy interval and the paired comparison say how many clusters there are and are
    wider than if every item were independent."""
    from workbench.records import Provenance

    items = [it.model_copy(update={"provenance": Provenance(
        section_id="s", span_hash="h", fact_hash=f"fact{i % 2}-{i // 8}")})
        for i, it in enumerate(bench())]
    cfg = EvalConfig(conditions=["none", "semantic"], methods=["loglik"], hit_vs_miss=False)
    rows, clustered = evaluate_conditions(Scripted(), items, cfg,
                                          contexts={"semantic": Passages("semantic")},
                                          log=lambda m: None)
    _, plain = evaluate_conditions(Scripted(), bench(), cfg,
                                   contexts={"semantic": Passages("semantic")},
                                   log=lambda m: None)
    # (odd and even questions differ in what the scripted model knows: a cluster agrees)
    assert len({r.extra["cluster"] for r in rows}) == N // 4
    acc_c = clustered.conditions["none"].scoring("cloze_norm").accuracy
    acc_p = plain.conditions["none"].scoring("cloze_norm").accuracy
    assert (acc_c.value, acc_c.clusters, acc_p.clusters) == (acc_p.value, N // 4, None)
    assert acc_c.ci_high - acc_c.ci_low > acc_p.ci_high - acc_p.ci_low
    (cc,), (cp,) = clustered.comparisons, plain.comparisons
    assert (cc.clusters, cp.clusters, cc.difference) == (N // 4, None, cp.difference)
    assert cc.p_value > cp.p_value
    # an older run without clusters compared with one that has them keeps the clusters
    plain_rows, _ = evaluate_conditions(Scripted(), bench(), cfg,
                                        contexts={"semantic": Passages("semantic")},
                                        log=lambda m: None)
    mixed = compare_runs(plain, plain_rows, clustered, rows)
    assert [c.clusters for c in mixed] == [N // 4, N // 4]
    md = summary_markdown(clustered)
    assert f"items form {N // 4} independent clusters" in md and f"{N} ({N // 4} clusters)" in md
    assert "independent clusters" not in summary_markdown(plain)
