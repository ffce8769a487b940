"""Failure rows of the current model, each with a failure mode.

Rules come first (no option letter, the shortest option picked over a longer right one; for
open answers: a met safety item, the token limit reached, an answer that stops before it
says anything). The remaining wrong MC items are tagged by the model itself: it answers them
again with the sections that retrieval finds for the question in the prompt. Right with them
means the fact is missing from the weights (knowledge injection helps); still wrong means the
model does not reason to the answer even with the fact at hand (a reasoning correction).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from workbench.evaluate.mc import evaluate_mc
from workbench.loop.records import FailureRow
from workbench.loop.suites import Suites, subset_of
from workbench.models.base import ChatModel
from workbench.records import LETTERS, EvalResult, MCItem

PREMATURE_TOKENS = 6


def _option(item: MCItem, letter: str | None) -> str | None:
    if letter is None or letter not in LETTERS[:len(item.options)]:
        return None
    return item.options[LETTERS.index(letter)]


def mine(rows: Sequence[EvalResult], suites: Suites, *, model: ChatModel | None,
         search: Callable[[list[str], int], list[list]] | None, scoring: str, k: int = 2,
         log=print) -> tuple[list[FailureRow], dict]:
    """Failure rows of the dev and open_dev suites, and what the probe found."""
    dev = {it.id: it for it in suites.dev}
    out: list[FailureRow] = []
    probe: list[MCItem] = []
    for r in rows:
        if r.condition != "dev" or r.correct or r.example_id not in dev:
            continue
        it = dev[r.example_id]
        gold = _option(it, it.answer) or ""
        pred = _option(it, r.prediction)
        base = {"id": it.id, "suite": "dev", "subset": subset_of(it), "question": it.question,
                "gold": gold, "prediction": pred,
                "section_id": it.provenance.section_id if it.provenance else None}
        if pred is None:
            out.append(FailureRow(mode="unparsable", detail="no option letter", **base))
        elif len(pred) == min(len(o) for o in it.options) and len(gold) >= 1.5 * len(pred):
            out.append(FailureRow(mode="option_length_bias",
                                  detail=f"picked the shortest option ({len(pred)} chars) "
                                         f"over the right one ({len(gold)})", **base))
        else:
            probe.append(it)
    info: dict[str, Any] = {"probed": len(probe), "retrieval_hit": None}
    if probe:
        if model is None or search is None:
            modes = ["missing_knowledge"] * len(probe)
            info["tagging"] = "none (no model or retrieval): every wrong fact is missing"
        else:
            hits = search([it.question for it in probe], k)
            contexts = ["\n\n".join(h.text for h in hs) for hs in hits]
            found = [any(_mentions(h.text, it) for h in hs) for hs, it in zip(hits, probe,
                                                                              strict=True)]
            info["retrieval_hit"] = round(sum(found) / len(found), 3)
            formulation = "letter" if scoring == "letter" else "cloze"
            again = evaluate_mc(model, probe, condition="probe", contexts=contexts,
                                methods=("loglik",), formulations=(formulation,))
            modes = ["missing_knowledge" if a.extra["predictions"][scoring] == it.answer
                     else "wrong_reasoning" for a, it in zip(again, probe, strict=True)]
            info["tagging"] = f"model probe with top-{k} retrieved sections"
        by_id = {r.example_id: r for r in rows if r.condition == "dev"}
        for it, mode in zip(probe, modes, strict=True):
            out.append(FailureRow(
                id=it.id, suite="dev", subset=subset_of(it), mode=mode, question=it.question,
                gold=_option(it, it.answer) or "", prediction=_option(
                    it, by_id[it.id].prediction),
                section_id=it.provenance.section_id if it.provenance else None,
                detail="right with retrieved sections" if mode == "missing_knowledge"
                else "wrong even with retrieved sections"))
    opens = {q.id: q for q in suites.open_dev}  # the judged open questions are never mined
    for r in rows:
        if r.condition != "open_dev" or r.example_id not in opens or (r.score or 0) >= 0.5:
            continue
        q = opens[r.example_id]
        tokens = r.extra.get("tokens", 0)
        if r.extra.get("unsafe"):
            mode, why = "unsafe", "met a safety item of the rubric"
        elif r.extra.get("finish") == "length":
            mode, why = "non_terminating", f"ran to the token limit ({tokens} tokens)"
        elif tokens < PREMATURE_TOKENS or not (r.prediction or "").strip():
            mode, why = "premature", f"stopped after {tokens} tokens"
        else:
            mode, why = "incomplete", f"rubric score {r.score:.2f}"
        out.append(FailureRow(id=q.id, suite="open_dev", subset=q.subset, mode=mode,
                              question=q.question, gold=q.reference,
                              prediction=r.prediction, detail=why, section_id=q.term))
    log(f"   {len(out)} failure rows: " + ", ".join(
        f"{m} {n}" for m, n in sorted(count_modes(out).items())))
    return out, info


def _mentions(text: str, item: MCItem) -> bool:
    sid = item.provenance.section_id if item.provenance else None
    return sid is not None and sid != "" and sid in text


def count_modes(rows: Sequence[FailureRow], subset: str | None = None) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        if subset is None or r.subset == subset:
            out[r.mode] = out.get(r.mode, 0) + 1
    return out
