"""When llguidance gives up on a reply mid-generation (issue 46, "what users still hit"): the
constraint could not be kept, so the reply is an error, never a 200 with a reply that breaks
it. The give-up is real, not injected: a schema of two object alternatives with 300 optional
properties each is within every bound of `models.bounds` (400 optional properties an object,
1,000 alternatives) and compiles, but llguidance's Earley parser gives up at the first key
("Current row has 2398 items; max is 2000"); before, the transformers backend ended the row
there and the server answered 200 `{"`, finish "stop", and llama.cpp sampled the rest
unconstrained (`{"{"{"…` to max_tokens, finish "length"). The models are the tiny random-init
ones the other tests build (a Hugging Face folder and its GGUF)."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from test_serve_tools import serving

from workbench.models import load_model
from workbench.models.base import GenerationParams
from workbench.models.bounds import bounded_schema
from workbench.models.constrain import (
    Constraint,
    ConstraintNotKept,
    ReplyCheck,
    check_text,
)

# two alternatives of 300 optional properties: within the bounds, given up on at `{"`
GIVES_UP = {"anyOf": [{"type": "object", "additionalProperties": False,
                       "properties": {f"b{b}p{i}": {"type": "string"} for i in range(300)}}
                      for b in range(2)]}
# "x" is kept; "y" then the schema is given up on: rows of one sampled batch differ
SOMETIMES = 'start: "x" | "y" %json ' + json.dumps(GIVES_UP) + "\n"
FINE = {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}}
ASK = [{"role": "user", "content": "Say something."}]
TOOL = [{"type": "function", "function": {"name": "fill", "parameters": GIVES_UP}}]
REASON = "Current row has 2398 items; max is 2000"
# a template that takes tools and writes only their names: the schema (~6,000 tokens as text)
# stays out of the prompt, which the tiny models' 1,024 positions could not hold
NAMES_ONLY = ("{% if tools %}<|im_start|>system\nCall one of: {% for t in tools %}"
              "{{ t.function.name }} {% endfor %}as <tool_call>{...}</tool_call><|im_end|>\n"
              "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
              "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
              "{% endif %}")


def test_the_schema_is_within_the_bounds_and_compiles(tiny):
    assert bounded_schema(GIVES_UP) is None
    tiny.check_constraint(Constraint.json_schema(GIVES_UP))  # no WorkbenchError
    tiny.check_constraint(Constraint.lark(SOMETIMES))


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return load_model(tiny_model, device="cpu", chat_template=NAMES_ONLY)


@pytest.fixture(scope="module")
def cpp(tiny_gguf):
    pytest.importorskip("xllamacpp")
    model = load_model(str(tiny_gguf), batch_size=4, chat_template=NAMES_ONLY)
    yield model
    model.close()


def _mixed_batch(model) -> list:
    """A sampled batch under SOMETIMES in which some rows were kept and some given up on."""
    for seed in range(6):
        gens = model.generate([ASK] * 8, GenerationParams(
            max_tokens=12, temperature=1.0, seed=seed, constraint=Constraint.lark(SOMETIMES)))
        if {g.ok for g in gens} == {True, False}:
            return gens
    pytest.fail("no seed gave a batch with kept and given-up rows")


@pytest.mark.parametrize("engine", ["tiny", "cpp"])
def test_a_row_given_up_on_fails_alone_and_the_other_rows_of_its_batch_are_kept(
        engine, request):
    model = request.getfixturevalue(engine)
    gens = _mixed_batch(model)
    for g in gens:
        if g.ok:  # kept: "x", or "y" then an object of the schema
            assert g.text == "x" or (g.text.startswith("y") and
                                     isinstance(json.loads(g.text[1:]), dict)), g
            assert g.finish_reason == "stop" and g.error_type is None
        else:  # the text that would break it is dropped; the reason is llguidance's
            assert g.error_type == "constraint" and g.finish_reason == "error"
            assert g.text == "" and not g.tool_calls
            assert g.error.startswith("the lark constraint could not be kept at token ")
            assert _given_up(g.error) and "\n" not in g.error, g.error
    print(f"\n{engine}: {sum(g.ok for g in gens)} of {len(gens)} rows kept, the rest failed")
    # every row given up on: every row fails; streamed, the stream raises
    schema = GenerationParams(max_tokens=16, constraint=Constraint.json_schema(GIVES_UP))
    assert all(g.error_type == "constraint" for g in model.generate([ASK] * 3, schema))
    with pytest.raises(ConstraintNotKept, match="json_schema constraint could not be kept"):
        list(model.stream(ASK, schema))
    # a reply cut by max_tokens is a valid beginning: still a reply, finish "length"
    cut = model.generate([ASK, ASK], GenerationParams(
        max_tokens=4, constraint=Constraint.json_schema(FINE)))
    assert all(g.ok and g.finish_reason == "length" and g.text.startswith("{") for g in cut)


@pytest.mark.parametrize("engine", ["tiny", "cpp"])
def test_rows_cut_by_a_stop_string_in_a_batch_are_replies_not_failures(engine, request):
    """A row a stop string ends is padded while the others go on: its matcher sees the pad
    (here the end token) where the grammar takes no end, which is no give-up."""
    model = request.getfixturevalue(engine)
    gens = model.generate([ASK] * 6, GenerationParams(
        max_tokens=30, temperature=1.0, seed=1, stop=("n",),
        constraint=Constraint.regex("[a-z]{40}")))
    assert all(g.ok for g in gens), [g.error for g in gens]  # before: 3 of 6 failed
    assert len({g.completion_tokens for g in gens}) > 1, "all rows ended together"
    assert all("n" not in g.text for g in gens)


def test_the_reply_check_follows_tokens_as_the_engine_made_them(tiny):
    tok = tiny.tokenizer
    eos = tok.eos_token_id

    def check(constraint, text, ended, after=""):
        """Feed `text` (then an end token and `after`, when `ended`) and finish."""
        c = ReplyCheck(constraint, tok, tiny._vocab_size(), {eos}, ends=[0])
        ids = tok(text, add_special_tokens=False)["input_ids"]
        c.feed(ids + ([eos] + tok(after, add_special_tokens=False)["input_ids"]) * ended)
        return c.finish(complete=ended)

    regex = Constraint.regex("[A-D]x")
    assert check(regex, "Bx", True) is None
    assert check(regex, "B", False) is None  # cut by max_tokens: a valid beginning
    assert "ended after 1 token, before the constraint was complete" in check(regex, "B", True)
    assert "at token 1 of the reply: " in check(regex, "Zx", False)
    assert "goes on after its end" in check(regex, "Bx", True, after="y")
    gave_up = check(Constraint.json_schema(GIVES_UP), '{"b0p1": "v"}', True)
    assert REASON in gave_up and "at token 1 of the reply" in gave_up


def test_text_checks_where_only_the_text_is_seen():
    schema = Constraint.json_schema({"type": "object", "required": ["n"], "properties": {
        "n": {"type": "integer", "maximum": 5}, "s": {"type": "string", "pattern": "^a+$"}}})
    assert check_text(schema, '{"n": 3, "s": "aa"}') is None
    assert check_text(schema, '{"n":3}') is None  # any server's spacing
    assert "['n']: 9 is greater than the maximum of 5" in check_text(schema, '{"n": 9}')
    assert "the reply: 'n' is a required property" in check_text(schema, "{}")
    assert "does not match" in check_text(schema, '{"n": 1, "s": "b"}')
    assert "is not JSON" in check_text(schema, '{"n": ')
    assert "not a JSON object" in check_text(Constraint.json_object(), "[1]")
    assert check_text(Constraint.choice(["yes", "no"]), "no") is None
    assert "not one of the choices" in check_text(Constraint.choice(["yes", "no"]), "maybe")
    assert check_text(Constraint.regex(r"[0-9]{3}"), "123") is None
    assert "does not match the regex" in check_text(Constraint.regex(r"[0-9]{3}"), "1234")
    assert check_text(Constraint.lark('start: "a"'), "b") is None  # not judged from text
    # a caller's pattern that backtracks is matched under a timeout, never for ever
    slow = Constraint.json_schema({"type": "string", "pattern": "^(a|a)+$"})
    t0 = time.monotonic()
    check_text(slow, json.dumps("a" * 40 + "!"))
    check_text(Constraint.regex("(a|a)+"), "a" * 40 + "!")
    assert time.monotonic() - t0 < 5


def _given_up(message: str) -> bool:
    """llguidance's reason: its parser's limit, or, where llama.cpp's sampler gave up on
    a mask before our matcher did (its llguidance gave up on the grammar's `%json` after
    "y", ours at the next token), the token it then sampled unconstrained."""
    return REASON in message or "doesn't satisfy the grammar" in message


def _error(r: httpx.Response, status: int, param: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert err["code"] == "constraint_not_kept" and err["message"].startswith(f"{param}: ")
    assert _given_up(err["message"]), err
    return err


def _stream_error(url: str, body: dict, param: str) -> None:
    """A streamed request's error event, in the shape of the 400 a whole reply gets."""
    with httpx.stream("POST", url + "/chat/completions", json={**body, "stream": True},
                      timeout=60) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    errors = [json.loads(e)["error"] for e in events[:-1] if "error" in json.loads(e)]
    assert len(errors) == 1, events
    assert errors[0]["code"] == "constraint_not_kept" and errors[0]["param"] == param
    assert errors[0]["type"] == "invalid_request_error" and _given_up(errors[0]["message"])
    assert not any(json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]
                   if "choices" in json.loads(e)), "a finish after the error"


