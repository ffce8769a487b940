"""LoRA SFT on a tiny random-init Llama (2 layers, hidden 64) with the bundled tokenizer."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from workbench.errors import DataError, WorkbenchError
from workbench.formats import write_dataset
from workbench.records import ChatExample
from workbench.train.config import TrainConfig
from workbench.train.data import IGNORE, pack, preview, tokenize_all, tokenize_example


def examples(n=40):
    rows = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"What is {i} plus {i}?"},
                {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}]
        if i % 3 == 0:
            msgs.insert(0, {"role": "system", "content": "Be brief."})
        if i % 4 == 0:
            msgs[-1]["reasoning_content"] = f"Add {i} to itself."
        rows.append(ChatExample.model_validate({"id": f"e{i}", "messages": msgs}))
    return rows


@pytest.fixture()
def data_file(tmp_path):
    path = tmp_path / "train.jsonl"
    write_dataset(path, examples())
    return path


def tc(data, **kw):
    base = dict(data=str(data), max_length=128, batch_size=4, learning_rate=5e-3,
                max_steps=20, eval_fraction=0.1, lora={"r": 4, "alpha": 8, "dropout": 0.0},
                warmup_ratio=0.1)
    base.update(kw)
    return TrainConfig(**base)


def test_assistant_only_labels(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    ex = ChatExample.model_validate({"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."},
        {"role": "user", "content": "Bye?"}, {"role": "assistant", "content": "Goodbye."}]})
    t = tokenize_example(tok, ex)
    trained = [i for i, lab in zip(t.input_ids, t.labels) if lab != IGNORE]
    untrained = [i for i, lab in zip(t.input_ids, t.labels) if lab == IGNORE]
    assert all(lab in (IGNORE, i) for i, lab in zip(t.input_ids, t.labels))
    text_trained = tok.decode(trained)
    assert "Hello." in text_trained and "Goodbye." in text_trained
    assert "<think>\nGreet back.\n</think>" in text_trained  # reasoning kept in the target
    assert "Hi?" not in text_trained and "Be brief." not in text_trained
    assert "Bye?" in tok.decode(untrained)
    # the concatenation equals the template's rendering of the whole conversation
    whole = tok.apply_chat_template([{"role": m.role, "content": m.content if m.role != "assistant"
                                      or not m.reasoning_content else
                                      f"<think>\n{m.reasoning_content}\n</think>\n\n{m.content}"}
                                     for m in ex.messages], tokenize=False)
    assert tok.decode(t.input_ids) == whole
    marked = preview(tok, ex)
    assert "[[" in marked and "Hello." in marked.split("[[", 1)[1]


def test_packing_has_no_cross_example_attention(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    toks = [tokenize_example(tok, e) for e in examples(6)]
    rows = pack(toks, 128, tok.pad_token_id)
    ids, labels, pos, n_real = rows[0]
    assert n_real < 128 and len(ids) == 128
    with torch.no_grad():
        packed = model(input_ids=torch.tensor([ids]), position_ids=torch.tensor([pos]),
                       use_cache=False).logits[0]
        offset = 0
        for t in toks:
            if offset + len(t.input_ids) > n_real:
                break
            alone = model(input_ids=torch.tensor([t.input_ids])).logits[0]
            seg = packed[offset:offset + len(t.input_ids)]
            assert (seg - alone).abs().max().item() < 1e-4
            offset += len(t.input_ids)
        assert offset > len(toks[0].input_ids)  # at least two examples were compared
        # without restarting positions (a plain causal mask) the second example sees the first
        leaky = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
        first = len(toks[0].input_ids)
        assert (leaky[first:first + 5] - packed[first:first + 5]).abs().max().item() > 1e-3


def test_preflight_refusals(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    from workbench.train.recipe import train

    tok = AutoTokenizer.from_pretrained(tiny_model)
    with pytest.raises(DataError, match="empty"):
        tokenize_all(tok, [], max_length=64, max_positions=1024)
    with pytest.raises(WorkbenchError, match="exceeds the model's 1024 positions"):
        tokenize_all(tok, examples(2), max_length=2048, max_positions=1024)
    with pytest.raises(DataError, match="over train.max_length=16"):
        tokenize_all(tok, examples(2), max_length=16, max_positions=1024)
    tok.chat_template = None
    with pytest.raises(WorkbenchError, match="no chat template"):
        tokenize_all(tok, examples(2), max_length=64, max_positions=1024)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = tmp_path / "out"
    with pytest.raises(DataError):
        train(tc(empty), model_spec=tiny_model, output=out, log=lambda m: None)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "x"}]}\n')
    with pytest.raises(DataError, match="line 1|:1:"):
        train(tc(bad), model_spec=tiny_model, output=out, log=lambda m: None)
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def _adapter(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


def test_training_learns_and_is_reproducible(tiny_model, data_file, tmp_path):
    from workbench.io import sha256_file
    from workbench.train.recipe import train

    a = train(tc(data_file), model_spec=tiny_model, output=tmp_path / "a", seed=1,
              log=lambda m: None)
    assert a.metrics[-1]["loss"] < a.metrics[0]["loss"] - 0.1  # LoRA on a random model: slow
    assert "eval_loss" in a.metrics[-1]
    train(tc(data_file), model_spec=tiny_model, output=tmp_path / "b", seed=1,
              log=lambda m: None)
    assert sha256_file(tmp_path / "a" / "adapter_model.safetensors") == \
        sha256_file(tmp_path / "b" / "adapter_model.safetensors")
    out = tmp_path / "a"
    names = {p.name for p in out.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "README.md", "manifest.json",
            "metrics.jsonl", "training_curves.png"} <= names
    assert not any(n.endswith((".bin", ".pt", ".pkl")) for n in names)
    man = json.loads((out / "manifest.json").read_text())
    assert man["outputs"]["chat_template_fingerprint"] and man["outputs"]["padding_share"] < 0.5
    assert "base_model" in (out / "README.md").read_text()


KILL = """
import os, sys, json
from workbench.train.config import TrainConfig
from workbench.train.recipe import train
cfg = TrainConfig.model_validate_json(sys.argv[1])
kill_at = int(sys.argv[4])
def on_step(step, row):
    print(json.dumps(row), flush=True)
    if step == kill_at:
        os.kill(os.getpid(), 9)
