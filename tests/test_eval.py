"""Evaluation: log-likelihood scoring agrees with lm-evaluation-harness (letter and cloze
formulations), answer extraction, circular evaluation, conditions with RAG, open-ended
scoring, the eval command."""

import json
import os

import pytest

from workbench.evaluate.mc import (
    evaluate_mc, extract_letter, loglik_letter_predictions, rotate,
)
from workbench.evaluate.summary import summarize
from workbench.records import MCItem, read_records

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


def require_lm_eval():
    """lm-eval, or a skip with the reason; in CI (env CI set) its absence is a failure, so the
    parity check cannot silently vanish there."""
    try:
        import lm_eval
    except ImportError:
        msg = "lm-eval is not installed (pip install -e '.[dev]'); the parity check needs it"
        if os.environ.get("CI"):
            pytest.fail(f"{msg}, and CI is set")
        pytest.skip(msg)
    return lm_eval


def test_missing_lm_eval_fails_in_ci_and_skips_elsewhere(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # makes `import lm_eval` fail
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        require_lm_eval()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="lm-eval is not installed"):
        require_lm_eval()


TASKS = ("wb_letter", "wb_cloze")  # written by `workbench eval export-lm-eval`


def statement_items(tmp_path, n=60):
    """The main job's items (issue 43): "Which statement about <section> is correct?" over a
    sentence of the RF corpus and three perturbed copies, from a scripted distillation."""
    from workbench.distill.config import AgentModel, DistillConfig
    from workbench.distill.pipeline import run_distill

    run_distill(DistillConfig(corpus="datasets/rf", domain="rf", mode="composed",
                              answer_source="text", perspectives=["concepts"], kinds=["mc"],
                              verifier={"enabled": False}, benchmark_fraction=0.5,
                              distractors="perturbed", benchmark_items="statement"),
                tmp_path / "distilled", seed=0,
                default_model=AgentModel(spec="fake", options={"script": "fake_teacher:reply"}))
    its = read_records(tmp_path / "distilled" / "benchmark.jsonl", MCItem)[:n]
    assert len(its) == n and all(it.question.startswith("Which statement") for it in its)
    return its


@pytest.mark.timeout(1800)  # lm-eval's own pass over the long statement options
@pytest.mark.parametrize("kind", ["written", "statement"])
def test_loglik_choices_agree_with_lm_eval_harness(bundled_model, tmp_path, kind):
    """Both OLMES formulations, raw prompts, through the task folder `workbench eval
    export-lm-eval` writes: our letter, cloze (acc) and cloze_norm (acc_norm) predictions are
    lm-eval's to the item, the option log-likelihoods agree, and so do the accuracies; on
    short written options and on the main job's statement items (options are sentences)."""
    lm_eval = require_lm_eval()
    from lm_eval.tasks import TaskManager

    from workbench.models.local import gguf_cache_dir

    from workbench.evaluate.lm_eval_export import export_lm_eval

    its = items(60) if kind == "written" else statement_items(tmp_path, 24)
    n = len(its)
    task_dir = tmp_path / "tasks"
    export_lm_eval(its, task_dir, "wb")  # the export is what lm-eval runs
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    folder = gguf_cache_dir(bundled_model.source)
    out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={folder},dtype=float32",
                                  tasks=list(TASKS), task_manager=TaskManager(
                                      include_path=str(task_dir)), log_samples=True,
                                  batch_size=8, device="cpu")

    def argmax(xs):
        return "ABCD"[max(range(4), key=lambda i: xs[i])]

    lls = {name: {s["doc_id"]: [r[0][0] for r in s["resps"]] for s in out["samples"][name]}
           for name in TASKS}
    assert len(lls["wb_letter"]) == len(lls["wb_cloze"]) == n
    rows = evaluate_mc(bundled_model, its, methods=["loglik"], template="raw")
    assert [argmax(lls["wb_letter"][i]) for i in range(n)] == \
        [r.extra["predictions"]["letter"] for r in rows] == \
        loglik_letter_predictions(bundled_model, its, template="raw")
    assert [argmax(lls["wb_cloze"][i]) for i in range(n)] == \
        [r.extra["predictions"]["cloze"] for r in rows]
    def per_char(i):  # lm-eval's acc_norm: divide by the choice's length in characters
        return [v / len(o) for v, o in zip(lls["wb_cloze"][i], its[i].options, strict=True)]

    assert [argmax(per_char(i)) for i in range(n)] == \
        [r.extra["predictions"]["cloze_norm"] for r in rows]
    for i, r in enumerate(rows):
        assert r.extra["logprobs"]["cloze"] == pytest.approx(lls["wb_cloze"][i], abs=2e-3)
    acc = out["results"]["wb_cloze"]
    s = summarize(rows)
    assert s.formulations["letter"].accuracy.value == pytest.approx(
        out["results"]["wb_letter"]["acc,none"])
    assert s.formulations["cloze"].accuracy.value == pytest.approx(acc["acc,none"])
    assert s.formulations["cloze_norm"].accuracy.value == pytest.approx(acc["acc_norm,none"])


