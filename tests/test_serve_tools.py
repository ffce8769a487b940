"""`workbench serve`'s HTTP API with the official `openai` client on 127.0.0.1: tool calls
(a fake model scripted to write the `<tool_call>` text a model would, parsed by the real
parser), tool turns in requests, streaming, and the 400s that name an unsupported field."""

import contextlib
import json
import threading

import httpx
import openai
import pytest

from conftest import free_port, wait_http
from workbench.models import load_model
from workbench.serve import create_app, make_server

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time"}}


def model_reply(conv):
    """What a tool-using model writes: a call, then an answer from the tool's result."""
    last = conv[-1]
    if last["role"] == "tool":
        return f"It is {json.loads(last['content'])['temp']}C in Paris."
    if "time" in last["content"]:
        return ('Two calls.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
                '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
                '</tool_call>')
    if "broken" in last["content"]:
        return '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>'
    return '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@contextlib.contextmanager
def serving(model, name: str, limits=None):
    port = free_port()
    server = make_server(create_app(model, name, limits), port=port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=60,
                  headers={"Authorization": f"Bearer {limits.api_key}"}
                  if limits is not None and limits.api_key else None)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def fake_server():
    model = load_model("fake", script=model_reply)
    with serving(model, "fake-tools") as url:
        yield url, model


@pytest.fixture()
def client(fake_server):
    return openai.OpenAI(base_url=fake_server[0], api_key="unused", max_retries=0)


def test_tool_call_round_trip_with_the_openai_client(client, fake_server):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model="fake-tools", messages=ask, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # send the call and its result back, as an agent does
    follow = ask + [choice.message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'}]
    r = client.chat.completions.create(model="fake-tools", messages=follow, tools=[WEATHER])
    assert r.choices[0].message.content == "It is 21C in Paris."
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    seen = fake_server[1].seen[-1]
    assert seen[1]["tool_calls"][0]["id"] == call.id
    assert seen[2] == {"role": "tool", "content": '{"temp": 21}', "tool_call_id": call.id}


def test_parallel_calls_content_and_parallel_tool_calls_false(client):
    ask = [{"role": "user", "content": "time and weather please"}]
    r = client.chat.completions.create(model="fake-tools", messages=ask,
                                       tools=[WEATHER, CLOCK], tool_choice="auto")
    msg = r.choices[0].message
    assert msg.content == "Two calls."
    assert [c.function.name for c in msg.tool_calls] == ["get_time", "get_weather"]
    r = client.chat.completions.create(model="fake-tools", messages=ask,
                                       tools=[WEATHER, CLOCK], parallel_tool_calls=False)
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_time"]


def test_unparseable_call_and_tool_choice_none_return_text(client):
    r = client.chat.completions.create(
        model="fake-tools", messages=[{"role": "user", "content": "broken"}], tools=[WEATHER])
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    assert r.choices[0].message.content.startswith("<tool_call>")
    r = client.chat.completions.create(
        model="fake-tools", messages=[{"role": "user", "content": "weather?"}],
        tools=[WEATHER], tool_choice="none")
    assert not r.choices[0].message.tool_calls and "get_weather" in r.choices[0].message.content


def test_streamed_tool_calls(client):
    stream = client.chat.completions.create(
        model="fake-tools", messages=[{"role": "user", "content": "weather?"}],
        tools=[WEATHER], stream=True)
    calls, finish = {}, None
    for chunk in stream:
        delta = chunk.choices[0].delta
        for tc in delta.tool_calls or []:
            calls.setdefault(tc.index, {"name": "", "arguments": ""})
            calls[tc.index]["name"] += tc.function.name or ""
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert calls == {0: {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@pytest.mark.parametrize("extra,param", [
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"logprobs": True}, "logprobs"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"n": 2}, "n"),
    ({"tool_choice": "required"}, "tool_choice"),  # no tools
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]},
     "tools[0].function.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
])
def test_unsupported_or_invalid_fields_are_400_naming_the_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="fake-tools",
                                       messages=[{"role": "user", "content": "x"}],
                                       **extra)
    assert e.value.status_code == 400 and e.value.param == param
    assert param.split(".")[0] in e.value.message
    assert e.value.type == "invalid_request_error"