train(cfg, model_spec=sys.argv[2], output=sys.argv[3], seed=1, on_step=on_step,
      log=lambda m: None)
"""


def test_kill_and_resume_is_exact(tiny_model, data_file, tmp_path, kill_injection):
    from workbench.train.recipe import train

    cfg = tc(data_file, save_every=5)
    ref = train(cfg, model_spec=tiny_model, output=tmp_path / "ref", seed=1,
                log=lambda m: None)
    script = tmp_path / "kill.py"
    script.write_text(KILL)
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, str(script), cfg.model_dump_json(), tiny_model,
                        str(out), "12"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert p.returncode == -9, p.stderr[-2000:]
    assert not out.exists()
    ckpts = sorted(x.name for x in (tmp_path / ".run.checkpoints").iterdir())
    assert ckpts == ["checkpoint-10", "checkpoint-5"]
    res = train(cfg, model_spec=tiny_model, output=out, seed=1, log=lambda m: None)
    ref_loss = {m["step"]: m["loss"] for m in ref.metrics}
    for m in res.metrics:
        if m["step"] > 10:
            assert abs(m["loss"] - ref_loss[m["step"]]) <= 1e-6, m["step"]
    a, b = _adapter(tmp_path / "ref"), _adapter(out)
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6


def test_crash_during_checkpoint_write_never_picked(tiny_model, data_file, tmp_path,
                                                   kill_injection):
    import random

    from transformers.trainer_utils import get_last_checkpoint

    from workbench.train import checkpoint as ck
    from workbench.train.recipe import train

    stages = ["adapter", "optimizer", "state"]
    rng = random.Random(0)
    picks = []
    for trial in range(20):
        crash_stage = rng.choice(stages)
        crash_step = rng.choice([10, 15])
        out = tmp_path / f"r{trial}"

        def fault(stage, _s=crash_stage, _t=crash_step, state={"step": 0}):
            state["step"] += stage == "adapter"
            if stage == _s and state["step"] == _t // 5:
                raise KeyboardInterrupt("crash while writing")

        with pytest.raises(KeyboardInterrupt):
            train(tc(data_file, save_every=5, max_steps=16), model_spec=tiny_model,
                  output=out, seed=1, fault=fault, log=lambda m: None)
        last = ck.latest_checkpoint(tmp_path / f".r{trial}.checkpoints")
        picks.append(last.name)
        assert last.name == f"checkpoint-{crash_step - 5}" and (last / ck.MARKER).exists()
    assert len(picks) == 20
    # a folder named like a checkpoint but never completed (a crash in a non-atomic writer)
    d = tmp_path / ".r0.checkpoints"
    (d / "checkpoint-99").mkdir()
    (d / "checkpoint-99" / "optimizer.safetensors").write_bytes(b"partial")
    assert get_last_checkpoint(str(d)).endswith("checkpoint-99")  # HF would pick it
    assert ck.latest_checkpoint(d).name != "checkpoint-99"  # we do not


def test_rotation_and_sigterm(tiny_model, data_file, tmp_path):
    from workbench.train import checkpoint as ck
    from workbench.train.recipe import train

    seen = []

    def on_step(step, row):
        seen.append(len(ck.complete_checkpoints(tmp_path / ".out.checkpoints")))
        if step == 13:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(SystemExit) as e:
        train(tc(data_file, save_every=2, save_total_limit=2), model_spec=tiny_model,
              output=tmp_path / "out", seed=1, on_step=on_step, log=lambda m: None)
    assert e.value.code == 143 and max(seen) <= 2
    assert ck.latest_checkpoint(tmp_path / ".out.checkpoints").name == "checkpoint-13"
    res = train(tc(data_file, save_every=2, save_total_limit=2), model_spec=tiny_model,
                output=tmp_path / "out", seed=1, log=lambda m: None)
    assert res.metrics[-1]["step"] == 20 and (tmp_path / "out" / "manifest.json").exists()


def test_merge_parity_and_unsafe_adapters(tiny_model, data_file, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from workbench.models.local import check_adapter_dir
    from workbench.train.merge import merge_adapter
    from workbench.train.recipe import train

    train(tc(data_file, max_steps=5), model_spec=tiny_model, output=tmp_path / "ad", seed=1,
          log=lambda m: None)
    rep = merge_adapter(tiny_model, tmp_path / "ad", tmp_path / "merged")
    assert rep["max_abs_logit_diff"] <= 1e-4 and (tmp_path / "merged" / "model.safetensors").exists()
    # NaN-injected adapter: safe_merge refuses
    bad = tmp_path / "nan"
    import shutil

    shutil.copytree(tmp_path / "ad", bad)
    w = load_file(str(bad / "adapter_model.safetensors"))
    k = next(iter(w))
    w[k] = torch.full_like(w[k], float("nan"))
    save_file(w, str(bad / "adapter_model.safetensors"))
    with pytest.raises(ValueError, match="NaN"):
        merge_adapter(tiny_model, bad, tmp_path / "merged2")
    assert not (tmp_path / "merged2").exists()
    # pickle adapters are refused without being opened
    evil = tmp_path / "evil"
    evil.mkdir()
    shutil.copy(tmp_path / "ad" / "adapter_config.json", evil)
    marker = tmp_path / "pwned"
    import pickle

    class Boom:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (evil / "adapter_model.bin").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(WorkbenchError, match="pickle files are refused"):
        check_adapter_dir(evil)
    assert not marker.exists()
    # a truncated safetensors adapter names the file
    trunc = tmp_path / "trunc"
    shutil.copytree(tmp_path / "ad", trunc)
    f = trunc / "adapter_model.safetensors"
    f.write_bytes(f.read_bytes()[:50])
    from workbench.models import load_model

    with pytest.raises(WorkbenchError, match="adapter_model.safetensors: corrupt or truncated"):
        load_model(tiny_model, adapter=str(trunc))
    body = trunc / "adapter_model.safetensors"
    body.write_bytes((tmp_path / "ad" / "adapter_model.safetensors").read_bytes()[:-16])
    with pytest.raises(WorkbenchError, match="truncated"):
        check_adapter_dir(trunc)


def test_a_non_finite_update_stops_training_and_writes_no_adapter(tiny_model, data_file,
                                                                  tmp_path):
    """A learning rate that blows the weights up (or is inf outright, as a library caller
    can pass) stops at the first non-finite update with one line; no adapter, no
    non-finite checkpoint."""
    from workbench.train.recipe import train

    cfg = tc(data_file, max_steps=4, save_every=1, warmup_ratio=0.0)
    cfg = cfg.model_copy(update={"learning_rate": float("inf")})
    with pytest.raises(WorkbenchError, match="not finite") as e:
        train(cfg, model_spec=tiny_model, output=tmp_path / "out", seed=1, log=lambda m: None)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()
    import torch
    from safetensors.torch import load_file

    for f in (tmp_path / ".out.checkpoints").rglob("adapter_model.safetensors"):
        assert all(bool(torch.isfinite(t).all()) for t in load_file(f).values()), f


def test_out_of_range_numbers_are_refused_at_load(cli):
    for setting, needle in [("seed=1000000000000000000000000000000", "seed"),
                            ("train.learning_rate=.inf", "train.learning_rate"),
                            ("train.weight_decay=.inf", "must be a finite number"),
                            ("eval.bootstrap_seed=-1", "eval.bootstrap_seed"),
                            ("train.learning_rate=5", "train.learning_rate")]:
        r = cli("config", "show", "-s", setting)
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, \
            (setting, r.stderr)


def test_domain_eval_scores_every_named_benchmark_in_the_headline_formulation(
        tiny_model, data_file, tmp_path):
    """Held-out accuracy by step on each benchmark compare hands training (unseen as
    domain_accuracy, seen as domain_accuracy_seen), in the report's formulation (cloze_norm,
    each option's log-likelihood per character) unless the letters are asked for."""
    from unittest import mock

    import workbench.evaluate.mc as mc
    from workbench.records import MCItem, write_records
    from workbench.train.recipe import train

    def item(i, stem):
        return MCItem.model_validate({"id": f"{stem}{i}", "question": f"Which sum is {2 * i}?",
                                      "options": [f"{i} plus {i}", f"{i} plus {i + 1}",
                                                  f"{i} minus {i}", f"{i} times {i + 2}"],
                                      "answer": "A"})
    for stem in ("unseen", "seen"):
        write_records(tmp_path / f"{stem}.jsonl", [item(i, stem) for i in range(6)])
    calls = []
    real = {k: getattr(mc, k) for k in ("cloze_norm_predictions", "loglik_letter_predictions")}

    def spy(name):
        def f(model, items, *a, **kw):
            calls.append((name, items[0].id[:-1], len(items)))
            return real[name](model, items, *a, **kw)
        return f
    de = {"benchmark": str(tmp_path / "unseen.jsonl"), "also": {"seen": str(tmp_path /
                                                                          "seen.jsonl")},
          "every": 2, "max_items": 4}
    with mock.patch.multiple(mc, **{k: spy(k) for k in real}):
        a = train(tc(data_file, max_steps=4, domain_eval=de), model_spec=tiny_model,
                  output=tmp_path / "a", seed=1, log=lambda m: None)
    scored = [m for m in a.metrics if "domain_accuracy" in m]
    assert [m["step"] for m in scored] == [2, 4]
    assert all(0 <= m["domain_accuracy_seen"] <= 1 for m in scored)
    assert calls == [("cloze_norm_predictions", "unseen", 4), ("cloze_norm_predictions",
                                                                 "seen", 4)] * 2
    assert "final domain accuracy seen" in (tmp_path / "a" / "README.md").read_text()
    calls.clear()
    with mock.patch.multiple(mc, **{k: spy(k) for k in real}):
        train(tc(data_file, max_steps=2, domain_eval={**de, "scoring": "letter"}),
              model_spec=tiny_model, output=tmp_path / "b", seed=1, log=lambda m: None)
    assert {c[0] for c in calls} == {"loglik_letter_predictions"}
    with pytest.raises(ValueError, match="lower-case words"):
        tc(data_file, domain_eval={**de, "also": {"Seen set": "x.jsonl"}})


