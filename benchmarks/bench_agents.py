"""Domain agents on the bundled model: what a claim costs, and what prefix reuse saves.

    python benchmarks/bench_agents.py --claims 32 --json bench_agents.json

1. Scoring with and without the shared-prefix cache (local backend): the guided agent's
   first-turn requests for N dev claims (system prompt, tool descriptions, the claim; four
   candidate calls each), scored in one call both ways; seconds, ratio, largest difference in
   log-probability.
2. KGV conditions on the same N dev claims (closed book, single-turn RAG, the agent; guided,
   batch-calibrated, hybrid retrieval): wall seconds per claim, model turns, search calls
   per claim, accuracy with its Wilson interval.
3. RF tools agent on the 40 design items: seconds per item, tool calls per item.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--claims", type=int, default=32)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    from workbench.agents.runner import AgentState, run_agents
    from workbench.config import load_config
    from workbench.agent_packs.kgv.api import make_agent, make_setup, select
    from workbench.agent_packs.kgv.metrics import summarise
    from workbench.agent_packs.kgv.pack import load_claims
    from workbench.evaluate.stats import wilson_interval
    from workbench.models import load_model
    from workbench.models.base import ScoreRequest
    from workbench.models.tools import TemplateTools, template_messages, tool_call_text
    from workbench.progress import quiet_libraries

    quiet_libraries()
    out: dict = {}
    cfg = load_config("configs/kgv_demo.yaml")
    tmp = Path(tempfile.mkdtemp())
    agent = make_agent(cfg, tmp, log=lambda m: None)
    claims = select(load_claims("datasets/kgv/claims.jsonl"), "dev", a.claims, 0)
    model = load_model("default")

    # 1. prefix reuse
    setup = make_setup(agent, cfg.agent, "agent")
    reqs = []
    for c in claims:
        task = agent.task(c)
        msgs = setup.scaffold.start(task, setup.system, "answer")
        calls = agent.propose(AgentState(task, msgs), ["search", "answer"])
        reqs.append(ScoreRequest(template_messages(msgs, TemplateTools.of(None),
                                                   setup.toolbox.specs()),
                                 [tool_call_text([x.model_dump(mode="json")]) for x in calls]))
    model.score(reqs[:2])  # warm up
    t0 = time.perf_counter()
    shared = model.score(reqs)
    t_shared = time.perf_counter() - t0
    real = model._common_prefix
    model._common_prefix = lambda ctxs: None
    t0 = time.perf_counter()
    alone = model.score(reqs)
    t_alone = time.perf_counter() - t0
    model._common_prefix = real
    diff = max(abs(x.logprob - y.logprob) for r1, r2 in zip(shared, alone)
               for x, y in zip(r1, r2))
    ptoks = len(model.tokenize(reqs[0].prompt))
    out["prefix_reuse"] = {"requests": len(reqs), "prompt_tokens": ptoks,
                           "seconds_shared": round(t_shared, 2),
                           "seconds_each_alone": round(t_alone, 2),
                           "speedup": round(t_alone / t_shared, 2),
                           "max_logprob_diff": diff}
    print(json.dumps(out["prefix_reuse"]))

    # 2. KGV conditions
    out["kgv"] = {}
    for cond in ("closed_book", "rag", "agent"):
        setup = make_setup(agent, cfg.agent, cond)
        t0 = time.perf_counter()
        trajs = run_agents(model, [agent.task(c) for c in claims], setup, desc=cond)
        wall = time.perf_counter() - t0
        s = summarise(trajs)
        k = round(s["accuracy"] * s["n"])
        out["kgv"][cond] = {"claims": len(claims), "seconds_per_claim": round(wall / len(
            claims), 3), "model_turns": s["model_turns_mean"],
            "search_calls_per_claim": s["search_calls_mean"],
            "accuracy": s["accuracy"], "accuracy_ci95": list(wilson_interval(k, s["n"])),
            "predictions": s["predictions"]}
        print(cond, json.dumps(out["kgv"][cond]))

    # 3. RF tools
    from workbench.agent_packs.rf.api import _with_tools, load_items

    items = load_items("datasets/rf_design")
    rcfg = load_config("configs/rf_agent_demo.yaml")
    t0 = time.perf_counter()
    rows = _with_tools(model, items, rcfg.agent)
    wall = time.perf_counter() - t0
    out["rf_tools"] = {"items": len(items), "seconds_per_item": round(wall / len(items), 3),
                       "tool_calls_per_item": sum(r["tool_calls"] for r in rows) / len(rows)}
    print(json.dumps(out["rf_tools"]))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
