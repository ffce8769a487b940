"""The compare experiment (the main job) end to end on a tiny configuration (the shared
`compare_run`: a scripted teacher distils, a tiny random-init Llama is the student); then a
re-run skips every stage and reports the same rows."""


def test_compare_end_to_end_and_cached_rerun(compare_run, cli):
    from workbench.experiments.compare import read_report

    run = compare_run.run
    report = read_report(run)
    names = [row.name for row in report.rows]
    assert names[:5] == ["Base", "Base + oracle context", "Base + semantic RAG",
                         "Base + keyword RAG", "Base + hybrid RAG"]
    assert "SFT" in names and any(n.startswith("SFT + ") for n in names)
    n_items = {row.n for row in report.rows}
    assert len(n_items) == 1 and 0 < n_items.pop() <= 8
    for row in report.rows:  # every accuracy with its interval, in both formulations
        for k in ("letter", "cloze_norm"):
            a = row.scorings[k]
            assert a.ci_low <= a.value <= a.ci_high and a.n == row.n
        assert sum(row.predictions["letter"].values()) == row.n
    assert report.headline_rule and any(c.a.startswith("base") and c.b.startswith("SFT")
                                        for c in report.comparisons)
    assert set(report.hit_vs_miss) == {"semantic", "keyword", "hybrid"}
    assert set(report.retrieval) == {"keyword", "semantic", "hybrid"}
    assert report.train["steps"] == 3 and report.train["chat_template_fingerprint"]
    md = (run / "report.md").read_text()
    assert "RF-Agent's table" in md and "Retrieval" in md and "significant at 5%" in md
    for f in ("comparison.png", "eval_base/accuracy.png", "adapter/training_curves.png",
              "eval_base/results.jsonl", "eval_sft/summary.json"):
        assert (run / f).exists(), f
    for stage in ("distill/distill", "rag/index", "compare/eval_base", "train/train",
                  "compare/eval_sft"):  # the first run ran every stage
        assert f"== {stage}\n" in compare_run.result.stderr, stage
    r2 = cli("compare", "run", str(compare_run.config), env={"TQDM_DISABLE": "1"})
    assert r2.returncode == 0, r2.stderr[-3000:]
    for stage in ("distill/distill", "rag/index", "compare/eval_base", "train/train",
                  "compare/eval_sft"):
        assert f"== {stage}: up to date" in r2.stderr, stage
    assert read_report(run).rows == report.rows
