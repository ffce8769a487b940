"""Prompted data agents (the knowledge track's `agent: prompted`): units rendered into the
prompt, the three scaffolds through the agent loop, Reflexion's trials, the outcome cache, and
federated rounds with prompted sites. The scripted `fake` backend scores a continuation by the
words it shares with the prompt, so a unit in the prompt changes its choice the way a real
model's copying does; it goes through the same model protocol as the real backends."""

from __future__ import annotations

import json

import pytest

from workbench.federated.knowledge.agent import render_units, step_text
from workbench.federated.knowledge.site import DataAgentSite, make_data_sites, workflow_of


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("agent_sites")
    return make_data_sites(out, chinook_parts=2, extra=[], scaffolds=["react", "plan"])[0]


def oracle_units(site, scaffold, tasks):
    """For each task whose candidates hold a right plan: the workflow of that plan."""
    agent = site.prompted(scaffold)
    units = []
    for t in tasks:
        right = next((c for c in agent.candidates(t) if t.check(agent.run_sql(c.sql))), None)
        if right is not None:
            units.append({"id": t.id, "kind": "workflow", "family": t.category,
                          "steps": list(workflow_of(right.moves)), "support": 2})
    return units


def test_units_render_in_the_plans_own_words():
    assert step_text("op=top") == "find which group has the most or the highest value"
    assert step_text("lit=conds:gt") == "a filter: whose <column> is greater than <value>"
    assert "linked" in step_text("lit=conds:eq:via1")
    units = [{"id": "a", "family": "lookup", "steps": ["op=select", "lit=conds:eq"],
              "support": 1},
             {"id": "b", "family": "lookup", "steps": ["op=select", "lit=conds:eq"],
              "support": 5},
             {"id": "c", "family": "lookup", "steps": ["op=lookup", "lit=conds:eq"],
              "support": 3},
             {"id": "d", "family": "join", "steps": ["op=count"], "support": 9}]
    text = render_units(units, "lookup")
    lines = text.splitlines()
    assert lines[0] == "What worked for lookup questions at other sites:"
    assert len(lines) == 3  # same steps rendered once; the join unit is not this family's
    assert lines[1].startswith("- list the distinct values")  # most supported first
    assert render_units(units, "aggregation") == ""


def test_scaffolds_run_through_the_agent_loop_and_units_reach_the_prompt(site_dir):
    site = DataAgentSite(site_dir, agent="prompted", agent_settings={"model": "fake"})
    tasks = site.tasks("learn", 8)
    units = oracle_units(site, "react", tasks)
    assert units, "no task of the slice has a right plan among its candidates"
    covered = {u["id"] for u in units}
    agent = site.prompted("react")
    t = next(t for t in tasks if t.id in covered)
    assert "What worked for" in agent.system(t, units)
    assert "What worked" not in agent.system(t, [])
    results = {}
    for scaffold in ("react", "plan", "reflexion"):
        base = site.attempt(tasks, [], scaffold=scaffold)
        guided = site.attempt(tasks, units, scaffold=scaffold)
        results[scaffold] = (sum(o.verified for o in base), sum(o.verified for o in guided))
        for o in guided:
            assert o.iterations >= 2 and o.executions >= 1  # a run and an answer at least
            if o.verified:
                assert o.workflow and all("=" in s for s in o.workflow)
    print("verified without / with the right workflows in the prompt:", results)
    # the units change what the model picks: more right answers at the first trial, and
    # never fewer with Reflexion's second trial
    assert results["react"][1] > results["react"][0], results
    assert results["plan"][1] > results["plan"][0], results
    assert results["reflexion"][1] >= results["reflexion"][0] >= results["react"][0], results
    # plan-then-execute spends a turn on its plan; Reflexion retries what failed
    plan = site.prompted("plan")
    react = site.prompted("react")
    assert plan.model_runs == react.model_runs
    refl = site.prompted("reflexion")
    assert refl.model_runs > react.model_runs  # failed tasks ran a second trial


