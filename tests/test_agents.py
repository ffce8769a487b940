"""The agent runtime with a scripted model through the real model interface: tool checks,
the loop, scaffolds, budgets, error policy, guided choice, batching and SFT export."""

import json
import time

import pytest

from workbench.agents.export import sft_examples, to_chat_example
from workbench.agents.runner import (
    AgentSetup,
    AgentTask,
    Budget,
    ErrorPolicy,
    FreePolicy,
    GuidedPolicy,
    PlanExecute,
    run_agents,
)
from workbench.agents.tools import Tool, Toolbox, ToolError
from workbench.errors import WorkbenchError
from workbench.models import load_model
from workbench.records import ToolCall

SEARCH = {"type": "object", "properties": {"query": {"type": "string", "minLength": 1},
                                           "k": {"type": "integer", "minimum": 1,
                                                 "maximum": 5}},
          "required": ["query"], "additionalProperties": False}
ANSWER = {"type": "object", "properties": {"label": {"type": "string",
                                                     "enum": ["YES", "NO"]}},
          "required": ["label"], "additionalProperties": False}


def box(searched=None):
    def search(query, k=2):
        if query == "boom":
            raise RuntimeError("our bug")
        if query == "missing":
            raise ToolError("no such entry")
        if searched is not None:
            searched.append(query)
        return f"results for {query}"

    return Toolbox([Tool("search", "Search.", SEARCH, search),
                    Tool("answer", "Answer.", ANSWER, lambda label: {"label": label},
                         final=True)])


def call(name, **args):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def test_toolbox_separates_model_mistakes_from_our_bugs():
    b = box()
    ok = b.call(ToolCall.make("search", {"query": "x"}))
    assert ok.error is None and ok.text == "results for x"
    for tc, part in [(ToolCall.make("serch", {"query": "x"}), "unknown tool 'serch'"),
                     (ToolCall.make("search", '{"query": '), "not valid JSON"),
                     (ToolCall.make("search", {"query": "x", "k": 9}), "search.k"),
                     (ToolCall.make("search", {"q": "x"}), "'query' is a required"),
                     (ToolCall.make("search", {"query": "missing"}), "no such entry")]:
        obs = b.call(tc)
        assert obs.error and part in obs.error, (tc, obs.error)
        assert obs.text.startswith("Error: ")
    with pytest.raises(RuntimeError, match="our bug"):
        b.call(ToolCall.make("search", {"query": "boom"}))
    with pytest.raises(WorkbenchError, match="no final tool"):
        Toolbox([Tool("search", "s", SEARCH, lambda query: "")])
    with pytest.raises(WorkbenchError, match="not valid JSON Schema"):
        Toolbox([Tool("a", "a", {"type": "objekt"}, lambda: "", final=True)])


