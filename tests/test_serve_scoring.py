"""Log-likelihood scoring of chat prompts over HTTP, and `workbench serve`'s text completions
and tokenizer routes, against the same model scored locally."""

import shutil

import httpx
import openai
import pytest

from test_serve_tools import serving
from workbench.models import GenerationParams, ScoreRequest, load_model
from workbench.models.openai_compat import _strip_doubled_specials

MC = [
    ("What does VSWR stand for?", ["Voltage standing wave ratio", "Very short wave radio",
                                   "Variable signal width ratio", "Vector sweep wave rate"]),
    ("Which colour is the sky on a clear day?", ["Green", "Blue", "Red", "Black"]),
    ("What is the capital of France?", ["Berlin", "Madrid", "Paris", "Rome"]),
    ("How many legs does a spider have?", ["Six", "Four", "Ten", "Eight"]),
]


def mc_requests() -> list[ScoreRequest]:
    out = []
    for q, opts in MC:
        body = q + "\n" + "\n".join(f"{'ABCD'[i]}) {o}" for i, o in enumerate(opts))
        out.append(ScoreRequest([{"role": "system", "content": "Answer with one letter."},
                                 {"role": "user", "content": body + "\nAnswer:"}],
                                list("ABCD")))
    return out


def assert_same_scores(remote_rows, local_rows, tol=1e-3):
    for r_row, l_row in zip(remote_rows, local_rows, strict=True):
        assert [s.n_tokens for s in r_row] == [s.n_tokens for s in l_row]
        for r, lo in zip(r_row, l_row, strict=True):
            assert abs(r.logprob - lo.logprob) < tol, (r, lo)
        assert max(range(4), key=lambda i: r_row[i].logprob) == \
            max(range(4), key=lambda i: l_row[i].logprob)


def test_doubled_special_tokens_are_stripped_once():
    decode = {1: "<s>", 7: "a"}.get
    assert _strip_doubled_specials("<s>ab", [1, 7], [1, 1, 7], lambda ids: decode(ids[0])) == "ab"
    assert _strip_doubled_specials("<s>ab", [1, 7], [1, 7], lambda ids: "<s>") == "<s>ab"
    assert _strip_doubled_specials("ab", [7], [1, 7], lambda ids: "<s>") == "ab"


