"""The CTranslate2 backend on real models: parity with transformers (tiny random Llama in
float32, the bundled SmolLM2 in float32 and int8), stop strings, seeds, streaming and
cancellation, the conversion cache (reuse, refusal of a partial conversion), LoRA merging,
and choosing the backend from the config."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import threading
from pathlib import Path

import pytest

from workbench.models import GenerationParams, ScoreRequest, load_model

REPO = Path(__file__).resolve().parents[1]

Q = [[{"role": "user", "content": "What is the capital of France?"}],
     [{"role": "user", "content": "Say hello."}],
     [{"role": "system", "content": "Answer in one word."},
      {"role": "user", "content": "What colour is the sky on a clear day?"}],
     [{"role": "user", "content": "Write a long poem about the sea, ships and the wind."}]]


def _ct2():
    from importlib.util import find_spec

    from conftest import require

    require(find_spec("ctranslate2") is not None, "ctranslate2 is not installed (dev extra)")
    from workbench.models import ct2

    return ct2


def _summary(gens):
    return [(g.text, g.finish_reason, g.prompt_tokens, g.completion_tokens) for g in gens]


@pytest.fixture(scope="module")
def tiny_pair(tiny_model, tmp_path_factory):
    _ct2()
    cache = tmp_path_factory.mktemp("ct2-tiny")
    ct = load_model(tiny_model, backend="ctranslate2", quantization="float32",
                    cache_dir=str(cache))
    return ct, load_model(tiny_model)


@pytest.fixture(scope="module")
def bundled_int8(bundled_model):  # full tier: the bundled model's weights
    _ct2()
    return load_model("default", backend="ctranslate2", batch_size=8)


# --- parity on the tiny model ------------------------------------------------------------------

def test_tiny_float32_greedy_equals_transformers(tiny_pair):
    ct, tf = tiny_pair
    p = GenerationParams(max_tokens=24)
    assert _summary(ct.generate(Q, p)) == _summary(tf.generate(Q, p))
    for q in Q[:2]:
        assert _summary(ct.generate([q], p)) == _summary(tf.generate([q], p))
    raw = ["The capital of France is", "Once upon a time there was"]
    assert _summary(ct.complete(raw, p)) == _summary(tf.complete(raw, p))
    assert ct.backend_name == "ctranslate2" and ct.identity.endswith(":float32")


def test_tiny_float32_scores_and_token_logprobs_match(tiny_pair):
    ct, tf = tiny_pair
    reqs = [ScoreRequest("The capital of France is", [" Paris", " London", " a city"]),
            ScoreRequest(Q[0], ["A", "B", "Paris is a city"]),
            ScoreRequest("Answer: ", ["yes", "no"]),  # trailing space moves (lm-eval)
            ScoreRequest("", ["Hello there"])]  # empty context: scored from BOS/EOS
    for a, b in zip(ct.score(reqs), tf.score(reqs), strict=True):
        for x, y in zip(a, b, strict=True):
            assert abs(x.logprob - y.logprob) < 1e-3
            assert (x.n_tokens, x.n_chars, x.is_greedy) == (y.n_tokens, y.n_chars, y.is_greedy)
    a, b = ct.token_logprobs("Hello world, this is", top=3), tf.token_logprobs(
        "Hello world, this is", top=3)
    assert (a.tokens, a.offsets) == (b.tokens, b.offsets)
    assert a.logprobs[0] is None and all(abs(x - y) < 1e-3 for x, y in
                                          zip(a.logprobs[1:], b.logprobs[1:], strict=True))
    assert [list(t) for t in a.top[1:]] == [list(t) for t in b.top[1:]]
    assert ct.tokenize(Q[2]) == tf.tokenize(Q[2]) and ct.detokenize(ct.tokenize("hi")) == "hi"
    assert ct.max_positions == tf.max_positions == 1024


# --- the bundled model in int8 -----------------------------------------------------------------

def test_int8_max_tokens_and_stop_strings(bundled_int8):
    m = bundled_int8
    g = m.generate([Q[0]], GenerationParams(max_tokens=4))[0]
    assert g.completion_tokens == 4 and g.finish_reason == "length" and g.text
    free = m.generate([Q[0]], GenerationParams(max_tokens=30))[0].text
    words = [w for w in free.split() if len(w) > 3 and free.index(w) > 5]
    assert words, free  # a word from the middle of the model's own greedy reply (int8 text
    stop = words[len(words) // 2]  # differs between CPUs, a fixed word did not always occur)
    g = m.generate([Q[0]], GenerationParams(max_tokens=30, stop=(stop,)))[0]
    assert stop not in g.text and g.finish_reason == "stop" and g.completion_tokens < 30
    assert free.startswith(g.text.rstrip())
    gens = m.generate(Q, GenerationParams(max_tokens=48, stop=(".", "!")))
    assert all("." not in g.text and "!" not in g.text for g in gens)
    assert all(g.prompt_tokens > 0 and 0 < g.completion_tokens <= 48 for g in gens)
    assert all(g.finish_reason == "stop" for g in gens if g.completion_tokens < 48)


def test_int8_seeded_sampling_repeats_whatever_ran_before(bundled_int8):
    m = bundled_int8
    p = GenerationParams(max_tokens=12, temperature=1.0, seed=7)
    a = [g.text for g in m.generate(Q[:2], p)]
    m.generate(Q[:2], GenerationParams(max_tokens=12, temperature=1.0))  # draws in between
    assert [g.text for g in m.generate(Q[:2], p)] == a
    other = [g.text for g in m.generate(Q[:2], p.model_copy(update={"seed": 8}))]
    assert other != a
    one = m.generate([Q[0]], p)[0].text  # one row draws differently from a batch of two
    assert "".join(m.stream(Q[0], p)) == one == m.generate([Q[0]], p)[0].text


def test_int8_stream_and_cancel(bundled_int8):
    from workbench.models.base import cancel_on

    m = bundled_int8
    p = GenerationParams(max_tokens=16)
    pieces = list(m.stream(Q[0], p))
    assert len(pieces) > 1 and "".join(pieces) == m.generate([Q[0]], p)[0].text
    held = list(m.stream(Q[0], GenerationParams(max_tokens=30, stop=("France",))))
    assert "Fr" not in "".join(held)  # the start of a stop string is held back
    ev = threading.Event()
    ev.set()
    with cancel_on(ev):
        gens = m.generate(Q, GenerationParams(max_tokens=200))
    assert all(g.completion_tokens <= 2 for g in gens)


def test_int8_tools_go_through_the_shared_parser(bundled_int8):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    g = bundled_int8.generate([[{"role": "user", "content": "Weather in Paris?"}]],
                              GenerationParams(max_tokens=40), tools=tools,
                              tool_choice="required")[0]
    # a forced call starts with the template's call prefix, parsed or not
    assert g.finish_reason in ("tool_calls", "stop", "length")
    assert g.tool_calls or g.text.startswith("<tool_call>")


# --- scoring parity on 100 multiple-choice items ----------------------------------------------

def test_scoring_parity_with_transformers_on_100_items(bundled_model):
    _ct2()
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from bench_ct2 import mc_requests, parity
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    pairs = mc_requests(100, "generated")
    reqs, gold = [r for r, _ in pairs], [g for _, g in pairs]
    ref = bundled_model.score(reqs)
    f32 = load_model("default", backend="ctranslate2", quantization="float32")
    p32 = parity(ref, f32.score(reqs), gold)
    i8 = load_model("default", backend="ctranslate2", scoring="ctranslate2")  # int8, the record
    assert load_model("default", backend="ctranslate2").scoring == "transformers"  # auto
    p8 = parity(ref, i8.score(reqs), gold)
    print(f"\nfloat32: {p32}\nint8: {p8}")
    assert p32["items"] == 100 and p32["same_choice"] >= 0.98
    assert p32["max_abs_dloglik"] < 0.01
    assert abs(p32["accuracy"] - p32["accuracy_ref"]) <= 0.01
    # int8 drift depends on the CPU's int8 kernels: 45% same choice (max 6.3 nats) on an
    # AVX2-only AMD EPYC, 97.8% on exam items on an earlier machine. It is recorded, not
    # required: int8 never scores unless asked for (the `auto` check above)
    assert p8["items"] == 100 and math.isfinite(p8["max_abs_dloglik"])


# --- the conversion cache ----------------------------------------------------------------------

def _copy(tiny_model: str, where: Path) -> Path:
    src = where / "src"
    shutil.copytree(tiny_model, src)
    return src


def test_conversion_is_cached_and_reused(tiny_model, tmp_path):
    ct2 = _ct2()
    src, cache = _copy(tiny_model, tmp_path), tmp_path / "cache"
    done = dict(ct2.conversions)  # counts are per folder name, which copies may share
    m1 = load_model(str(src), backend="ctranslate2", quantization="int8", cache_dir=str(cache))
    folder, marker = m1.folder, m1.folder / ct2.COMPLETE
    n = ct2.conversions[folder.name]
    assert n == done.get(folder.name, 0) + 1 and folder.parent == cache
    assert json.loads(marker.read_text())["quantization"] == "int8"
    stamp = marker.stat().st_mtime_ns
    m2 = load_model(str(src), backend="ctranslate2", quantization="int8", cache_dir=str(cache))
    assert m2.folder == folder and ct2.conversions[folder.name] == n
    assert marker.stat().st_mtime_ns == stamp
    assert not [p for p in cache.iterdir() if ".tmp-" in p.name or ".merge-" in p.name]
    g = m2.generate([Q[0]], GenerationParams(max_tokens=5))[0]
    assert g.completion_tokens == 5
    # another quantization, or a changed source file, is another conversion
    m3 = load_model(str(src), backend="ctranslate2", quantization="float32",
                    cache_dir=str(cache))
    assert m3.folder != folder
    st = (src / "config.json").stat()
    os.utime(src / "config.json", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    m4 = load_model(str(src), backend="ctranslate2", quantization="int8", cache_dir=str(cache))
    assert m4.folder != folder and ct2.conversions[m4.folder.name] == \
        done.get(m4.folder.name, 0) + 1


def test_partial_conversion_is_rebuilt_never_loaded(tiny_model, tmp_path):
    ct2 = _ct2()
    src, cache = _copy(tiny_model, tmp_path), tmp_path / "cache"
    target = ct2.ct2_cache_dir(src, "int8", cache_dir=cache)
    target.mkdir(parents=True)
    (target / "model.bin").write_bytes(b"\0" * 64)  # as a killed conversion could leave it
    (target / "config.json").write_text("{}")
    killed = cache / f".{target.name}.tmp-999999"  # temp folder of a killed conversion
    killed.mkdir()
    n = ct2.conversions.get(target.name, 0)
    m = load_model(str(src), backend="ctranslate2", quantization="int8", cache_dir=str(cache))
    assert m.folder == target and ct2.is_complete(target)
    assert ct2.conversions[target.name] == n + 1 and not killed.exists()
    assert m.generate([Q[1]], GenerationParams(max_tokens=4))[0].completion_tokens == 4
    # weights lost under a finished marker: not complete either, converted again
    (target / "model.bin").unlink()
    assert not ct2.is_complete(target)
    m = load_model(str(src), backend="ctranslate2", quantization="int8", cache_dir=str(cache))
    assert ct2.conversions[target.name] == n + 2 and ct2.is_complete(target)


def test_lora_adapter_is_merged_converted_and_cached(tiny_model, tmp_path):
    ct2 = _ct2()
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                           target_modules=["q_proj", "v_proj", "up_proj"]))
    peft.save_pretrained(tmp_path / "adapter")
    opts = {"backend": "ctranslate2", "quantization": "float32",
            "cache_dir": str(tmp_path / "c"), "adapter": str(tmp_path / "adapter")}
    ct = load_model(tiny_model, **opts)
    n = ct2.conversions[ct.folder.name]
    assert "+adapter:" in ct.identity and n == 1  # a fresh cache folder
    tf = load_model(tiny_model, adapter=str(tmp_path / "adapter"))
    p = GenerationParams(max_tokens=16)
    assert _summary(ct.generate(Q[:3], p)) == _summary(tf.generate(Q[:3], p))
    again = load_model(tiny_model, **opts)
    assert again.folder == ct.folder and ct2.conversions[ct.folder.name] == n
    assert not [p for p in (tmp_path / "c").iterdir() if ".merge-" in p.name]


# --- choosing the backend ----------------------------------------------------------------------

def test_backend_forced_from_the_config(tiny_model, tmp_path):
    _ct2()
    from workbench.config import load_config
    from workbench.models.factory import open_chat_model
    from workbench.models.backends import available_backends, backend_uses

    # a config written for transformers (its options included) switches with one override
    common = [f"models.chat.spec={tiny_model}", "models.chat.options.batch_size=4",
              "models.chat.options.threads=1", "models.chat.options.dtype=float32"]
    cfg = load_config(None, [*common, "models.chat.backend=ctranslate2",
                             f"models.chat.options.cache_dir={tmp_path}"])
    m = open_chat_model(cfg.models.chat)
    assert m.backend_name == "ctranslate2" and m.batch_size == 4
    # the measured best layout on a small CPU: 1 intra-op thread x 2 batches in parallel
    assert m.info().details["inter_threads"] == max(1, min(2, os.cpu_count() or 1))
    assert m.info().details["intra_threads"] == 1
    assert m.generate([Q[0]], GenerationParams(max_tokens=3))[0].completion_tokens == 3
    cfg = load_config(None, [*common, "models.chat.backend=transformers"])
    assert open_chat_model(cfg.models.chat).backend_name == "local"
    assert open_chat_model(load_config(None, common[:1]).models.chat).backend_name == "local"
    assert {"ctranslate2", "transformers", "local"} <= set(available_backends())
    # a GGUF (the bundled model) generates on llama.cpp where it is installed
    assert backend_uses("default") == {"generate": "llamacpp", "score": "transformers"}
    assert backend_uses("default", "transformers") == {"generate": "transformers",
                                                       "score": "transformers"}
    assert backend_uses("default", "ctranslate2") == {"generate": "ctranslate2",
                                                      "score": "transformers"}  # int8: auto
    assert backend_uses("default", "ctranslate2", {"quantization": "float32"}) == {
        "generate": "ctranslate2", "score": "ctranslate2"}
    assert backend_uses("default", "ctranslate2", {"scoring": "transformers"}) == {
        "generate": "ctranslate2", "score": "transformers"}


def test_scoring_can_stay_on_transformers(tiny_model, tmp_path):
    _ct2()
    ct = load_model(tiny_model, backend="ctranslate2", cache_dir=str(tmp_path),
                    scoring="transformers")
    tf = load_model(tiny_model)
    req = [ScoreRequest("The capital of France is", [" Paris", " London"])]
    assert [s.logprob for s in ct.score(req)[0]] == [s.logprob for s in tf.score(req)[0]]
    assert ct.identity.endswith("+score:transformers")