def test_react_loop_runs_calls_and_ends_on_the_final_tool():
    searched = []
    replies = [call("search", query="capital of France"), call("answer", label="YES")]
    model = load_model("fake", responses=replies)
    setup = AgentSetup(toolbox=box(searched), system="Be brief.")
    (t,) = run_agents(model, [AgentTask("t1", "Is Paris the capital?")], setup)
    assert t.ok and t.final == {"label": "YES"} and t.stop == "final"
    assert searched == ["capital of France"]
    assert [s.kind for s in t.steps] == ["tool_call", "observation", "final"]
    assert t.tool_calls == 1 and t.model_turns == 2
    roles = [m.role for m in t.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert t.messages[3].tool_call_id == t.messages[2].tool_calls[0].id
    ex = to_chat_example(t)
    assert ex.messages[-1].tool_calls[0].function.name == "answer"
    assert [x.name for x in ex.tools] == ["search", "answer"]


def test_tasks_run_in_lockstep_batches():
    model = load_model("fake", responses=[call("answer", label="NO")])
    tasks = [AgentTask(f"t{i}", f"q{i}") for i in range(5)]
    out = run_agents(model, tasks, AgentSetup(toolbox=box()))
    assert [t.task_id for t in out] == [f"t{i}" for i in range(5)]
    assert model.batches == [5]


def test_tool_budget_leaves_only_the_final_tool_and_steps_stop_the_run():
    three = "\n".join(call("search", query=q) for q in ("a", "b", "c"))
    model = load_model("fake", responses=[three, call("answer", label="NO")])
    setup = AgentSetup(toolbox=box(), budget=Budget(max_steps=4, max_tool_calls=2))
    (t,) = run_agents(model, [AgentTask("t", "q")], setup)
    assert t.ok and t.tool_calls == 2
    refused = [s for s in t.steps if s.error and "budget" in s.error]
    assert len(refused) == 1 and refused[0].arguments == '{"query": "c"}'
    assert model.seen_tools == [["search", "answer"], ["answer"]]  # spent: only the answer
    # a model that never answers stops at max_steps, and is not training data
    looping = load_model("fake", responses=[call("search", query="again")])
    setup = AgentSetup(toolbox=box(), budget=Budget(max_steps=3, max_tool_calls=10))
    (t,) = run_agents(looping, [AgentTask("t", "q")], setup)
    assert t.stop == "max_steps" and t.final is None and t.tool_calls == 3
    assert to_chat_example(t) is None
    tokens = AgentSetup(toolbox=box(), budget=Budget(max_steps=9, max_tool_calls=9,
                                                     max_tokens=5))
    (t,) = run_agents(load_model("fake", responses=[call("search", query="again")]),
                      [AgentTask("t", "q")], tokens)
    assert t.stop == "max_tokens"


def test_model_mistakes_are_steps_and_the_error_policy_decides():
    replies = [call("serch", query="x"), "I think so.", call("answer", label="MAYBE"),
               call("answer", label="YES")]
    model = load_model("fake", responses=replies)
    setup = AgentSetup(toolbox=box(), errors=ErrorPolicy(max_errors=5))
    (t,) = run_agents(model, [AgentTask("t", "q")], setup)
    errs = [s for s in t.steps if s.error and s.kind != "observation"]
    assert "unknown tool 'serch'" in errs[0].error
    assert errs[1].kind == "error" and "no tool" in errs[1].error
    assert "answer.label" in errs[2].error
    assert t.ok and t.final == {"label": "YES"} and t.errors == 3
    assert to_chat_example(t) is None  # mistakes are not taught
    assert to_chat_example(t, drop_errors=False) is not None
    # the nudge after a text reply, and every call answered by a tool turn
    assert any(m.role == "user" and "Call one of the tools" in (m.content or "")
               for m in t.messages)
    stop = AgentSetup(toolbox=box(), errors=ErrorPolicy(on_error="stop"))
    (t2,) = run_agents(load_model("fake", responses=replies), [AgentTask("t", "q")], stop)
    assert t2.stop == "errors" and t2.model_turns == 1
    few = AgentSetup(toolbox=box(), errors=ErrorPolicy(max_errors=1))
    (t3,) = run_agents(load_model("fake", responses=replies), [AgentTask("t", "q")], few)
    assert t3.stop == "errors" and t3.errors == 2


def test_text_answer_is_read_by_the_packs_parser():
    model = load_model("fake", responses=["The answer is YES."])
    setup = AgentSetup(toolbox=box(), parse_final=lambda text: {"label": "YES"}
                       if "YES" in text else None)
    (t,) = run_agents(model, [AgentTask("t", "q")], setup)
    assert t.ok and t.steps[-1].kind == "final" and t.final == {"label": "YES"}


def test_backend_failure_stops_that_run_only():
    model = load_model("fake", responses=[call("answer", label="YES")], fail_every=2)
    out = run_agents(model, [AgentTask("a", "q"), AgentTask("b", "q")],
                     AgentSetup(toolbox=box()))
    assert out[0].ok and out[1].stop == "backend_error"


def test_plan_execute_plans_without_tools_then_acts():
    replies = ["1. search 2. answer", call("search", query="x"), call("answer", label="NO")]
    model = load_model("fake", responses=replies)
    setup = AgentSetup(toolbox=box(), scaffold=PlanExecute())
    (t,) = run_agents(model, [AgentTask("t", "Is it so?")], setup)
    assert [s.kind for s in t.steps][:2] == ["plan", "tool_call"]
    assert model.seen_tools[0] == []  # the plan turn offers no tools
    assert "numbered plan" in model.seen[0][-1]["content"]
    assert any(m.role == "user" and m.content == PlanExecute.go for m in t.messages)
    assert t.ok and t.scaffold == "plan_execute"


def test_guided_policy_scores_the_proposed_calls():
    model = load_model("fake")  # scores a continuation by how many of its words the prompt has

    def propose(state, allowed):
        out = [ToolCall.make("answer", {"label": "YES"})]
        if "search" in allowed:
            out += [ToolCall.make("search", {"query": "zzz qqq"}),
                    ToolCall.make("search", {"query": "ocean tides"})]
        return out

    setup = AgentSetup(toolbox=box(), policy=GuidedPolicy(propose),
                       budget=Budget(max_steps=3, max_tool_calls=1))
    (t,) = run_agents(model, [AgentTask("t", "Do ocean tides follow the moon?")], setup)
    first = t.steps[0]
    assert first.candidates and len(first.candidates) == 3
    best = max(first.candidates, key=lambda c: c["mean_logprob"])
    assert (first.tool, first.arguments) == (best["call"], json.loads(best["arguments"]))
    assert len({c["mean_logprob"] for c in first.candidates}) > 1  # the scores differ
    assert t.ok  # after the one allowed search only the answer is proposed
    with pytest.raises(WorkbenchError, match="proposed no call"):
        run_agents(model, [AgentTask("t", "q")],
                   AgentSetup(toolbox=box(), policy=GuidedPolicy(lambda s, a: [])))


def test_guided_sampling_is_seeded():
    def propose(state, allowed):
        return [ToolCall.make("answer", {"label": lab}) for lab in ("YES", "NO")]

    def labels(seed):
        model = load_model("fake")
        setup = AgentSetup(toolbox=box(), policy=GuidedPolicy(propose, temperature=5.0,
                                                              seed=seed))
        return [t.final["label"] for t in run_agents(
            model, [AgentTask(str(i), "q") for i in range(20)], setup)]

    assert labels(1) == labels(1)
    assert set(labels(1)) == {"YES", "NO"}


def test_free_policy_forces_the_final_tool_when_the_budget_is_spent():
    seen = []

    def script(conv):
        seen.append(conv)
        return call("search", query="q") if len(seen) == 1 else call("answer", label="NO")

    model = load_model("fake", script=script)
    setup = AgentSetup(toolbox=box(), policy=FreePolicy(),
                       budget=Budget(max_steps=3, max_tool_calls=1))
    (t,) = run_agents(model, [AgentTask("t", "q")], setup)
    assert t.ok and model.seen_tools == [["search", "answer"], ["answer"]]


def test_sft_export_trains_assistant_turns_and_masks_observations(tiny_model):
    from transformers import AutoTokenizer

    from workbench.train.data import IGNORE, tokenize_example

    replies = [call("search", query="capital"), call("answer", label="YES")]
    (t,) = run_agents(load_model("fake", responses=replies), [AgentTask("t", "q?")],
                      AgentSetup(toolbox=box()))
    (ex,) = sft_examples([t])
    tok = AutoTokenizer.from_pretrained(tiny_model)
    tz = tokenize_example(tok, ex)
    trained = tok.decode([i for i, lab in zip(tz.input_ids, tz.labels) if lab != IGNORE])
    assert "capital" in trained and '"answer"' in trained
    assert "results for capital" not in trained  # the observation is context only
    assert "results for capital" in tok.decode(tz.input_ids)


def test_batch_calibration_removes_a_fixed_preference():
    """Raw scores prefer YES for every input; relative to the batch's mean per kind of call,
    the input that likes NO most gets NO."""
    pol = GuidedPolicy(lambda s, a: [], calibrate="batch", min_batch=2,
                       final_names=["answer"])
    yes, no = ToolCall.make("answer", {"label": "YES"}), ToolCall.make("answer", {"label": "NO"})
    rows = [([yes, no], [-1.0, -1.5]), ([yes, no], [-1.0, -1.1]), ([yes, no], [-1.0, -1.4])]
    off = pol._offsets(rows)
    assert off == {pol._kind(yes): -1.0, pol._kind(no): pytest.approx(-4.0 / 3)}
    picks = [pol._choose([m - off[pol._kind(c)] for c, m in zip(calls, means)])
             for calls, means in rows]
    assert picks == [0, 1, 0]
    assert GuidedPolicy(lambda s, a: [])._offsets(rows) == {}  # off by default
    assert GuidedPolicy(lambda s, a: [], calibrate="batch", min_batch=4,
                        final_names=["answer"])._offsets(rows) == {}


def test_batch_calibration_groups_verdicts_not_evidence():
    pol = GuidedPolicy(lambda s, a: [], calibrate="batch", final_names=["answer"])
    pol.enums = {"answer": ["label"]}
    a = ToolCall.make("answer", {"label": "YES", "evidence": ["e1"]})
    b = ToolCall.make("answer", {"label": "YES", "evidence": ["e2", "e3"]})
    assert pol._kind(a) == pol._kind(b) != pol._kind(ToolCall.make("answer", {"label": "NO"}))
    assert pol._kind(ToolCall.make("search", {"query": "x"})) == "search"


def test_an_answering_turn_does_nothing_else():
    """A reply that searches and answers at once: the search is dropped unrun, so the
    conversation has no unanswered call and ends on the answer."""
    searched = []
    both = call("search", query="x") + "\n" + call("answer", label="YES")
    (t,) = run_agents(load_model("fake", responses=[both]), [AgentTask("t", "q")],
                      AgentSetup(toolbox=box(searched)))
    assert t.ok and searched == [] and t.tool_calls == 0
    assert [tc.function.name for tc in t.messages[-1].tool_calls] == ["answer"]
    assert any(s.kind == "error" and "dropped" in s.error for s in t.steps)
    assert to_chat_example(t) is not None  # not the model's mistake


def test_whole_number_floats_count_as_integers():
    obs = box().call(ToolCall.make("search", {"query": "x", "k": 3.0}))
    assert obs.error is None and obs.arguments == {"query": "x", "k": 3}
    assert box().call(ToolCall.make("search", {"query": "x", "k": 2.5})).error


def _nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def test_a_parameter_schema_nested_too_deeply_is_one_error_naming_the_tool():
    """A schema 2,000 levels deep: before, jsonschema's check_schema let Python's
    RecursionError out of Toolbox(); now one WorkbenchError naming the tool, before anything
    recurses over it (the bounds of constrained decoding: depth 64, alternatives, size)."""
    answer = Tool("answer", "Answer.", ANSWER, lambda label: label, final=True)
    with pytest.raises(WorkbenchError, match=r"^tool deep: parameter schema nested too "
                                             r"deeply \(4001 levels"):
        Toolbox([Tool("deep", "Deep.", _nested(2000), lambda **k: ""), answer])
    with pytest.raises(WorkbenchError, match="tool wide: parameter schema refused: .* 1001 "
                                             "alternatives"):
        Toolbox([Tool("wide", "w", {"type": "object", "properties": {"k": {
            "enum": list(range(1001))}}}, lambda **k: ""), answer])
    with pytest.raises(WorkbenchError, match="tool bad: tool schema is not valid JSON Schema"):
        Toolbox([Tool("bad", "b", {"type": "objekt"}, lambda **k: ""), answer])
    # unevaluatedProperties with patternProperties: validated, bounded (the test below)
    Toolbox([Tool("both", "b", {"type": "object", "patternProperties": {"^a": {}},
                                "unevaluatedProperties": False}, lambda **k: ""), answer])
    Toolbox([Tool("ok", "o", _nested(30), lambda **k: ""), answer])  # 61 levels: taken


def test_arguments_nested_thousands_deep_are_the_models_error():
    """A model's arguments `{"label": [[[[...]]]]}` 5,000 deep as JSON text: json.loads
    raised RecursionError; now an error observation the model sees, as is an object 100
    deep that json.loads reads; the Hermes parser takes such a block for no call."""
    from workbench.models.tools import parse_tool_calls

    b = box()
    deep = "[" * 5000 + "]" * 5000
    obs = b.call(ToolCall.make("answer", '{"label": ' + deep + "}"))
    assert obs.error == "answer: arguments nested too deeply to read (over 64 levels of " \
                        "objects and arrays)"
    assert obs.text.startswith("Error: ")
    obs = b.call(ToolCall.make("answer", '{"label": ' + "[" * 100 + "]" * 100 + "}"))
    assert obs.error and "nested too deeply (101 levels" in obs.error
    text = f'<tool_call>\n{{"name": "answer", "arguments": {{"label": {deep}}}}}\n</tool_call>'
    assert parse_tool_calls(text, "hermes", ["answer"]) == (text, [])


def test_a_pattern_that_backtracks_is_refused_in_bounded_time(monkeypatch):
    """`pattern` and `patternProperties` are matched with the `regex` module under a
    timeout: a value a pattern backtracks on (`^(a|a)+$` against 40 "a" then "!", which
    Python's `re` takes for ever) is an argument error naming the field; `^(a+)+$`, which
    hangs `re` too, `regex` answers at once; ordinary patterns work as before."""
    import workbench.agents.tools as T

    monkeypatch.setattr(T, "PATTERN_TIMEOUT_S", 0.1)
    monkeypatch.setattr(T, "PATTERN_BUDGET_S", 0.3)
    schema = {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^(a|a)+$"},
        "nested": {"type": "string", "pattern": "^(a+)+$"},
        "letter": {"type": "string", "pattern": "^[A-D]$"}},
        "patternProperties": {"^(b|b)+$": {"type": "integer"}},
        "additionalProperties": False}
    b = Toolbox([Tool("p", "P.", schema, lambda **k: "ok", final=True)])
    slow = "a" * 40 + "!"
    cases = [({"code": slow}, "p.code: the value 'aaaa"),
             ({"nested": slow}, "p.nested: 'aaaa"),
             ({"b" * 40 + "!": 1}, "p.bbbb"),
             ({"letter": "E"}, "p.letter: 'E' does not match '^[A-D]$'"),
             ({"zz": 1}, "'zz' does not match any of the regexes")]
    for args, part in cases:
        t0 = time.monotonic()
        obs = b.call(ToolCall.make("p", args))
        assert time.monotonic() - t0 < 2.0, args
        assert obs.error and part in obs.error, (args, obs.error)
    assert "could not be matched against the pattern '^(a|a)+$' in time" in \
        b.call(ToolCall.make("p", {"code": slow})).error
    # many slow values in one call: the call's budget bounds them all
    t0 = time.monotonic()
    obs = b.call(ToolCall.make("p", {"code": slow, **{"b" * n + "!": 1 for n in range(30, 45)}}))
    assert obs.error and time.monotonic() - t0 < 1.5
    ok = b.call(ToolCall.make("p", {"code": "aaa", "nested": "aa", "letter": "B", "bb": 3}))
    assert ok.error is None and ok.text == "ok"