@pytest.fixture(scope="module")
def bos_model(tiny_model, tmp_path_factory):
    """The tiny model with a tokenizer that adds BOS (`<|im_start|>`) to every text, while
    its chat template writes `<|im_start|>` itself: Llama-style doubled BOS."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("bos") / "tiny-bos"
    shutil.copytree(tiny_model, folder)
    AutoTokenizer.from_pretrained(tiny_model, add_bos_token=True).save_pretrained(folder)
    model = load_model(str(folder), device="cpu")
    assert model.tokenizer("x")["input_ids"][0] == model.tokenizer.bos_token_id
    return str(folder), model


@pytest.mark.parametrize("tokenizer", [None, "server"])
def test_chat_scoring_over_http_has_no_doubled_bos(bos_model, tokenizer):
    folder, model = bos_model
    with serving(model, folder) as url:  # served under its folder: resolvable here
        remote = load_model(f"{url}#{folder}", tokenizer=tokenizer)
        reqs = mc_requests()[:2]
        rendered = remote.render(reqs[0].prompt)
        assert not rendered.startswith("<|im_start|><|im_start|>")
        assert_same_scores(remote.score(reqs), model.score(reqs), tol=1e-4)
        remote.close()


def test_tokenizer_option_is_checked_up_front(fake_url="http://127.0.0.1:9/v1#x"):
    from workbench.errors import WorkbenchError

    with pytest.raises(WorkbenchError, match="not found"):
        load_model(fake_url, tokenizer="/no/such/folder", max_retries=0)


def test_server_without_tokenize_is_a_clear_error(tmp_path):
    from workbench.errors import BackendError

    with serving(load_model("fake"), "not-a-local-model") as url:
        remote = load_model(f"{url}#not-a-local-model", max_retries=0)
        with pytest.raises(BackendError, match="pass the `tokenizer` option"):
            remote.score(mc_requests()[:1])


# --- the bundled model ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def bundled_server(bundled_model):
    with serving(bundled_model, "smollm2-135m-instruct") as url:
        yield url


@pytest.mark.parametrize("tokenizer", [None, "server"])
def test_chat_prompt_scoring_over_http_matches_local(bundled_server, bundled_model, tokenizer):
    remote = load_model(f"{bundled_server}#smollm2-135m-instruct", tokenizer=tokenizer)
    reqs = mc_requests()
    assert_same_scores(remote.score(reqs), bundled_model.score(reqs))
    remote.close()


def test_bundled_model_chat_with_tools_over_http(bundled_server):
    client = openai.OpenAI(base_url=bundled_server, api_key="unused", max_retries=0)
    weather = {"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object",
                                              "properties": {"city": {"type": "string"}}}}}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    plain = client.chat.completions.create(model="smollm2-135m-instruct", messages=ask,
                                           max_tokens=8)
    r = client.chat.completions.create(model="smollm2-135m-instruct", messages=ask,
                                       tools=[weather], max_tokens=24)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    msg = r.choices[0].message
    assert msg.role == "assistant" and (msg.content or msg.tool_calls)
    # the tools are described in the prompt (SmolLM2's template takes none)
    assert r.usage.prompt_tokens > plain.usage.prompt_tokens + 50
    history = ask + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'}]
    r = client.chat.completions.create(model="smollm2-135m-instruct", messages=history,
                                       tools=[weather], max_tokens=16)
    assert r.choices[0].message.role == "assistant"
    r = client.chat.completions.create(model="smollm2-135m-instruct", messages=ask,
                                       tools=[weather], max_tokens=24, tool_choice={
                                           "type": "function",
                                           "function": {"name": "get_weather"}})
    msg = r.choices[0].message
    assert msg.tool_calls or msg.content.startswith('<tool_call>\n{"name": "get_weather"')


def test_text_completions_and_tokenizer_routes(bundled_server, bundled_model):
    client = openai.OpenAI(base_url=bundled_server, api_key="unused", max_retries=0)
    prompt = "The capital of France is"
    want = bundled_model.complete([prompt], GenerationParams(max_tokens=6))[0]
    r = client.completions.create(model="smollm2-135m-instruct", prompt=prompt, max_tokens=6)
    assert r.choices[0].text == want.text and want.text
    assert r.usage.completion_tokens == want.completion_tokens
    r = client.completions.create(model="smollm2-135m-instruct", prompt=[prompt, "Hello,"],
                                  max_tokens=4, echo=True, seed=3, temperature=0.8, top_p=0.9)
    assert [c.index for c in r.choices] == [0, 1] and r.choices[1].text.startswith("Hello,")
    stop = client.completions.create(model="smollm2-135m-instruct", prompt=prompt,
                                     max_tokens=6, stop=[want.text.split()[0]])
    assert stop.choices[0].text.strip() == "" and stop.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="smollm2-135m-instruct", prompt=prompt, max_tokens=6, stream=True))
    assert streamed == want.text
    root = bundled_server.removesuffix("/v1")
    conv = [{"role": "user", "content": "Hi"}]
    tok = httpx.post(f"{root}/tokenize", json={"model": "smollm2-135m-instruct",
                                               "messages": conv}, timeout=30).json()
    assert tok["tokens"] == bundled_model.tokenize(conv) and tok["count"] == len(tok["tokens"])
    assert tok["max_model_len"] == bundled_model.max_positions
    text = httpx.post(f"{root}/detokenize", json={"tokens": tok["tokens"]}, timeout=30).json()
    assert text["prompt"] == bundled_model.render(conv)
    r = httpx.post(f"{root}/tokenize", json={"prompt": "a", "messages": conv}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    # prompt scoring returns the top token too, so greedy continuations are known over HTTP
    remote = load_model(f"{bundled_server}#smollm2-135m-instruct")
    (paris, london), = remote.score([ScoreRequest(prompt, [" Paris", " London"])])
    assert paris.is_greedy and not london.is_greedy