def test_methods_circular_and_summary(bundled_model):
    its = items(12)
    rows = evaluate_mc(bundled_model, its, methods=["loglik", "generate"], circular=True,
                       max_tokens=12)
    s = summarize(rows)
    assert s.n == 12 and set(s.formulations) == {"letter", "cloze", "cloze_norm"}
    assert s.generation is not None and 0 <= s.generation.unparsed <= 1
    assert s.circular.value <= s.formulations["letter"].accuracy.value
    assert s.agreement_letter_generation is not None
    assert set(s.seconds_per_item_by_pass) == {"letter", "cloze", "circular", "generate"}
    assert sum(s.formulations["letter"].predictions.values()) == 12
    assert all(r.latency_s is not None and r.condition == "none" for r in rows)


def test_default_loglik_path_with_a_fake_model():
    """The defaults users run (chat template, letter + cloze, generation) through the
    registry's fake backend."""
    from workbench.models import load_model

    its = items(10)
    fake = load_model("fake", responses=["The answer is C"])
    rows = evaluate_mc(fake, its)
    assert [r.example_id for r in rows] == [it.id for it in its]
    r = rows[0]
    assert set(r.extra["predictions"]) == {"letter", "cloze", "cloze_norm", "generate"}
    assert r.extra["predictions"]["generate"] == "C"
    assert r.prediction == r.extra["predictions"]["letter"]  # the first formulation
    assert set(r.scores) == {"letter", "cloze", "cloze_norm", "generate"}
    assert len(r.extra["logprobs"]["cloze"]) == 4
    # the fake scores an option higher the more of its words the prompt holds; only the
    # letter prompt lists the options
    s = summarize(rows)
    assert s.n == 10 and s.generation.predictions["C"] == 10


def test_extract_letter_and_rotation():
    assert extract_letter("<think>..</think> so <answer>c</answer>") == "C"
    assert extract_letter("The answer is B because") == "B"
    assert extract_letter("B) 1.5") == "B"
    assert extract_letter("I would pick option D.") == "D"
    assert extract_letter("no idea") is None
    assert extract_letter("The answer is F", n_options=4) is None
    assert extract_letter("The answer is F", n_options=6) == "F"
    assert extract_letter("E) no\nB) yes", n_options=4) == "B"
    it = MCItem(id="x", question="q", options=["a", "b", "c", "d"], answer="B")
    r = rotate(it, 1)
    assert r.options == ["b", "c", "d", "a"] and r.answer == "A"
    assert rotate(it, 4) == it
    five = MCItem(id="y", question="q", options=list("vwxyz"), answer="E")
    assert rotate(five, 2).answer == "C"


def test_fake_model_through_conditions(rf_index, embedder):
    from workbench.evaluate.config import EvalConfig
    from workbench.evaluate.run import evaluate_conditions, evaluate_open, token_f1
    from workbench.models import load_model
    from workbench.records import Provenance, QTSASample
    from workbench.retrieval.index import RagIndex
    from workbench.retrieval.search import context_providers

    idx = RagIndex.load(rf_index, embedder=embedder)
    sec = idx.store.chunks[0]
    it = MCItem(id="q1", question="What is the speed of a wave on a lossless line?",
                options=["1/sqrt(LC)", "LC", "R/G", "zero"], answer="A",
                provenance=Provenance(section_id=sec.section_id, span_hash="h"))
    fake = load_model("fake", responses=["<answer>A</answer>"])
    cfg = EvalConfig()
    res, summ = evaluate_conditions(fake, [it], cfg, log=lambda m: None,
                                    contexts=context_providers(idx, cfg.conditions))
    assert set(summ.conditions) == {"none", "semantic", "keyword", "hybrid",
                                    "semantic_ranks4-6", "keyword_ranks4-6", "hybrid_ranks4-6"}
    assert summ.conditions["none"].generation.accuracy.value == 1.0
    ctx = next(r for r in res if r.condition == "semantic").extra["context"]
    assert ctx.startswith("[1] ")
    assert token_f1("Z0 is sqrt of L over C", "Z0 equals sqrt of L over C") > 0.7
    s = QTSASample(id="n", kind="nd", question="What is Z0?", thinking="t", solution="s",
                   answer="Z0 equals sqrt of L over C",
                   provenance=Provenance(section_id="x", span_hash="h"))
    rows = evaluate_open(load_model("fake", responses=["Z0 is sqrt of L over C"]), [s])
    assert rows[0].correct and rows[0].score > 0.7


