"""The improvement loop (Cura) as a library: plan -> approve -> run -> decide, round by round.

    plan     evaluate the current model on every suite (cached per adapter), mine the dev
             and open failures with their modes, pick the target subset, write the plan
    approve  a person (or --auto) accepts the plan, optionally editing it
    run      synthesise per failure mode + retention anchors -> quality gates -> mixture
             search (short LoRA runs, scored on a held-out dev slice) -> the candidate LoRA
             -> evaluation on every suite -> per-subset deltas and the guards
    decide   keep / continue / revert / deploy; revert proves the current adapter is the
             previous one by its sha256

Each candidate is trained from the base model on the cumulative data of the kept rounds
plus this round's mixture, so every kept adapter is reproducible from its data file. Every
step writes its files atomically and records itself in `round.json`; a killed run re-run
continues at the first unfinished step.

`Loop` is the loop's folder and its four verbs; each verb's work is its own module:
`plan` (the plan and its approval), `review` (a person's review of the data), `steps` (a
round's run), `decide` (keep / revert), `report` (report.md, history.md). Those modules take
the two parts a `Loop` is made of, never the `Loop`: its `RoundStore` (`store`: the state and
the rounds on disk) and its `Evaluator` (`evaluator`: the suites, the models and the cached
evaluations).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.config import experiment_config_model
from workbench.errors import WorkbenchError
from workbench.loop.decide import decide_round
from workbench.loop.evaluator import Evaluator
from workbench.loop.guards import recommend
from workbench.loop.pack import loop_pack
from workbench.loop.plan import approve_plan, make_plan, plan_round
from workbench.loop.records import Choice, KeptAdapter, LoopState, Round, round_name
from workbench.loop.report import history_rows, write_history
from workbench.loop.review import approve_data
from workbench.loop.steps import run_steps
from workbench.loop.store import RoundStore
from workbench.loop.suites import Suites
from workbench.loop.synth import LoopPack
from workbench.records import EvalResult
from workbench.registry import PipelineResult
from workbench.runs import RunContext, RunLayout

# older imports of these names from here keep working
__all__ = ["Loop", "history_rows", "loop_pack", "make_plan", "run"]


class Loop:
    """One loop's folder: `state.json`, `rounds/NN/`, `adapters/<sha>/`, `evals/<key>/`; its
    rounds are the `store`'s, its suites and models the `evaluator`'s, and each verb is a
    function of the two (and of the run's context, for a round's run)."""

    def __init__(self, cfg, ctx: RunContext | None = None, *, log: Callable[[str], None]
                 = print):
        self.cfg, self.lc = cfg, cfg.loop
        self.ctx = ctx or RunContext(layout=RunLayout.of(cfg), log=log)
        self.log = self.ctx.log
        self.root = self.ctx.layout.folder("loop")
        self.store = RoundStore(self.root, log=self.log)
        self.files = self.store.files
        self.evaluator = Evaluator(cfg, self.files, log=self.log)

    @classmethod
    def at(cls, run_dir: str | Path, *, log: Callable[[str], None] = print) -> Loop:
        """The loop of a run folder, with the config its plans were made with."""
        p = RunLayout.at(run_dir).artifact("loop", "config")
        if not p.exists():
            raise WorkbenchError(f"{run_dir}: no improvement loop here (no loop/config.yaml)")
        import yaml

        cfg = experiment_config_model().model_validate(yaml.safe_load(p.read_text()))
        return cls(cfg, RunContext(layout=RunLayout.at(run_dir), log=log))

    def save_config(self) -> None:
        self.store.save_config(self.cfg)

    # ------------------------------------------------------------------ the store's
    def state(self) -> LoopState:
        return self.store.state()

    def save_state(self, st: LoopState) -> None:
        self.store.save_state(st)

    def folder(self, index: int) -> Path:
        return self.store.folder(index)

    def rounds(self) -> list[Round]:
        return self.store.rounds()

    def round(self, index: int | None = None) -> Round:
        return self.store.round(index)

    def save(self, r: Round) -> Round:
        return self.store.save(r)

    # ------------------------------------------------------------------ the evaluator's
    @property
    def suites(self) -> Suites:
        return self.evaluator.suites

    @property
    def pack(self) -> LoopPack:
        return self.evaluator.pack

    def open_model(self, adapter: KeptAdapter | Path | None):
        return self.evaluator.open_model(adapter)

    def judge(self):
        return self.evaluator.judge()

    def search(self, queries: list[str], k: int):
        return self.evaluator.search(queries, k)

    def evaluation(self, adapter: KeptAdapter | Path | None, *, model=None,
                   name: str | None = None, suites: tuple[str, ...] | None = None
                   ) -> list[EvalResult]:
        return self.evaluator.evaluation(adapter, model=model, name=name,
                                         **({"suites": suites} if suites else {}))

    # ------------------------------------------------------------------ the verbs
    def plan(self) -> Round:
        """Evaluate the current model, mine its failures and write the next round's plan."""
        return plan_round(self.store, self.evaluator)

    def approve(self, index: int | None = None, *, by: str, edits: dict[str, Any] | None = None,
                data: bool = False, review: dict[str, Any] | None = None) -> Round:
        """Approve the planned round's plan, or (`data=True`) the synthesised data of a
        running round, with `review` = {sample id: "reject" | {"answer": edited text}}."""
        if data:
            return approve_data(self.store, index, by=by, review=review or {})
        return approve_plan(self.store, self.evaluator, index, by=by, edits=edits)

    def run_round(self, index: int | None = None) -> Round:
        return run_steps(self.store, self.evaluator, self.ctx, index)

    def decide(self, index: int | None, choice: Choice, *, reason: str, by: str,
               plan_next: bool = True) -> Round:
        r = decide_round(self.store, self.evaluator, index, choice, reason=reason, by=by)
        if choice == "continue" and plan_next:
            self.plan()
        return r

    # ------------------------------------------------------------------ unattended
    def auto(self, rounds: int) -> list[Round]:
        """Plan, approve, run and decide by the guards, `rounds` times (resuming an
        unfinished round first)."""
        self.save_config()
        done: list[Round] = []
        for _ in range(rounds):
            rs = self.rounds()
            r = rs[-1] if rs and rs[-1].status != "decided" else self.plan()
            if r.status == "planned":
                r = self.approve(r.index, by="auto")
            if r.status in ("approved", "running"):
                r = self.run_round(r.index)
                if r.status == "running":  # stopped
                    return done
            if r.status == "awaiting_decision":
                if "guards" in r.steps:
                    choice, why = recommend(r.guards, r.deltas, self.lc.guards.min_gain)
                else:
                    choice, why = "revert", "no candidate was trained (no data)"
                r = self.decide(r.index, choice, reason=why, by="auto")
            done.append(r)
        return done


