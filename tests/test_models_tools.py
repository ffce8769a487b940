"""Tool calls through the models protocol: typed messages, template detection, rendering,
the per-family parsers, capabilities, and the fake and local backends with `tools=`."""

import json

import pytest

from workbench.errors import WorkbenchError
from workbench.models import Generation, GenerationParams, load_model
from workbench.models.base import Capabilities
from workbench.models.cache import CachedModel, CallCache
from workbench.models.messages import (
    NamedToolChoice, ToolCall, ToolSpec, as_tool_choice, as_tool_specs, plain_conversation,
)
from workbench.models.tools import (
    TemplateTools, forced_prefix, generic_tool_prompt, parse_tool_calls, template_messages,
)

WEATHER = ToolSpec.of("get_weather", "Current weather of a city",
                      {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]})
TIME = ToolSpec.of("get_time")
ASK = [{"role": "user", "content": "Weather in Paris?"}]

# Minimal templates with each family's markers (the real ones are long; detection reads only
# these markers and the variables they use).
QWEN_LIKE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}{{ t | tojson }}"
    "{% endfor %}</tools>\nCall as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>"
    "<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content }}"
    "{%- for tc in m.tool_calls %}<tool_call>\n{\"name\": \"{{ tc.function.name }}\", "
    "\"arguments\": {{ tc.function.arguments | tojson }}}\n</tool_call>{%- endfor %}"
    "<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3_LIKE = ("{{ '<|start_header_id|>' }}{% if tools %}{{ tools | tojson }}{% endif %}"
               "{% for m in messages %}{% if m.role == 'tool' or m.role == 'ipython' %}x"
               "{% elif m.tool_calls %}{{ m.tool_calls[0].function.arguments | tojson }}"
               "{% endif %}{% endfor %}")
MISTRAL_LIKE = ("{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}{% endif %}"
                "{% for m in messages %}{% if m['role'] == 'tool' %}[TOOL_RESULTS]"
                "{% elif m.tool_calls %}[TOOL_CALLS]{% endif %}{% endfor %}")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


# --- typed messages ------------------------------------------------------------------------

def test_tool_specs_and_choice_are_validated_with_the_field_named():
    assert as_tool_specs(None) is None and as_tool_specs([]) is None
    specs = as_tool_specs([WEATHER, {"type": "function", "function": {"name": "get_time"}}])
    assert [t.name for t in specs] == ["get_weather", "get_time"]
    with pytest.raises(WorkbenchError, match=r"tools\.0\.function\.name"):
        as_tool_specs([{"type": "function", "function": {"name": "has space"}}])
    with pytest.raises(WorkbenchError, match=r"tools\.0\.function\.descripton"):
        as_tool_specs([{"type": "function", "function": {"name": "f", "descripton": "typo"}}])
    with pytest.raises(WorkbenchError, match="duplicate function name"):
        as_tool_specs([TIME, TIME])
    assert as_tool_choice(None, specs) == "auto"
    named = as_tool_choice({"type": "function", "function": {"name": "get_time"}}, specs)
    assert isinstance(named, NamedToolChoice) and named.function.name == "get_time"
    with pytest.raises(WorkbenchError, match="no tool named 'nope'"):
        as_tool_choice({"type": "function", "function": {"name": "nope"}}, specs)
    with pytest.raises(WorkbenchError, match="needs `tools`"):
        as_tool_choice("required", None)
    with pytest.raises(WorkbenchError, match="tool_choice: 'always'"):
        as_tool_choice("always", specs)


