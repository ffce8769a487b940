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
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workbench import services
from workbench.errors import DataError, WorkbenchError
from workbench.io import atomic_write_json, read_jsonl, replace_dir, write_jsonl
from workbench.loop.failures import count_modes, mine
from workbench.loop.guards import check, deltas, plan_guards, recommend
from workbench.loop.records import (
    JOBS,
    MODES,
    Choice,
    Decision,
    FailureRow,
    KeptAdapter,
    LoopState,
    Plan,
    Round,
)
from workbench.loop.suites import (
    Suites, evaluate_suites, load_suites, per_subset, seeded_split, subset_of,
)
from workbench.loop.synth import LoopPack, Synthesiser, by_job, dev_right
from workbench.loop.train import adapter_hash
from workbench.records import ChatExample, EvalResult
from workbench.registry import PipelineResult
from workbench.runs import RunContext, hash_inputs

STEPS = ("synth", "gates", "mixture", "train", "eval", "guards")
GUARDED = ("test", "retention", "open")  # what a candidate is judged on (dev is trained on)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def loop_pack(name: str) -> LoopPack:
    from workbench.domains import load_pack

    pack = load_pack(name)
    raw = pack.pipelines.get("loop")
    if raw is None:
        raise WorkbenchError(f"domain pack {name!r} has no pipelines.loop section (the "
                             "synthesis templates of the improvement loop)")
    try:
        lp = LoopPack.model_validate(raw)
    except ValueError as e:
        raise WorkbenchError(f"domain pack {name!r}, pipelines.loop: {e}") from None
    from workbench.domains import placeholders

    known = {"term", "branch", "text", "definition", *lp.fields}
    problems = []
    for i, t in enumerate(lp.knowledge):
        for where, text in (("question", t.question), ("answer", t.answer)):
            if bad := placeholders(text) - known:
                problems.append(f"knowledge.{i}.{where}: unknown fields {sorted(bad)}")
        if bad := set(t.needs) - known:
            problems.append(f"knowledge.{i}.needs: unknown fields {sorted(bad)}")
    for key in ("thinking", "open_answer", "rationale_template"):
        extra = {"gold", "letter"} if key == "rationale_template" else set()
        if bad := placeholders(getattr(lp, key)) - known - extra:
            problems.append(f"{key}: unknown fields {sorted(bad)}")
    if bad := placeholders(lp.rationale_prompt) - {"question", "options", "letter", "gold"}:
        problems.append(f"rationale_prompt: unknown fields {sorted(bad)}")
    if problems:
        raise WorkbenchError(f"domain pack {name!r}, pipelines.loop: " + "; ".join(problems))
    return lp


