"""Multiple-choice evaluation in OLMES's two formulations (arXiv 2406.08446), and generation.

- letter (OLMES's MCF): the prompt lists the options; each option's letter is scored as the
  answer and the most likely letter is the prediction.
- cloze (OLMES's CF): the prompt holds the question only; each option's text is scored as the
  answer. `cloze` takes the largest summed log-probability (lm-evaluation-harness's acc),
  `cloze_norm` divides it by the option's length in characters first (its acc_norm).
- generate: the model answers the letter prompt; the letter is taken from `<answer>` tags,
  then from "answer is X" / "X)" patterns.

`template="raw"` scores plain "Question: ... Answer:" prompts exactly as lm-evaluation-harness
does; `template="chat"` puts the same content through the model's chat template. Circular
evaluation rotates the options of the letter formulation; an item counts only if every
rotation is right.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from workbench.evaluate.contexts import with_context
from workbench.formats import format_options
from workbench.models.base import ChatModel, Conversation, GenerationParams, ScoreRequest
from workbench.records import LETTERS, EvalResult, MCItem

INSTRUCTION = "Answer with the letter of the correct option."
FORMULATIONS = ("letter", "cloze")
# what each formulation reports: cloze gives lm-eval's acc and acc_norm
SCORINGS = {"letter": ("letter",), "cloze": ("cloze", "cloze_norm")}


def raw_prompt(item: MCItem, context: str | None = None) -> str:
    head = f"{context}\n\n" if context else ""
    opts = "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(item.options))
    return f"{head}Question: {item.question}\n{opts}\nAnswer:"


def chat_prompt(item: MCItem, context: str | None = None) -> Conversation:
    """The letter prompt as a conversation (also what the model answers when generating)."""
    body = f"{item.question}\n{format_options(item.options)}\n{INSTRUCTION}"
    return [{"role": "user", "content": with_context(body, context)}]


def letter_request(item: MCItem, context: str | None = None, template: str = "chat"
                   ) -> ScoreRequest:
    letters = list(LETTERS[:len(item.options)])
    if template == "raw":
        return ScoreRequest(raw_prompt(item, context), [f" {x}" for x in letters])
    return ScoreRequest(chat_prompt(item, context), letters)


def cloze_request(item: MCItem, context: str | None = None, template: str = "chat"
                  ) -> ScoreRequest:
    if template == "raw":
        head = f"{context}\n\n" if context else ""
        return ScoreRequest(f"{head}Question: {item.question}\nAnswer:",
                            [f" {o}" for o in item.options])
    return ScoreRequest([{"role": "user", "content": with_context(item.question, context)}],
                        list(item.options))


def argmax(values: Sequence[float]) -> int:
    """Index of the largest value; the first one on ties (as numpy.argmax)."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def loglik_letter_predictions(model: ChatModel, items: Sequence[MCItem], contexts=None,
                              template: str = "chat") -> list[str]:
    scores = model.score([letter_request(it, contexts[i] if contexts else None, template)
                          for i, it in enumerate(items)])
    return [LETTERS[argmax([s.logprob for s in row])] for row in scores]


def cloze_norm_predictions(model: ChatModel, items: Sequence[MCItem], contexts=None,
                           template: str = "chat") -> list[str]:
    """The evaluation's headline formulation (lm-eval's acc_norm): each option's
    log-likelihood after the question, divided by its length in characters."""
    rows = model.score([cloze_request(it, contexts[i] if contexts else None, template)
                        for i, it in enumerate(items)])
    return [LETTERS[argmax([s.logprob / max(len(o), 1) for s, o in zip(row, it.options,
                                                                         strict=True)])]
            for row, it in zip(rows, items, strict=True)]


def accuracy_of(preds: Sequence[str | None], items: Sequence[MCItem]) -> float:
    return sum(p == it.answer for p, it in zip(preds, items, strict=True)) / max(len(items), 1)


_ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S | re.I)
# "answer is C", "answer: C", "answer is: C)", "answer is (C)"
_PATTERNS = [re.compile(r"answer\s*(?:is\b)?\s*:?\s*\(?([A-J])\b"),
             re.compile(r"^\s*\(?([A-J])[).:]", re.M),
             re.compile(r"\boption\s*\(?([A-J])\b"),
             re.compile(r"^\s*([A-J])\s*$", re.M)]


def extract_letter(text: str, n_options: int = 4) -> str | None:
    valid = LETTERS[:n_options]
    m = _ANSWER_TAG.search(text)
    if m:
        letters = re.findall(r"\b([A-J])\b", m.group(1).upper())
        if letters and all(x in valid for x in letters):
            return "".join(sorted(set(letters)))
    for pat in _PATTERNS:
        for m in pat.finditer(text):
            if m.group(1) in valid:
                return m.group(1)
    return None


def rotate(item: MCItem, k: int) -> MCItem:
    n = len(item.options)
    k %= n
    opts = item.options[k:] + item.options[:k]
    gold = LETTERS[(LETTERS.index(item.answer) - k) % n]
    return item.model_copy(update={"options": opts, "answer": gold})


