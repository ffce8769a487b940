"""Paraphrasing a pool's questions with a chat model, keeping a rewrite only when every
entity the question states is still in it."""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import ConfigDict, Field

from workbench.datatasks.answers import as_number, values_equal
from workbench.datatasks.normalise import normalise_question
from workbench.datatasks.pool import Task
from workbench.models.base import GenerationParams
from workbench.records import StrictModel

PARAPHRASE_SYSTEM = (
    "You rewrite database questions in natural English. Keep every quoted value, every number "
    "and every table and column name exactly as written. Do not answer the question. Reply "
    "with the rewritten question only, on one line.")


def _loose(s: str) -> str:
    return re.sub(r"[\W_]+", "", s.casefold())


def missing_entities(text: str, ents: Sequence[str]) -> list[str]:
    """The entities a text does not contain. Numbers must appear as numbers (3 ≠ three);
    names and values are compared ignoring case, spaces, punctuation and underscores."""
    numbers = [as_number(m) for m in
               re.findall(r"[-+]?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?", text)]
    loose = _loose(text)
    out = []
    for e in ents:
        n = as_number(e)
        if n is not None:
            if not any(x is not None and values_equal(n, x) for x in numbers):
                out.append(e)
        elif _loose(e) and _loose(e) not in loose:
            out.append(e)
    return out


class ParaphraseResult(StrictModel):
    model_config = ConfigDict(frozen=True)

    task_id: str
    accepted: bool
    text: str = Field(description="The question kept (the paraphrase or the template text).")
    candidate: str = ""
    reason: str = ""
    missing: list[str] = Field(default_factory=list)


def _clean_paraphrase(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    s = re.sub(r"^(paraphrase|rewritten question|question)\s*:\s*", "", lines[0],
               flags=re.IGNORECASE)
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"`":
        s = s[1:-1].strip()
    return s


def paraphrase_tasks(tasks: Sequence[Task], model, *, params=None
                     ) -> tuple[list[Task], list[ParaphraseResult]]:
    """Ask `model` (a `ChatModel`, through `generate` only) to rewrite each question; keep the
    rewrite only when every entity is still there, otherwise the template text. Ids, programs
    and answers do not change."""
    params = params or GenerationParams(max_tokens=96, temperature=0.0)
    convs = [[{"role": "system", "content": PARAPHRASE_SYSTEM},
              {"role": "user", "content": t.template_question}] for t in tasks]
    step = max(1, int(getattr(model, "batch_size", 8) or 8))
    gens = [g for i in range(0, len(convs), step) for g in model.generate(convs[i:i + step],
                                                                          params)]
    out_tasks, results = [], []
    for t, g in zip(tasks, gens, strict=True):
        cand = _clean_paraphrase(g.text) if g.error is None else ""
        reason, missing = "", []
        if g.error is not None:
            reason = f"generation failed: {g.error}"
        elif not cand:
            reason = "empty"
        elif len(cand) > 3 * len(t.template_question) + 40:
            reason = "too long"
        elif normalise_question(cand) == normalise_question(t.template_question):
            reason = "unchanged"
        else:
            missing = missing_entities(cand, t.entities)
            if missing:
                reason = "lost entities"
        ok = not reason
        text = cand if ok else t.template_question
        results.append(ParaphraseResult(task_id=t.id, accepted=ok, text=text, candidate=cand,
                                        reason=reason, missing=missing))
        out_tasks.append(t.model_copy(update={"question": text, "paraphrased": ok}))
    return out_tasks, results
