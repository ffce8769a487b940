"""Preference optimisation (DPO) in the training library, on the tiny random-init Llama: the
margin rises on pairs from every exporter's shape, the reference runs once and is then read
from its cache, a killed run resumes exactly, the masks train only each side's own turns, and
the pair format round-trips through TRL's."""

import json

import pytest

from workbench.errors import DataError, TrainingInterrupted, WorkbenchError
from workbench.formats import (
    from_trl_preference, read_preferences, to_trl_preference, validate_preferences,
)
from workbench.records import PreferencePair
from workbench.train.config import TrainConfig
from workbench.train.data import IGNORE
from workbench.train.preference import tokenize_pair
from workbench.train.session import (
    adapter_state, export, preference_metrics, restore_checkpoint, setup, train_steps,
)

RUN_SQL = {"type": "function", "function": {
    "name": "run_sql", "description": "Run one SQL query.",
    "parameters": {"type": "object", "properties": {"sql": {"type": "string"}},
                   "required": ["sql"]}}}


def qa_pairs(n=24):
    """Plain chat pairs: an answer against a refusal (a preference a tiny random model can
    learn in a few steps)."""
    return [PreferencePair.model_validate({
        "id": f"qa{i}", "kind": "refusal",
        "prompt": [{"role": "user", "content": f"What is {i} times 3?"}],
        "chosen": [{"role": "assistant", "content": f"{i} times 3 is {3 * i}."}],
        "rejected": [{"role": "assistant", "content": f"I cannot say what {i} times 3 is."}]})
        for i in range(n)]


def trajsynth_pair(i):
    """trajsynth's shape: system + question, then a multi-turn run_sql trajectory whose tool
    results sit inside the sides (masked)."""
    def side(sql, result, answer):
        return [{"role": "assistant", "content": "", "tool_calls": [
                    {"id": f"c{i}", "type": "function",
                     "function": {"name": "run_sql", "arguments": json.dumps({"sql": sql})}}]},
                {"role": "tool", "tool_call_id": f"c{i}", "content": result},
                {"role": "assistant", "content": answer}]
    return PreferencePair.model_validate({
        "id": f"t{i}", "tools": [RUN_SQL], "metadata": {"source": "trajsynth"},
        "prompt": [{"role": "system", "content": "You answer with SQL."},
                   {"role": "user", "content": f"How many sales in region {i}?"}],
        "chosen": side(f"SELECT COUNT(*) FROM sale WHERE region_id = {i}", "2", "2"),
        "rejected": side(f"SELECT COUNT(*) FROM region WHERE region_id = {i}", "1", "1")})


def litsearch_pair(i):
    """litsearch's shape: the prompt holds earlier assistant turns (not trained), each side
    is one tool call."""
    def call(op):
        return [{"role": "assistant", "content": "", "tool_calls": [
            {"id": f"w{i}", "type": "function",
             "function": {"name": "run_sql", "arguments": json.dumps({"sql": op})}}]}]
    return PreferencePair.model_validate({
        "id": f"l{i}", "kind": "dropped_node", "tools": [RUN_SQL],
        "prompt": [{"role": "user", "content": f"papers on topic {i}"},
                   {"role": "assistant", "content": "Searching first."},
                   {"role": "user", "content": "Now filter by year."}],
        "chosen": call(f"search {i} | filter year"), "rejected": call(f"filter year {i}")})


def config(**kw):
    base = {"method": "dpo", "max_length": 384, "batch_size": 4, "learning_rate": 2e-2,
            "max_steps": 10, "eval_fraction": 0.2, "warmup_ratio": 0.0,
            "scheduler": "constant", "lora": {"r": 4, "alpha": 8, "dropout": 0.0},
            "dpo": {"beta": 0.5}}
    base.update(kw)
    return TrainConfig(**base)


def in_memory(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(tiny_model),
            AutoTokenizer.from_pretrained(tiny_model))


def session(tiny_model, pairs, **kw):
    cache = kw.pop("reference_cache", None)
    ck = kw.pop("checkpoint_dir", None)
    model, tok = in_memory(tiny_model)
    return setup(config(**kw), model=model, tokenizer=tok, pairs=pairs, seed=1,
                 reference_cache=cache, checkpoint_dir=ck)


@pytest.mark.parametrize("make", [lambda: qa_pairs(12),
                                  lambda: [trajsynth_pair(i) for i in range(10)],
                                  lambda: [litsearch_pair(i) for i in range(10)]],
                         ids=["chat", "trajsynth", "litsearch"])
