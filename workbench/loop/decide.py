"""Deciding a finished round: keep, continue or deploy its candidate, or revert to the
adapter it started from; each proven by the sha256 of the weights, and safe to retry after a
kill. And the judge guard of the round that awaits a decision, refreshed as a person's
ratings of the judge stand."""

from __future__ import annotations

import shutil
from pathlib import Path

from workbench.errors import DataError, WorkbenchError
from workbench.io import replace_dir
from workbench.loop.agreement import judge_check, judge_guard
from workbench.loop.evaluator import Evaluator
from workbench.loop.guards import recommend
from workbench.loop.records import (
    Choice,
    Decision,
    GuardResult,
    KeptAdapter,
    LoopState,
    Round,
    now,
    round_name,
)
from workbench.loop.report import write_history, write_round_report
from workbench.loop.store import RoundStore
from workbench.loop.train import adapter_hash


def decide_round(store: RoundStore, ev: Evaluator, index: int | None, choice: Choice, *,
                 reason: str, by: str) -> Round:
    """Decide round `index` (the latest by default); a `continue` plans no next round here
    (the caller does, as `Loop.decide` does)."""
    r = store.round(index)
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
    st = store.state()
    before = st.current.sha256 if st.current else None
    if unfinished:  # abandoned: whatever is current stays, checked byte for byte
        after = verify_current(store, st, before)
        d = Decision(choice="revert", reason=reason, by=by, at=now(),
                     adapter_before=before, adapter_after=after)
        r = store.save(r.model_copy(update={"status": "decided", "decision": d}))
        store.log(f"== round {r.index} abandoned ({reason}); current adapter "
                 f"{(after or 'base model')[:12]}")
        write_round_report(store, ev, r)
        write_history(store)
        return r
    if choice != "revert" and before is not None and before == r.candidate:
        before = r.parent  # a keep that a kill interrupted after the state was saved
    elif before != r.parent:
        raise DataError(f"the current adapter ({str(before or 'base model')[:12]}) is not "
                        f"the one round {r.index} started from "
                        f"({str(r.parent or 'base model')[:12]})",
                        path=str(store.files.path("state")))
    if choice == "revert":
        after = verify_current(store, st, r.parent)
    else:
        kept = keep(store, r, st)
        st = store.state()
        after = kept.sha256
        if choice == "deploy":
            replace_dir(_copy_tmp(store, Path(kept.path), "deployed"),
                        store.files.path("deployed"))
            st.deployed = kept.sha256
            store.save_state(st)
    d = Decision(choice=choice, reason=reason, by=by, at=now(), adapter_before=before,
                 adapter_after=after)
    r = store.save(r.model_copy(update={"status": "decided", "decision": d}))
    store.log(f"== round {r.index}: {choice} ({reason}); current adapter "
             f"{(after or 'base model')[:12]}")
    write_round_report(store, ev, r)
    write_history(store)
    return r


def _copy_tmp(store: RoundStore, src: Path, name: str) -> Path:
    tmp = store.root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    return tmp


def keep(store: RoundStore, r: Round, st: LoopState) -> KeptAdapter:
    """The round's candidate, copied into `adapters/` and made the current adapter."""
    cand = store.files.path("candidate", round_name(r.index))
    sha = adapter_hash(cand)
    if sha != r.candidate:
        raise DataError(f"the candidate's weights changed since round {r.index} measured "
                        f"them (sha256 {sha[:12]}, measured {str(r.candidate)[:12]})",
                        path=str(cand))
    dest = store.files.path("adapters") / sha[:16]
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        replace_dir(_copy_tmp(store, cand, f"adapter-{sha[:16]}"), dest)
    kept = KeptAdapter(sha256=sha, path=str(dest.resolve()), round=r.index,
                       data=[str(store.files.path("train", round_name(r.index)).resolve())])
    if st.current is not None and st.current.sha256 == sha:
        return st.current  # already kept (a retried decision)
    if st.current is not None:
        st.history.append(st.current)
    st.current = kept
    store.save_state(st)
    return kept


def verify_current(store: RoundStore, st: LoopState, parent: str | None) -> str | None:
    """Revert: the current adapter is the round's parent, byte for byte."""
    if st.current is None:
        if parent is not None:
            raise DataError("the loop state has no current adapter but the round started "
                            "from one", path=str(store.files.path("state")))
        return None
    sha = adapter_hash(st.current.path)
    if sha != parent or sha != st.current.sha256:
        raise DataError(f"the current adapter's weights hash to {sha[:12]}, not the "
                        f"{str(parent)[:12]} the round started from; restore "
                        f"{st.current.path} before reverting", path=st.current.path)
    return sha


def refresh_round_guard(store: RoundStore, ev: Evaluator) -> GuardResult | None:
    """Put the judge guard, as the ratings now stand, into the latest round that awaits a
    decision (and its recommendation); returns it, or None when no round awaits one."""
    rounds = [r for r in store.rounds() if r.status == "awaiting_decision" and r.guards]
    if not rounds:
        return None
    r = rounds[-1]
    g = judge_guard(judge_check(ev), ev.lc.guards)
    guards = [x for x in r.guards if x.guard.kind != "judge_agreement"] + [g]
    choice, _ = recommend(guards, r.deltas, ev.lc.guards.min_gain)
    r = store.save(r.model_copy(update={"guards": guards, "recommendation": choice}))
    write_round_report(store, ev, r)
    return g
