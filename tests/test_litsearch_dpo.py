"""Literature search with adapters it trains itself (issue 27): agent+sft (LoRA SFT on the
oracle teacher's dialogues) and agent+sft_dpo (DPO on the corruption pairs, from the SFT
adapter), reported beside the agent with intervals and paired comparisons; stages resume; a
report written before them reads. A tiny random-init Llama: plumbing, not a result."""

from __future__ import annotations

import json

import pytest

from workbench.errors import ConfigError


def _config(tiny_model, tmp_path, conditions="[agent, agent+sft, agent+sft_dpo]", extra=()):
    from workbench.config import load_config

    from conftest import tiny_litsearch_data

    data = tmp_path / "ls"
    if not data.exists():
        tiny_litsearch_data(data, ("dev", "dev", "train", "train"))
    return load_config(None, [
        "agent.pack=litsearch", f"agent.data={data}", "agent.turns=2",
        f"agent.conditions={conditions}", f"models.chat.spec={tiny_model}",
        "agent.student.max_steps=2", "agent.student.batch_size=2",
        "agent.student.max_length=1024", "agent.student.lora.r=4",
        "agent.student.lora.alpha=8", "cache.enabled=false",
        f"output_dir={tmp_path / 'runs'}", "name=ls", *extra])


def _run(cfg, log=None):
    from workbench.runs import RunContext, RunLayout, run_pipeline

    return run_pipeline("agent", cfg, RunContext(layout=RunLayout.of(cfg),
                                                 log=log or (lambda m: None)))


def test_sft_then_dpo_beside_sft_with_paired_tests_and_resume(tmp_path, tiny_model,
                                                              monkeypatch):
    from workbench.agent_packs.litsearch.report import read_report
    from workbench.agent_packs.reports import report_json
    from workbench.train import recipe

    calls = []
    real = recipe.train

    def counted(tc, **kw):
        calls.append((tc.method, tc.init_adapter))
        return real(tc, **kw)

    monkeypatch.setattr(recipe, "train", counted)
    cfg = _config(tiny_model, tmp_path)
    res = _run(cfg)
    agent = tmp_path / "runs" / "ls" / "agent"
    sft, dpo = agent / "litsearch_sft", agent / "litsearch_sft_dpo"
    assert calls == [("sft", None), ("dpo", str(sft))]
    # the DPO adapter was trained from the SFT adapter (then its reference), on the pairs
    m_sft = json.loads((sft / "manifest.json").read_text())
    m_dpo = json.loads((dpo / "manifest.json").read_text())
    assert m_sft["config"]["method"] == "sft"
    assert m_sft["config"]["data"] == str(agent / "litsearch_sft.messages.jsonl")
    assert m_dpo["config"]["method"] == "dpo" and m_dpo["config"]["init_adapter"] == str(sft)
    assert m_dpo["config"]["data"] == str(agent / "litsearch_preferences.jsonl")
    assert res.outputs["adapter_sft_dpo"] == str(dpo)

    report = read_report(tmp_path / "runs" / "ls")
    assert report_json(report) == (agent / "litsearch_report.json").read_text()
    assert list(report.conditions) == ["agent", "agent+sft", "agent+sft_dpo"]
    for c in ("agent+sft", "agent+sft_dpo"):
        v = report.conditions[c]
        value, ci = v.final("ndcg10")
        assert v.dialogues == 2 and ci.low <= value <= ci.high
        assert v.execution_error_ci95.low <= v.execution_error_rate <= \
            v.execution_error_ci95.high
    p = report.paired_with("agent+sft_dpo", "agent+sft")
    assert p is not None and p.intents == 2 and p.turns == 4
    assert p.ndcg10_final_diff_ci95.low <= p.ndcg10_final_diff <= p.ndcg10_final_diff_ci95.high
    assert 0 <= p.ndcg10_final_p <= 1 and 0 <= p.errors_p <= 1
    assert report.paired_with("agent+sft", "agent") is not None
    t = report.trained["agent+sft_dpo"]
    assert (t.method, t.init_adapter, t.adapter, t.steps) == ("dpo", "litsearch_sft",
                                                              "litsearch_sft_dpo", 2)
    assert t.examples == report.exports.preferences and t.reward_accuracy is not None
    assert report.trained["agent+sft"].examples == report.exports.sft == 2
    md = (agent / "litsearch_report.md").read_text()
    assert "| agent+sft_dpo vs agent+sft |" in md and "McNemar p" in md
    assert "from `litsearch_sft` (also the reference)" in md

    # a re-run skips every finished stage: no training, no dialogue
    stages = json.loads((tmp_path / "runs" / "ls" / "stages.json").read_text())["stages"]
    assert {"agent/litsearch_sft", "agent/litsearch_dpo", "agent/litsearch_agent+sft",
            "agent/litsearch_agent+sft_dpo"} <= set(stages)
    logs = []
    _run(cfg, logs.append)
    assert calls == [("sft", None), ("dpo", str(sft))]
    assert json.loads((tmp_path / "runs" / "ls" / "stages.json").read_text())["stages"] == stages
    assert "== agent/litsearch_dpo: up to date" in logs
    assert "== agent/litsearch_agent+sft_dpo: up to date" in logs
    assert report_json(read_report(tmp_path / "runs" / "ls")) == report_json(report)
    # the DPO adapter gone (e.g. a killed run): only DPO and its condition run again
    (dpo / "adapter_model.safetensors").unlink()
    logs.clear()
    _run(cfg, logs.append)
    assert calls[2:] == [("dpo", str(sft))]
    assert "== agent/litsearch_sft: up to date" in logs
    assert "== agent/litsearch_agent+sft: up to date" in logs