def test_unevaluated_properties_with_pattern_properties_are_validated_in_bounded_time(
        monkeypatch):
    """A schema with `unevaluatedProperties` and `patternProperties` was refused (jsonschema
    matches the names it evaluates with `re`, unbounded); now the names are matched with
    `regex` under the call's time budget, through allOf, $ref and the rest, with
    jsonschema's own messages (the same verdicts as jsonschema on 18,576 ordinary cases
    when this was written), and a name a pattern backtracks on is refused, naming it."""
    import workbench.agents.tools as T

    monkeypatch.setattr(T, "PATTERN_TIMEOUT_S", 0.1)
    monkeypatch.setattr(T, "PATTERN_BUDGET_S", 0.3)
    schema = {"type": "object", "properties": {"q": {"type": "string"}},
              "patternProperties": {"^x_[a-z]+$": {"type": "integer"}, "^(b|b)+$": {}},
              "allOf": [{"patternProperties": {"^y_": {"type": "string"}}}],
              "$defs": {"z": {"patternProperties": {"^z_": {}}}}, "$ref": "#/$defs/z",
              "unevaluatedProperties": False}
    b = Toolbox([Tool("u", "U.", schema, lambda **k: "ok", final=True)])
    ok = b.call(ToolCall.make("u", {"q": "s", "x_ab": 3, "y_z": "w", "z_1": None}))
    assert ok.error is None and ok.text == "ok"
    cases = [({"q": "s", "zz": 1}, "u.(arguments): Unevaluated properties are not allowed "
                                   "('zz' was unexpected)"),
             ({"x_ab": "no"}, "u.x_ab: 'no' is not of type 'integer'"),
             ({"b" * 40 + "!": 1}, "could not be matched against the pattern '^(b|b)+$' in "
                                   "time")]
    for args, part in cases:
        t0 = time.monotonic()
        obs = b.call(ToolCall.make("u", args))
        assert time.monotonic() - t0 < 2.0, args
        assert obs.error and part in obs.error, (args, obs.error)
    # many names to match, each slow: the call's budget bounds them all
    t0 = time.monotonic()
    obs = b.call(ToolCall.make("u", {"b" * n + "!": 1 for n in range(30, 60)}))
    assert obs.error and time.monotonic() - t0 < 2.0
    # unevaluatedProperties as a schema: what no other keyword evaluated must match it
    v = Toolbox([Tool("v", "V.", {"type": "object", "properties": {"q": {}},
                                  "patternProperties": {"^x": {}},
                                  "unevaluatedProperties": {"type": "integer"}},
                      lambda **k: "ok", final=True)])
    assert v.call(ToolCall.make("v", {"q": "a", "xs": "s", "n": 3})).error is None
    assert "('n', 'm' were unevaluated and invalid)" in v.call(
        ToolCall.make("v", {"n": "s", "m": "t"})).error


