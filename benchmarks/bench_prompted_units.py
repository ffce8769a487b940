"""Can a unit in the prompt move a small prompted data agent? The ceiling and the effect.

For the learning tasks of one Chinook site (the knowledge track's experiment sites), per
scaffold (react, plan, reflexion):

- coverage: tasks whose candidate plans (sampled from the grammar, no units, no verifier)
  hold a right one: the most any choice among them can verify;
- no units: what the agent verifies with nothing in its prompt;
- oracle units: what it verifies when its prompt holds the workflow of a right candidate of
  every covered task of the slice (at most 3 per family, the most supported first): the most
  that rendering units into the prompt can buy with this model;
- seconds and model turns per task.

    python benchmarks/bench_prompted_units.py --tasks 12 --model default \
        --json benchmarks/results/prompted_units.json

Outcomes are cached per prompt in the site folder (`agent_outcomes.jsonl`): --fresh removes
the cache first so the times are cold.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from workbench.evaluate.stats import mcnemar_exact, wilson_interval
    from workbench.federated.knowledge.site import DataAgentSite, make_data_sites, workflow_of

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=12, help="learning tasks of the site")
    ap.add_argument("--model", default="default", help="chat model spec")
    ap.add_argument("--candidates", type=int, default=8)
    ap.add_argument("--out", default="runs/bench_prompted_units", help="site folders")
    ap.add_argument("--fresh", action="store_true", help="drop cached outcomes first")
    ap.add_argument("--json", default=None, help="write the numbers here")
    a = ap.parse_args()
    folder = make_data_sites(a.out, chinook_parts=4, extra=[])[0]
    if a.fresh:
        (folder / "agent_outcomes.jsonl").unlink(missing_ok=True)
    site = DataAgentSite(folder, agent="prompted",
                         agent_settings={"model": a.model, "candidates": a.candidates})
    tasks = site.tasks("learn", a.tasks)
    probe = site.prompted("react")
    units, covered = [], []
    for t in tasks:
        right = next((c for c in probe.candidates(t) if t.check(probe.run_sql(c.sql))), None)
        covered.append(right is not None)
        if right is not None:
            units.append({"id": t.id, "kind": "workflow", "family": t.category,
                          "steps": list(workflow_of(right.moves)), "support": 1})
    rows = []
    for scaffold in ("react", "plan", "reflexion"):
        res = {}
        for cond, view in (("none", []), ("oracle", units)):
            t0 = time.perf_counter()
            out = site.attempt(tasks, view, scaffold=scaffold)
            res[cond] = {"verified": [o.verified for o in out],
                         "turns": sum(o.iterations for o in out),
                         "seconds": round(time.perf_counter() - t0, 1)}
        a_, b_ = res["none"]["verified"], res["oracle"]["verified"]
        rows.append({"scaffold": scaffold, "tasks": len(tasks), "covered": sum(covered),
                     **{f"{c}_{k}": v for c, r in res.items() for k, v in r.items()},
                     "none_ci": wilson_interval(sum(a_), len(a_)),
                     "oracle_ci": wilson_interval(sum(b_), len(b_)),
                     "mcnemar_p": mcnemar_exact(a_, b_)})
    print(f"| scaffold | tasks | covered (ceiling) | no units | oracle units | McNemar p | "
          f"model turns (none / oracle) | s (none / oracle) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['scaffold']} | {r['tasks']} | {r['covered']} | "
              f"{sum(r['none_verified'])} [{r['none_ci'][0]:.2f}, {r['none_ci'][1]:.2f}] | "
              f"{sum(r['oracle_verified'])} [{r['oracle_ci'][0]:.2f}, "
              f"{r['oracle_ci'][1]:.2f}] | {r['mcnemar_p']:.3f} | {r['none_turns']} / "
              f"{r['oracle_turns']} | {r['none_seconds']} / {r['oracle_seconds']} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"model": a.model, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
