"""KGV's agent_grpo condition (issue 44; AgentKGV's second stage) end to end on the tiny
random-init model: the agent trained with GRPO against the pack's reward (a right verdict,
less a cost per search) as its own stage, the adapter chosen on training claims held out
from the rollouts, then scored on the dev claims beside the agent it started from, with the
change in accuracy and in searches per claim; a re-run finds everything up to date."""

import json

from workbench.agent_packs.kgv.report import paired_vs_agent
from workbench.agents.steps import AgentTrajectory


def test_agent_grpo_trains_chooses_and_reports_searches_against_the_agent(tmp_path,
                                                                           tiny_model):
    from workbench.agent_packs.kgv.report import read_report
    from workbench.config import load_config
    from workbench.runs import RunContext, RunLayout, run_pipeline

    cfg = load_config("configs/kgv_demo.yaml", [
        f"models.chat.spec={tiny_model}", "agent.dev_limit=4", "agent.train_limit=6",
        "agent.retriever=keyword", "agent.conditions=[agent,agent_grpo]",
        "agent.grpo.max_steps=2", "agent.grpo.batch_size=2", "agent.grpo.dev_share=0.34",
        "agent.grpo.settings.group_size=2", "agent.grpo.settings.tasks_per_step=1",
        "agent.grpo.settings.temperature=1.0", "agent.grpo.settings.eval_every=1",
        f"output_dir={tmp_path}", "name=tiny"])
    logs: list[str] = []
    res = run_pipeline("agent", cfg, RunContext(layout=RunLayout.of(cfg), log=logs.append))
    agent = tmp_path / "tiny" / "agent"
    rep = read_report(tmp_path / "tiny")
    assert set(rep.conditions) == {"agent", "agent_grpo"}
    assert rep.conditions["agent_grpo"]["all"].n == 4
    t = rep.training["agent_grpo"]
    # 6 training claims: 2 choose the adapter, 4 are rolled out; the 4 dev claims are scored
    assert (t.train_items, t.dev_items, t.test_items) == (4, 2, 4)
    assert t.steps == 2 and t.adapter_step in (0, 1, 2)
    assert t.tool_calls_first_quarter is not None
    p = rep.paired_vs_agent["agent_grpo"]
    assert p.n == 4 and p.vs == "agent" and 0 <= p.p_search_calls <= 1
    dev_ids = {json.loads(x)["task_id"] for x in
               (agent / "trajectories" / "agent_grpo.jsonl").read_text().splitlines()}
    rolled = "".join(f.read_text() for f in (agent / "kgv_grpo.rollouts").iterdir())
    assert rolled and not [i for i in dev_ids if f'"{i}#' in rolled]  # dev claims: never
    assert (agent / "kgv_grpo.live.jsonl").read_text().count("reward_mean") == 2
    md = (agent / "report.md").read_text()
    assert "Trained against the agent" in md and "Δ searches / claim" in md
    assert "agent after GRPO: trained 2 steps on the rollouts of 4 items" in md
    assert "agent_grpo_macro_f1" in res.figures
    logs.clear()
    run_pipeline("agent", cfg, RunContext(layout=RunLayout.of(cfg), log=logs.append))
    assert any("kgv_grpo: up to date" in m for m in logs), logs


def _run(task_id: str, searches: int, verdict: str, gold: str = "SUPPORTED"):
    steps = [{"index": i, "turn": i, "kind": "tool_call", "tool": "search"}
             for i in range(searches)]
    return AgentTrajectory.model_validate({
        "id": task_id, "task_id": task_id, "messages": [], "steps": steps,
        "final": {"label": verdict}, "metadata": {"claim": {"label": gold}}})


def test_paired_against_the_agent_counts_searches_claim_by_claim():
    """Three claims: the trained agent searches 2, 1, 0 times fewer and gets one more right;
    the sign-flip p of three negative differences is 2 / 2^3."""
    before = [_run("a", 2, "REFUTED"), _run("b", 1, "SUPPORTED"), _run("c", 1, "SUPPORTED")]
    after = [_run("a", 0, "SUPPORTED"), _run("b", 0, "SUPPORTED"), _run("c", 0, "SUPPORTED")]
    out = paired_vs_agent({"agent": before, "agent_grpo": after})
    g = out["agent_grpo"]
    assert g["delta_accuracy"] == 1 / 3 and (g["only_base"], g["only_this"]) == (0, 1)
    assert g["delta_search_calls"] == -4 / 3 and g["p_search_calls"] == 0.25
    assert paired_vs_agent({"agent": before}) is None
