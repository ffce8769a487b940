"""Evaluation: log-likelihood scoring agrees with lm-evaluation-harness, answer extraction,
circular evaluation, conditions with RAG, open-ended scoring."""

import json
import os

import pytest

from workbench.evaluate.mc import (
    evaluate_mc, extract_letter, loglik_letter_predictions, rotate, summarize,
)
from workbench.records import MCItem

FACTS = [("the unit of resistance", "ohm", ["volt", "ampere", "watt"]),
         ("the colour of a clear daytime sky", "blue", ["green", "red", "black"]),
         ("the number of days in a week", "seven", ["five", "ten", "three"]),
         ("the frozen form of water", "ice", ["steam", "sand", "oil"]),
         ("the planet we live on", "Earth", ["Mars", "Venus", "Jupiter"]),
         ("the opposite of hot", "cold", ["warm", "loud", "tall"]),
         ("the animal that barks", "dog", ["cat", "cow", "fish"]),
         ("the season after winter", "spring", ["autumn", "summer", "night"]),
         ("the unit of frequency", "hertz", ["metre", "gram", "joule"]),
         ("the largest ocean", "Pacific", ["Arctic", "Indian", "Baltic"])]


def items(n=60):
    out = []
    for i in range(n):
        topic, right, wrong = FACTS[i % len(FACTS)]
        opts = [right, *wrong]
        k = (i * 7) % 4
        opts[0], opts[k] = opts[k], opts[0]
        q = f"What is {topic}?" if i < len(FACTS) else f"Question {i}: what is {topic}?"
        out.append(MCItem(id=f"m{i}", question=q, options=opts, answer="ABCD"[k]))
    return out


@pytest.mark.slow
def test_loglik_choices_agree_with_lm_eval_harness(bundled_model, tmp_path):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    from workbench.models.local import _gguf_cache_dir

    data = tmp_path / "items.jsonl"
    its = items(60)
    data.write_text("".join(json.dumps(it.to_json()) + "\n" for it in its))
    task_dir = tmp_path / "tasks"
    task_dir.mkdir()
    (task_dir / "wb_mc.yaml").write_text(f"""task: wb_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nA. {{{{options[0]}}}}\\nB. {{{{options[1]}}}}\\nC. {{{{options[2]}}}}\\nD. {{{{options[3]}}}}\\nAnswer:"
doc_to_choice: ["A", "B", "C", "D"]
doc_to_target: "{{{{['A','B','C','D'].index(answer)}}}}"
metric_list:
  - metric: acc
""")
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    folder = _gguf_cache_dir(bundled_model.source)
    out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={folder},dtype=float32",
                                  tasks=["wb_mc"], task_manager=TaskManager(
                                      include_path=str(task_dir)), log_samples=True,
                                  batch_size=8, device="cpu")
    theirs = {}
    for s in out["samples"]["wb_mc"]:
        lls = [r[0][0] for r in s["resps"]]
        theirs[s["doc_id"]] = "ABCD"[max(range(4), key=lambda i: lls[i])]
    ours = loglik_letter_predictions(bundled_model, its, template="raw")
    assert len(theirs) == 60
    assert [theirs[i] for i in range(60)] == ours


@pytest.mark.slow
def test_methods_circular_and_summary(bundled_model):
    its = items(12)
    rows = evaluate_mc(bundled_model, its, methods=["loglik", "generate"], circular=True,
                       max_tokens=12)
    s = summarize(rows)
    assert s["n"] == 12 and 0 <= s["acc_loglik_letter"] <= 1
    assert {"acc_loglik_text", "acc_loglik_text_norm", "acc_generate",
            "acc_circular_correct", "agreement_loglik_generate"} <= set(s)
    assert s["acc_circular_correct"] <= s["acc_loglik_letter"]
    assert all(r.latency_s is not None and r.condition == "none" for r in rows)


def test_extract_letter_and_rotation():
    assert extract_letter("<think>..</think> so <answer>c</answer>") == "C"
    assert extract_letter("The answer is B because") == "B"
    assert extract_letter("B) 1.5") == "B"
    assert extract_letter("I would pick option D.") == "D"
    assert extract_letter("no idea") is None
    it = MCItem(id="x", question="q", options=["a", "b", "c", "d"], answer="B")
    r = rotate(it, 1)
    assert r.options == ["b", "c", "d", "a"] and r.answer == "A"
    assert rotate(it, 4 % 4) == it


def test_fake_model_through_conditions(rf_index, embedder):
    from workbench.evaluate.config import EvalConfig
    from workbench.evaluate.run import evaluate_conditions, evaluate_open, token_f1
    from workbench.models import load_model
    from workbench.rag.index import RagIndex
    from workbench.records import Provenance, QTSASample

    idx = RagIndex.load(rf_index, embedder=embedder)
    sec = idx.store.chunks[0]
    it = MCItem(id="q1", question="What is the speed of a wave on a lossless line?",
                options=["1/sqrt(LC)", "LC", "R/G", "zero"], answer="A",
                provenance=Provenance(section_id=sec.section_id, span_hash="h"))
    fake = load_model("fake", responses=["<answer>A</answer>"])
    res, summ = evaluate_conditions(fake, [it], EvalConfig(), index=idx, log=lambda m: None)
    assert set(summ) == {"none", "semantic", "keyword", "hybrid", "semantic_ranks4-6",
                         "keyword_ranks4-6", "hybrid_ranks4-6"}
    assert summ["none"]["acc_generate"] == 1.0
    ctx = next(r for r in res if r.condition == "semantic").extra["context"]
    assert ctx.startswith("[1] ")
    assert token_f1("Z0 is sqrt of L over C", "Z0 equals sqrt of L over C") > 0.7
    s = QTSASample(id="n", kind="nd", question="What is Z0?", thinking="t", solution="s",
                   answer="Z0 equals sqrt of L over C",
                   provenance=Provenance(section_id="x", span_hash="h"))
    rows = evaluate_open(load_model("fake", responses=["Z0 is sqrt of L over C"]), [s])
    assert rows[0].correct and rows[0].score > 0.7


def test_eval_train_preview_and_merge_commands(tiny_model, tmp_path):
    from conftest import run_cli
    from workbench.formats import write_dataset
    from workbench.records import ChatExample

    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps(it.to_json()) + "\n" for it in items(6)))
    out = tmp_path / "ev"
    r = run_cli("eval", "-s", f"models.chat.spec={tiny_model}", "-s", f"eval.benchmark={bench}",
                "-s", "eval.conditions=[none]", "-s", "eval.methods=[loglik]",
                "-s", f"eval.output={out}", "-s", f"output_dir={tmp_path}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "| none | 6 |" in r.stdout
    assert (out / "results.jsonl").exists() and (out / "accuracy.png").exists()
    data = tmp_path / "d.jsonl"
    write_dataset(data, [ChatExample.model_validate({"messages": [
        {"role": "user", "content": f"q{i}?"}, {"role": "assistant", "content": f"a{i}."}]})
        for i in range(8)])
    common = ["-s", f"models.chat.spec={tiny_model}", "-s", f"train.data={data}",
              "-s", f"output_dir={tmp_path}", "-s", "name=t"]
    r = run_cli("train", "preview", *common)
    assert r.returncode == 0 and "[[a0.<|im_end|>" in r.stdout.replace("\n", "")
    r = run_cli("train", "run", *common, "-s", "train.max_steps=2", "-s", "train.max_length=64")
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli("train", "merge", str(tmp_path / "t" / "adapter"), "-o", str(tmp_path / "m"),
                "--base", tiny_model)
    assert r.returncode == 0 and "max |logit diff|" in r.stdout