def test_reflexion_shows_lessons_and_does_not_repeat_a_failed_answer(site_dir):
    from workbench.agents.runner import AgentTask, run_reflexion
    from workbench.federated.knowledge.site import chat_model

    site = DataAgentSite(site_dir, agent="prompted", agent_settings={"model": "fake",
                                                                      "trials": 3})
    agent = site.prompted("reflexion")
    tasks = site.tasks("learn", 6)
    for t in tasks:
        agent._tasks[t.id] = t
    todo = [AgentTask(id=t.id, prompt=t.question, system=agent.system(t, []),
                      metadata={"task_id": t.id}) for t in tasks]
    runs = run_reflexion(chat_model("fake"), todo, agent._setup(), evaluate=agent.judge,
                         lesson=agent.lesson, trials=3)
    retried = [r for r in runs if len(r) > 1]
    assert retried, "every task was right at the first trial"
    for trials in retried:
        answers = [(x.final or {}).get("sql") for x in trials]
        assert len(set(answers)) == len(answers)  # a failed answer is never given again
        system = trials[1].messages[0].content
        assert "Lessons from your earlier trials:" in system and "Trial 1 answered" in system
        assert trials[-1].metadata["lessons"][0].startswith("Trial 1 answered with")
    assert all(agent.judge(r[-1])[0] or len(r) == 3 for r in runs)


def test_outcomes_are_cached_per_prompt_and_survive_a_restart(site_dir, tmp_path):
    import shutil

    d = tmp_path / "site"
    shutil.copytree(site_dir, d)
    (d / "agent_outcomes.jsonl").unlink(missing_ok=True)
    site = DataAgentSite(d, agent="prompted", agent_settings={"model": "fake"})
    tasks = site.tasks("learn", 6)
    first = site.attempt(tasks, [])
    agent = site.prompted("react")
    ran = agent.model_runs
    assert ran == len(tasks)
    fam = tasks[0].category
    other = {"id": "u", "family": "no_such_family", "steps": ["op=count"], "support": 2}
    assert site.attempt(tasks, [other]) == first  # no task's prompt changed: no run
    assert agent.model_runs == ran
    mine = {"id": "v", "family": fam, "steps": ["op=count"], "support": 2}
    site.attempt(tasks, [mine])
    assert agent.model_runs == ran + sum(t.category == fam for t in tasks)
    # a torn last line costs that one task, nothing else
    with (d / "agent_outcomes.jsonl").open("a") as f:
        f.write('{"key": "tor')
    again = DataAgentSite(d, agent="prompted", agent_settings={"model": "fake"})
    assert again.attempt(tasks, []) == first
    assert again.prompted("react").model_runs == 0
    again.attempt(tasks, [mine], scaffold="plan")  # new records after the torn line
    third = DataAgentSite(d, agent="prompted", agent_settings={"model": "fake"})
    third.attempt(tasks, [mine], scaffold="plan")
    assert third.prompted("plan").model_runs == 0


def test_bad_agent_settings_name_the_field(site_dir):
    from workbench.errors import WorkbenchError

    with pytest.raises(WorkbenchError, match=r"knowledge\.prompted\.candidates"):
        DataAgentSite(site_dir, agent="prompted", agent_settings={"candidates": 1})
    with pytest.raises(WorkbenchError, match=r"knowledge\.prompted\.temprature"):
        DataAgentSite(site_dir, agent="prompted", agent_settings={"temprature": 1})
    with pytest.raises(WorkbenchError, match="grammar or prompted"):
        DataAgentSite(site_dir, agent="llm")


