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
round's run), `decide` (keep / revert), `report` (report.md, history.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.errors import DataError, WorkbenchError
from workbench.io import atomic_write_json, read_jsonl, write_jsonl
from workbench.loop.decide import decide_round, keep
from workbench.loop.files import LoopFiles
from workbench.loop.guards import recommend
from workbench.loop.pack import loop_pack
from workbench.loop.plan import approve_plan, make_plan, plan_round
from workbench.loop.records import Choice, KeptAdapter, LoopState, Round
from workbench.loop.report import history_rows, write_history
from workbench.loop.review import approve_data
from workbench.loop.steps import run_steps
from workbench.loop.suites import Suites, evaluate_suites, load_suites
from workbench.loop.synth import LoopPack
from workbench.loop.train import adapter_hash
from workbench.records import EvalResult
from workbench.registry import PipelineResult
from workbench.runs import RunContext, RunLayout, hash_inputs

# older imports of these names from here keep working
__all__ = ["Loop", "history_rows", "loop_pack", "make_plan", "run"]


class Loop:
    """One loop's folder: `state.json`, `rounds/NN/`, `adapters/<sha>/`, `evals/<key>/`."""

    def __init__(self, cfg, ctx: RunContext | None = None, *, log: Callable[[str], None]
                 = print):
        from workbench.runs import RunLayout

        self.cfg, self.lc = cfg, cfg.loop
        self.ctx = ctx or RunContext(layout=RunLayout.of(cfg), log=log)
        self.log = self.ctx.log
        self.root = self.ctx.layout.folder("loop")
        self.files = LoopFiles(self.root)
        self._suites: Suites | None = None
        self._pack: LoopPack | None = None
        self._searcher = None
        self._judge = None

    @classmethod
    def at(cls, run_dir: str | Path, *, log: Callable[[str], None] = print) -> Loop:
        """The loop of a run folder, with the config its plans were made with."""
        from workbench.config import experiment_config_model

        p = LoopFiles(RunLayout.at(run_dir).folder("loop")).config
        if not p.exists():
            raise WorkbenchError(f"{run_dir}: no improvement loop here (no loop/config.yaml)")
        import yaml

        cfg = experiment_config_model().model_validate(yaml.safe_load(p.read_text()))
        return cls(cfg, RunContext(layout=RunLayout.at(run_dir), log=log))

    def save_config(self) -> None:
        import yaml

        from workbench.config import dump_config
        from workbench.io import atomic_write_text

        atomic_write_text(self.files.config,
                          yaml.safe_dump(dump_config(self.cfg), sort_keys=False))

    # ------------------------------------------------------------------ state on disk
    @property
    def suites(self) -> Suites:
        if self._suites is None:
            self._suites = load_suites(self.lc.suites, seed=self.cfg.seed)
        return self._suites

    @property
    def pack(self) -> LoopPack:
        if self._pack is None:
            self._pack = loop_pack(self.lc.pack)
        return self._pack

    def state(self) -> LoopState:
        p = self.files.state
        if not p.exists():
            return LoopState()
        try:
            return LoopState.model_validate_json(p.read_bytes())
        except ValueError as e:
            raise DataError(f"not a loop state file ({str(e)[:160]})", path=str(p)) from None

    def save_state(self, st: LoopState) -> None:
        atomic_write_json(self.files.state, st.model_dump(mode="json"))

    def folder(self, index: int) -> Path:
        return self.files.round(index).folder

    def rounds(self) -> list[Round]:
        out = []
        for p in self.files.round_records():
            out.append(self._read_round(p))
        return out

    def _read_round(self, p: Path) -> Round:
        try:
            return Round.model_validate_json(p.read_bytes())
        except ValueError as e:
            raise DataError(f"not a round record ({str(e)[:160]})", path=str(p)) from None

    def round(self, index: int | None = None) -> Round:
        rs = self.rounds()
        if not rs:
            raise WorkbenchError("no rounds yet: run `workbench loop plan CONFIG` first")
        if index is None:
            return rs[-1]
        for r in rs:
            if r.index == index:
                return r
        raise WorkbenchError(f"no round {index} (rounds: {', '.join(str(r.index) for r in rs)})")

    def save(self, r: Round) -> Round:
        atomic_write_json(self.files.round(r.index).record, r.model_dump(mode="json"))
        return r

    # ------------------------------------------------------------------ models
    def _model_config(self, adapter: KeptAdapter | Path | None):
        mc = self.cfg.models.chat
        path = adapter.path if isinstance(adapter, KeptAdapter) else adapter
        if path is None:
            return mc
        return mc.model_copy(update={"options": {**mc.options, "adapter": str(path),
                                                 "merge_adapter": True}})

    def open_model(self, adapter: KeptAdapter | Path | None):
        from workbench.models.factory import open_chat_model

        return open_chat_model(self._model_config(adapter), self.cfg)

    def judge(self):
        """The rubric judge: the same for every adapter (a model judge is `judge_model`, or
        the base model without any adapter), so a delta measures the answers only."""
        from workbench.loop.rubric import KeywordJudge, ModelJudge

        s = self.lc.suites
        if s.judge == "keyword":
            return KeywordJudge()
        if self._judge is None:
            from workbench.models.factory import open_chat_model

            self._judge = ModelJudge(open_chat_model(s.judge_model or self.cfg.models.chat,
                                                     self.cfg))
        return self._judge

    def search(self, queries: list[str], k: int):
        if self._searcher is None:
            # the test terms' sections are never searched: nothing is made from them
            from workbench.rag.api import Searcher  # the loop composes pipelines

            self._searcher = Searcher(
                self.suites.training_sections(), self.files.index, retriever="keyword",
                log=self.log)
        return self._searcher(queries, k)

    # ------------------------------------------------------------------ evaluation (cached)
    def evaluation(self, adapter: KeptAdapter | Path | None, *, model=None,
                   name: str | None = None,
                   suites: tuple[str, ...] = ("dev", "open_dev", *("test", "retention",
                                                                    "open"))
                   ) -> list[EvalResult]:
        """The rows of `suites` for the base model plus `adapter`; each suite is computed once
        per adapter and suite settings (a candidate's dev rows only when a plan needs them)."""
        sha = (adapter.sha256 if isinstance(adapter, KeptAdapter)
               else adapter_hash(adapter) if adapter is not None else "base")
        s = self.lc.suites
        key = hash_inputs(sha, self.suites.digest, self.cfg.models.chat.model_dump(),
                          s.model_dump(mode="json"))[:12]
        folder = self.files.evals / f"{sha[:12]}-{key}"
        rows: list[EvalResult] = []
        todo = [x for x in suites if not (folder / f"{x}.jsonl").exists()]
        if todo:
            who = "the base model" if sha == "base" else "adapter " + sha[:12]
            self.log(f"== evaluating {who} on {', '.join(todo)}")
            model = model or self.open_model(adapter)
            judge = self.judge() if {"open", "open_dev"} & set(todo) else None
            for suite in todo:
                got = evaluate_suites(model, self.suites, s, judge=judge, suites_run=(suite,),
                                      name=name or sha[:12], log=self.log)
                write_jsonl(folder / f"{suite}.jsonl", got)
        for suite in suites:
            rows += read_jsonl(folder / f"{suite}.jsonl", EvalResult.model_validate)
        return rows

    # ------------------------------------------------------------------ the verbs
    def plan(self) -> Round:
        """Evaluate the current model, mine its failures and write the next round's plan."""
        return plan_round(self)

    def approve(self, index: int | None = None, *, by: str, edits: dict[str, Any] | None = None,
                data: bool = False, review: dict[str, Any] | None = None) -> Round:
        """Approve the planned round's plan, or (`data=True`) the synthesised data of a
        running round, with `review` = {sample id: "reject" | {"answer": edited text}}."""
        if data:
            return approve_data(self, index, by=by, review=review or {})
        return approve_plan(self, index, by=by, edits=edits)

    def run_round(self, index: int | None = None) -> Round:
        return run_steps(self, index)

    def decide(self, index: int | None, choice: Choice, *, reason: str, by: str,
               plan_next: bool = True) -> Round:
        return decide_round(self, index, choice, reason=reason, by=by, plan_next=plan_next)

    def _keep(self, r: Round, st: LoopState) -> KeptAdapter:
        return keep(self, r, st)

    # ------------------------------------------------------------------ unattended
    def auto(self, rounds: int) -> list[Round]:
        """Plan, approve, run and decide by the guards, `rounds` times (resuming an
        unfinished round first)."""
        self.save_config()
        done = []
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
                              outputs={"round": str(loop.files.round(r.index).record)},
                              figures={"round": r.index, "target": r.plan.target},
                              message=f"round {r.index} planned: target {r.plan.target}")
    if cfg.loop.mode == "run":
        loop.save_config()
        r = loop.run_round()
        return PipelineResult(pipeline="loop", run_dir=str(ctx.layout.root),
                              outputs={"report": str(loop.files.round(r.index).report)},
                              figures={"round": r.index, "status": r.status,
                                       "recommendation": r.recommendation},
                              message=f"round {r.index}: {r.status}"
                                      + (f"; the guards recommend {r.recommendation}"
                                         if r.recommendation else ""))
    done = loop.auto(cfg.loop.rounds)
    write_history(loop)
    lines = [f"round {r.index}: target {r.plan.target}, "
             f"{r.decision.choice if r.decision else r.status}"
             + (f" ({r.decision.reason})" if r.decision else "") for r in done]
    return PipelineResult(
        pipeline="loop", run_dir=str(ctx.layout.root),
        outputs={"history": str(loop.files.history),
                 **{f"round_{r.index}": str(loop.files.round(r.index).report) for r in done}},
        figures={f"round_{r.index}": r.decision.choice if r.decision else r.status
                 for r in done} | {"seconds": round(time.perf_counter() - t0, 1)},
        message="\n".join(lines + [f"history: {loop.files.history}"]))