def test_margin_rises_on_pairs_of_every_exporter_shape(tiny_model, make):
    s = session(tiny_model, make(), max_steps=6)
    before = preference_metrics(s, s.train_set)
    assert abs(before["reward_margin"]) < 1e-4  # the policy starts as the reference
    rows = train_steps(s, s.total)
    after = preference_metrics(s, s.train_set)
    assert after["reward_margin"] > before["reward_margin"] + 0.05, (before, after)
    assert after["loss"] < before["loss"]
    assert after["reward_accuracy"] >= 0.75
    assert rows[-1]["reward_accuracy"] >= 0 and "eval_reward_accuracy" in rows[-1]
    assert rows[-1]["loss"] < rows[0]["loss"]


def test_only_each_sides_own_turns_are_trained(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    t = tokenize_pair(tok, litsearch_pair(3))
    trained = tok.decode([i for i, lab in zip(t.chosen.input_ids, t.chosen.labels, strict=True)
                          if lab != IGNORE])
    assert "search 3 | filter year" in trained
    assert "Searching first" not in trained  # the prompt's own assistant turn: context
    t = tokenize_pair(tok, trajsynth_pair(2))
    ids, labels = t.rejected.input_ids, t.rejected.labels
    trained = tok.decode([i for i, lab in zip(ids, labels, strict=True) if lab != IGNORE])
    untrained = tok.decode([i for i, lab in zip(ids, labels, strict=True) if lab == IGNORE])
    assert "FROM region" in trained and "How many sales" in untrained
    # the tool result between the two assistant turns is context, not target
    assert trained.count("1") >= 1 and "tool" not in trained.lower().replace("tool_call", "")


def test_reference_runs_once_then_comes_from_the_cache(tiny_model, tmp_path, monkeypatch):
    import torch

    from workbench.train import preference

    cache = tmp_path / "ref.jsonl"
    first = session(tiny_model, qa_pairs(), reference_cache=cache, max_steps=12)
    assert first.ref_forwards == 6  # 24 pairs (train and held-out), batches of 4
    lines = cache.read_text().splitlines()
    assert len(lines) == 24
    # 19 training pairs: 5 batches an epoch; steps 6-11 are the second and third epochs
    assert first.batches_per_epoch == 5
    train_steps(first, 5)
    calls = {"grad": 0, "no_grad": 0}
    real = preference.sequence_logps

    def counted(*a, **kw):
        calls["grad" if torch.is_grad_enabled() else "no_grad"] += 1
        return real(*a, **kw)

    monkeypatch.setattr(preference, "sequence_logps", counted)
    train_steps(first, 6)  # not the last step, which also scores the held-out pairs
    assert calls == {"grad": 6, "no_grad": 0}  # the policy's passes only: no reference pass
    assert first.ref_forwards == 6
    monkeypatch.setattr(preference, "sequence_logps", real)

    again = session(tiny_model, qa_pairs(), reference_cache=cache, max_steps=12,
                    dpo={"beta": 0.1})  # another beta: the same reference
    assert again.ref_forwards == 0
    assert cache.read_text().splitlines() == lines
    # a damaged line is recomputed, the rest is read
    cache.write_text(lines[0][:20] + "\n" + "\n".join(lines[1:]) + "\n")
    third = session(tiny_model, qa_pairs(), reference_cache=cache)
    assert third.ref_forwards == 1
    for k, v in first.reference.values.items():
        assert third.reference.values[k] == pytest.approx(v, abs=1e-5)
    # a cache file that is not a regular file is refused, not followed
    link = tmp_path / "link.jsonl"
    link.symlink_to(tmp_path / "elsewhere.jsonl")
    with pytest.raises(WorkbenchError, match="not a regular file"):
        session(tiny_model, qa_pairs(), reference_cache=link)


def test_only_the_pairs_the_schedule_draws_get_a_reference(tiny_model, tmp_path):
    from workbench.train.session import _micro_batches

    pairs = qa_pairs(48)
    s = session(tiny_model, pairs, max_steps=2, grad_accum=2)  # 4 batches of 4
    assert s.batches_per_epoch * 4 >= len(s.train_set) > 16
    drawn = {k for step in range(2) for b in _micro_batches(s, step) for k in b.keys}
    assert len(drawn) == 16
    assert set(s.reference.values) == drawn | {p.key for p in s.eval_set}
    assert s.ref_forwards == 4 + -(-len(s.eval_set) // 4)
    assert len(train_steps(s, 2)) == 2
    # a longer schedule over the same cache scores only the pairs it adds
    cache = tmp_path / "ref.jsonl"
    a = session(tiny_model, pairs, max_steps=2, grad_accum=2, reference_cache=cache)
    b = session(tiny_model, pairs, max_steps=20, grad_accum=2, reference_cache=cache)
    assert a.ref_forwards == s.ref_forwards
    assert len(b.reference.values) == 48
    assert 0 < b.ref_forwards <= -(-(48 - 16 - len(s.eval_set)) // 4)
    # past the scored pairs, one line says why rather than a KeyError
    with pytest.raises(WorkbenchError, match="no reference log-probabilities"):
        s.reference.tensor([p.key for p in s.train_set], "cpu")


def test_kill_and_resume_is_exact(tiny_model, tmp_path):
    pairs = [trajsynth_pair(i) for i in range(12)] + qa_pairs(12)
    whole = session(tiny_model, pairs, max_steps=8)
    train_steps(whole, 8)
    ck = tmp_path / "ck"
    cache = tmp_path / "ref.jsonl"
    first = session(tiny_model, pairs, max_steps=8, checkpoint_dir=ck, reference_cache=cache)
    with pytest.raises(TrainingInterrupted):
        train_steps(first, 8, should_stop=lambda: first.step == 3)
    resumed = session(tiny_model, pairs, max_steps=8, checkpoint_dir=ck,
                      reference_cache=cache)
    assert resumed.ref_forwards == 0
    assert restore_checkpoint(resumed) is not None and resumed.step == 3
    train_steps(resumed, 5)
    a, b = adapter_state(whole), adapter_state(resumed)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6
    assert [round(r["loss"], 6) for r in whole.metrics] == \
        [round(r["loss"], 6) for r in resumed.metrics]


def test_dpo_on_top_of_an_adapter_uses_it_as_the_reference(tiny_model, tmp_path):
    from workbench.records import ChatExample

    sft = setup(TrainConfig(max_length=128, batch_size=4, learning_rate=5e-3, max_steps=4,
                            lora={"r": 4, "alpha": 8, "dropout": 0.0}),
                model_spec=tiny_model, seed=1,
                examples=[ChatExample.model_validate({"messages": [
                    {"role": "user", "content": f"q{i}"},
                    {"role": "assistant", "content": f"a{i}"}]}) for i in range(16)])
    train_steps(sft, 4)
    export(sft, tmp_path / "sft")
    s = setup(config(init_adapter=str(tmp_path / "sft")), model_spec=tiny_model,
              pairs=qa_pairs(), seed=1)
    # the policy starts at the SFT adapter, which is also the reference: margin 0
    assert abs(preference_metrics(s, s.train_set)["reward_margin"]) < 1e-4
    start = adapter_state(s)
    assert any(float(v.abs().max()) > 0 for k, v in start.items() if "lora_B" in k)
    assert "|base|" not in s.reference.model_key
    train_steps(s, 3)
    manifest = export(s, tmp_path / "dpo")
    assert manifest["config"]["method"] == "dpo"
    assert manifest["outputs"]["reference_forward_passes"] == s.ref_forwards > 0
    assert "tags: [lora, workbench, dpo]" in (tmp_path / "dpo" / "README.md").read_text()


def test_wrong_data_for_the_method_is_refused_before_the_model(tiny_model, tmp_path):
    model, tok = in_memory(tiny_model)
    with pytest.raises(WorkbenchError, match="pass pairs="):
        setup(config(), model=model, tokenizer=tok, examples=[], seed=0)
    sft_file = tmp_path / "sft.jsonl"
    sft_file.write_text(json.dumps({"messages": [{"role": "user", "content": "q"},
                                                 {"role": "assistant", "content": "a"}]})
                        + "\n")
    with pytest.raises(DataError, match="chosen: missing field") as e:
        setup(config(data=str(sft_file)), model=model, tokenizer=tok, seed=0)
    assert e.value.line == 1
    long = [PreferencePair.model_validate({
        "prompt": [{"role": "user", "content": "word " * 500}],
        "chosen": [{"role": "assistant", "content": "a"}],
        "rejected": [{"role": "assistant", "content": "b"}]})]
    with pytest.raises(DataError, match="over train.max_length"):
        setup(config(), model=model, tokenizer=tok, pairs=long, seed=0)


@pytest.mark.parametrize("row,code", [
    ({"prompt": [], "chosen": [{"role": "assistant", "content": "a"}],
      "rejected": [{"role": "assistant", "content": "b"}]}, "empty_messages"),
    ({"prompt": [{"role": "user", "content": "q"}],
      "chosen": [{"role": "assistant", "content": "a"}],
      "rejected": [{"role": "assistant", "content": "a"}]}, "same_sides"),
    ({"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x"}],
      "chosen": [{"role": "assistant", "content": "a"}],
      "rejected": [{"role": "assistant", "content": "b"}]}, "prompt_ends_assistant"),
    ({"prompt": [{"role": "user", "content": "q"}],
      "chosen": [{"role": "user", "content": "a"}],
      "rejected": [{"role": "assistant", "content": "b"}]}, "not_assistant"),
    ({"prompt": [{"role": "user", "content": "q"}], "chosen": "a", "rejected": "b"},
     "wrong_type"),
])
def test_bad_pairs_are_named_by_line_and_code(tmp_path, row, code):
    f = tmp_path / "p.jsonl"
    good = to_trl_preference(qa_pairs(1)[0])
    f.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    n, problems = validate_preferences(f)
    assert n == 1 and len(problems) == 1
    assert problems[0].line == 2 and problems[0].code == code, problems[0]
    with pytest.raises(DataError) as e:
        read_preferences(f)
    assert e.value.line == 2


def test_round_trip_through_trls_conversational_format():
    for pair in qa_pairs(2) + [trajsynth_pair(1), litsearch_pair(2)]:
        trl = to_trl_preference(pair)
        assert set(trl) <= {"prompt", "chosen", "rejected", "tools"}
        for side in ("chosen", "rejected"):
            for m in trl[side]:
                for c in m.get("tool_calls", ()):
                    assert isinstance(c["function"]["arguments"], dict)  # TRL's objects
        back = from_trl_preference(trl)
        for k in ("prompt", "chosen", "rejected", "tools"):
            assert getattr(back, k) == getattr(pair, k)
    # TRL's implicit-prompt rows: whole conversations, the prompt is their shared start
    p = qa_pairs(1)[0]
    implicit = {"chosen": [m.to_json() for m in p.prompt + p.chosen],
                "rejected": [m.to_json() for m in p.prompt + p.rejected]}
    back = from_trl_preference(implicit)
    assert back.prompt == p.prompt and back.chosen == p.chosen and back.rejected == p.rejected
    # TRL rows carry no call ids: tool results answer the latest call
    trl = to_trl_preference(trajsynth_pair(4))
    for side in ("chosen", "rejected"):
        for m in trl[side]:
            m.pop("tool_call_id", None)
            for c in m.get("tool_calls", ()):
                c.pop("id")
    back = from_trl_preference(trl)
    assert back.chosen[1].tool_call_id == back.chosen[0].tool_calls[0].id


def test_the_exporters_files_read_as_pairs(tmp_path):
    """The shapes trajsynth and litsearch write (their own dict layouts) read as pairs."""
    f = tmp_path / "prefs.jsonl"
    rows = [trajsynth_pair(1).to_json(), litsearch_pair(1).to_json()]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = read_preferences(f)
    assert [p.id for p in pairs] == ["t1", "l1"] and pairs[1].kind == "dropped_node"


# --- step-level pairs from trajectories, and the shells ---------------------------------------

SQL_TOOL = {"type": "function", "function": {
    "name": "run_sql", "parameters": {"type": "object", "properties": {
        "sql": {"type": "string"}}, "required": ["sql"], "additionalProperties": False}}}
LOOKUP_TOOL = {"type": "function", "function": {
    "name": "lookup", "parameters": {"type": "object", "properties": {
        "field": {"type": "string", "enum": ["name", "region", "amount"]},
        "limit": {"type": "integer", "minimum": 1, "maximum": 5},
        "exact": {"type": "boolean"}}, "required": ["field"], "additionalProperties": False}}}
ANSWER_TOOL = {"type": "function", "function": {
    "name": "answer", "parameters": {"type": "object", "properties": {
        "text": {"type": "string"}}, "required": ["text"]}}}


def trajectories():
    """trajsynth's SFT shape (run_sql steps, tool results, an answer) and a domain agent's
    (enum, integer and boolean arguments, a final answer tool)."""
    from workbench.records import ChatExample

    rows = []
    for i, (sql1, sql2) in enumerate([
            ("SELECT COUNT(*) FROM sale WHERE amount > 3", "SELECT name FROM region"),
            ("SELECT MAX(amount) FROM sale", "SELECT region_id FROM sale ORDER BY day ASC")]):
        msgs = [{"role": "system", "content": "Answer with SQL."},
                {"role": "user", "content": f"Question {i}?"}]
        for k, sql in enumerate((sql1, sql2)):
            msgs += [{"role": "assistant", "content": "", "tool_calls": [{
                "id": f"c{k}", "type": "function",
                "function": {"name": "run_sql", "arguments": json.dumps({"sql": sql})}}]},
                {"role": "tool", "tool_call_id": f"c{k}", "content": "3"}]
        msgs.append({"role": "assistant", "content": "3"})
        rows.append(ChatExample.model_validate({"id": f"sql{i}", "messages": msgs,
                                                "tools": [SQL_TOOL]}))
    msgs = [{"role": "user", "content": "Who sold most?"},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": "a", "type": "function", "function": {"name": "lookup", "arguments":
                    json.dumps({"field": "amount", "limit": 3, "exact": True})}}]},
            {"role": "tool", "tool_call_id": "a", "content": "north"},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": "b", "type": "function", "function": {"name": "answer", "arguments":
                    json.dumps({"text": "north"})}}]},
            {"role": "tool", "tool_call_id": "b", "content": "ok"},
            {"role": "assistant", "content": "north"}]
    rows.append(ChatExample.model_validate({
        "id": "agent0", "messages": msgs, "tools": [LOOKUP_TOOL, ANSWER_TOOL, SQL_TOOL],
        "metadata": {"alternatives": {"3": [{"id": "x", "type": "function", "function": {
            "name": "answer", "arguments": json.dumps({"text": "south"})}}]}}}))
    return rows


