"""A round's plan: the target subset and the synthesis recipe, made from the current model's
failures, and its approval by a person (who may change the target or the weightings)."""

from __future__ import annotations

import time
from typing import Any

from workbench.errors import WorkbenchError
from workbench.loop.evaluator import Evaluator
from workbench.loop.failures import count_modes, mine
from workbench.loop.guards import plan_guards
from workbench.loop.records import FailureRow, Plan, Round, now, round_name
from workbench.loop.store import RoundStore
from workbench.loop.suites import Suites, per_subset
from workbench.loop.synth import by_job
from workbench.records import EvalResult
from workbench.text import percent


def plan_round(store: RoundStore, ev: Evaluator) -> Round:
    """Evaluate the current model, mine its failures and write the next round's plan."""
    rs = store.rounds()
    if rs and rs[-1].status != "decided":
        raise WorkbenchError(f"round {rs[-1].index} is {rs[-1].status}: decide it before "
                             "planning the next (`workbench loop decide`)")
    store.save_config(ev.cfg)
    t0 = time.perf_counter()
    st = store.state()
    index = rs[-1].index + 1 if rs else 1
    model = ev.open_model(st.current)
    rows = ev.evaluation(st.current, model=model)
    failures, info = mine(rows, ev.suites, model=model, search=ev.search,
                          scoring=ev.lc.suites.scoring, k=ev.lc.synth.retrieve_k,
                          log=store.log)
    folder = store.folder(index)
    folder.mkdir(parents=True, exist_ok=True)
    store.files.write("failures", failures, round_name(index))
    plan = make_plan(ev.lc, ev.suites, rows, failures, rs)
    r = Round(index=index, parent=st.current.sha256 if st.current else None, plan=plan,
              created_at=now(), suites_digest=ev.suites.digest,
              steps={"failures": {**info, "rows": len(failures),
                                  "modes": count_modes(failures),
                                  "seconds": round(time.perf_counter() - t0, 1)}})
    store.log(f"== round {index} planned: target {plan.target} ({plan.rationale})")
    return store.save(r)


def approve_plan(store: RoundStore, ev: Evaluator, index: int | None, *, by: str,
                 edits: dict[str, Any] | None) -> Round:
    """Approve the planned round's plan, with `edits` (target, weightings) re-planned."""
    r = store.round(index)
    if r.status != "planned":
        raise WorkbenchError(f"round {r.index} is {r.status}, not planned")
    if not by.strip():
        raise WorkbenchError("say who approves (--by NAME)")
    plan = r.plan
    if edits:
        unknown = set(edits) - {"target", "weightings"}
        if unknown:
            raise WorkbenchError(f"plan edits: unknown fields {sorted(unknown)} (target, "
                                 "weightings)")
        if "target" in edits and edits["target"] not in plan.subsets:
            raise WorkbenchError(f"target {edits['target']!r} is not a subset "
                                 f"({', '.join(plan.subsets)})")
        if not edits.get("weightings", plan.weightings):
            raise WorkbenchError("weightings: give at least one anchor weight")
        lc = ev.lc.model_copy(update={
            "target": edits.get("target", plan.target),
            "weightings": edits.get("weightings", plan.weightings)})
        # a new target gets its own recipe, modes and rationale, from the same failures
        st = store.state()
        rows = ev.evaluation(st.current)
        failures = store.files.read("failures", round_name(r.index))
        plan = make_plan(lc, ev.suites, rows, failures, store.rounds()[:-1])
        # what the plan was made with stays (a later config does not rewrite it)
        plan = plan.model_copy(update={"hyper": r.plan.hyper, "guards": r.plan.guards,
                                       "review_data": r.plan.review_data,
                                       "rationale": r.plan.rationale})
        if plan.target != r.plan.target:
            plan.rationale = f"set by {by} at approval (planned: {r.plan.target})"
    r = r.model_copy(update={"plan": plan, "status": "approved", "approved_by": by,
                             "approved_at": now()})
    store.log(f"== round {r.index} approved by {by}")
    return store.save(r)


def make_plan(lc, suites: Suites, rows: list[EvalResult], failures: list[FailureRow],
              earlier: list[Round]) -> Plan:
    subsets = suites.subsets
    dev = per_subset(rows)
    acc = {s: (sum(dev[("dev", s)].values()) / len(dev[("dev", s)])
               if dev.get(("dev", s)) else 1.0) for s in subsets}
    reverted = {r.plan.target for r in earlier[-1:] if r.decision
                and r.decision.choice == "revert"}
    if lc.target is not None:
        if lc.target not in subsets:
            raise WorkbenchError(f"loop.target {lc.target!r} is not a subset "
                                 f"({', '.join(subsets)})")
        target, why = lc.target, "set in the config"
    else:
        order = sorted(subsets, key=lambda s: (s in reverted, acc[s], s))
        target = order[0]
        why = (f"weakest dev subset: {percent(acc[target])} "
               f"({', '.join(f'{s} {percent(acc[s])}' for s in subsets)})")
        if reverted and target not in reverted:
            why += f"; {', '.join(sorted(reverted))} was reverted last round"
    mine_ = [f for f in failures if f.subset == target]
    jobs = by_job(mine_)
    s = lc.synth
    recipe = {"knowledge": len(jobs.get("knowledge", [])) * s.knowledge_per_failure,
              "reasoning": len(jobs.get("reasoning", [])) * s.reasoning_per_failure,
              "calibration": len(jobs.get("calibration", []))}
    targeted = min(sum(recipe.values()), s.max_samples)
    recipe["anchors"] = round(s.anchor_ratio * max(lc.weightings) * targeted)
    return Plan(target=target, rationale=why,
                benchmarks=["dev"] + (["open_dev"] if suites.open_dev else []) + ["test"]
                + (["retention"] if suites.retention else []) + (["open"] if suites.open
                                                                 else []),
                subsets=subsets, recipe=recipe, modes=count_modes(mine_),
                weightings=list(lc.weightings), hyper=lc.train.model_dump(mode="json"),
                review_data=lc.review_data,
                guards=plan_guards(subsets, lc.guards, retention=bool(suites.retention),
                                   opens=bool(suites.open)))
