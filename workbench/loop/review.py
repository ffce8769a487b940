"""A person's review of a round's synthesised data before training: accept, edit or reject
each accepted sample (`review.json`), and the samples as the review leaves them."""

from __future__ import annotations

from typing import Any

from workbench.errors import WorkbenchError
from workbench.io import atomic_write_json, read_jsonl
from workbench.loop.records import Round, round_name
from workbench.loop.store import RoundStore
from workbench.records import ChatExample


def approve_data(store: RoundStore, index: int | None, *, by: str,
                 review: dict[str, Any]) -> Round:
    """Record `review` = {sample id: "reject" | {"answer": edited text}} for the running
    round whose data waits for it."""
    r = store.round(index)
    if r.status != "running" or "gates" not in r.steps or "mixture" in r.steps:
        raise WorkbenchError(f"round {r.index} has no synthesised data waiting for review "
                             f"(status {r.status}"
                             + ("; training has begun" if "mixture" in r.steps else "")
                             + ")")
    if not by.strip():
        raise WorkbenchError("say who reviewed the data (--by NAME)")
    accepted = {e.id for e in read_jsonl(store.files.path("accepted", round_name(r.index)),
                                         ChatExample.model_validate)}
    unknown = sorted(set(review) - accepted)
    if unknown:
        raise WorkbenchError(f"review: no accepted samples {unknown[:5]}")
    for k, v in review.items():
        if v != "reject" and not (isinstance(v, dict) and str(v.get("answer", "")).strip()):
            raise WorkbenchError(f"review of {k}: 'reject' or {{'answer': text}}")
    atomic_write_json(store.files.path("review", round_name(r.index)), review)
    rejected = sum(v == "reject" for v in review.values())
    edited = sum(isinstance(v, dict) for v in review.values())
    store.log(f"== round {r.index}: data reviewed by {by} ({rejected} rejected, {edited} "
             "edited)")
    return store.save(r.model_copy(update={"reviewed_by": by}))


def apply_review(samples: list[ChatExample], review: dict[str, Any]) -> list[ChatExample]:
    """A person's review: {id: "reject"} drops a sample, {id: {"answer": text}} edits it."""
    out = []
    for e in samples:
        v = review.get(e.id) if e.id is not None else None
        if v == "reject":
            continue
        if isinstance(v, dict) and v.get("answer"):
            msgs = list(e.messages)
            msgs[-1] = msgs[-1].model_copy(update={"content": v["answer"]})
            e = e.model_copy(update={"messages": msgs, "metadata": {**(e.metadata or {}),
                                                                    "edited": True}})
        out.append(e)
    return out