def test_step_pairs_at_every_expert_call_fit_the_schema():
    from jsonschema import Draft202012Validator

    from workbench.train.steppairs import step_pairs

    pairs, report = step_pairs(trajectories(), per_step=5, seed=0, final_tools=["answer"])
    assert report["steps"] == 6 and report["steps_without_pair"] == 0
    kinds = report["by_kind"]
    for k in ("sql_table", "sql_operator", "enum", "number", "boolean", "alternative"):
        assert kinds.get(k), (k, kinds)
    schemas = {t["function"]["name"]: t["function"]["parameters"]
               for t in (SQL_TOOL, LOOKUP_TOOL, ANSWER_TOOL)}
    for p in pairs:
        chosen, bad = p.chosen[0].tool_calls[0], p.rejected[0].tool_calls[0]
        args = json.loads(bad.function.arguments)
        assert Draft202012Validator(schemas[bad.function.name]).is_valid(args), p.id
        assert (bad.function.name, args) != (chosen.function.name,
                                             json.loads(chosen.function.arguments))
        assert p.prompt[-1].role in ("user", "tool")  # the state before the expert's step
        assert bad.function.name != "answer" or p.kind == "alternative"  # never wrong_tool
    table = next(p for p in pairs if p.kind == "sql_table")
    assert "FROM sale" in table.chosen[0].tool_calls[0].function.arguments
    assert "FROM region" in table.rejected[0].tool_calls[0].function.arguments
    alt = next(p for p in pairs if p.kind == "alternative")
    assert "south" in alt.rejected[0].tool_calls[0].function.arguments
    # the same seed, the same pairs
    again, _ = step_pairs(trajectories(), per_step=5, seed=0, final_tools=["answer"])
    assert [p.to_json() for p in again] == [p.to_json() for p in pairs]


