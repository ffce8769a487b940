"""The main job's protocol end to end (issue 43): `workbench compare run` with statement items,
recall samples and the seen benchmark, on a scripted teacher and the tiny random-init student.
Both benchmarks are scored, the seen one under the conditions `compare.seen_conditions` names,
training watches both, and the report reads (none, oracle) first and names the shortcut floor."""

import json

from conftest import REPO, cli_in_process

CONFIG = """name: proto
output_dir: {out}
models:
  chat: {{spec: {model}}}
corpus: {corpus}
distill:
  mode: composed
  answer_source: text
  max_sections: 12
  kinds: [mc, nd]
  perspectives: [concepts, analysis]
  benchmark_fraction: 0.3
  distractors: perturbed
  benchmark_items: statement
  seen_fraction: 1.0
  recall_samples: true
  benchmark_rationales: false
  verifier: {{enabled: false}}
  models: {{writer: {teacher}, answerer: {teacher}}}
rag: {{chunk_size: 96, chunk_overlap: 16}}
train: {{max_steps: 2, batch_size: 2, max_length: 512, eval_fraction: 0.1,
        domain_eval: {{every: 2, max_items: 4}}}}
eval: {{methods: [loglik], letter_conditions: [none], hit_vs_miss: false, oracle_tokens: 64}}
compare: {{eval_items: 6, seen_conditions: [none, oracle]}}
"""


def test_compare_scores_seen_and_unseen_with_the_oracle_first(tmp_path, tiny_model):
    conf = tmp_path / "proto.yaml"
    conf.write_text(CONFIG.format(
        out=tmp_path / "runs", model=tiny_model, corpus=REPO / "datasets" / "rf",
        teacher='{spec: fake, options: {script: "fake_teacher:reply"}}'))
    res = cli_in_process("compare", "run", str(conf), env={"TQDM_DISABLE": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "runs" / "proto"
    report = json.loads((run / "report.json").read_text())
    rows = {(r["benchmark"], r["name"]) for r in report["rows"]}
    assert {b for b, _ in rows} == {"unseen", "seen"}
    seen_rows = sorted(n for b, n in rows if b == "seen")
    unseen_rows = sorted(n for b, n in rows if b == "unseen")
    assert len(unseen_rows) == 7 and len(seen_rows) == 3, rows  # base x5 + SFT x2; 2 + 1
    assert not any("RAG" in n for n in seen_rows)
    # the letter formulation is scored on unseen (under none) and not on seen
    # (compare.letter_benchmarks): there it would be a second pass for nothing read
    for name, letter in (("eval_base", True), ("eval_base_seen", False),
                         ("eval_sft", True), ("eval_sft_seen", False)):
        scored = [json.loads(x)["scores"] for x in (run / name / "results.jsonl").read_text()
                  .splitlines()]
        assert any("letter" in s for s in scored) is letter, name
    md = (run / "report.md").read_text()
    assert md.split("## Benchmark `seen`")[1].count("The letter formulation is not scored") == 1
    assert "## Benchmark `seen`" in md and "Knowledge-free rules" in md
    assert "with the item's own passage (the oracle bound)" in md
    # the context table: each base condition with what it was given, the oracle's passage and
    # the retrievers' chunks counted in words (the question alone: none)
    unseen_md = md.split("## Benchmark `unseen`")[1].split("## Benchmark `seen`")[0]
    assert "| configuration | context | words (mean) |" in unseen_md
    words = {r["condition"]: r["context_words"] for r in report["rows"]
             if r["model"] == "Base" and r["benchmark"] == "unseen"}
    assert words["none"] is None and all(words[c] > 10 for c in
                                         ("oracle", "semantic", "keyword", "hybrid"))
    assert "seen" in md.split("## Training")[1].split("\n\n")[1]  # both held-out accuracies
    metrics = [json.loads(x) for x in (run / "adapter" / "metrics.jsonl").read_text()
               .splitlines()]
    assert "domain_accuracy_seen" in metrics[-1]
    distilled = json.loads((run / "distill" / "report.json").read_text())
    assert distilled["stages"]["recall_samples"] > 0


def test_a_difference_not_significant_says_the_items_that_would_show_it():
    """Below the table of paired tests, a difference seen but not significant gets the size of
    run that would find it (Connor's McNemar formula); none for a zero difference."""
    from workbench.evaluate.summary import PairedComparison
    from workbench.experiments.compare_report import _power

    def comp(only_a, only_b, significant=False):
        return PairedComparison(a="base / none", b="SFT (LoRA) / none", formulation_a="c",
                                formulation_b="c", n=36, accuracy_a=0.47,
                                accuracy_b=0.47 + (only_b - only_a) / 36,
                                difference=(only_b - only_a) / 36, difference_ci_low=-0.1,
                                difference_ci_high=0.2, only_a=only_a, only_b=only_b,
                                p_value=0.5, p_holm=0.5, significant=significant)

    lines = _power([comp(3, 4), comp(4, 4), comp(0, 20, significant=True)])
    assert len(lines) == 2 and lines[1].count("about") == 1
    assert "SFT (LoRA) / none vs base / none +2.8 points (3 / 4" in lines[1]
    assert _power([comp(4, 4)]) == []