def test_trained_conditions_are_opt_in_and_named_once(tmp_path, tiny_model):
    from workbench.agent_packs.litsearch.api import _wanted

    cfg = _config(tiny_model, tmp_path, conditions="null")
    assert _wanted(cfg.agent) == ["query_only", "fixed", "agent", "oracle"]
    bad = _config(tiny_model, tmp_path, conditions="[agent+dpo]")
    with pytest.raises(ConfigError, match="agent\\+dpo.*known: .*agent\\+sft, agent\\+sft_dpo"):
        _run(bad)
    clash = _config(tiny_model, tmp_path, conditions="[agent+sft]",
                    extra=[f"agent.adapters={{sft: {tmp_path}}}"])
    with pytest.raises(ConfigError, match="'sft' would also be the trained condition"):
        _run(clash)


def test_a_report_without_the_trained_conditions_still_reads(tmp_path):
    """A report written before issue 27's keys (no paired, no trained, no agent+sft*) reads
    and dumps as it was written."""
    from workbench.agent_packs.litsearch.api import summarise
    from workbench.agent_packs.litsearch.report import read_report
    from workbench.agent_packs.reports import report_json

    def dialogue(i, ndcg):
        turns = [{"turn": t, "hit5": 1.0, "mrr": 0.5, "ndcg10": ndcg, "error": None,
                  "memo_hits": t, "memo_misses": 2, "choice": "keep"} for t in (1, 2)]
        return {"id": f"ls-{i}", "turns": turns, "seconds": 0.5}

    old = {"intents": 2, "turns": 2, "model": "m",
           "conditions": {"agent": summarise([dialogue(i, 0.3) for i in range(2)])},
           "exports": {"sft": 2, "preferences": 9}}
    path = tmp_path / "agent" / "litsearch_report.json"
    path.parent.mkdir()
    path.write_text(json.dumps(old, indent=1) + "\n")
    rep = read_report(tmp_path)
    assert rep.paired is None and rep.trained is None
    assert rep.paired_with("agent+sft_dpo", "agent+sft") is None
    dumped = json.loads(report_json(rep))
    assert dumped.pop("schema_version") == 1 and dumped.pop("citations") is True
    assert dumped == json.loads(json.dumps(old))