def test_federated_rounds_with_prompted_sites(tmp_path):
    """Two rounds over the real ClientApp in process: prompted sites send operations and
    counts only, no canary leaves, and the listener's scaffold contributes nothing."""
    from workbench.config import load_config
    from workbench.federated.flower_app import client_app
    from workbench.federated.knowledge.api import knowledge_sites, run_knowledge_rounds

    cfg = load_config(None, [
        "federated.track=knowledge", "federated.rounds=2", "federated.model=",
        "federated.knowledge.agent=prompted", "federated.knowledge.prompted={model: fake}",
        "federated.knowledge.slice=4", "federated.knowledge.chinook_parts=3",
        "federated.knowledge.extra=[]", "federated.knowledge.scaffolds=[react,plan,reflexion]",
        "federated.knowledge.listener=2", "federated.knowledge.poison=null",
        "federated.guards.min_nodes=3", "federated.guards.min_replies=3",
        f"output_dir={tmp_path}", "name=kp"])
    fc = cfg.federated
    sites = knowledge_sites(fc, tmp_path / "fed")
    summary = run_knowledge_rounds(fc, sites, tmp_path / "fed" / "federated", client_app(),
                                   log=lambda m: None)
    assert summary["wire"]["canary_leaks"] == 0 and summary["wire"]["long_strings"] == 0
    rounds = [json.loads(x) for x in
              (tmp_path / "fed" / "federated" / "rounds.jsonl").read_text().splitlines()]
    assert [r["used"] for r in rounds] == [3, 3]
    for d in sites:  # every site ran prompted agents (their outcomes are cached locally)
        assert (d / "agent_outcomes.jsonl").exists()


def test_insights_contrast_successes_with_failures_and_merge_by_embedding(site_dir, embedder):
    """ExpeL's success-vs-failure comparison: a step the family's right plans share and its
    wrong ones lack becomes a free-text insight; the server merges paraphrased insights of a
    family by MiniLM cosine and counts each site's vote once."""
    from workbench.federated.knowledge.units import KnowledgeBase, apply_round
    from workbench.records import KnowledgeOp
    from workbench.federated.knowledge.site import Outcome, contrast_insight

    win, lose = ("op=select", "lit=conds:eq"), ("op=count", "lit=conds:eq")
    text = contrast_insight("lookup", [win, win], [lose, lose])
    assert text == ("For lookup questions, right plans: list the distinct values of a "
                    "column. Wrong plans: count the rows.")
    assert contrast_insight("lookup", [win, win], [win, win]) is None  # nothing separates
    site = DataAgentSite(site_dir)
    outcomes = [Outcome(f"w{i}", "lookup", True, 2, 2, win, tried=win) for i in range(2)]
    outcomes += [Outcome(f"f{i}", "lookup", False, 2, 2, (), tried=lose) for i in range(2)]
    ops = site.propose(outcomes, [], min_support=2)
    (ins,) = [o for o in ops if o.kind == "insight"]
    assert ins.op == "ADD" and ins.text == text and ins.count == 2
    held = [{"id": "i1", "kind": "insight", "family": "lookup", "text": text, "steps": []}]
    assert KnowledgeOp(op="AGREE", target="i1", count=2) in site.propose(outcomes, held,
                                                                          min_support=2)
    kb = KnowledgeBase()
    para = ("For lookup questions, right plans: list distinct values of a column. "
            "Wrong plans: count rows.")
    other = "For join questions, right plans: a filter on a linked table."
    apply_round(kb, [("a", [KnowledgeOp(op="ADD", kind="insight", family="lookup", text=text)]),
                     ("b", [KnowledgeOp(op="ADD", kind="insight", family="lookup", text=para)]),
                     ("c", [KnowledgeOp(op="ADD", kind="insight", family="join", text=other)])],
                k_min=2, rnd=1, embed=embedder.embed, threshold=0.9)
    lookup = [u for u in kb.units.values() if u.family == "lookup"]
    assert len(lookup) == 1 and set(lookup[0].support) == {"a", "b"}
    assert lookup[0].status == "active" and len(kb.units) == 2


def test_a_task_without_any_plan_fails_without_stopping_the_others(site_dir, tmp_path,
                                                                    monkeypatch):
    import shutil

    from workbench.federated.knowledge.agent import DataAgent

    d = tmp_path / "site"
    shutil.copytree(site_dir, d)
    (d / "agent_outcomes.jsonl").unlink(missing_ok=True)
    site = DataAgentSite(d, agent="prompted", agent_settings={"model": "fake"})
    tasks = site.tasks("learn", 4)
    real = DataAgent.candidates
    monkeypatch.setattr(DataAgent, "candidates",
                        lambda self, t: [] if t.id == tasks[0].id else real(self, t))
    out = site.attempt(tasks, [])
    assert not out[0].verified and out[0].iterations == 0
    assert site.prompted("react").model_runs == len(tasks) - 1
