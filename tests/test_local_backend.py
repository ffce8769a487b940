"""The real bundled model through the local backend: generation, stop strings, scoring."""

import math


from workbench.models import GenerationParams, ScoreRequest


Q = [[{"role": "user", "content": "What is the capital of France?"}],
     [{"role": "user", "content": "Say hello."}],
     [{"role": "system", "content": "Answer in one word."},
      {"role": "user", "content": "What colour is the sky on a clear day?"}]]


def test_greedy_generation_is_batch_independent(bundled_model):
    p = GenerationParams(max_tokens=16)
    batched = bundled_model.generate(Q, p)
    single = [bundled_model.generate([q], p)[0] for q in Q]
    assert [g.text for g in batched] == [g.text for g in single]
    assert "Paris" in batched[0].text
    assert all(g.prompt_tokens > 0 and 0 < g.completion_tokens <= 16 for g in batched)


def test_stop_strings_max_tokens_and_seed(bundled_model):
    g = bundled_model.generate([Q[0]], GenerationParams(max_tokens=4))[0]
    assert g.completion_tokens <= 4 and g.finish_reason == "length"
    g = bundled_model.generate([Q[0]], GenerationParams(max_tokens=30, stop=("France",)))[0]
    assert "France" not in g.text and g.finish_reason == "stop"
    p = GenerationParams(max_tokens=12, temperature=1.0, seed=7)
    a = bundled_model.generate([Q[1]], p)[0].text
    b = bundled_model.generate([Q[1]], p)[0].text
    assert a == b


def test_scoring_matches_manual_logprobs(bundled_model):
    import torch

    tok, model = bundled_model.tokenizer, bundled_model.model
    prompt, conts = "The capital of France is", [" Paris", " London", " a city in Europe"]
    scores = bundled_model.score([ScoreRequest(prompt, conts)])[0]
    assert scores[0].logprob > scores[1].logprob and scores[0].is_greedy
    for cont, sc in zip(conts, scores):
        ids = tok(prompt + cont, add_special_tokens=False)["input_ids"]
        n_ctx = len(tok(prompt, add_special_tokens=False)["input_ids"])
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        manual = sum(lp[i - 1, ids[i]].item() for i in range(n_ctx, len(ids)))
        assert math.isclose(sc.logprob, manual, abs_tol=1e-4)
        assert sc.n_tokens == len(ids) - n_ctx


def test_chat_prompt_scoring(bundled_model):
    conv = [{"role": "user", "content": "Which is a colour: (A) seven or (B) blue? "
                                        "Answer with the letter."}]
    (a, b), = bundled_model.score([ScoreRequest(conv, ["A", "B"])])
    # lm-eval's convention moves the template's trailing newline into the continuation
    assert a.n_tokens == b.n_tokens == 2 and a.n_chars == 1
    assert math.isfinite(a.logprob) and math.isfinite(b.logprob)


def test_requests_with_a_common_prompt_prefix_score_as_if_alone(bundled_model):
    """The prefix several prompts share (an agent's system prompt) is run once per call; the
    scores must equal those of each request scored on its own."""
    system = ("You check statements about words. " * 12).strip()
    reqs = [ScoreRequest([{"role": "system", "content": system},
                          {"role": "user", "content": f"Is a {w} an animal? Say yes or no."}],
                         [" yes", " no", " maybe not", " maybe so"])
            for w in ("dog", "chair", "cat")]
    used = []
    real = bundled_model._common_prefix
    bundled_model._common_prefix = lambda ctxs: used.append(real(ctxs)) or used[-1]
    try:
        together = bundled_model.score(reqs)
    finally:
        del bundled_model._common_prefix
    assert used[0] is not None and used[0][0] >= bundled_model.PREFIX_MIN
    # the reference: every continuation scored on its own (no sharing of any kind)
    alone = [[bundled_model.score([ScoreRequest(r.prompt, [c])])[0][0]
              for c in r.continuations] for r in reqs]
    for row_t, row_a in zip(together, alone):
        for t, a in zip(row_t, row_a):
            assert math.isclose(t.logprob, a.logprob, abs_tol=2e-4), (t, a)
            assert t.n_tokens == a.n_tokens and t.is_greedy == a.is_greedy


def test_stream_yields_same_text_as_generate(bundled_model):
    p = GenerationParams(max_tokens=16)
    pieces = list(bundled_model.stream(Q[0], p))
    assert len(pieces) > 1
    assert "".join(pieces).strip() == bundled_model.generate([Q[0]], p)[0].text.strip()


def test_converted_cache_is_used(bundled_model):
    from workbench.models.local import gguf_cache_dir

    folder = gguf_cache_dir(bundled_model.source)
    assert (folder / "model.safetensors").exists()
    assert not any(folder.parent.glob(".*.tmp-*"))