def test_keep_best_exports_the_best_evaluated_step_on_items_the_report_does_not_score(
        tiny_model, data_file, tmp_path):
    """domain_eval.keep_best (issue 43 item 4): the adapter of the evaluated step with the
    best mean domain accuracy is the one exported, and it survives a kill and a resume;
    domain_eval.skip keeps the items a later evaluation reports out of the choice."""
    from unittest import mock

    from safetensors.torch import load_file

    import workbench.train.session as session
    from workbench.records import MCItem, write_records
    from workbench.train.recipe import train

    write_records(tmp_path / "bench.jsonl", [MCItem.model_validate(
        {"id": f"b{i}", "question": f"q{i}?", "options": ["w", "x", "y", "z"], "answer": "A"})
        for i in range(10)])
    seen_ids = []
    scores = iter([0.5, 0.75, 0.25, 0.5, 0.25, 0.5])  # steps 1..6: the best is step 2

    def fake(s, items=None):
        seen_ids.append([it.id for it in (items or s.benchmark)])
        return next(scores)
    de = {"benchmark": str(tmp_path / "bench.jsonl"), "every": 1, "max_items": 3, "skip": 6,
          "keep_best": True}
    cfg = tc(data_file, max_steps=6, save_every=1, domain_eval=de)
    with mock.patch.object(session, "domain_accuracy", fake):
        r = train(cfg, model_spec=tiny_model, output=tmp_path / "whole", seed=1,
                  log=lambda m: None)
    assert seen_ids[0] == ["b6", "b7", "b8"]  # items 0-5 are the report's
    assert r.manifest["outputs"]["adapter_step"] == 2
    assert r.manifest["outputs"]["domain_accuracy_best"] == 0.75
    whole = load_file(str(tmp_path / "whole" / "adapter_model.safetensors"))

    # the same run killed while writing checkpoint 5 (checkpoint 4 holds step 2's adapter as
    # the best so far) and resumed: steps 5 and 6 score again
    scores = iter([0.5, 0.75, 0.25, 0.5, 0.25, 0.5, 0.25, 0.5])
    writes = {"n": 0}

    def fault(stage):
        writes["n"] += stage == "adapter"
        if writes["n"] == 5:
            raise KeyboardInterrupt("killed while writing checkpoint 5")
    with mock.patch.object(session, "domain_accuracy", fake):
        with pytest.raises(KeyboardInterrupt):
            train(cfg, model_spec=tiny_model, output=tmp_path / "resumed", seed=1,
                  log=lambda m: None, fault=fault)
        r2 = train(cfg, model_spec=tiny_model, output=tmp_path / "resumed", seed=1,
                   log=lambda m: None)
    assert r2.manifest["outputs"]["adapter_step"] == 2
    resumed = load_file(str(tmp_path / "resumed" / "adapter_model.safetensors"))
    assert all((whole[k] - resumed[k]).abs().max() < 1e-6 for k in whole)