class Loop:
    """One loop's folder: `state.json`, `rounds/NN/`, `adapters/<sha>/`, `evals/<key>/`."""

    def __init__(self, cfg, ctx: RunContext | None = None, *, log: Callable[[str], None]
                 = print):
        from workbench.runs import RunLayout

        self.cfg, self.lc = cfg, cfg.loop
        self.ctx = ctx or RunContext(layout=RunLayout.of(cfg), log=log)
        self.log = self.ctx.log
        self.root = self.ctx.layout.folder("loop")
        self._suites: Suites | None = None
        self._pack: LoopPack | None = None
        self._searcher = None
        self._judge = None

    @classmethod
    def at(cls, run_dir: str | Path, *, log: Callable[[str], None] = print) -> Loop:
        """The loop of a run folder, with the config its plans were made with."""
        from workbench.config import experiment_config_model

        p = Path(run_dir) / "loop" / "config.yaml"
        if not p.exists():
            raise WorkbenchError(f"{run_dir}: no improvement loop here (no loop/config.yaml)")
        import yaml

        from workbench.runs import RunLayout

        cfg = experiment_config_model().model_validate(yaml.safe_load(p.read_text()))
        return cls(cfg, RunContext(layout=RunLayout.at(run_dir), log=log))

    def _save_config(self) -> None:
        import yaml

        from workbench.config import dump_config
        from workbench.io import atomic_write_text

        atomic_write_text(self.root / "config.yaml",
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
        p = self.root / "state.json"
        if not p.exists():
            return LoopState()
        try:
            return LoopState.model_validate_json(p.read_bytes())
        except ValueError as e:
            raise DataError(f"not a loop state file ({str(e)[:160]})", path=str(p)) from None

    def _save_state(self, st: LoopState) -> None:
        atomic_write_json(self.root / "state.json", st.model_dump(mode="json"))

    def folder(self, index: int) -> Path:
        return self.root / "rounds" / f"{index:02d}"

    def rounds(self) -> list[Round]:
        out = []
        for p in sorted((self.root / "rounds").glob("*/round.json")):
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
        atomic_write_json(self.folder(r.index) / "round.json", r.model_dump(mode="json"))
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
            self._searcher = services.searcher()(
                self.suites.training_sections(), self.root / "index", retriever="keyword",
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
        folder = self.root / "evals" / f"{sha[:12]}-{key}"
        rows: list[EvalResult] = []
        todo = [x for x in suites if not (folder / f"{x}.jsonl").exists()]
        if todo:
            self.log(f"== evaluating {'the base model' if sha == 'base' else 'adapter ' + sha[:12]}"
                     f" on {', '.join(todo)}")
            model = model or self.open_model(adapter)
            judge = self.judge() if {"open", "open_dev"} & set(todo) else None
            for suite in todo:
                got = evaluate_suites(model, self.suites, s, judge=judge, suites_run=(suite,),
                                      name=name or sha[:12], log=self.log)
                write_jsonl(folder / f"{suite}.jsonl", got)
        for suite in suites:
            rows += read_jsonl(folder / f"{suite}.jsonl", EvalResult.model_validate)
        return rows

    # ------------------------------------------------------------------ plan
    def plan(self) -> Round:
        """Evaluate the current model, mine its failures and write the next round's plan."""
        rs = self.rounds()
        if rs and rs[-1].status != "decided":
            raise WorkbenchError(f"round {rs[-1].index} is {rs[-1].status}: decide it before "
                                 "planning the next (`workbench loop decide`)")
        self._save_config()
        t0 = time.perf_counter()
        st = self.state()
        index = rs[-1].index + 1 if rs else 1
        model = self.open_model(st.current)
        rows = self.evaluation(st.current, model=model)
        failures, info = mine(rows, self.suites, model=model, search=self.search,
                              scoring=self.lc.suites.scoring, k=self.lc.synth.retrieve_k,
                              log=self.log)
        folder = self.folder(index)
        folder.mkdir(parents=True, exist_ok=True)
        write_jsonl(folder / "failures.jsonl", failures)
        plan = make_plan(self.lc, self.suites, rows, failures, rs)
        r = Round(index=index, parent=st.current.sha256 if st.current else None, plan=plan,
                  created_at=now(), suites_digest=self.suites.digest,
                  steps={"failures": {**info, "rows": len(failures),
                                      "modes": count_modes(failures),
                                      "seconds": round(time.perf_counter() - t0, 1)}})
        self.log(f"== round {index} planned: target {plan.target} ({plan.rationale})")
        return self.save(r)

    def approve(self, index: int | None = None, *, by: str, edits: dict[str, Any] | None = None,
                data: bool = False, review: dict[str, Any] | None = None) -> Round:
        """Approve the planned round's plan, or (`data=True`) the synthesised data of a
        running round, with `review` = {sample id: "reject" | {"answer": edited text}}."""
        if data:
            return self._approve_data(index, by=by, review=review or {})
        r = self.round(index)
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
            lc = self.lc.model_copy(update={
                "target": edits.get("target", plan.target),
                "weightings": edits.get("weightings", plan.weightings)})
            # a new target gets its own recipe, modes and rationale, from the same failures
            st = self.state()
            rows = self.evaluation(st.current)
            failures = read_jsonl(self.folder(r.index) / "failures.jsonl",
                                  FailureRow.model_validate)
            plan = make_plan(lc, self.suites, rows, failures, self.rounds()[:-1])
            # what the plan was made with stays (a later config does not rewrite it)
            plan = plan.model_copy(update={"hyper": r.plan.hyper, "guards": r.plan.guards,
                                           "review_data": r.plan.review_data,
                                           "rationale": r.plan.rationale})
            if plan.target != r.plan.target:
                plan.rationale = f"set by {by} at approval (planned: {r.plan.target})"
        r = r.model_copy(update={"plan": plan, "status": "approved", "approved_by": by,
                                 "approved_at": now()})
        self.log(f"== round {r.index} approved by {by}")
        return self.save(r)

    def _approve_data(self, index: int | None, *, by: str, review: dict[str, Any]) -> Round:
        r = self.round(index)
        if r.status != "running" or "gates" not in r.steps or "mixture" in r.steps:
            raise WorkbenchError(f"round {r.index} has no synthesised data waiting for review "
                                 f"(status {r.status}"
                                 + ("; training has begun" if "mixture" in r.steps else "")
                                 + ")")
        if not by.strip():
            raise WorkbenchError("say who reviewed the data (--by NAME)")
        accepted = {e.id for e in read_jsonl(self.folder(r.index) / "accepted.jsonl",
                                             ChatExample.model_validate)}
        unknown = sorted(set(review) - accepted)
        if unknown:
            raise WorkbenchError(f"review: no accepted samples {unknown[:5]}")
        for k, v in review.items():
            if v != "reject" and not (isinstance(v, dict) and str(v.get("answer", "")).strip()):
                raise WorkbenchError(f"review of {k}: 'reject' or {{'answer': text}}")
        atomic_write_json(self.folder(r.index) / "review.json", review)
        self.log(f"== round {r.index}: data reviewed by {by} ({sum(v == 'reject' for v in review.values())} "
                 f"rejected, {sum(isinstance(v, dict) for v in review.values())} edited)")
        return self.save(r.model_copy(update={"reviewed_by": by}))

    # ------------------------------------------------------------------ run
    def run_round(self, index: int | None = None) -> Round:
        r = self.round(index)
        if r.status not in ("approved", "running"):
            raise WorkbenchError(f"round {r.index} is {r.status}: only an approved round runs"
                                 + (" (`workbench loop approve` first)"
                                    if r.status == "planned" else ""))
        st = self.state()
        abandon = (f"; abandon it with `workbench loop decide revert --round {r.index}` and "
                   "plan again")
        if (st.current.sha256 if st.current else None) != r.parent:
            raise WorkbenchError(f"round {r.index} was planned on another adapter than the "
                                 "current one" + abandon)
        if r.suites_digest and r.suites_digest != self.suites.digest:
            raise WorkbenchError(f"round {r.index} was planned on other suites (data or "
                                 "loop.suites settings changed)" + abandon)
        r = self.save(r.model_copy(update={"status": "running"}))
        runner = _RoundRun(self, r, st)
        for step in STEPS:
            if self.ctx.should_stop():
                self.log("stop requested: the round resumes at this step on the next run")
                return runner.r
            if step == "mixture":
                if r.plan.review_data and not runner.r.reviewed_by:
                    self.log(f"round {r.index} waits for a review of its data (accept / edit "
                             "/ reject in the app, or `workbench loop approve --data --by "
                             "NAME`)")
                    return runner.r
                if not runner.targeted():
                    return self._no_data(runner.r)
            runner.step(step)
        r = runner.r
        choice, why = recommend(r.guards, r.deltas, self.lc.guards.min_gain)
        r = self.save(r.model_copy(update={"status": "awaiting_decision",
                                           "recommendation": choice}))
        self.log(f"== round {r.index}: the guards recommend {choice}: {why}")
        write_round_report(self, r)
        return r

    def _no_data(self, r: Round) -> Round:
        why = "no targeted sample passed the quality gates (or the review): nothing to train"
        r = self.save(r.model_copy(update={"status": "awaiting_decision",
                                           "recommendation": "revert", "candidate": None,
                                           "deltas": [], "guards": []}))
        self.log(f"== round {r.index}: {why}; the guards recommend revert")
        write_round_report(self, r)
        return r

    # ------------------------------------------------------------------ decide
    def decide(self, index: int | None, choice: Choice, *, reason: str, by: str,
               plan_next: bool = True) -> Round:
        r = self.round(index)
        unfinished = r.status in ("planned", "approved", "running")
        if r.status == "decided" or (unfinished and choice != "revert"):
            raise WorkbenchError(f"round {r.index} is {r.status}: only a finished round is "
                                 "decided" + (f" ({'an' if r.status == 'approved' else 'a'} "
                                              f"{r.status} round can only be reverted, to "
                                              "abandon it)" if unfinished else ""))
        if not reason.strip() or not by.strip():
            raise WorkbenchError("a decision needs a reason (--reason) and who took it (--by)")
        if choice != "revert" and (r.candidate is None or "guards" not in r.steps):
            raise WorkbenchError(f"round {r.index} has no measured candidate: it can only be "
                                 "reverted")
        st = self.state()
        before = st.current.sha256 if st.current else None
        if unfinished:  # abandoned: whatever is current stays, checked byte for byte
            after = self._verify_current(st, before)
            d = Decision(choice="revert", reason=reason, by=by, at=now(),
                         adapter_before=before, adapter_after=after)
            r = self.save(r.model_copy(update={"status": "decided", "decision": d}))
            self.log(f"== round {r.index} abandoned ({reason}); current adapter "
                     f"{(after or 'base model')[:12]}")
            write_round_report(self, r)
            write_history(self)
            return r
        if choice != "revert" and before is not None and before == r.candidate:
            before = r.parent  # a keep that a kill interrupted after the state was saved
        elif before != r.parent:
            raise DataError(f"the current adapter ({str(before or 'base model')[:12]}) is not "
                            f"the one round {r.index} started from "
                            f"({str(r.parent or 'base model')[:12]})",
                            path=str(self.root / "state.json"))
        if choice == "revert":
            after = self._verify_current(st, r.parent)
        else:
            kept = self._keep(r, st)
            st = self.state()
            after = kept.sha256
            if choice == "deploy":
                replace_dir(self._copy_tmp(Path(kept.path), "deployed"), self.root / "deployed")
                st.deployed = kept.sha256
                self._save_state(st)
        d = Decision(choice=choice, reason=reason, by=by, at=now(), adapter_before=before,
                     adapter_after=after)
        r = self.save(r.model_copy(update={"status": "decided", "decision": d}))
        self.log(f"== round {r.index}: {choice} ({reason}); current adapter "
                 f"{(after or 'base model')[:12]}")
        write_round_report(self, r)
        write_history(self)
        if choice == "continue" and plan_next:
            self.plan()
        return r

    def _copy_tmp(self, src: Path, name: str) -> Path:
        tmp = self.root / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        return tmp

    def _keep(self, r: Round, st: LoopState) -> KeptAdapter:
        cand = self.folder(r.index) / "candidate"
        sha = adapter_hash(cand)
        if sha != r.candidate:
            raise DataError(f"the candidate's weights changed since round {r.index} measured "
                            f"them (sha256 {sha[:12]}, measured {str(r.candidate)[:12]})",
                            path=str(cand))
        dest = self.root / "adapters" / sha[:16]
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            replace_dir(self._copy_tmp(cand, f"adapter-{sha[:16]}"), dest)
        kept = KeptAdapter(sha256=sha, path=str(dest.resolve()), round=r.index,
                           data=[str((self.folder(r.index) / "train.jsonl").resolve())])
        if st.current is not None and st.current.sha256 == sha:
            return st.current  # already kept (a retried decision)
        if st.current is not None:
            st.history.append(st.current)
        st.current = kept
        self._save_state(st)
        return kept

    def _verify_current(self, st: LoopState, parent: str | None) -> str | None:
        """Revert: the current adapter is the round's parent, byte for byte."""
        if st.current is None:
            if parent is not None:
                raise DataError("the loop state has no current adapter but the round started "
                                "from one", path=str(self.root / "state.json"))
            return None
        sha = adapter_hash(st.current.path)
        if sha != parent or sha != st.current.sha256:
            raise DataError(f"the current adapter's weights hash to {sha[:12]}, not the "
                            f"{str(parent)[:12]} the round started from; restore "
                            f"{st.current.path} before reverting", path=st.current.path)
        return sha

    # ------------------------------------------------------------------ unattended
    def auto(self, rounds: int) -> list[Round]:
        """Plan, approve, run and decide by the guards, `rounds` times (resuming an
        unfinished round first)."""
        self._save_config()
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
        why = (f"weakest dev subset: {100 * acc[target]:.0f}% "
               f"({', '.join(f'{s} {100 * acc[s]:.0f}%' for s in subsets)})")
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


class _RoundRun:
    """The steps of one round; each records what it did in the round and is skipped when it
    already finished with the same inputs (its key chains the previous step's, so a redone
    step redoes everything after it)."""

    def __init__(self, loop: Loop, r: Round, st: LoopState):
        from workbench.loop.config import TrainSettings

        self.loop, self.r, self.st = loop, r, st
        self.folder = loop.folder(r.index)
        self.lc = loop.lc
        self.train = TrainSettings.model_validate(r.plan.hyper) if r.plan.hyper \
            else loop.lc.train
        self._model = None

    @property
    def model(self):
        if self._model is None:
            self._model = self.loop.open_model(self.st.current)
        return self._model

    def _inputs(self, name: str) -> list:
        lc = self.lc
        extra = {"synth": [lc.synth.model_dump(mode="json"), lc.pack,
                           self.loop.cfg.models.chat.model_dump(mode="json")],
                 "gates": [lc.gates.model_dump(mode="json")],
                 "mixture": [lc.trainer, _file_key(self.folder / "review.json")],
                 "train": [lc.trainer, _file_key(self.folder / "review.json")],
                 "eval": [], "guards": [lc.guards.model_dump(mode="json")]}[name]
        before = STEPS[STEPS.index(name) - 1] if STEPS.index(name) else None
        prev = (self.r.steps.get(before) or {}).get("_key") if before else None
        return [self.r.plan.model_dump(mode="json"), self.r.parent, self.loop.suites.digest,
                name, prev, *extra]

    def step(self, name: str) -> None:
        key = hash_inputs(*self._inputs(name))
        done = self.r.steps.get(name)
        if done and done.get("_key") == key and not self.loop.ctx.fresh and all(
                (self.folder / f).exists() for f in done.get("_files", [])):
            self.loop.log(f"== round {self.r.index} {name}: up to date")
            return
        self.loop.log(f"== round {self.r.index} {name}")
        t0 = time.perf_counter()
        info = getattr(self, f"_{name}")()
        info.update(_key=key, seconds=round(time.perf_counter() - t0, 1))
        # a step that ran again invalidates what came after it
        later = set(STEPS[STEPS.index(name) + 1:])
        steps = {k: v for k, v in self.r.steps.items() if k not in later}
        stale: dict[str, Any] = {}  # what the dropped steps had set
        if "train" in later:
            stale["candidate"] = None
        if "guards" in later:
            stale.update(deltas=[], guards=[], recommendation=None)
        self.r = self.loop.save(self.r.model_copy(update={"steps": {**steps, name: info},
                                                          **stale}))

    def targeted(self) -> list[ChatExample]:
        return [e for e in self._accepted() if (e.metadata or {}).get("job") != "anchors"]

    # --- steps
    def _failures(self) -> list[FailureRow]:
        return read_jsonl(self.folder / "failures.jsonl", FailureRow.model_validate)

    def _baseline(self) -> list[EvalResult]:
        return self.loop.evaluation(self.st.current)

    def _split(self) -> tuple[set[str], set[str], set[str]]:
        """(train-side ids of the target's dev items, the held-out ids the mixture search
        scores: the target's other third plus a sample of the other subsets, which anchors
        never use). Seeded by the loop's seed alone: the same in every round."""
        suites, target = self.loop.suites, self.r.plan.target
        mine = [it.id for it in suites.dev if subset_of(it) == target]
        train_side, select = seeded_split(mine, 2 / 3, self.loop.cfg.seed)
        others = sorted(it.id for it in suites.dev if subset_of(it) != target)
        probe, _ = seeded_split(others, min(1.0, 12 / max(len(others), 1)),
                                self.loop.cfg.seed + 1) if others else ([], [])
        return set(train_side), set(select), set(probe)

    def _synth(self) -> dict:
        plan, s = self.r.plan, self.lc.synth
        train_side, select, probe = self._split()
        failures = [f for f in self._failures() if f.subset == plan.target
                    and (f.suite == "open_dev" or f.id in train_side)]
        syn = Synthesiser(self.loop.suites, self.loop.pack, s,
                          scoring=self.lc.suites.scoring, model=self.model,
                          search=self.loop.search, seed=self.loop.cfg.seed + self.r.index,
                          tag=f"r{self.r.index:02d}", log=self.loop.log)
        jobs = by_job(failures)
        made = {job: getattr(syn, job)(jobs.get(job, []))
                if plan.recipe.get(job, 1) else [] for job in ("knowledge", "reasoning",
                                                               "calibration")}
        targeted = [e for j in ("knowledge", "reasoning", "calibration")
                    for e in made[j]][:s.max_samples]
        right = dev_right(self._baseline(), self.loop.suites, exclude=select | probe)
        n_anchors = plan.recipe["anchors"] if "anchors" in plan.recipe else round(
            s.anchor_ratio * max(plan.weightings) * len(targeted))
        made["anchors"] = syn.anchors(right, n_anchors, last=plan.target)
        write_jsonl(self.folder / "synth.jsonl", targeted + made["anchors"])
        return {"_files": ["synth.jsonl"], "failures_used": len(failures),
                **{j: len(made.get(j, [])) for j in JOBS}, **syn.stats}

    def _gates(self) -> dict:
        from workbench.loop.gates import Gates

        samples = read_jsonl(self.folder / "synth.jsonl", ChatExample.model_validate)
        seen = [e for p in (self.st.current.data if self.st.current else ())
                for e in read_jsonl(p, ChatExample.model_validate)]
        sections = {s.id: s.text for s in self.loop.suites.sections}
        kept, dropped = Gates(self.loop.suites, self.lc.gates, seen=seen,
                              sections=sections).run(samples)
        write_jsonl(self.folder / "accepted.jsonl", kept)
        write_jsonl(self.folder / "dropped.jsonl", dropped)
        # new data: an earlier review no longer applies
        (self.folder / "review.json").unlink(missing_ok=True)
        if self.r.reviewed_by:
            self.r = self.r.model_copy(update={"reviewed_by": None})
        by_gate: dict[str, int] = {}
        for d in dropped:
            by_gate[d["gate"]] = by_gate.get(d["gate"], 0) + 1
        self.loop.log(f"   kept {len(kept)} of {len(samples)}; dropped "
                      + (", ".join(f"{g} {n}" for g, n in sorted(by_gate.items())) or "none"))
        judged = [" ".join(q.lower().split()) for q in self.loop.suites.judged_questions()]
        leaks = sum(any(q in " ".join(" ".join(m.content or "" for m in e.messages
                                               if m.role == "user").lower().split())
                        for q in judged) for e in kept)
        return {"_files": ["accepted.jsonl", "dropped.jsonl"], "in": len(samples),
                "kept": len(kept), "dropped": by_gate, "leaks_kept": leaks}

    def _accepted(self) -> list[ChatExample]:
        accepted = read_jsonl(self.folder / "accepted.jsonl", ChatExample.model_validate)
        review = self.folder / "review.json"
        if review.exists():  # a person's accept/edit/reject in the app
            accepted = apply_review(accepted, json.loads(review.read_text()))
        return accepted

    def _data(self, w: float) -> list[ChatExample]:
        """Earlier kept data + this round's targeted samples + anchors at weight w."""
        accepted = self._accepted()
        targeted = [e for e in accepted if (e.metadata or {}).get("job") != "anchors"]
        anchors = [e for e in accepted if (e.metadata or {}).get("job") == "anchors"]
        n = round(w * self.lc.synth.anchor_ratio * len(targeted))
        earlier = [e for p in (self.st.current.data if self.st.current else ())
                   for e in read_jsonl(p, ChatExample.model_validate)]
        return earlier + targeted + anchors[:n]

    def _train(self) -> dict:
        from workbench.registry import load_attr

        w = self.r.steps["mixture"]["chosen"]
        data = self._data(w)
        write_jsonl(self.folder / "train.jsonl", data)
        out = self.folder / "candidate"
        trainer = load_attr(self.lc.trainer)
        info = trainer(self.folder / "train.jsonl", out, self.train, steps=self.train.steps,
                       model_spec=self.loop.cfg.models.chat.spec, seed=self.loop.cfg.seed,
                       log=self.loop.log)
        sha = adapter_hash(out)
        self.r = self.r.model_copy(update={"candidate": sha})
        return {"_files": ["train.jsonl", "candidate/adapter_model.safetensors"],
                "examples": len(data), "weight": w, "sha256": sha, **info}

    def _mixture(self) -> dict:
        from workbench.evaluate.mc import evaluate_mc
        from workbench.registry import load_attr

        weightings = self.r.plan.weightings
        _, select, probe = self._split()
        items = [it for it in self.loop.suites.dev if it.id in select | probe]
        if len(weightings) == 1 or not items:
            return {"chosen": weightings[0], "probes": {},
                    "note": "one weighting: no search" if len(weightings) == 1
                    else "no held-out dev items to score: the first weighting"}
        trainer = load_attr(self.lc.trainer)
        scores: dict[str, dict] = {}
        formulation = "letter" if self.lc.suites.scoring == "letter" else "cloze"
        for w in weightings:
            data = self._data(w)
            path = self.folder / "mixture" / f"w{w:g}.jsonl"
            write_jsonl(path, data)
            out = self.folder / "mixture" / f"w{w:g}"
            trainer(path, out, self.train, steps=self.train.mixture_steps,
                    model_spec=self.loop.cfg.models.chat.spec, seed=self.loop.cfg.seed,
                    log=lambda _m: None)
            model = self.loop.open_model(out)
            rows = evaluate_mc(model, items, condition="select", methods=("loglik",),
                               formulations=(formulation,))
            ok = [r.extra["predictions"][self.lc.suites.scoring] == it.answer
                  for r, it in zip(rows, items, strict=True)]
            scores[f"{w:g}"] = {"examples": len(data), "accuracy": sum(ok) / len(ok),
                                "n": len(ok)}
            self.loop.log(f"   anchors x{w:g}: {len(data)} examples, selection accuracy "
                          f"{100 * sum(ok) / len(ok):.0f}% of {len(ok)}")
            del model
        best = max(weightings, key=lambda w: (scores[f"{w:g}"]["accuracy"], w))
        return {"chosen": best, "probes": scores, "selection_items": len(items)}

    def _eval(self) -> dict:
        rows = self.loop.evaluation(self.folder / "candidate", name=f"round {self.r.index}",
                                    suites=GUARDED)
        return {"rows": len(rows)}

    def _guards(self) -> dict:
        before = self.loop.evaluation(self.st.current, suites=GUARDED)
        after = self.loop.evaluation(self.folder / "candidate", suites=GUARDED)
        ds = deltas(before, after, target=self.r.plan.target, seed=self.loop.cfg.seed)
        gs = check(self.r.plan.guards, ds, before, after,
                   limit_tokens=self.lc.suites.open_max_tokens)
        if self.loop.suites.open:  # the rubric delta is as good as the judge's decisions
            from workbench.loop.agreement import judge_check, judge_guard

            gs.append(judge_guard(judge_check(self.loop), self.lc.guards))
        self.r = self.r.model_copy(update={"deltas": ds, "guards": gs})
        flagged = [g.guard.name for g in gs if not g.passed]
        return {"flagged": flagged}


def _file_key(path: Path) -> str | None:
    from workbench.runs import file_hash

    return file_hash(path)


def apply_review(samples: list[ChatExample], review: dict[str, Any]) -> list[ChatExample]:
    """A person's review: {id: "reject"} drops a sample, {id: {"answer": text}} edits it."""
    out = []
    for e in samples:
        v = review.get(e.id)
        if v == "reject":
            continue
        if isinstance(v, dict) and v.get("answer"):
            msgs = list(e.messages)
            msgs[-1] = msgs[-1].model_copy(update={"content": v["answer"]})
            e = e.model_copy(update={"messages": msgs, "metadata": {**(e.metadata or {}),
                                                                    "edited": True}})
        out.append(e)
    return out


# ------------------------------------------------------------------------------- reports

def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def round_markdown(loop: Loop, r: Round) -> str:
    p = r.plan
    lines = [f"# Round {r.index}: {p.target}", "",
             f"Status **{r.status}**; started from "
             f"{'the base model' if r.parent is None else 'adapter ' + r.parent[:12]}; "
             f"approved by {r.approved_by or '-'}.", "",
             f"**Plan.** Target `{p.target}`: {p.rationale}. Recipe: "
             + ", ".join(f"{k} {v}" for k, v in p.recipe.items())
             + f". Anchor weightings tried: {', '.join(f'{w:g}' for w in p.weightings)}.", ""]
    f = r.steps.get("failures", {})
    if f:
        lines += ["## Failures (current model: dev items, open questions on dev terms)", "",
                  "| mode | rows | job |", "|---|---|---|"]
        lines += [f"| {m} | {n} | {MODES[m]} |" for m, n in sorted(f.get("modes", {}).items())]
        if f.get("retrieval_hit") is not None:
            lines += ["", f"Tagging: {f.get('tagging')}; the section a failure needs was "
                          f"among those retrieved for {_pct(f['retrieval_hit'])} of them."]
    g = r.steps.get("gates")
    if g:
        s = r.steps.get("synth", {})
        lines += ["", "## Data", "", "Synthesised: " + ", ".join(
            f"{j} {s.get(j, 0)}" for j in JOBS) + f" (rationales: {s.get('rationales_by_model', 0)} "
            f"by the model, {s.get('rationales_by_template', 0)} from templates; model "
            f"rationales refused: {s.get('rationales_off_answer', 0)} not naming the answer, "
            f"{s.get('rationales_ungrounded', 0)} with claims the section lacks). "
            f"Quality gates kept {g['kept']} of {g['in']}; dropped: "
            + (", ".join(f"{k} {v}" for k, v in g["dropped"].items()) or "none") + "."]
    m = r.steps.get("mixture")
    if m and m.get("probes"):
        lines += ["", "Mixture search (short LoRA runs, accuracy on a held-out dev slice): "
                  + "; ".join(f"anchors x{w}: {_pct(v['accuracy'])} of {v['n']} "
                              f"({v['examples']} examples)" for w, v in m["probes"].items())
                  + f". Chosen: x{m['chosen']:g}."]
    if r.deltas:
        lines += ["", "## Per-subset deltas (candidate - current, same items, 95% intervals)",
                  "", "| suite | subset | n | current | candidate | delta [95% CI] | p |",
                  "|---|---|---|---|---|---|---|"]
        for d in r.deltas:
            star = " (target)" if d.target else ""
            lines.append(
                f"| {d.suite} | {d.subset}{star} | {d.n} | {_pct(d.before)} "
                f"[{_pct(d.before_ci[0])}, {_pct(d.before_ci[1])}] | {_pct(d.after)} "
                f"[{_pct(d.after_ci[0])}, {_pct(d.after_ci[1])}] | "
                f"{100 * d.delta:+.1f} [{100 * d.ci_low:+.0f}, {100 * d.ci_high:+.0f}] | "
                f"{d.p_value:.2f} |")
        lines += ["", "MC subsets: accuracy with Wilson intervals, paired bootstrap interval "
                  "of the delta, exact McNemar p. Open: HealthBench rubric score, bootstrap "
                  "intervals, sign-flip p. A delta whose interval holds 0 is not a result at "
                  "this size; the guards still act on the point estimate, to stop "
                  "regressions early."]
    if r.guards:
        lines += ["", "## Guards", "", "| guard | limit | passed | measured |",
                  "|---|---|---|---|"]
        lines += [f"| {x.guard.name} | {x.guard.limit:g} | {'yes' if x.passed else '**NO**'} "
                  f"| {x.detail} |" for x in r.guards]
    if any(x.guard.kind == "judge_agreement" for x in r.guards):
        from workbench.loop.agreement import agreement_markdown, judge_check

        lines += agreement_markdown(judge_check(loop))
    if r.recommendation:
        lines += ["", f"The guards recommend **{r.recommendation}**."]
    if r.decision:
        d = r.decision
        lines += ["", f"## Decision: {d.choice}", "", f"{d.reason} (by {d.by}, {d.at}). "
                  f"Adapter {str(d.adapter_before or 'base')[:12]} -> "
                  f"{str(d.adapter_after or 'base')[:12]}."]
    lines += ["", "## Step times (s)", "", "| step | seconds |", "|---|---|"]
    lines += [f"| {k} | {v.get('seconds', '-')} |" for k, v in r.steps.items()]
    return "\n".join(lines) + "\n"


def write_round_report(loop: Loop, r: Round) -> Path:
    from workbench.io import atomic_write_text

    p = loop.folder(r.index) / "report.md"
    atomic_write_text(p, round_markdown(loop, r))
    return p


def history_rows(loop: Loop) -> list[dict[str, Any]]:
    rows = []
    for r in loop.rounds():
        row = {"round": r.index, "target": r.plan.target, "status": r.status,
               "decision": r.decision.choice if r.decision else None,
               "by": r.decision.by if r.decision else None,
               "flags": len(r.flagged), "adapter": (r.candidate or "")[:12]}
        for d in r.deltas:
            row[f"{d.suite}/{d.subset}"] = round(100 * d.delta, 1)
        rows.append(row)
    return rows


def write_history(loop: Loop) -> Path:
    """history.md (a table) and history.png (deltas per subset, round by round)."""
    from workbench.io import atomic_savefig, atomic_write_text

    rows = history_rows(loop)
    keys = sorted({k for r in rows for k in r if "/" in k})
    lines = ["# Improvement history", "", "Kept and reverted interventions, with each "
             "subset's delta in points (candidate - current).", "",
             "| round | target | decision | by | flags | " + " | ".join(keys) + " |",
             "|---|---|---|---|---|" + "---|" * len(keys)]
    for r in rows:
        lines.append(f"| {r['round']} | {r['target']} | {r['decision'] or r['status']} | "
                     f"{r['by'] or '-'} | {r['flags']} | "
                     + " | ".join(f"{r[k]:+.1f}" if k in r else "-" for k in keys) + " |")
    atomic_write_text(loop.root / "history.md", "\n".join(lines) + "\n")
    if rows and keys:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(keys)), 3.8))
        width = 0.8 / len(rows)
        for i, r in enumerate(rows):
            xs = [j + i * width for j in range(len(keys))]
            ys = [r.get(k, 0.0) for k in keys]
            kept = r["decision"] in ("keep", "continue", "deploy")
            ax.bar(xs, ys, width, label=f"round {r['round']} ({r['decision'] or r['status']})",
                   color=("tab:green" if kept else "tab:red") if r["decision"] else "tab:grey",
                   alpha=0.5 + 0.5 * (i + 1) / len(rows), edgecolor="black")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))], keys, rotation=30,
                      ha="right", fontsize=8)
        ax.set_ylabel("delta (points)")
        ax.set_title("Evolution map: kept (green) and reverted (red) rounds")
        ax.legend(fontsize=7)
        fig.tight_layout()
        atomic_savefig(fig, loop.root / "history.png")
        plt.close(fig)
    return loop.root / "history.md"