def test_plain_conversation_accepts_dicts_and_records():
    from workbench.records import Message

    call = ToolCall.make("get_weather", {"city": "Paris"}, id="call_1")
    typed = [Message(role="user", content="hi"),
             Message(role="assistant", tool_calls=[call]),
             Message(role="tool", content="21C", tool_call_id="call_1")]
    as_dicts = [{"role": "user", "content": "hi", "extra": "dropped"},
                {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "content": "21C", "tool_call_id": "call_1"}]
    assert plain_conversation(typed) == plain_conversation(as_dicts)
    assert plain_conversation(typed)[1] == {"role": "assistant",
                                            "tool_calls": [call.model_dump()]}
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_generation_round_trips_tool_calls_through_json():
    g = Generation(text="", finish_reason="tool_calls",
                   tool_calls=[ToolCall.make("get_time", {}, id="call_9")])
    back = Generation.from_json(json.loads(json.dumps(g.to_json())), cached=True)
    assert back.tool_calls == g.tool_calls and back.finish_reason == "tool_calls"
    assert g.message() == {"role": "assistant", "content": "",
                           "tool_calls": [g.tool_calls[0].model_dump()]}
    old_row = {"text": "x", "finish_reason": "stop", "prompt_tokens": 1,
               "completion_tokens": 1, "error": None}  # cached before tool calls existed
    assert Generation.from_json(old_row).tool_calls == []


# --- parsers -------------------------------------------------------------------------------

def test_hermes_parser():
    text = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
            '\n</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    content, calls = parse_tool_calls(text, "hermes")
    assert content == "Let me look."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert calls[0].id != calls[1].id and calls[0].id.startswith("call_")
    # a block cut short by the end of generation still counts when its JSON is whole
    _, calls = parse_tool_calls('<tool_call>\n{"name": "get_time", "arguments": {}}\n',
                                "hermes")
    assert [c.function.name for c in calls] == ["get_time"]
    for broken in ['<tool_call>{"name": "get_time", "arguments": {</tool_call>',
                   '<tool_call>{"arguments": {}}</tool_call>',
                   '<tool_call>{"name": "a"} {"name": "b"}</tool_call>',
                   "no call here", ""]:
        assert parse_tool_calls(broken, "hermes") == (broken, [])


def test_llama3_json_parser():
    names = ["get_weather", "get_time"]
    content, calls = parse_tool_calls(
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
        '{"name": "get_time", "parameters": {}}', "llama3_json", names)
    assert content == "" and [c.function.name for c in calls] == names
    assert json.loads(calls[0].function.arguments) == {"city": "Oslo"}
    answer = '{"name": "Ada", "age": 36}'  # JSON that is an answer, not a call
    assert parse_tool_calls(answer, "llama3_json", names) == (answer, [])
    assert parse_tool_calls("It is sunny.", "llama3_json", names) == ("It is sunny.", [])
    trailing = '{"name": "get_time", "parameters": {}} and then text'
    assert parse_tool_calls(trailing, "llama3_json", names) == (trailing, [])


def test_mistral_parser_both_generations():
    content, calls = parse_tool_calls(
        'Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}, '
        '"id": "abc123XYZ"}]', "mistral")
    assert content == "Sure." and calls[0].id == "abc123XYZ"
    assert json.loads(calls[0].function.arguments) == {"city": "Rome"}
    _, calls = parse_tool_calls('[TOOL_CALLS]get_time[ARGS]{}[TOOL_CALLS]get_weather[ARGS]'
                                '{"city": "Oslo"}', "mistral")
    assert [c.function.name for c in calls] == ["get_time", "get_weather"]
    assert all(len(c.id) == 9 for c in calls)
    assert parse_tool_calls("[TOOL_CALLS]oops", "mistral") == ("[TOOL_CALLS]oops", [])
    with pytest.raises(ValueError, match="unknown tool-call syntax"):
        parse_tool_calls("x", "xml")


# --- templates -----------------------------------------------------------------------------

def test_template_detection():
    qwen = TemplateTools.of(QWEN_LIKE)
    assert (qwen.family, qwen.native, qwen.renders_tool_calls, qwen.tool_role) == (
        "hermes", True, True, True)
    assert TemplateTools.of(LLAMA3_LIKE).family == "llama3_json"
    mistral = TemplateTools.of(MISTRAL_LIKE)
    assert mistral.family == "mistral" and mistral.tool_role
    plain = TemplateTools.of(CHATML)
    assert (plain.family, plain.native, plain.renders_tool_calls, plain.tool_role) == (
        "hermes", False, False, False)
    odd = TemplateTools.of("{% if tools %}{{ tools }}{% endif %}")
    assert odd.native and not odd.known_family and odd.family == "hermes"


