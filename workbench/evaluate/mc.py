"""Multiple-choice evaluation, scored two ways.

- log-likelihood: the log-probability of each option's letter (and of each option's text,
  plain and length-normalised by characters, lm-evaluation-harness's acc / acc_norm) after
  the prompt; the most likely option is the prediction. `template="raw"` scores a plain
  "Question / A. / Answer:" prompt exactly as lm-evaluation-harness does, `template="chat"`
  puts the same content through the model's chat template.
- generation: the model answers; the letter is taken from `<answer>` tags, then from
  "answer is X" / "X)" patterns.
Circular evaluation rotates the options; an item counts only if every rotation is right.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from workbench.distill.parse import format_options
from workbench.models.base import ChatModel, GenerationParams, ScoreRequest
from workbench.records import EvalResult, MCItem

LETTERS = "ABCDEFGHIJ"
INSTRUCTION = "Answer with the letter of the correct option."


def raw_prompt(item: MCItem, context: str | None = None) -> str:
    head = f"{context}\n\n" if context else ""
    opts = "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(item.options))
    return f"{head}Question: {item.question}\n{opts}\nAnswer:"


def chat_prompt(item: MCItem, context: str | None = None) -> list[dict]:
    from workbench.rag.context import with_context

    body = f"{item.question}\n{format_options(item.options)}\n{INSTRUCTION}"
    return [{"role": "user", "content": with_context(body, context) if context else body}]


def _requests(items, contexts, template: str, what: str) -> list[ScoreRequest]:
    reqs = []
    for i, it in enumerate(items):
        ctx = contexts[i] if contexts else None
        letters = list(LETTERS[:len(it.options)])
        if template == "raw":
            conts = [f" {x}" for x in letters] if what == "letter" else \
                [f" {o}" for o in it.options]
            reqs.append(ScoreRequest(raw_prompt(it, ctx), conts))
        else:
            conts = letters if what == "letter" else list(it.options)
            reqs.append(ScoreRequest(chat_prompt(it, ctx), conts))
    return reqs


def _argmax(values: Sequence[float]) -> int:
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def loglik_letter_predictions(model: ChatModel, items: Sequence[MCItem], contexts=None,
                              template: str = "chat") -> list[str]:
    scores = model.score(_requests(items, contexts, template, "letter"))
    return [LETTERS[_argmax([s.logprob for s in row])] for row in scores]


def accuracy_of(preds: Sequence[str | None], items: Sequence[MCItem]) -> float:
    return sum(p == it.answer for p, it in zip(preds, items, strict=True)) / max(len(items), 1)


_ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S | re.I)
_PATTERNS = [re.compile(r"answer\s*(?:is|:)\s*\(?([A-D])\b"), re.compile(r"^\s*\(?([A-D])[).:]",
                                                                         re.M),
             re.compile(r"\boption\s*\(?([A-D])\b"), re.compile(r"^\s*([A-D])\s*$", re.M)]


def extract_letter(text: str, n_options: int = 4) -> str | None:
    valid = LETTERS[:n_options]
    m = _ANSWER_TAG.search(text)
    if m:
        letters = re.findall(r"\b([A-J])\b", m.group(1).upper())
        if letters and all(x in valid for x in letters):
            return "".join(sorted(set(letters)))
    for pat in _PATTERNS:
        m = pat.search(text)
        if m and m.group(1) in valid:
            return m.group(1)
    return None


def rotate(item: MCItem, k: int) -> MCItem:
    n = len(item.options)
    opts = item.options[k:] + item.options[:k]
    gold = LETTERS[(LETTERS.index(item.answer) - k) % n]
    return item.model_copy(update={"options": opts, "answer": gold})


def evaluate_mc(model: ChatModel, items: Sequence[MCItem], *, condition: str = "none",
                contexts: Sequence[str] | None = None, methods: Sequence[str] = ("loglik",
                                                                                  "generate"),
                template: str = "chat", circular: bool = False, max_tokens: int = 64,
                model_name: str | None = None) -> list[EvalResult]:
    """One EvalResult per item and condition, with every method's prediction in `scores`
    and `extra`; `prediction`/`correct` hold the primary method (the first in `methods`)."""
    name = model_name or model.identity
    n = len(items)
    out: dict[str, dict] = {it.id: {"scores": {}, "extra": {}} for it in items}
    t_per: dict[str, float] = {}
    if "loglik" in methods:
        t0 = time.perf_counter()
        # letters and option texts follow the same prompt: one request, one prompt pass
        both = [ScoreRequest(lr.prompt, [*lr.continuations, *tr.continuations]) for lr, tr in
                zip(_requests(items, contexts, template, "letter"),
                    _requests(items, contexts, template, "text"), strict=True)]
        scored = model.score(both)
        letter = [row[:len(it.options)] for row, it in zip(scored, items, strict=True)]
        text = [row[len(it.options):] for row, it in zip(scored, items, strict=True)]
        t_per["loglik"] = (time.perf_counter() - t0) / max(n, 1)
        for it, lrow, trow in zip(items, letter, text, strict=True):
            o = out[it.id]
            o["extra"]["loglik_letter"] = LETTERS[_argmax([s.logprob for s in lrow])]
            o["extra"]["loglik_text"] = LETTERS[_argmax([s.logprob for s in trow])]
            o["extra"]["loglik_text_norm"] = LETTERS[_argmax(
                [s.logprob / max(s.n_chars, 1) for s in trow])]
            o["extra"]["letter_logprobs"] = [round(s.logprob, 4) for s in lrow]
    if circular and "loglik" in methods:
        ok = {it.id: True for it in items}
        for k in range(1, 4):
            rot = [rotate(it, k) for it in items]
            preds = loglik_letter_predictions(model, rot, contexts, template)
            for it, r, p in zip(items, rot, preds, strict=True):
                ok[it.id] &= p == r.answer
        for it in items:
            out[it.id]["extra"]["circular_correct"] = bool(
                ok[it.id] and out[it.id]["extra"]["loglik_letter"] == it.answer)
    if "generate" in methods:
        convs = [chat_prompt(it, contexts[i] if contexts else None)
                 for i, it in enumerate(items)]
        t0 = time.perf_counter()
        gens = model.generate(convs, GenerationParams(max_tokens=max_tokens))
        t_per["generate"] = (time.perf_counter() - t0) / max(n, 1)
        for it, g in zip(items, gens, strict=True):
            out[it.id]["extra"]["generate"] = extract_letter(g.text, len(it.options))
            out[it.id]["extra"]["generation"] = g.text[:500]
    primary = "loglik_letter" if "loglik" in methods else "generate"
    results = []
    for i, it in enumerate(items):
        o = out[it.id]
        pred = o["extra"].get(primary)
        for key in ("loglik_letter", "loglik_text", "loglik_text_norm", "generate",
                    "circular_correct"):
            if key in o["extra"]:
                v = o["extra"][key]
                o["scores"][key] = float(v if isinstance(v, bool) else v == it.answer)
        if contexts:
            o["extra"]["context"] = contexts[i][:2000]
        results.append(EvalResult(
            example_id=it.id, condition=condition, model=name, prediction=pred, gold=it.answer,
            correct=pred == it.answer, scores=o["scores"], extra=o["extra"],
            latency_s=sum(t_per.values())))
    return results


def summarize(results: Sequence[EvalResult]) -> dict:
    """Accuracy per method, agreement between log-likelihood and generation, macro-F1,
    seconds per item."""
    from workbench.evaluate.metrics import macro_f1

    if not results:
        return {"n": 0}
    keys = sorted({k for r in results for k in r.scores})
    out = {"n": len(results)}
    for k in keys:
        vals = [r.scores[k] for r in results if k in r.scores]
        out[f"acc_{k}"] = sum(vals) / len(vals)
    out["macro_f1"] = macro_f1([r.prediction for r in results], [r.gold for r in results])
    both = [r for r in results if "loglik_letter" in r.extra and "generate" in r.extra]
    if both:
        out["agreement_loglik_generate"] = sum(
            r.extra["loglik_letter"] == r.extra["generate"] for r in both) / len(both)
        out["generate_unparsed"] = sum(r.extra["generate"] is None for r in both) / len(both)
    out["seconds_per_item"] = sum(r.latency_s or 0 for r in results) / len(results)
    return out