@pytest.mark.parametrize("engine", ["tiny", "cpp"])
def test_the_server_answers_a_400_naming_the_field_never_a_200_that_breaks_it(
        engine, request):
    """Before: 200 with `{"` (transformers) or `{"{"{"…` (llama.cpp) for every case here."""
    model = request.getfixturevalue(engine)
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": GIVES_UP}}
    cases = [({"response_format": fmt}, "response_format"),
             ({"guided_grammar": 'start: "y" %json ' + json.dumps(GIVES_UP)}, "guided_grammar"),
             ({"tools": TOOL, "tool_choice": "required"}, "tools"),
             ({"tools": TOOL, "tool_choice": {"type": "function", "function": {
                 "name": "fill"}}}, "tools")]
    with serving(model, "tiny") as url:
        for extra, param in cases:
            body = {"messages": ASK, "max_tokens": 24, **extra}
            _error(httpx.post(url + "/chat/completions", json=body, timeout=60), 400, param)
            _stream_error(url, body, param)
        # a reply cut by max_tokens under a constraint it keeps stays a 200, finish length
        ok = httpx.post(url + "/chat/completions", timeout=60, json={
            "messages": ASK, "max_tokens": 4, "response_format": {
                "type": "json_schema", "json_schema": {"name": "x", "schema": FINE}}})
        assert ok.status_code == 200, ok.text
        choice = ok.json()["choices"][0]
        assert choice["finish_reason"] == "length" and choice["message"]["content"][0] == "{"
        # the official client raises on both; the openai backend fails the row alone
        c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="could not be kept"):
            c.chat.completions.create(model="tiny", messages=ASK, max_tokens=24,
                                      response_format=fmt)
        with pytest.raises(openai.APIError, match="could not be kept"):
            list(c.chat.completions.create(model="tiny", messages=ASK, max_tokens=24,
                                           response_format=fmt, stream=True))
        remote = load_model(url)
        bad, good = [remote.generate([ASK], GenerationParams(max_tokens=4, constraint=c))[0]
                     for c in (Constraint.json_schema(GIVES_UP), Constraint.json_schema(FINE))]
        assert bad.error_type == "constraint" and REASON in bad.error and bad.text == ""
        assert good.ok and good.finish_reason == "length"
        with pytest.raises(ConstraintNotKept, match="could not be kept"):
            list(remote.stream(ASK, GenerationParams(
                max_tokens=24, constraint=Constraint.json_schema(GIVES_UP))))
        # a stop string's cut is a valid beginning, reported "stop" as OpenAI does: a reply,
        # not a constraint broken (the 40 letters come whole only where no n was drawn)
        cut = remote.generate([ASK] * 4, GenerationParams(
            max_tokens=30, temperature=1.0, seed=1, stop=("n",),
            constraint=Constraint.regex("[a-z]{40}")))
        assert all(g.ok and len(g.text) <= 40 and "n" not in g.text for g in cut), \
            [(g.text, g.error) for g in cut]
        streamed = "".join(remote.stream(ASK, GenerationParams(
            max_tokens=30, temperature=1.0, seed=1, stop=("n",),
            constraint=Constraint.regex("[a-z]{40}"))))  # before: raised ConstraintNotKept
        assert len(streamed) <= 40 and "n" not in streamed
        remote.close()