def test_template_without_tools_gets_generic_prompt_and_user_turns_for_results():
    call_a = ToolCall.make("get_weather", {"city": "Paris"}, id="call_a")
    call_b = ToolCall.make("get_time", {}, id="call_b")
    conv = [{"role": "system", "content": "Be brief."}, *ASK,
            {"role": "assistant", "content": "Checking.",
             "tool_calls": [call_a.model_dump(), call_b.model_dump()]},
            {"role": "tool", "tool_call_id": "call_a", "content": "21C"},
            {"role": "tool", "tool_call_id": "call_b", "content": "noon"}]
    msgs = template_messages(conv, TemplateTools.of(CHATML), [WEATHER, TIME])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[0]["content"].startswith("Be brief.\n\n# Tools")
    assert '"name": "get_weather"' in msgs[0]["content"]
    assert msgs[2]["content"] == ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments":'
                                  ' {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
                                  '{"name": "get_time", "arguments": {}}\n</tool_call>')
    assert msgs[3]["content"] == "Result of get_weather:\n21C\n\nResult of get_time:\nnoon"
    # the generic prompt asks for exactly what the hermes parser reads
    assert "<tool_call>" in generic_tool_prompt([WEATHER])
    assert "Call the function get_time now." in generic_tool_prompt(
        [TIME], NamedToolChoice(function={"name": "get_time"}))


def test_native_template_gets_objects_and_mistral_ids():
    conv = [*ASK, {"role": "assistant", "content": "",
                   "tool_calls": [ToolCall.make("get_weather", {"city": "Paris"},
                                                id="call_long_id_1").model_dump()]},
            {"role": "tool", "tool_call_id": "call_long_id_1", "content": "21C"}]
    msgs = template_messages(conv, TemplateTools.of(QWEN_LIKE), [WEATHER])
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert msgs[2] == {"role": "tool", "content": "21C", "tool_call_id": "call_long_id_1",
                       "name": "get_weather"}
    assert msgs[0] == ASK[0]  # tools go to the template, not into the prompt text
    m = template_messages(conv, TemplateTools.of(MISTRAL_LIKE), [WEATHER])
    assert len(m[1]["tool_calls"][0]["id"]) == 9 and m[2]["tool_call_id"] == \
        m[1]["tool_calls"][0]["id"]


def test_forced_prefixes():
    named = NamedToolChoice(function={"name": "get_time"})
    hermes = TemplateTools.of(QWEN_LIKE)
    assert forced_prefix(hermes, "auto", QWEN_LIKE) == ""
    assert forced_prefix(hermes, "required", QWEN_LIKE) == "<tool_call>\n"
    assert forced_prefix(hermes, named, QWEN_LIKE).endswith('{"name": "get_time", '
                                                            '"arguments": ')
    assert forced_prefix(TemplateTools.of(LLAMA3_LIKE), named, LLAMA3_LIKE).startswith(
        '{"name": "get_time"')
    assert forced_prefix(TemplateTools.of(MISTRAL_LIKE), "required", MISTRAL_LIKE) == \
        "[TOOL_CALLS]["


# --- backends ------------------------------------------------------------------------------

def test_capabilities_are_declared_and_forwarded(tmp_path):
    from workbench.models.local import LocalChatModel
    from workbench.models.openai_compat import OpenAIChatModel

    fake = load_model("fake")
    assert fake.capabilities == Capabilities(score=True, tool_calls=True)
    assert LocalChatModel.capabilities.token_logprobs and LocalChatModel.capabilities.tokenize
    # a server's token log-probs: /v1/completions with echo (on-policy distillation's teacher)
    assert OpenAIChatModel.capabilities.tool_calls and \
        OpenAIChatModel.capabilities.token_logprobs
    cached = CachedModel(fake, CallCache(tmp_path / "c.sqlite"))
    assert cached.capabilities is fake.capabilities
    from workbench.errors import BackendError

    with pytest.raises(BackendError, match="cannot return token logprobs"):
        cached.token_logprobs("x")


