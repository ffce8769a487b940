"""The main job end to end on a tiny configuration: a scripted teacher distils, a tiny
random-init Llama is the student; then a re-run skips every stage."""

import json
import time
from pathlib import Path

import pytest

from conftest import REPO, run_cli

TESTS = str(Path(__file__).parent)


@pytest.mark.slow
def test_pipeline_end_to_end_and_cached_rerun(tmp_path, tiny_model):
    conf = tmp_path / "tiny.yaml"
    teacher = '{spec: fake, options: {script: "fake_teacher:reply"}}'
    conf.write_text(f"""name: tiny
output_dir: {tmp_path}
models:
  chat: {{spec: {tiny_model}}}
distill:
  corpus: {REPO / "datasets" / "rf"}
  mode: single
  max_sections: 12
  kinds: [mc, nd]
  perspectives: [concepts, analysis]
  benchmark_fraction: 0.3
  verifier: {{method: generate}}
  models: {{writer: {teacher}, answerer: {teacher}, verifier: {teacher}}}
rag: {{chunk_size: 96, chunk_overlap: 16}}
train: {{max_steps: 3, batch_size: 2, max_length: 512, eval_fraction: 0.1,
        domain_eval: {{every: 3, max_items: 5}}}}
eval: {{methods: [loglik, generate], max_tokens: 8}}
pipeline: {{eval_items: 8}}
""")
    env = {"PYTHONPATH": TESTS, "TQDM_DISABLE": "1"}
    t0 = time.perf_counter()
    r = run_cli("pipeline", "run", str(conf), env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "tiny"
    report = json.loads((run / "report.json").read_text())
    names = [row["name"] for row in report["table"]]
    assert names[:4] == ["Base", "Base + semantic RAG", "Base + keyword RAG",
                         "Base + hybrid RAG"]
    assert "SFT" in names and any(n.startswith("SFT + ") for n in names)
    n_items = {row["n"] for row in report["table"]}
    assert len(n_items) == 1 and 0 < n_items.pop() <= 8
    assert set(report["hit_vs_miss"]) == {"semantic", "keyword", "hybrid"}
    assert set(report["retrieval"]) == {"keyword", "semantic", "hybrid"}
    assert report["train"]["steps"] == 3 and report["train"]["chat_template_fingerprint"]
    md = (run / "report.md").read_text()
    assert "RF-Agent's table" in md and "Retrieval" in md
    for f in ("comparison.png", "eval_base/accuracy.png", "adapter/training_curves.png",
              "eval_base/results.jsonl", "eval_sft/summary.json"):
        assert (run / f).exists(), f
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    r2 = run_cli("pipeline", "run", str(conf), env=env, timeout=600)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert "== distill" not in r2.stderr and "== train" not in r2.stderr
    assert json.loads((run / "report.json").read_text())["table"] == report["table"]
    assert time.perf_counter() - t0 < min(120, first)
