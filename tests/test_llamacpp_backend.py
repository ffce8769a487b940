"""The llama.cpp backend (`workbench.models.llamacpp`) on tiny random-init GGUF files that
these tests write themselves: the same tokens as transformers, constraints, tool calls,
streaming, stops, cancellation, seeds, LoRA adapters applied unmerged, scoring on
transformers, the server's lock, and the default choice of engine. The bundled model on
llama.cpp is in the full tier (`bundled_llamacpp`)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from conftest import write_tiny_gguf

from workbench.errors import WorkbenchError
from workbench.models import load_model
from workbench.models.base import GenerationParams, ScoreRequest, cancel_on
from workbench.models.constrain import Constraint

pytest.importorskip("xllamacpp")

GREEDY = GenerationParams(max_tokens=24)
TOOLS = [{"type": "function", "function": {
    "name": "calc", "description": "Evaluate an expression.",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}},
                   "required": ["expr"], "additionalProperties": False}}}]


def _convs(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"Hello number {i}, tell me about filters."}]
            for i in range(n)]


@pytest.fixture(scope="module")
def peaked(tmp_path_factory, tiny_model):
    """(HF folder, GGUF file) of a tiny llama whose logits are far apart (init 0.2), so that
    greedy paths do not turn on rounding; its tokenizer is the bundled model's."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    cfg = AutoConfig.from_pretrained(tiny_model)
    cfg.initializer_range = 0.2
    torch.manual_seed(1)
    out = tmp_path_factory.mktemp("peaked") / "peaked"
    LlamaForCausalLM(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(out)
    return out, write_tiny_gguf(out, out.parent / "peaked.gguf")


@pytest.fixture(scope="module")
def engines(peaked):
    folder, gguf = peaked
    hf = load_model(str(folder))
    cpp = load_model(str(gguf), batch_size=4)
    yield hf, cpp
    cpp.close()


def _ids(model, texts):
    return [model.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_a_gguf_generates_on_llama_cpp_by_default_with_transformers_tokens(engines):
    hf, cpp = engines
    assert cpp.backend_name == "llamacpp" and hf.backend_name == "local"
    assert cpp.identity.startswith("llamacpp:") and "+score:transformers" in cpp.identity
    convs = _convs(6)
    a, b = hf.generate(convs, GREEDY), cpp.generate(convs, GREEDY)
    assert all(g.ok for g in b)
    # same prompt tokens in, and (f32 weights, far-apart logits) the same greedy tokens out
    assert [g.prompt_tokens for g in a] == [g.prompt_tokens for g in b]
    assert _ids(hf, [g.text for g in a]) == _ids(hf, [g.text for g in b])
    assert [g.finish_reason for g in a] == [g.finish_reason for g in b]
    # a batch larger than the slots, and raw completion
    assert len(cpp.generate(_convs(9), GenerationParams(max_tokens=4))) == 9
    raw = cpp.complete(["The filter"], GenerationParams(max_tokens=5))[0]
    assert raw.ok and raw.completion_tokens == 5 and raw.finish_reason == "length"


def test_a_batch_counts_its_replies_as_they_come(engines, monkeypatch):
    """A log's progress line moves with each reply of a batch, not once per batch: the
    replies are counted as they come back, out of the batch's size (a prompt too long for a
    slot is no reply)."""
    import workbench.models.llamacpp as backend

    seen = []

    def counting(items, desc="", total=None, unit="it", *, delay=0.0):
        seen.append([desc, total, unit, 0])
        for x in items:
            assert x.done()  # a finished request, counted when it finishes
            seen[-1][3] += 1
            yield x

    monkeypatch.setattr(backend, "progress", counting)
    _, cpp = engines
    too_long = [{"role": "user", "content": "filter " * cpp.max_positions}]
    gens = cpp.generate(_convs(6) + [too_long], GenerationParams(max_tokens=4))
    assert [g.ok for g in gens] == [True] * 6 + [False]
    assert seen == [["generating", 6, "reply", 6]]


def test_a_batch_logs_the_tokens_made_before_any_reply_is_back(engines, monkeypatch, capsys):
    """Before, a redirected log read "generating: 0/4 reply (0%), 0/s, ETA ?" until the first
    reply of a batch came back (minutes on a CPU); now each line carries the tokens the
    busy slots have made so far (llama.cpp's /slots), which grow from line to line."""
    import re

    from workbench import progress as P

    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.delenv("WB_PROGRESS_FILE", raising=False)
    monkeypatch.setenv("WB_PROGRESS_SECONDS", "0.05")
    _, cpp = engines
    with P.stage("distill"):
        gens = cpp.generate(_convs(4), GenerationParams(max_tokens=800, temperature=1.0,
                                                        seed=3))
    assert all(g.ok for g in gens)
    lines = [x for x in capsys.readouterr().err.splitlines()
             if x.startswith("[progress] distill > generating: 0/4 reply")]
    while lines and " token (" not in lines[0]:  # the prompts read, no token made yet
        lines.pop(0)
    counts = [int(m.group(1)) for x in lines if (m := re.search(r" (\d+) token \(", x))]
    assert len(counts) >= 2 and len(counts) == len(lines), lines
    assert counts == sorted(counts) and counts[-1] > counts[0] > 0, lines


def test_the_prompt_cache_gives_the_same_replies(peaked, engines):
    """With llama.cpp's host-memory prompt cache (on by default: an eighth of the machine's
    memory, at most 8 GiB) a slot may start from another prompt's KV (a shared section text
    read once, an agent's dialogue taken up on another slot): the replies are the ones each
    prompt gets without it."""
    import os

    _, gguf = peaked
    _, cpp = engines
    ram_mib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20
    assert cpp.prompt_cache_mib == min(8192, ram_mib // 8) > 0
    assert cpp.info().details["prompt_cache_mib"] == cpp.prompt_cache_mib
    text = "A quarter-wave line matches two impedances at one frequency. " * 6
    convs = [[{"role": "user", "content": text + f"Question {i}?"}] for i in range(8)]
    plain = load_model(str(gguf), batch_size=4, prompt_cache_mib=0)
    try:
        assert plain.prompt_cache_mib == 0
        want = [g.text for g in plain.generate(convs, GREEDY)]
    finally:
        plain.close()
    for _ in range(2):  # the second pass finds every prompt's prefix in the cache
        assert [g.text for g in cpp.generate(convs, GREEDY)] == want


def test_stops_streaming_and_seeds(engines):
    _, cpp = engines
    conv = _convs(1)[0]
    whole = cpp.generate([conv], GREEDY)[0].text
    assert "".join(cpp.stream(conv, GREEDY)) == whole
    stop = whole[len(whole) // 2:len(whole) // 2 + 3]
    if stop.strip():
        cut = cpp.generate([conv], GREEDY.model_copy(update={"stop": (stop,)}))[0]
        assert cut.text == whole[:whole.find(stop)] and cut.finish_reason == "stop"
        assert "".join(cpp.stream(conv, GREEDY.model_copy(update={"stop": (stop,)}))) == cut.text
    sampled = GenerationParams(max_tokens=16, temperature=1.0, seed=7)
    one = [g.text for g in cpp.generate(_convs(3), sampled)]
    assert one == [g.text for g in cpp.generate(_convs(3), sampled)]
    assert one != [g.text for g in cpp.generate(_convs(3), sampled.model_copy(
        update={"seed": 8}))]


def test_deterministic_replies_do_not_depend_on_the_batch(peaked):
    """`deterministic`: one slot, each prompt read alone and a seed where none is given (the
    i-th row seed + i), so a sampled batch gives the same replies twice, and each row the
    reply it gets alone with its seed; equal prompts in a batch get different samples."""
    _, gguf = peaked
    det = load_model(str(gguf), batch_size=4, deterministic=True)
    try:
        assert det.batch_size == 1
        sampled = GenerationParams(max_tokens=16, temperature=1.0)  # no seed given
        batch = [g.text for g in det.generate(_convs(5), sampled)]
        assert batch == [g.text for g in det.generate(_convs(5), sampled)]
        assert batch == [det.generate([c], sampled.model_copy(update={"seed": i}))[0].text
                         for i, c in enumerate(_convs(5))]
        group = [g.text for g in det.generate(_convs(1) * 4, sampled)]
        assert len(set(group)) > 1
    finally:
        det.close()


@pytest.mark.parametrize("constraint,check", [
    (Constraint.json_schema({"type": "object", "properties": {
        "n": {"type": "integer"}, "ok": {"type": "boolean"}}, "required": ["n", "ok"],
        "additionalProperties": False}),
     lambda t: set(json.loads(t)) == {"n", "ok"} and ", " in t),
    (Constraint.regex(r"[0-9]{2}/[a-c]{2}"),
     lambda t: len(t) == 5 and t[2] == "/" and t[:2].isdigit()),
    (Constraint.choice(["yes", "no", "not sure"]), lambda t: t in ("yes", "no", "not sure")),
    (Constraint.lark('start: "A" | "B" " " /[xy]+/'), lambda t: t == "A" or t.startswith("B ")),
    (Constraint.json_object(), lambda t: isinstance(json.loads(t), dict)),
])
def test_constraints_hold_on_llama_cpp(engines, constraint, check):
    _, cpp = engines
    cpp.check_constraint(constraint)
    gens = cpp.generate(_convs(3), GenerationParams(max_tokens=48, constraint=constraint))
    for g in gens:
        assert g.ok
        if g.finish_reason == "stop":
            assert check(g.text), g.text


def test_forced_tool_calls_parse_and_stream(engines):
    _, cpp = engines
    gens = cpp.generate(_convs(3), GenerationParams(max_tokens=64), tools=TOOLS,
                        tool_choice="required")
    for g in gens:
        assert g.finish_reason in ("tool_calls", "length")
        if g.finish_reason == "tool_calls":
            call = g.tool_calls[0]
            assert call.function.name == "calc"
            assert set(json.loads(call.function.arguments)) == {"expr"}
    events = list(cpp.stream_tool_call(_convs(1)[0], GenerationParams(max_tokens=64), TOOLS,
                                       {"type": "function", "function": {"name": "calc"}}))
    assert events[0] == ("name", "calc") and events[-1][0] == "finish"
    if events[-1][1] == "tool_calls":
        args = "".join(v for k, v in events if k == "arguments")
        assert set(json.loads(args)) == {"expr"}
    with pytest.raises(WorkbenchError, match="invalid"):
        cpp.check_constraint(Constraint.lark("start: ("))


def test_a_streamed_reply_keeps_characters_split_across_tokens(engines):
    """llama.cpp streams no token that ends inside a UTF-8 character, and the chunk that
    completes it carries only its own token: the ids alone decoded to " \\ufffd" (the forced
    call here writes " 컥" in 3 tokens), and under its grammar the call then failed its check.
    Streamed (and, with a cancel event, as the server asks) as whole, the same text."""
    _, cpp = engines
    named = {"type": "function", "function": {"name": "calc"}}
    params = GenerationParams(max_tokens=64)
    whole = cpp.generate(_convs(1), params, tools=TOOLS, tool_choice=named)[0]
    with cancel_on(threading.Event()):  # the streamed request the server's calls make
        cancellable = cpp.generate(_convs(1), params, tools=TOOLS, tool_choice=named)[0]
    events = list(cpp.stream_tool_call(_convs(1)[0], params, TOOLS, named))
    args = "".join(v for k, v in events if k == "arguments")
    assert whole.ok and cancellable.ok, (whole.error, cancellable.error)
    text = whole.tool_calls[0].function.arguments if whole.tool_calls else whole.text
    assert "\ufffd" not in text and any(ord(c) > 127 for c in text), text
    assert [c.function for c in cancellable.tool_calls] == [c.function for c in
                                                             whole.tool_calls]
    assert args == text, (args, text)


def test_cancel_ends_generation_within_a_few_tokens(engines):
    _, cpp = engines
    event = threading.Event()
    params = GenerationParams(max_tokens=2000)
    conv = [{"role": "user", "content": "Write without end."}]
    t0 = time.perf_counter()
    threading.Timer(0.3, event.set).start()
    with cancel_on(event):
        gen = cpp.generate([conv], params)[0]
    assert gen.completion_tokens < 2000 and time.perf_counter() - t0 < 20
    pieces = []
    with cancel_on(threading.Event()) as ev:
        for piece in cpp.stream(conv, params):
            pieces.append(piece)
            if len(pieces) == 3:
                ev.set()
    assert 3 <= len(pieces) <= 5


def test_a_prompt_longer_than_the_model_is_an_item_error(engines):
    _, cpp = engines
    long = [{"role": "user", "content": "filter " * 1500}]  # the tiny model takes 1024
    gens = cpp.generate([long, _convs(1)[0]], GenerationParams(max_tokens=4))
    assert gens[0].error and "a slot holds 1024" in gens[0].error and gens[1].ok


def test_scores_are_the_transformers_models_and_shared_in_the_cache(engines, peaked,
                                                                    tmp_path):
    from workbench.models.cache import CachedModel, CallCache

    _, cpp = engines
    req = [ScoreRequest("The band-pass filter", [" passes", " stops"])]
    assert cpp.score_identity == f"local:{peaked[1]}"
    a = load_model(str(peaked[1]), backend="transformers").score(req)
    b = cpp.score(req)
    assert [s.logprob for s in a[0]] == pytest.approx([s.logprob for s in b[0]], abs=1e-5)
    cache = CallCache(tmp_path / "calls.sqlite")
    CachedModel(load_model(str(peaked[1]), backend="transformers"), cache).score(req)
    cached = CachedModel(cpp, cache)
    cached.score(req)
    assert cached.calls_made == 0  # the transformers backend's cached scores were used
    cached.generate(_convs(1), GREEDY)
    assert cached.calls_made == 1  # generations are keyed by the llama.cpp identity


def test_lora_adapter_runs_unmerged_as_the_merged_model_does(peaked, tmp_path, cli):
    """A PEFT adapter (rsLoRA, a per-module alpha) converted to a GGUF LoRA adapter and
    applied at run time gives the greedy tokens of the same adapter merged into the
    weights; and they differ from the base model's."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder, gguf = peaked
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    cfg = LoraConfig(r=4, lora_alpha=8, use_rslora=True, alpha_pattern={"v_proj": 16},
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                     init_lora_weights=False)
    torch.manual_seed(3)
    peft = get_peft_model(base, cfg)
    for name, p in peft.named_parameters():
        if "lora_" in name:
            p.data.normal_(0, 0.3)
    adapter = tmp_path / "adapter"
    peft.save_pretrained(adapter)
    merged = tmp_path / "merged"
    peft.merge_and_unload().save_pretrained(merged)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(folder).save_pretrained(merged)
    merged_gguf = write_tiny_gguf(merged, tmp_path / "merged.gguf")
    convs = _convs(4)
    with_lora = load_model(str(gguf), adapter=str(adapter), batch_size=2)
    try:
        assert "+adapter:" in with_lora.identity
        got = [g.text for g in with_lora.generate(convs, GREEDY)]
    finally:
        with_lora.close()
    want_model = load_model(str(merged_gguf), batch_size=2)
    base_model = load_model(str(gguf), batch_size=2)
    try:
        assert got == [g.text for g in want_model.generate(convs, GREEDY)]
        assert got != [g.text for g in base_model.generate(convs, GREEDY)]
    finally:
        want_model.close()
        base_model.close()
    # the same file for llama.cpp's --lora, written by the CLI, applied as `lora`
    out = tmp_path / "adapter.gguf"
    res = cli("train", "export-gguf", str(adapter), "-o", str(out), "--lora", "--base",
              str(gguf))
    assert res.returncode == 0, res.stderr
    assert "GGUF LoRA adapter" in res.stdout
    from_file = load_model(str(gguf), lora=str(out), batch_size=2)
    try:
        assert "+lora:" in from_file.identity
        assert [g.text for g in from_file.generate(convs, GREEDY)] == got
        with pytest.raises(WorkbenchError, match="PEFT adapter folder"):
            from_file.score([ScoreRequest("a", [" b"])])
    finally:
        from_file.close()


def test_the_server_is_loopback_and_locked(engines):
    import httpx

    _, cpp = engines
    url = cpp.server.url
    assert url.startswith("http://127.0.0.1:")
    assert httpx.post(url + "/completion", json={"prompt": "hi"}, trust_env=False
                      ).status_code == 401
    assert httpx.get(url + "/v1/models", trust_env=False).status_code == 401
    # /slots (the progress lines' count of tokens made so far) is behind the key too
    assert httpx.get(url + "/slots", trust_env=False).status_code == 401
    assert cpp.server.decoding() == 0  # nothing in flight


def test_without_the_engine_a_gguf_falls_back_to_transformers_saying_so(
        peaked, monkeypatch, caplog):
    from workbench.models import backends, llamacpp, llamacpp_server

    monkeypatch.setattr(llamacpp_server, "available", lambda: False)  # the registry's check
    monkeypatch.setattr(llamacpp, "available", lambda: False)  # the backend's own
    monkeypatch.setattr(backends, "_FALLBACK_SAID", set())
    with caplog.at_level("WARNING", logger="workbench.models"):
        m = load_model(str(peaked[1]))
        load_model(str(peaked[1]))
    assert m.backend_name == "local"
    said = [r.getMessage() for r in caplog.records if "llama.cpp" in r.getMessage()]
    assert len(said) == 1 and "xllamacpp" in said[0]
    assert backends.backend_uses(str(peaked[1])) == {"generate": "transformers",
                                                     "score": "transformers"}
    with pytest.raises(WorkbenchError, match="xllamacpp"):
        load_model(str(peaked[1]), backend="llamacpp")


def test_options_and_sources_it_refuses(peaked, tiny_model):
    with pytest.raises(WorkbenchError, match="GGUF"):
        load_model(tiny_model, backend="llamacpp")
    with pytest.raises(WorkbenchError, match="device"):
        load_model(str(peaked[1]), device="mps")
    with pytest.raises(WorkbenchError, match="no such"):
        load_model(str(peaked[1]), lora=str(Path(peaked[1]).parent / "missing.gguf"))
    from workbench.models.backends import backend_uses

    assert backend_uses(str(peaked[1])) == {"generate": "llamacpp", "score": "transformers"}


def test_a_small_quantised_file_is_decoded_from_an_f16_copy(peaked, engines, tmp_path):
    """llama.cpp quantises activations against quantised weights; `weights: auto` decodes a
    small quantised GGUF from an f16 copy made once, and says so in the identity."""
    import gguf as gguf_pkg

    from workbench.models.gguf_file import dequantised_tensors, write_gguf
    from workbench.models.gguf_header import file_type

    reader = gguf_pkg.GGUFReader(str(peaked[1]))
    q8 = tmp_path / "peaked-q8.gguf"
    write_gguf(q8, reader, "llama", dequantised_tensors(reader), out_type="q8_0", name="q8")
    assert file_type(q8) == 7 and file_type(peaked[1]) == 0
    _, f32 = engines
    convs, params = _convs(3), GenerationParams(max_tokens=8)
    # the same weights in fp32 (transformers dequantises the file itself)
    want = [g.text for g in load_model(str(q8), backend="transformers").generate(convs, params)]
    auto = load_model(str(q8), batch_size=2)
    try:
        assert auto.weights == "f16" and "@f16+score:transformers" in auto.identity
        from workbench.models.local import gguf_cache_dir
        from workbench.models.resolve import resolve_chat_model

        cache = gguf_cache_dir(resolve_chat_model(str(q8)))
        copy = cache.with_name(cache.name + "-f16") / "model-f16.gguf"
        assert file_type(copy) == 1
        made = (copy.stat().st_ino, copy.stat().st_mtime_ns)
        assert [g.text for g in auto.generate(convs, params)] == want
    finally:
        auto.close()
    again = load_model(str(q8), batch_size=2)  # made once: the second load reuses it
    try:
        assert again.identity == auto.identity
        assert (copy.stat().st_ino, copy.stat().st_mtime_ns) == made
    finally:
        again.close()
    as_is = load_model(str(q8), batch_size=2, weights="file")
    try:
        assert as_is.weights == "file" and "@f16" not in as_is.identity
    finally:
        as_is.close()
    assert "@f16" not in f32.identity  # an unquantised file is decoded as it is


def test_thread_options_reach_the_engine_and_a_late_openmp_is_said(peaked, monkeypatch,
                                                                     caplog):
    """`threads` and `poll` reach llama.cpp's CPU parameters (both the decoding and the
    prompt-batch ones); where libgomp was loaded before the workbench could make OpenMP's
    threads sleep (`workbench.openmp`), starting the engine on 2 threads says so, once."""
    from workbench import openmp
    from workbench.models import llamacpp_server

    monkeypatch.setattr(openmp, "_STATE", "late")
    monkeypatch.setattr(llamacpp_server, "_SPIN_SAID", False)
    with caplog.at_level("WARNING", logger="workbench.models.llamacpp_server"):
        m = load_model(str(peaked[1]), threads=2, poll=0, batch_size=1)
    try:
        p = m.server.params
        assert (p.cpuparams.n_threads, p.cpuparams_batch.n_threads) == (2, 2)
        assert (p.cpuparams.poll, p.cpuparams_batch.poll) == (0, 0)
        details = m.info().details
        assert (details["threads"], details["poll"], details["openmp_wait"]) == (2, 0, "late")
        assert m.generate(_convs(1), GenerationParams(max_tokens=3))[0].ok
    finally:
        m.close()
    said = [r.getMessage() for r in caplog.records if "spin-wait" in r.getMessage()]
    assert len(said) == 1 and "GOMP_SPINCOUNT=1000" in said[0]