def test_fake_backend_scripted_and_parsed_tool_calls():
    text_call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    m = load_model("fake", responses=[
        text_call, {"tool_calls": [{"name": "get_time", "arguments": {}}]}, "It is 21C."])
    g1, g2, g3 = m.generate([ASK, ASK, ASK], tools=[WEATHER, TIME])
    assert g1.finish_reason == "tool_calls" and g1.text == ""
    assert g1.tool_calls[0].function.name == "get_weather"
    assert g2.tool_calls[0].function.name == "get_time" and g2.finish_reason == "tool_calls"
    assert g3.tool_calls == [] and g3.text == "It is 21C."
    assert m.seen_tools[-1] == ["get_weather", "get_time"]
    # without tools (or with tool_choice none) the same text is just text
    m = load_model("fake", responses=[text_call])
    assert m.generate([ASK])[0].text == text_call
    assert m.generate([ASK], tools=[WEATHER], tool_choice="none")[0].tool_calls == []
    m = load_model("fake", responses=[{"tool_calls": [{"name": "rm_rf"}]}])
    with pytest.raises(WorkbenchError, match="did not offer"):
        m.generate([ASK], tools=[WEATHER])


def test_agent_loop_through_the_protocol():
    """What an agent does: call, run the tool, send the result back, get the answer."""
    def script(conv):
        if conv[-1]["role"] == "tool":
            return f"It is {conv[-1]['content']} in Paris."
        return {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}

    m = load_model("fake", script=script)
    conv = list(ASK)
    gen = m.generate([conv], tools=[WEATHER])[0]
    conv.append(gen.message())
    call = gen.tool_calls[0]
    conv.append({"role": "tool", "tool_call_id": call.id, "content": "21C"})
    final = m.generate([conv], tools=[WEATHER])[0]
    assert final.text == "It is 21C in Paris." and not final.tool_calls


def test_local_backend_renders_native_tools_and_forced_prefix(tiny_model):
    local = load_model(tiny_model, chat_template=QWEN_LIKE, device="cpu")
    conv = [*ASK, {"role": "assistant", "content": "",
                   "tool_calls": [ToolCall.make("get_weather", {"city": "Paris"},
                                                id="c1").model_dump()]},
            {"role": "tool", "tool_call_id": "c1", "content": "21C"}]
    text = local.render(conv, [WEATHER])
    assert text.startswith("<|im_start|>system\n# Tools\n<tools>")
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<tool_response>\n21C\n</tool_response>" in text
    assert local.render(ASK, [WEATHER], "required").endswith("<|im_start|>assistant\n"
                                                             "<tool_call>\n")
    assert "<tools>" not in local.render(ASK, [WEATHER], "none")
    # a random model writes no valid call: its text comes back, no calls, no exception
    g = local.generate([ASK], GenerationParams(max_tokens=6), tools=[WEATHER],
                       tool_choice="required")[0]
    assert g.tool_calls == [] and g.text.startswith("<tool_call>\n") and g.ok
    ids = local.tokenize(ASK)
    assert local.detokenize(ids) == local.render(ASK)


def test_local_backend_without_tool_template_uses_generic_prompt(tiny_model, caplog):
    local = load_model(tiny_model, device="cpu")  # SmolLM2's template: no tools
    assert not local.template_tools.native
    with caplog.at_level("WARNING"):
        text = local.render(ASK, [WEATHER])
        local.render(ASK, [WEATHER])
    assert "# Tools" in text and "<tool_call>" in text
    notices = [r for r in caplog.records if "takes no tools" in r.getMessage()]
    assert len(notices) == 1
