"""Constrained decoding (issue 28): a forced tool call always parses and fits its tool's
schema, `response_format` is honoured, regex and choice constraints hold. The model is the
tiny random-init one: unconstrained, it writes noise, so every valid output here is the
grammar's doing."""

import json

import httpx
import jsonschema
import openai
import pytest
from test_serve_tools import serving

from workbench.models import load_model
from workbench.models.base import GenerationParams
from workbench.models.constrain import Constraint, tool_call_constraint
from workbench.records import ToolSpec

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"type": "string", "maxLength": 12},
                          "days": {"type": "integer", "minimum": 1, "maximum": 14},
                          "unit": {"enum": ["C", "F"]}}}
SEARCH = {"type": "object", "additionalProperties": False, "required": ["query"],
          "properties": {"query": {"type": "string", "maxLength": 20}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "search", "parameters": SEARCH}}]
SCHEMAS = {"get_weather": WEATHER, "search": SEARCH}
ASK = [{"role": "user", "content": "Weather in Paris for 3 days?"}]


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return load_model(tiny_model, device="cpu")


@pytest.fixture(scope="module")
def client(tiny):
    with serving(tiny, "tiny") as url:
        yield openai.OpenAI(base_url=url, api_key="unused", max_retries=0), url


@pytest.mark.parametrize("choice", ["required", "get_weather", "search"])
def test_a_forced_tool_choice_always_returns_a_call_that_fits_the_schema(client, choice):
    """Before: HTTP 200 with no tool_calls at all (the model's block did not parse)."""
    c, _ = client
    tool_choice = choice if choice == "required" else {"type": "function",
                                                       "function": {"name": choice}}
    names = []
    for seed in range(6):  # sampled at temperature 1: six different calls
        r = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                      tool_choice=tool_choice, temperature=1.0, seed=seed,
                                      max_tokens=120)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch
        (call,) = ch.message.tool_calls
        if choice != "required":
            assert call.function.name == choice
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        names.append(call.function.name)
    print(f"\n{choice}: 6 of 6 calls valid; tools called {names}")


def test_a_forced_call_cut_by_max_tokens_comes_back_partial_with_length(client):
    c, _ = client
    r = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=4,
                                  tool_choice={"type": "function",
                                               "function": {"name": "get_weather"}})
    ch = r.choices[0]
    assert ch.finish_reason == "length"
    (call,) = ch.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments.startswith("{")
    with pytest.raises(ValueError):
        json.loads(call.function.arguments)


def test_response_format_json_schema_and_json_object(client):
    c, url = client
    schema = {"type": "object", "additionalProperties": False, "required": ["answer", "score"],
              "properties": {"answer": {"enum": ["yes", "no"]},
                             "score": {"type": "integer", "minimum": 0, "maximum": 9}}}
    for seed in range(4):
        r = c.chat.completions.create(
            model="tiny", messages=ASK, temperature=1.0, seed=seed, max_tokens=60,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "verdict", "schema": schema,
                                             "strict": True}})
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    # streamed: the pieces make the same kind of object
    stream = c.chat.completions.create(
        model="tiny", messages=ASK, max_tokens=60, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "v", "schema": schema}})
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    jsonschema.validate(json.loads(text), schema)
    r = c.chat.completions.create(model="tiny", messages=ASK, max_tokens=80,
                                  response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # an object left open by max_tokens, as OpenAI returns it
        assert r.choices[0].message.content.startswith("{")
    for bad, why in [({"type": "json_schema"}, "needs `json_schema`"),
                     ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
                         "type": "object", "properties": {"a": {"type": "nonsense"}}}}},
                      "invalid"),
                     ({"type": "json_schema", "json_schema": {"name": "a b"}}, "name"),
                     ({"type": "xml"}, "response_format")]:
        resp = httpx.post(url + "/chat/completions", json={
            "messages": ASK, "max_tokens": 5, "response_format": bad}, timeout=30)
        assert resp.status_code == 400, (bad, resp.text)
        err = resp.json()["error"]
        assert why in err["message"] and (err["param"] or "").startswith("response_format")


def test_a_backend_that_cannot_constrain_says_so():
    fake = load_model("fake")
    with serving(fake, "fake") as url:
        resp = httpx.post(url + "/chat/completions", json={
            "messages": ASK, "response_format": {"type": "json_object"}}, timeout=30)
    assert resp.status_code == 400 and "cannot constrain" in resp.json()["error"]["message"]


def test_regex_choice_and_lark_constraints_hold_in_a_sampled_batch(tiny):
    convs = [ASK] * 4
    cases = [(Constraint.regex(r"[A-D]"), lambda t: t in "ABCD" and len(t) == 1),
             (Constraint.choice(["alpha", "beta", "gamma delta"]),
              lambda t: t in ("alpha", "beta", "gamma delta")),
             (Constraint.lark('start: "n=" /[0-9]{2}/ ";"'),
              lambda t: len(t) == 5 and t.startswith("n=") and t[2:4].isdigit())]
    for constraint, ok in cases:
        gens = tiny.generate(convs, GenerationParams(max_tokens=20, temperature=1.0, seed=3,
                                                     constraint=constraint))
        texts = [g.text for g in gens]
        assert all(ok(t) for t in texts) and all(g.finish_reason == "stop" for g in gens), \
            (constraint.kind, texts)
    with pytest.raises(Exception, match="invalid"):
        tiny.check_constraint(Constraint.lark("start: undefined_rule"))


def test_tool_call_grammar_per_family():
    """The rest of a forced call after each family's forced prefix."""
    tools = [ToolSpec.of("f", parameters={"type": "object"}),
             ToolSpec.of("g", parameters={"type": "object"})]
    hermes = tool_call_constraint("hermes", None, tools, None).value
    assert '"{\\"name\\": \\"f\\", \\"arguments\\": "' in hermes and "</tool_call>" in hermes
    named = tool_call_constraint("hermes", None, tools, "g").value
    assert "args1" in named and "args0" not in named
    llama = tool_call_constraint("llama3_json", None, tools, None).value
    assert '"f\\", \\"parameters\\": "' in llama
    mistral = tool_call_constraint("mistral", "[ARGS]", tools, None).value
    assert '"f[ARGS]"' in mistral
    with pytest.raises(Exception, match="not among the tools"):
        tool_call_constraint("hermes", None, tools, "h")
