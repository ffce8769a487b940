"""Running an approved round: its steps (synthesis, quality gates, mixture search, the
candidate's training, its evaluation, the guards) in order, each resumable, then the guards'
recommendation."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.evaluate.mc import evaluate_mc
from workbench.io import read_jsonl, write_jsonl
from workbench.loop.agreement import judge_check, judge_guard
from workbench.loop.config import TrainSettings
from workbench.loop.evaluator import Evaluator
from workbench.loop.gates import Gates
from workbench.loop.guards import check, deltas, recommend
from workbench.loop.records import JOBS, FailureRow, LoopState, Round, round_name
from workbench.loop.report import write_round_report
from workbench.loop.review import apply_review
from workbench.loop.store import RoundStore
from workbench.loop.suites import seeded_split, subset_of
from workbench.loop.synth import Synthesiser, by_job, dev_right
from workbench.loop.train import adapter_hash
from workbench.plugins import load
from workbench.records import ChatExample, EvalResult
from workbench.runs import RunContext, file_hash, hash_inputs
from workbench.text import percent

STEPS = ("synth", "gates", "mixture", "train", "eval", "guards")
GUARDED = ("test", "retention", "open")  # what a candidate is judged on (dev is trained on)


def run_steps(store: RoundStore, ev: Evaluator, ctx: RunContext, index: int | None) -> Round:
    """Run (or resume) the approved round's steps; stops where a review or a stop request
    says to wait, or where no targeted data is left to train on."""
    r = store.round(index)
    if r.status not in ("approved", "running"):
        raise WorkbenchError(f"round {r.index} is {r.status}: only an approved round runs"
                             + (" (`workbench loop approve` first)"
                                if r.status == "planned" else ""))
    st = store.state()
    abandon = (f"; abandon it with `workbench loop decide revert --round {r.index}` and "
               "plan again")
    if (st.current.sha256 if st.current else None) != r.parent:
        raise WorkbenchError(f"round {r.index} was planned on another adapter than the "
                             "current one" + abandon)
    if r.suites_digest and r.suites_digest != ev.suites.digest:
        raise WorkbenchError(f"round {r.index} was planned on other suites (data or "
                             "ev.suites settings changed)" + abandon)
    r = store.save(r.model_copy(update={"status": "running"}))
    runner = _RoundRun(store, ev, ctx, r, st)
    for step in STEPS:
        if ctx.should_stop():
            store.log("stop requested: the round resumes at this step on the next run")
            return runner.r
        if step == "mixture":
            if r.plan.review_data and not runner.r.reviewed_by:
                store.log(f"round {r.index} waits for a review of its data (accept / edit "
                         "/ reject in the app, or `workbench loop approve --data --by "
                         "NAME`)")
                return runner.r
            if not runner.targeted():
                return _no_data(store, ev, runner.r)
        runner.step(step)
    r = runner.r
    choice, why = recommend(r.guards, r.deltas, ev.lc.guards.min_gain)
    r = store.save(r.model_copy(update={"status": "awaiting_decision",
                                       "recommendation": choice}))
    store.log(f"== round {r.index}: the guards recommend {choice}: {why}")
    write_round_report(store, ev, r)
    return r


def _no_data(store: RoundStore, ev: Evaluator, r: Round) -> Round:
    why = "no targeted sample passed the quality gates (or the review): nothing to train"
    r = store.save(r.model_copy(update={"status": "awaiting_decision",
                                       "recommendation": "revert", "candidate": None,
                                       "deltas": [], "guards": []}))
    store.log(f"== round {r.index}: {why}; the guards recommend revert")
    write_round_report(store, ev, r)
    return r


class _RoundRun:
    """The steps of one round; each records what it did in the round and is skipped when it
    already finished with the same inputs (its key chains the previous step's, so a redone
    step redoes everything after it)."""

    def __init__(self, store: RoundStore, ev: Evaluator, ctx: RunContext, r: Round,
                 st: LoopState):
        self.store, self.ev, self.ctx, self.r, self.st = store, ev, ctx, r, st
        self.log = store.log
        self.files = store.files.for_value(round_name(r.index))
        self.folder = self.files.path("round").parent
        self.lc = ev.lc
        self.train = TrainSettings.model_validate(r.plan.hyper) if r.plan.hyper \
            else ev.lc.train
        self._model = None

    @property
    def model(self):
        if self._model is None:
            self._model = self.ev.open_model(self.st.current)
        return self._model

    def _inputs(self, name: str) -> list:
        lc = self.lc
        extra = {"synth": [lc.synth.model_dump(mode="json"), lc.pack,
                           self.ev.cfg.models.chat.model_dump(mode="json")],
                 "gates": [lc.gates.model_dump(mode="json")],
                 "mixture": [lc.trainer, _file_key(self.files.path("review"))],
                 "train": [lc.trainer, _file_key(self.files.path("review"))],
                 "eval": [], "guards": [lc.guards.model_dump(mode="json")]}[name]
        before = STEPS[STEPS.index(name) - 1] if STEPS.index(name) else None
        prev = (self.r.steps.get(before) or {}).get("_key") if before else None
        return [self.r.plan.model_dump(mode="json"), self.r.parent, self.ev.suites.digest,
                name, prev, *extra]

    def step(self, name: str) -> None:
        key = hash_inputs(*self._inputs(name))
        done = self.r.steps.get(name)
        if done and done.get("_key") == key and not self.ctx.fresh and all(
                (self.folder / f).exists() for f in done.get("_files", [])):
            self.log(f"== round {self.r.index} {name}: up to date")
            return
        self.log(f"== round {self.r.index} {name}")
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
        self.r = self.store.save(self.r.model_copy(update={"steps": {**steps, name: info},
                                                          **stale}))

    def targeted(self) -> list[ChatExample]:
        return [e for e in self._accepted() if (e.metadata or {}).get("job") != "anchors"]

    def _rel(self, *paths: Path) -> list[str]:
        """The files a step made, relative to the round's folder (kept in round.json)."""
        return [p.relative_to(self.folder).as_posix() for p in paths]

    # --- steps
    def _failures(self) -> list[FailureRow]:
        return self.files.read("failures")

    def _baseline(self) -> list[EvalResult]:
        return self.ev.evaluation(self.st.current)

    def _split(self) -> tuple[set[str], set[str], set[str]]:
        """(train-side ids of the target's dev items, the held-out ids the mixture search
        scores: the target's other third plus a sample of the other subsets, which anchors
        never use). Seeded by the loop's seed alone: the same in every round."""
        suites, target = self.ev.suites, self.r.plan.target
        mine = [it.id for it in suites.dev if subset_of(it) == target]
        train_side, select = seeded_split(mine, 2 / 3, self.ev.cfg.seed)
        others = sorted(it.id for it in suites.dev if subset_of(it) != target)
        probe, _ = seeded_split(others, min(1.0, 12 / max(len(others), 1)),
                                self.ev.cfg.seed + 1) if others else ([], [])
        return set(train_side), set(select), set(probe)

    def _synth(self) -> dict:
        plan, s = self.r.plan, self.lc.synth
        train_side, select, probe = self._split()
        failures = [f for f in self._failures() if f.subset == plan.target
                    and (f.suite == "open_dev" or f.id in train_side)]
        syn = Synthesiser(self.ev.suites, self.ev.pack, s,
                          scoring=self.lc.suites.scoring, model=self.model,
                          search=self.ev.search, seed=self.ev.cfg.seed + self.r.index,
                          tag=f"r{self.r.index:02d}", log=self.log)
        jobs = by_job(failures)
        made = {job: getattr(syn, job)(jobs.get(job, []))
                if plan.recipe.get(job, 1) else [] for job in ("knowledge", "reasoning",
                                                               "calibration")}
        targeted = [e for j in ("knowledge", "reasoning", "calibration")
                    for e in made[j]][:s.max_samples]
        right = dev_right(self._baseline(), self.ev.suites, exclude=select | probe)
        n_anchors = plan.recipe["anchors"] if "anchors" in plan.recipe else round(
            s.anchor_ratio * max(plan.weightings) * len(targeted))
        made["anchors"] = syn.anchors(right, n_anchors, last=plan.target)
        self.files.write("synth", targeted + made["anchors"])
        return {"_files": self._rel(self.files.path("synth")), "failures_used": len(failures),
                **{j: len(made.get(j, [])) for j in JOBS}, **syn.stats}

    def _gates(self) -> dict:
        samples = self.files.read("synth")
        seen = [e for p in (self.st.current.data if self.st.current else ())
                for e in read_jsonl(p, ChatExample.model_validate)]
        sections = {s.id: s.text for s in self.ev.suites.sections}
        kept, dropped = Gates(self.ev.suites, self.lc.gates, seen=seen,
                              sections=sections).run(samples)
        self.files.write("accepted", kept)
        write_jsonl(self.files.path("dropped"), dropped)
        # new data: an earlier review no longer applies
        self.files.path("review").unlink(missing_ok=True)
        if self.r.reviewed_by:
            self.r = self.r.model_copy(update={"reviewed_by": None})
        by_gate: dict[str, int] = {}
        for d in dropped:
            by_gate[d["gate"]] = by_gate.get(d["gate"], 0) + 1
        self.log(f"   kept {len(kept)} of {len(samples)}; dropped "
                      + (", ".join(f"{g} {n}" for g, n in sorted(by_gate.items())) or "none"))
        judged = [" ".join(q.lower().split()) for q in self.ev.suites.judged_questions()]
        leaks = sum(any(q in " ".join(" ".join(m.content or "" for m in e.messages
                                               if m.role == "user").lower().split())
                        for q in judged) for e in kept)
        return {"_files": self._rel(self.files.path("accepted"), self.files.path("dropped")),
                "in": len(samples),
                "kept": len(kept), "dropped": by_gate, "leaks_kept": leaks}

    def _accepted(self) -> list[ChatExample]:
        accepted = self.files.read("accepted")
        review = self.files.path("review")
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
        w = self.r.steps["mixture"]["chosen"]
        data = self._data(w)
        self.files.write("train", data)
        out = self.files.path("candidate")
        trainer = load(self.lc.trainer, what="loop.trainer")
        info = trainer(self.files.path("train"), out, self.train, steps=self.train.steps,
                       model_spec=self.ev.cfg.models.chat.spec, seed=self.ev.cfg.seed,
                       log=self.log)
        sha = adapter_hash(out)
        self.r = self.r.model_copy(update={"candidate": sha})
        return {"_files": self._rel(self.files.path("train"),
                                   out / "adapter_model.safetensors"),
                "examples": len(data), "weight": w, "sha256": sha, **info}

    def _mixture(self) -> dict:
        weightings = self.r.plan.weightings
        _, select, probe = self._split()
        items = [it for it in self.ev.suites.dev if it.id in select | probe]
        if len(weightings) == 1 or not items:
            return {"chosen": weightings[0], "probes": {},
                    "note": "one weighting: no search" if len(weightings) == 1
                    else "no held-out dev items to score: the first weighting"}
        trainer = load(self.lc.trainer, what="loop.trainer")
        scores: dict[str, dict] = {}
        formulation = "letter" if self.lc.suites.scoring == "letter" else "cloze"
        for w in weightings:
            data = self._data(w)
            path = self.files.path("mixture") / f"w{w:g}.jsonl"
            write_jsonl(path, data)
            out = self.files.path("mixture") / f"w{w:g}"
            trainer(path, out, self.train, steps=self.train.mixture_steps,
                    model_spec=self.ev.cfg.models.chat.spec, seed=self.ev.cfg.seed,
                    log=lambda _m: None)
            model = self.ev.open_model(out)
            rows = evaluate_mc(model, items, condition="select", methods=("loglik",),
                               formulations=(formulation,))
            ok = [r.extra["predictions"][self.lc.suites.scoring] == it.answer
                  for r, it in zip(rows, items, strict=True)]
            scores[f"{w:g}"] = {"examples": len(data), "accuracy": sum(ok) / len(ok),
                                "n": len(ok)}
            self.log(f"   anchors x{w:g}: {len(data)} examples, selection accuracy "
                          f"{percent(sum(ok) / len(ok))} of {len(ok)}")
            del model
        best = max(weightings, key=lambda w: (scores[f"{w:g}"]["accuracy"], w))
        return {"chosen": best, "probes": scores, "selection_items": len(items)}

    def _eval(self) -> dict:
        rows = self.ev.evaluation(self.files.path("candidate"),
                                  name=f"round {self.r.index}",
                                    suites=GUARDED)
        return {"rows": len(rows)}

    def _guards(self) -> dict:
        before = self.ev.evaluation(self.st.current, suites=GUARDED)
        after = self.ev.evaluation(self.files.path("candidate"), suites=GUARDED)
        ds = deltas(before, after, target=self.r.plan.target, seed=self.ev.cfg.seed)
        gs = check(self.r.plan.guards, ds, before, after,
                   limit_tokens=self.lc.suites.open_max_tokens)
        if self.ev.suites.open:  # the rubric delta is as good as the judge's decisions
            gs.append(judge_guard(judge_check(self.ev), self.lc.guards))
        self.r = self.r.model_copy(update={"deltas": ds, "guards": gs})
        flagged = [g.guard.name for g in gs if not g.passed]
        return {"flagged": flagged}


def _file_key(path: Path) -> str | None:
    return file_hash(path)
