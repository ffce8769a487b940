"""Training as a library (workbench.train.session) on the tiny random-init Llama: sessions
built from models in memory, N+N steps equal 2N, adapter tensors out and back in, stop
requests without signals or exits."""

import re
import signal
import subprocess
import sys
import threading

import pytest

from conftest import REPO
from workbench.errors import TrainingInterrupted, WorkbenchError
from workbench.records import ChatExample
from workbench.train.config import TrainConfig
from workbench.train.session import (
    adapter_state, export, load_adapter_state, restore_checkpoint, setup, train_steps,
)


def examples(n=40):
    rows = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"What is {i} times 3?"},
                {"role": "assistant", "content": f"{i} times 3 is {3 * i}."}]
        if i % 3 == 0:
            msgs.insert(0, {"role": "system", "content": "Answer in one line."})
        rows.append(ChatExample.model_validate({"id": f"m{i}", "messages": msgs}))
    return rows


def config(**kw):
    base = {"max_length": 128, "batch_size": 4, "learning_rate": 5e-3, "max_steps": 12,
            "eval_fraction": 0.1, "lora": {"r": 4, "alpha": 8, "dropout": 0.1},
            "warmup_ratio": 0.1}
    base.update(kw)
    return TrainConfig(**base)


def in_memory(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(tiny_model),
            AutoTokenizer.from_pretrained(tiny_model))


def session(tiny_model, *, seed=1, checkpoint_dir=None, **kw):
    model, tok = in_memory(tiny_model)
    return setup(config(**kw), model=model, tokenizer=tok, examples=examples(), seed=seed,
                 checkpoint_dir=checkpoint_dir)


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def logits(s):
    import torch

    ids = s.tokenizer("A short question about numbers?", return_tensors="pt")["input_ids"]
    s.model.eval()
    with torch.no_grad():
        out = s.model(input_ids=ids).logits
    s.model.train()
    return out


def test_n_steps_twice_equal_2n_steps_once(tiny_model):
    one = session(tiny_model)
    rows_one = train_steps(one, 12)
    two = session(tiny_model)
    rows_two = train_steps(two, 6) + train_steps(two, 6)
    assert [r["step"] for r in rows_two] == list(range(1, 13)) and two.step == 12
    for a, b in zip(rows_one, rows_two, strict=True):
        assert abs(a["loss"] - b["loss"]) <= 1e-6, a["step"]
    assert abs(rows_one[-1]["eval_loss"] - rows_two[-1]["eval_loss"]) <= 1e-6
    assert max_diff(adapter_state(one), adapter_state(two)) <= 1e-6
    with pytest.raises(WorkbenchError, match="0 of the schedule's 12 remain"):
        train_steps(two, 1)


def test_setup_from_a_spec_and_refused_arguments(tiny_model):
    from_disk = setup(config(), model_spec=tiny_model, examples=examples(), seed=1)
    assert from_disk.base_model == tiny_model and from_disk.total == 12
    assert len(train_steps(from_disk, 2)) == 2
    model, tok = in_memory(tiny_model)
    with pytest.raises(WorkbenchError, match="not both or neither"):
        setup(config(), model_spec=tiny_model, model=model, examples=examples())
    with pytest.raises(WorkbenchError, match="tokenizer="):
        setup(config(), model=model, examples=examples())
    with pytest.raises(WorkbenchError, match="examples were passed and train.data is"):
        setup(config(data="train.jsonl"), model=model, tokenizer=tok, examples=examples())
    with pytest.raises(WorkbenchError, match="train.dtype is bfloat16 but the model"):
        setup(config(dtype="bfloat16"), model=model, tokenizer=tok, examples=examples())


def test_adapter_state_round_trip_and_strict_names(tiny_model, tmp_path):
    from safetensors.torch import load_file

    trained = session(tiny_model, seed=1)
    train_steps(trained, 5)
    state = adapter_state(trained)
    assert state and all(".lora_A." in k or ".lora_B." in k for k in state)
    export(trained, tmp_path / "adapter")
    saved = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert saved.keys() == state.keys() and max_diff(saved, state) == 0  # PEFT's own names

    other = session(tiny_model, seed=2)
    assert (logits(other) - logits(trained)).abs().max().item() > 1e-3
    load_adapter_state(other, state)
    assert (logits(other) - logits(trained)).abs().max().item() <= 1e-6

    copy = {k: v.clone() for k, v in state.items()}
    train_steps(trained, 2)
    assert max_diff(state, copy) == 0  # a snapshot, not a view of the live weights

    fresh = session(tiny_model, seed=3)
    before = adapter_state(fresh)
    name = min(state)
    renamed = dict(state)
    renamed[name.replace("layers.0", "layers.7")] = renamed.pop(name)
    with pytest.raises(WorkbenchError, match=rf"missing {re.escape(name)}.*unexpected"):
        load_adapter_state(fresh, renamed)
    narrow = dict(state, **{name: state[name][:2]})
    with pytest.raises(WorkbenchError, match=rf"{re.escape(name)} has shape \(2, "):
        load_adapter_state(fresh, narrow)
    assert max_diff(adapter_state(fresh), before) == 0  # refused before anything was written