def test_eval_train_preview_and_merge_commands(tiny_model, tmp_path, cli):
    run_cli = cli
    from workbench.evaluate.report import read_eval_results, read_eval_summary
    from workbench.formats import write_dataset
    from workbench.records import ChatExample

    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps(it.to_json()) + "\n" for it in items(6)))
    out = tmp_path / "ev"
    r = run_cli("eval", "run", "-s", f"models.chat.spec={tiny_model}",
                "-s", f"eval.benchmark={bench}", "-s", "eval.conditions=[none]",
                "-s", "eval.methods=[loglik]", "-s", f"eval.output={out}",
                "-s", f"output_dir={tmp_path}")
    assert r.returncode == 0, r.stderr[-2000:]
    summary = read_eval_summary(out)
    assert summary.conditions["none"].n == 6 and summary.headline.rule
    assert len(read_eval_results(out)) == 6 and (out / "accuracy.png").exists()
    assert "| none | 6 |" in (out / "summary.md").read_text()
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


def test_export_lm_eval_writes_a_task_folder_lm_eval_loads_as_it_is(tmp_path, cli,
                                                                    monkeypatch):
    """The exported folder, moved elsewhere, loads through lm-eval's own TaskManager: the
    documents, prompts, choices and targets are those `workbench eval` scores (raw)."""
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    from workbench.evaluate.mc import cloze_request, letter_request

    its = items(6) + [MCItem(id="multi", question="Which two?", options=["a", "b", "c"],
                             answer="AB")]
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps(it.to_json()) + "\n" for it in its))
    r = cli("eval", "export-lm-eval", str(bench), "-o", str(tmp_path / "made"),
            "--name", "RF demo")
    assert r.returncode == 0, r.stderr
    assert "6 items" in r.stdout and "1 items with more than one answer" in r.stdout
    assert "--tasks rf_demo" in r.stdout
    again = cli("eval", "export-lm-eval", str(bench), "-o", str(tmp_path / "made"))
    assert again.returncode == 0, again.stderr  # an earlier export is replaced
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's file")
    refused = cli("eval", "export-lm-eval", str(bench), "-o", str(tmp_path / "mine"))
    assert refused.returncode != 0 and "not made by the workbench" in refused.stderr
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]
    moved = tmp_path / "elsewhere"
    (tmp_path / "made").rename(moved)  # the loader finds its data next to itself
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    # lm-eval's own loader on the folder alone: indexing its 14k built-in task files as well
    # took 10 s here and reads none of ours (the full tier's agreement test loads the export
    # beside them)
    loaded = TaskManager(include_path=str(moved), include_defaults=False).load(["rf_demo"])
    assert loaded["group_map"]["rf_demo"] == ["rf_demo_letter", "rf_demo_cloze"]
    flat = loaded["tasks"]
    letter, cloze = flat["rf_demo_letter"], flat["rf_demo_cloze"]
    docs = list(letter.test_docs())
    assert len(docs) == 6
    for doc, it in zip(docs, its, strict=False):
        want = letter_request(it, None, "raw")
        assert letter.doc_to_text(doc) == want.prompt
        assert [" " + c for c in letter.doc_to_choice(doc)] == list(want.continuations)
        assert letter.doc_to_target(doc) == "ABCD".index(it.answer)
        wc = cloze_request(it, None, "raw")
        assert cloze.doc_to_text(doc) == wc.prompt
        assert [" " + c for c in cloze.doc_to_choice(doc)] == list(wc.continuations)