def test_a_schema_pattern_regex_cannot_compile_or_unroll_is_one_error_naming_it():
    """Every pattern of a tool's schema is compiled by `regex`, the module that matches it,
    when the toolbox is made: `(?t)a` (Python's `re` takes it, so jsonschema's check_schema
    did; `regex` does not) was matched with `re` at each call, now it is one error naming
    the tool and the pattern, as are a pattern whose counted repeats `regex` unrolls past
    the bound (`a{4294967294}` took 2.8 GB and 9 s to fail) and an oversized one; the
    bounds of a regex constraint (alternatives) hold too. Ordinary patterns are taken."""
    from workbench.models.bounds import pattern_units

    def make(pattern: str, where: str = "pattern") -> Toolbox:
        schema = ({"type": "object", "properties": {"s": {"type": "string",
                                                          "pattern": pattern}}}
                  if where == "pattern" else
                  {"type": "object", "patternProperties": {pattern: {}}})
        return Toolbox([Tool("t", "T.", schema, lambda **k: "ok", final=True)])

    for where in ("pattern", "patternProperties"):
        with pytest.raises(WorkbenchError, match=r"^tool t: parameter schema pattern '\(\?t\)a"
                                                 r"' cannot be compiled by the regex module "
                                                 r"that matches it \(unknown extension"):
            make("(?t)a", where)
    t0 = time.monotonic()
    for pattern, count in (("a{4294967294}", "4,294,967,294"), ("(a{1000}){1000}",
                                                                "1,000,000"),
                           ("(?:x|yz){100000}", "300,000"), ("a{" + "9" * 5000 + "}", None)):
        with pytest.raises(WorkbenchError, match=r"^tool t: parameter schema pattern .* "
                                                 r"repeats too much \(" + (count or "")):
            make(pattern)
    assert time.monotonic() - t0 < 2.0
    # a repeat count of over 4,300 digits: check_schema's `re` raised ValueError, `regex`
    # too; now one error from the bound or the compile
    with pytest.raises(WorkbenchError, match=r"^tool t: parameter schema pattern 'a\{0,999"
                                             r".* cannot be compiled .*4300 digits"):
        make("a{0," + "9" * 5000 + "}")
    with pytest.raises(WorkbenchError, match=r"\(10001 characters\) is over the limit of "
                                             r"10000 characters"):
        make("x" * 10_001)
    with pytest.raises(WorkbenchError, match="refused: the regex has 1001 alternatives"):
        make("|".join(["a"] * 1001))
    # a value in `enum` or `default` is no pattern, whatever its keys say
    Toolbox([Tool("t", "T.", {"type": "object", "properties": {"s": {
        "enum": [{"pattern": "(?t)"}], "default": {"pattern": "a{99999999}"}}}},
        lambda **k: "ok", final=True)])
    for ok in ("^[A-D]$", "^\\d{5}(-\\d{4})?$", "^.{0,65535}$", "a{100000}",
               "(?<=a)(?P<x>b){5}", "^[a-z]+(?:-[a-z]+)*$"):
        assert make(ok).call(ToolCall.make("t", {"s": "zz"})).text in ("ok", "Error: "
                                                                      "t.s: 'zz' does not "
                                                                      f"match {ok!r}"), ok
    assert pattern_units("(a{10}b){3}c") == 34