# ------------------------------------------------------------------------------- registry

def run(cfg, ctx: RunContext) -> PipelineResult:
    """The registry's entry (`workbench jobs start loop`, the demo, the app): by `loop.mode`,
    `loop.rounds` unattended rounds (the guards decide), or one plan, or one round's run."""
    loop = Loop(cfg, ctx)
    t0 = time.perf_counter()
    if cfg.loop.mode == "plan":
        r = loop.plan()
        return PipelineResult(pipeline="loop", run_dir=str(ctx.layout.root),
                              outputs={"round": str(loop.files.path(
                                  "round", round_name(r.index)))},
                              figures={"round": r.index, "target": r.plan.target},
                              message=f"round {r.index} planned: target {r.plan.target}")
    if cfg.loop.mode == "run":
        loop.save_config()
        r = loop.run_round()
        return PipelineResult(pipeline="loop", run_dir=str(ctx.layout.root),
                              outputs={"report": str(loop.files.path(
                                  "report", round_name(r.index)))},
                              figures={"round": r.index, "status": r.status,
                                       "recommendation": r.recommendation},
                              message=f"round {r.index}: {r.status}"
                                      + (f"; the guards recommend {r.recommendation}"
                                         if r.recommendation else ""))
    done = loop.auto(cfg.loop.rounds)
    write_history(loop.store)
    lines = [f"round {r.index}: target {r.plan.target}, "
             f"{r.decision.choice if r.decision else r.status}"
             + (f" ({r.decision.reason})" if r.decision else "") for r in done]
    return PipelineResult(
        pipeline="loop", run_dir=str(ctx.layout.root),
        outputs={"history": str(loop.files.path("history")),
                 **{f"round_{r.index}": str(loop.files.path("report", round_name(r.index)))
                    for r in done}},
        figures={f"round_{r.index}": r.decision.choice if r.decision else r.status
                 for r in done} | {"seconds": round(time.perf_counter() - t0, 1)},
        message="\n".join(lines + [f"history: {loop.files.path('history')}"]))
