"""Agent policies on the bundled SmolLM2-135M: guided, free (unconstrained), free (constrained).

    python benchmarks/bench_policies.py [--claims 32] [--rf 40] [--backends B1,B2] [--json FILE]

The same KGV dev claims (hybrid retrieval, ReAct) and RF design items run under three
policies: `guided` (the pack proposes calls, the model's log-likelihood picks), `free_unc`
(the model writes its own calls as text; the ones that parse are taken) and `free` (every
turn a forced tool call generated under the tools' JSON schemas: issue 28). For each: the
share of model turns that produced a usable call, the share whose call a tool refused (bad
arguments), the task metric with its Wilson interval and prediction counts, exact McNemar
tests between policies on the same items, and seconds per item. With several `--backends`
(e.g. `transformers,llamacpp`: issue 42) every policy runs on each generation engine and each
engine's correct items are tested against the first one's (exact McNemar, same items); the
guided policy picks by log-likelihood, which stays on transformers, so it is the control.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from itertools import combinations
from pathlib import Path

POLICIES = ("guided", "free_unconstrained", "free")


def turn_stats(trajs) -> dict:
    valid = no_call = refused = turns = 0
    for t in trajs:
        turns += t.model_turns
        for s in t.steps:
            if s.kind == "final" or (s.kind == "tool_call" and not s.error):
                valid += 1
            elif s.kind == "tool_call" and s.error and "budget" not in s.error:
                refused += 1
            elif s.kind == "error" and "calls no tool" in (s.error or ""):
                no_call += 1
    asked = valid + refused + no_call
    return {"model_turns": turns, "valid_calls": valid, "refused_calls": refused,
            "no_call_turns": no_call,
            "valid_call_rate": round(valid / asked, 3) if asked else None,
            "refused_rate": round(refused / turns, 3) if turns else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--claims", type=int, default=32)
    ap.add_argument("--rf", type=int, default=40)
    ap.add_argument("--backends", default="", help="comma-separated generation engines "
                                                    "(default: the default one)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    from workbench.models import load_model

    backends = [b for b in a.backends.split(",") if b] or [None]
    out: dict = {}
    right: dict = {}
    for b in backends:
        model = load_model("default", backend=b)
        key = b or model.identity
        print("engine", key, model.identity, flush=True)
        out[key], right[key] = run_policies(model, a)
        model.close()
    from workbench.evaluate.stats import mcnemar_exact

    first = next(iter(right))
    out["engines_mcnemar_p"] = {
        key: {task: {pol: round(mcnemar_exact(right[first][task][pol], r[task][pol]), 4)
                     for pol in POLICIES} for task in r}
        for key, r in right.items() if key != first}
    print(json.dumps(out.get("engines_mcnemar_p")))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out if len(backends) > 1 else out[first], indent=1))


def run_policies(model, a) -> tuple[dict, dict]:
    """Every policy on KGV claims and RF items with `model`: (figures, correct per item)."""
    from workbench.agent_packs.kgv.api import make_agent, make_setup, select
    from workbench.agent_packs.kgv.metrics import prediction, summarise
    from workbench.agent_packs.kgv.pack import load_claims
    from workbench.agent_packs.rf.api import _with_tools, load_items
    from workbench.agent_packs.rf.bench import correct
    from workbench.agents.runner import run_agents
    from workbench.config import load_config
    from workbench.evaluate.stats import mcnemar_exact, wilson_interval
    from workbench.progress import quiet_libraries

    quiet_libraries()
    out: dict = {"kgv": {}, "rf": {}}
    cfg = load_config("configs/kgv_demo.yaml")
    agent = make_agent(cfg, Path(tempfile.mkdtemp()), log=lambda m: None)
    claims = select(load_claims("datasets/kgv/claims.jsonl"), "dev", a.claims, 0)
    right: dict[str, dict[str, list[bool]]] = {"kgv": {}, "rf": {}}
    for pol in POLICIES:
        setup = make_setup(agent, cfg.agent, "agent", policy=pol)
        t0 = time.perf_counter()
        trajs = run_agents(model, [agent.task(c) for c in claims], setup, desc=pol)
        wall = time.perf_counter() - t0
        s = summarise(trajs)
        right["kgv"][pol] = [prediction(t) == t.metadata["claim"]["label"] for t in trajs]
        k = sum(right["kgv"][pol])
        out["kgv"][pol] = {"claims": len(claims), **turn_stats(trajs),
                           "accuracy": round(k / len(claims), 3),
                           "accuracy_ci95": [round(x, 3) for x in
                                             wilson_interval(k, len(claims))],
                           "predictions": s["predictions"],
                           "seconds_per_item": round(wall / len(claims), 2)}
        print("kgv", pol, json.dumps(out["kgv"][pol]), flush=True)

    rcfg = load_config("configs/rf_agent_demo.yaml")
    items = load_items("datasets/rf_design")[:a.rf]
    for pol in POLICIES:
        ac = rcfg.agent.model_copy(update={"policy": pol})
        t0 = time.perf_counter()
        rows = _with_tools(model, items, ac)
        wall = time.perf_counter() - t0
        from workbench.agents.steps import AgentTrajectory

        trajs = [AgentTrajectory.model_validate(r["trajectory"]) for r in rows]
        right["rf"][pol] = [correct(r["prediction"], it) for r, it in zip(rows, items,
                                                                          strict=True)]
        k = sum(right["rf"][pol])
        out["rf"][pol] = {"items": len(items), **turn_stats(trajs),
                          "accuracy": round(k / len(items), 3),
                          "accuracy_ci95": [round(x, 3) for x in
                                            wilson_interval(k, len(items))],
                          "answered": sum(r["prediction"] is not None for r in rows),
                          "seconds_per_item": round(wall / len(items), 2)}
        print("rf", pol, json.dumps(out["rf"][pol]), flush=True)
    out["mcnemar_p"] = {task: {f"{x} vs {y}": round(mcnemar_exact(r[x], r[y]), 4)
                               for x, y in combinations(POLICIES, 2)}
                        for task, r in right.items()}
    print(json.dumps(out["mcnemar_p"]))
    return out, right


if __name__ == "__main__":
    main()