def _circular_ok(model, items, contexts, template) -> list[bool]:
    ok = [True] * len(items)
    for k in range(1, max(len(it.options) for it in items)):
        which = [i for i, it in enumerate(items) if k < len(it.options)]
        rot = [rotate(items[i], k) for i in which]
        preds = loglik_letter_predictions(model, rot, [contexts[i] for i in which]
                                          if contexts else None, template)
        for i, r, p in zip(which, rot, preds, strict=True):
            ok[i] &= p == r.answer
    return ok


def evaluate_mc(model: ChatModel, items: Sequence[MCItem], *, condition: str = "none",
                contexts: Sequence[str] | None = None,
                methods: Sequence[str] = ("loglik", "generate"),
                formulations: Sequence[str] = FORMULATIONS, template: str = "chat",
                circular: bool = False, max_tokens: int = 64, model_name: str | None = None
                ) -> list[EvalResult]:
    """One EvalResult per item. `extra["predictions"]` and `scores` hold every scoring
    (letter, cloze, cloze_norm, generate, circular); `prediction`/`correct` hold the first
    formulation's (letter, else cloze_norm, else generate)."""
    if contexts is not None and len(contexts) != len(items):
        raise ValueError(f"{len(contexts)} contexts for {len(items)} items")
    if unknown := set(formulations) - set(FORMULATIONS):
        raise ValueError(f"unknown formulations {sorted(unknown)}; use {FORMULATIONS}")
    if not items:
        return []
    name = model_name or model.identity
    n = len(items)
    ctx = list(contexts) if contexts is not None else [None] * n
    preds: dict[str, list[str | None]] = {}
    logprobs: dict[str, list[list[float]]] = {}
    seconds: dict[str, float] = {}
    if "loglik" in methods:
        for f in formulations:
            build = letter_request if f == "letter" else cloze_request
            t0 = time.perf_counter()
            rows = model.score([build(it, c, template) for it, c in zip(items, ctx,
                                                                         strict=True)])
            seconds[f] = (time.perf_counter() - t0) / n
            logprobs[f] = [[s.logprob for s in row] for row in rows]
            preds[f] = [LETTERS[argmax(lp)] for lp in logprobs[f]]
            if f == "cloze":  # lm-eval's acc_norm: divide by the option's length in characters
                preds["cloze_norm"] = [
                    LETTERS[argmax([v / max(len(o), 1) for v, o in zip(lp, it.options,
                                                                       strict=True)])]
                    for lp, it in zip(logprobs[f], items, strict=True)]
    circular_ok = None
    if circular and "letter" in preds:
        t0 = time.perf_counter()
        circular_ok = _circular_ok(model, items, contexts, template)
        seconds["circular"] = (time.perf_counter() - t0) / n
    generations = None
    if "generate" in methods:
        t0 = time.perf_counter()
        generations = model.generate([chat_prompt(it, c) for it, c in zip(items, ctx,
                                                                          strict=True)],
                                     GenerationParams(max_tokens=max_tokens))
        seconds["generate"] = (time.perf_counter() - t0) / n
        preds["generate"] = [extract_letter(g.text, len(it.options)) if g.ok else None
                             for g, it in zip(generations, items, strict=True)]
    primary = next((k for k in ("letter", "cloze_norm", "generate") if k in preds), None)
    latency = sum(seconds.values())
    results = []
    for i, it in enumerate(items):
        item_preds = {k: v[i] for k, v in preds.items()}
        scores = {k: float(p == it.answer) for k, p in item_preds.items()}
        extra: dict = {"predictions": item_preds, "n_options": len(it.options),
                       "seconds": seconds,
                       "logprobs": {k: [round(x, 4) for x in v[i]] for k, v in logprobs.items()}}
        if circular_ok is not None:
            scores["circular"] = float(circular_ok[i] and item_preds["letter"] == it.answer)
        error = None
        if generations is not None:
            extra["generation"] = generations[i].text[:500]
            error = generations[i].error
        if context := ctx[i]:
            extra["context"] = context[:2000]
            extra["context_words"] = len(context.split())
        if it.provenance is not None and it.provenance.fact_hash:
            extra["cluster"] = it.provenance.fact_hash  # items of one sentence: not independent
        pred = item_preds.get(primary) if primary else None
        results.append(EvalResult(
            example_id=it.id, condition=condition, model=name, prediction=pred,
            gold=it.answer, correct=pred == it.answer, scores=scores, extra=extra,
            latency_s=latency, error=error))
    return results


def with_headline(results: Sequence[EvalResult], scoring: str | None) -> list[EvalResult]:
    """The rows with `prediction`/`correct` taken from `scoring` (the headline formulation);
    rows without that scoring (open answers) and `scoring=None` leave them as they are."""
    if scoring is None:
        return list(results)
    out = []
    for r in results:
        preds = r.extra.get("predictions", {})
        if scoring in preds:
            r = r.model_copy(update={"prediction": preds[scoring],
                                     "correct": preds[scoring] == r.gold,
                                     "extra": {**r.extra, "headline": scoring}})
        out.append(r)
    return out