def test_pairs_preview_and_dpo_run_from_the_cli(cli, tiny_model, tmp_path):
    from workbench.formats import write_dataset

    traj = tmp_path / "traj.jsonl"
    write_dataset(traj, trajectories() * 3)
    out = tmp_path / "pairs.jsonl"
    r = cli("train", "pairs", str(traj), "-o", str(out), "--per-step", "2",
            "--final-tool", "answer")
    assert r.returncode == 0, r.stderr
    assert "pairs from 18 expert steps of 9 trajectories" in r.stdout
    pairs = read_preferences(out)
    assert len(pairs) == 36
    common = ["-s", f"models.chat.spec={tiny_model}", "-s", "train.method=dpo",
              "-s", f"train.data={out}", "-s", f"output_dir={tmp_path / 'runs'}",
              "-s", "name=dpo"]
    r = cli("train", "preview", *common, "--index", "2")
    assert r.returncode == 0, r.stderr
    chosen, rejected = r.stdout.split("== rejected")
    assert chosen.count("[[") == 1 and rejected.count("[[") == 1  # one step trained per side
    assert "Question 0?" in chosen and "[[" not in chosen.split("Question 0?")[0]
    r = cli("train", "run", *common, "-s", "train.max_steps=3", "-s", "train.batch_size=4",
            "-s", "train.max_length=512", "-s", "train.lora.r=4")
    assert r.returncode == 0, r.stderr
    adapter = tmp_path / "runs" / "dpo" / "adapter"
    manifest = json.loads((adapter / "manifest.json").read_text())
    assert manifest["config"]["method"] == "dpo" and manifest["outputs"]["steps"] == 3
    rows = [json.loads(x) for x in (adapter / "metrics.jsonl").read_text().splitlines()]
    assert {"reward_accuracy", "reward_margin"} <= rows[-1].keys()
    assert "reference log-probabilities: " in r.stdout + r.stderr
    assert (tmp_path / "runs" / "dpo" / ".adapter.reference.jsonl").is_file()
    # starting from the adapter the run would write: refused before any work
    r = cli("train", "run", *common, "-s", f"train.init_adapter={adapter}")
    assert r.returncode != 0 and "also the output folder" in r.stderr
    assert json.loads((adapter / "manifest.json").read_text())["outputs"]["steps"] == 3
    # method dpo with no data names what to pass
    r = cli("train", "run", "-s", "train.method=dpo", "-s", f"output_dir={tmp_path / 'r2'}",
            "-s", "name=x")
    assert r.returncode != 0 and "preference JSONL" in r.stderr