def test_malformed_messages_are_400_naming_the_message_field(fake_server):
    url = fake_server[0]
    cases = [
        ([{"role": "tool", "content": "21C"}], "messages[0].tool_call_id"),
        ([{"role": "user", "content": "x", "tool_call_id": "c"}], "messages[0].tool_call_id"),
        ([{"role": "user", "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "f", "arguments": "{}"}}]}], "messages[0].tool_calls"),
        ([{"role": "assistant"}], "messages[0].content"),
        ([{"role": "user", "content": "x", "weight": 1}], "messages[0].weight"),
        ([{"role": "robot", "content": "x"}], "messages[0].role"),
        ([], "messages"),
    ]
    for messages, param in cases:
        r = httpx.post(f"{url}/chat/completions", json={"messages": messages}, timeout=30)
        assert r.status_code == 400, (messages, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["param"] == param, (messages, err)
        assert param in err["message"]


def test_other_routes_and_errors(fake_server, client):
    url = fake_server[0]
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="other",
                                       messages=[{"role": "user", "content": "x"}])
    assert e.value.param == "model"
    assert httpx.get(f"{url}/models", timeout=5).json()["data"][0]["id"] == "fake-tools"
    assert httpx.get(url.removesuffix("/v1") + "/health", timeout=5).json()["status"] == "ok"
    # the fake backend cannot continue raw text or tokenize: said, not ignored
    r = httpx.post(f"{url}/completions", json={"prompt": "x", "max_tokens": 4}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = httpx.post(url.removesuffix("/v1") + "/tokenize", json={"prompt": "x"}, timeout=30)
    assert r.status_code == 400 and "tokenizer" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/completions", json={"prompt": "x", "best_of": 2}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"
    r = httpx.post(f"{url}/completions", json={"prompt": "x", "max_tokens": 2, "logprobs": 1},
                   timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"


def test_openai_backend_sends_tools_and_reads_calls_back(fake_server):
    """Our own `openai` backend against the server: tools out, typed tool calls back."""
    from workbench.models.messages import ToolSpec

    remote = load_model(fake_server[0] + "#fake-tools", max_retries=0)
    ask = [{"role": "user", "content": "weather?"}]
    g = remote.generate([ask], tools=[ToolSpec.model_validate(WEATHER)])[0]
    assert g.finish_reason == "tool_calls" and g.tool_calls[0].function.name == "get_weather"
    conv = ask + [g.message(), {"role": "tool", "tool_call_id": g.tool_calls[0].id,
                                "content": '{"temp": 5}'}]
    assert remote.generate([conv], tools=[WEATHER])[0].text == "It is 5C in Paris."
    # tool_choice travels to the server's model: the fake refuses a script that ignores it
    named = {"type": "function", "function": {"name": "get_weather"}}
    g = remote.generate([ask], tools=[WEATHER, CLOCK], tool_choice=named)[0]
    assert g.ok and g.tool_calls[0].function.name == "get_weather"
    named = {"type": "function", "function": {"name": "get_time"}}
    g = remote.generate([ask], tools=[WEATHER, CLOCK], tool_choice=named)[0]
    assert not g.ok and "HTTP 400" in g.error and "'get_time'" in g.error
    remote.close()


def test_stop_strings_are_capped_as_openai_caps_them():
    """At most 4 stop strings of 1 to 256 characters: 300 one-letter stops cost 32 s of
    uncancellable work before the cap, 10,000 wedged the server for minutes."""
    import pytest as _pytest
    from pydantic import ValidationError

    from workbench.serve import ChatCompletionRequest, CompletionRequest

    msgs = [{"role": "user", "content": "hi"}]
    ChatCompletionRequest(messages=msgs, stop=["a", "b", "c", "d"])
    CompletionRequest(prompt="x", stop="x" * 256)
    for bad in (list("abcde"), ["a"] * 300, [""], "x" * 257):
        with _pytest.raises(ValidationError, match="stop"):
            ChatCompletionRequest(messages=msgs, stop=bad)
        with _pytest.raises(ValidationError, match="stop"):
            CompletionRequest(prompt="x", stop=bad)
