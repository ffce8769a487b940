"""Literature search with adapters beside the plain agent (issue 27): `agent.adapters` adds
an agent+NAME condition per adapter (e.g. SFT, and SFT then DPO), reported with paired
differences on the same intents. A tiny random-init Llama and random adapters: plumbing."""

from __future__ import annotations

import pytest

from workbench.errors import WorkbenchError


def _adapter(model_path, out, seed):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    m = get_peft_model(AutoModelForCausalLM.from_pretrained(model_path),
                       LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    m.save_pretrained(out, safe_serialization=True)
    return out


def test_adapter_conditions_beside_the_agent_with_paired_differences(tmp_path, tiny_model):
    from workbench.config import load_config
    from workbench.runs import RunContext, RunLayout, run_pipeline

    from conftest import tiny_litsearch_data

    data = tiny_litsearch_data(tmp_path / "ls", ("dev", "dev", "train"))
    sft, dpo = _adapter(tiny_model, tmp_path / "sft", 1), _adapter(tiny_model, tmp_path / "dpo", 2)
    cfg = load_config(None, [
        "agent.pack=litsearch", f"agent.data={data}", "agent.turns=2",
        "agent.conditions=[agent]", f"agent.adapters={{sft: {sft}, sft_dpo: {dpo}}}",
        f"models.chat.spec={tiny_model}", "cache.enabled=false",
        f"output_dir={tmp_path / 'runs'}", "name=ls"])
    run_pipeline("agent", cfg, RunContext(layout=RunLayout.of(cfg), log=lambda m: None))
    out = tmp_path / "runs" / "ls"
    from workbench.agent_packs.litsearch.report import read_report
    from workbench.agent_packs.reports import report_json

    report = read_report(out)
    assert report_json(report) == (out / "agent" / "litsearch_report.json").read_text()
    assert list(report.conditions) == ["agent", "agent+sft", "agent+sft_dpo"]
    assert all(v.dialogues == 2 for v in report.conditions.values())
    md = next(out.rglob("litsearch_report.md")).read_text()
    assert "| agent+sft vs agent |" in md and "| agent+sft_dpo vs agent+sft |" in md
    assert "McNemar p" in md
    # a folder that is not an adapter is named before any dialogue; other packs refuse
    bad = cfg.model_copy(update={"agent": cfg.agent.model_copy(
        update={"adapters": {"x": str(tmp_path)}})})
    with pytest.raises(WorkbenchError, match="agent.adapters: .*not a PEFT adapter"):
        run_pipeline("agent", bad, RunContext(layout=RunLayout.of(bad), log=lambda m: None))
    kgv = cfg.model_copy(update={"agent": cfg.agent.model_copy(update={"pack": "kgv"})})
    with pytest.raises(WorkbenchError, match="pack 'kgv' has no adapter conditions"):
        run_pipeline("agent", kgv, RunContext(layout=RunLayout.of(kgv), log=lambda m: None))