# ------------------------------------------------------------------------------- registry

def run(cfg, ctx: RunContext) -> PipelineResult:
    """The registry's entry (`workbench jobs start loop`, the demo, the app): by `loop.mode`,
    `loop.rounds` unattended rounds (the guards decide), or one plan, or one round's run."""
    loop = Loop(cfg, ctx)
    t0 = time.perf_counter()
    if cfg.loop.mode == "plan":
        r = loop.plan()
        return PipelineResult(pipeline="loop", run_dir=str(ctx.layout.root),
                              outputs={"round": str(loop.folder(r.index) / "round.json")},
                              figures={"round": r.index, "target": r.plan.target},
                              message=f"round {r.index} planned: target {r.plan.target}")
    if cfg.loop.mode == "run":
        loop._save_config()
        r = loop.run_round()
        return PipelineResult(pipeline="loop", run_dir=str(ctx.layout.root),
                              outputs={"report": str(loop.folder(r.index) / "report.md")},
                              figures={"round": r.index, "status": r.status,
                                       "recommendation": r.recommendation},
                              message=f"round {r.index}: {r.status}"
                                      + (f"; the guards recommend {r.recommendation}"
                                         if r.recommendation else ""))
    done = loop.auto(cfg.loop.rounds)
    write_history(loop)
    lines = [f"round {r.index}: target {r.plan.target}, {r.decision.choice if r.decision else r.status}"
             + (f" ({r.decision.reason})" if r.decision else "") for r in done]
    return PipelineResult(
        pipeline="loop", run_dir=str(ctx.layout.root),
        outputs={"history": str(loop.root / "history.md"),
                 **{f"round_{r.index}": str(loop.folder(r.index) / "report.md") for r in done}},
        figures={f"round_{r.index}": r.decision.choice if r.decision else r.status
                 for r in done} | {"seconds": round(time.perf_counter() - t0, 1)},
        message="\n".join(lines + [f"history: {loop.root / 'history.md'}"]))