def test_should_stop_checkpoints_and_raises_without_signals(tiny_model, tmp_path):
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    ref = session(tiny_model)
    ref_rows = train_steps(ref, 12)

    s = session(tiny_model, checkpoint_dir=tmp_path / "ck", save_every=0)
    stop = threading.Event()
    with pytest.raises(TrainingInterrupted) as e:
        train_steps(s, 12, should_stop=stop,
                    on_step=lambda row: row["step"] == 4 and stop.set())
    assert isinstance(e.value, WorkbenchError) and e.value.exit_code == 143
    assert e.value.step == 4 and e.value.checkpoint == tmp_path / "ck" / "checkpoint-4"
    assert (e.value.checkpoint / "COMPLETE").exists()
    assert {s_: signal.getsignal(s_) for s_ in handlers} == handlers

    resumed = session(tiny_model, checkpoint_dir=tmp_path / "ck")
    assert restore_checkpoint(resumed) == e.value.checkpoint and resumed.step == 4
    rows = train_steps(resumed, 8)
    assert [r["loss"] for r in resumed.metrics] == pytest.approx(
        [r["loss"] for r in ref_rows], abs=1e-6)
    assert rows[-1]["step"] == 12 and max_diff(adapter_state(ref), adapter_state(resumed)) \
        <= 1e-6

    bare = session(tiny_model)  # no checkpoint folder: the stop still raises, saves nothing
    with pytest.raises(TrainingInterrupted) as e:
        train_steps(bare, 5, should_stop=lambda: True)
    assert e.value.step == 1 and e.value.checkpoint is None and bare.step == 1


def test_in_memory_model_trains_with_no_files(tiny_model, tmp_path, monkeypatch):
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tiny_model)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id))
    monkeypatch.chdir(tmp_path)
    s = setup(config(max_steps=20, lora={"r": 4, "alpha": 8, "dropout": 0.0}), model=model,
              tokenizer=tok, examples=examples(), seed=1)
    rows = train_steps(s, 20)
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.1 and "eval_loss" in rows[-1]
    assert list(tmp_path.iterdir()) == []
    manifest = export(s, tmp_path / "adapter")
    assert manifest["outputs"]["base_model"] == "in-memory"
    assert manifest["outputs"]["steps"] == 20 and manifest["input_hashes"]["data"]
    assert manifest["status"] == "completed"


def test_peft_model_in_memory(tiny_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    first = session(tiny_model)
    train_steps(first, 3)
    again = setup(config(), model=first.model, tokenizer=first.tokenizer,
                  examples=examples(), seed=1)
    assert max_diff(adapter_state(again), adapter_state(first)) == 0  # trains the adapter it has
    with pytest.raises(WorkbenchError, match="r: adapter 4, train.lora 8"):
        setup(config(lora={"r": 8, "alpha": 8, "dropout": 0.1}), model=first.model,
              tokenizer=first.tokenizer, examples=examples())
    export(first, tmp_path / "adapter")
    frozen = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model),
                                       tmp_path / "adapter")
    with pytest.raises(WorkbenchError, match="is_trainable=True"):
        setup(config(), model=frozen, tokenizer=first.tokenizer, examples=examples())


def test_library_installs_no_handler_and_never_exits():
    code = ("import signal\n"
            "before = {s: signal.getsignal(s) for s in signal.valid_signals()}\n"
            "import workbench.train.session\n"
            "after = {s: signal.getsignal(s) for s in signal.valid_signals()}\n"
            "assert before == after, [s for s in before if before[s] != after[s]]\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=REPO, timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-2000:]


def test_stop_on_sigterm_restores_the_handler():
    import os

    from workbench.train.recipe import stop_on_sigterm

    before = signal.getsignal(signal.SIGTERM)
    with stop_on_sigterm() as stop:
        assert signal.getsignal(signal.SIGTERM) is not before
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5)
    assert signal.getsignal(signal.SIGTERM) == before

    seen = {}

    def elsewhere():  # only the main thread can own a handler: nothing installed, no error
        with stop_on_sigterm() as ev:
            seen["set"], seen["handler"] = ev.is_set(), signal.getsignal(signal.SIGTERM)

    t = threading.Thread(target=elsewhere)
    t.start()
    t.join()
    assert seen == {"set": False, "handler": before}