def test_data_validate_reads_pairs(cli, tmp_path):
    f = tmp_path / "pairs.jsonl"
    f.write_text(json.dumps(to_trl_preference(qa_pairs(1)[0])) + "\n"
                 + json.dumps({"prompt": [{"role": "user", "content": "q"}],
                               "chosen": [{"role": "assistant", "content": "a"}],
                               "rejected": [{"role": "assistant", "content": "a"}]}) + "\n")
    r = cli("data", "validate", str(f))
    assert r.returncode == 3
    assert "pairs.jsonl:2" in r.stderr and "same_sides" in r.stderr
    assert "1 valid, 1 invalid (same_sides=1)" in r.stdout


# --- the app's Train page (AppTest; the app's own fixtures) ------------------------------------

@pytest.fixture()
def ws(tmp_path, monkeypatch):
    """An empty app workspace (as test_app's `ws`)."""
    import os

    from test_app import TESTS

    monkeypatch.setenv("WB_WORKSPACE", str(tmp_path / "ws"))
    monkeypatch.setenv("PYTHONPATH", TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return tmp_path / "ws"


def test_dpo_from_the_train_page_on_exported_pairs(ws, tiny_model, monkeypatch):
    """A workspace run holds trajectory pairs: the page offers them under DPO, trains on
    them as a job, and shows the reward accuracy and margin curves and the method."""
    from test_app import frame, page, texts

    from workbench.jobs import list_jobs, wait_job
    from workbench.workspace import open_workspace

    w = open_workspace(ws)
    monkeypatch.setenv("WB_APP_MODEL", tiny_model)
    src = w / "runs" / "search" / "trajsynth"
    src.mkdir(parents=True)
    (src / "preferences.jsonl").write_text("".join(json.dumps(p.to_json()) + "\n"
                                                   for p in qa_pairs(12)))
    at = page("train").run()
    at.radio(key="t-method").set_value("DPO").run()
    assert at.selectbox(key="t-pairs").value == "search: trajsynth pairs"
    assert at.selectbox(key="t-init").options[0] == "the base model"
    at.number_input(key="t-steps").set_value(3)
    at.number_input(key="t-save").set_value(0)
    at.button[0].click().run()
    (job,) = list_jobs(w, kind="train")
    job = wait_job(job, timeout=300)
    assert not at.exception and not at.error, ([e.value for e in at.error], job.log_text())
    assert job.status == "completed", job.log_text()
    at = page("train").run()
    at.selectbox(key="t-run").set_value("dpo").run()
    assert not at.exception
    m = frame(at, "status", "method")
    assert m["method"][0] == "dpo" and m["status"][0] == "completed"
    assert "Reward accuracy and margin" in texts(at)
