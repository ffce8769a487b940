"""Knowledge-free baselines: how far a benchmark can be solved without knowing anything.

A multiple-choice benchmark written by a model from a text can leak its answers through
form: the correct option shares the question's words, is the longest, or is the one the
distractors were made from. Each rule here picks an option from the item's wording alone;
the best of them is the floor a model's accuracy has to clear before it says anything about
knowledge. A benchmark that a rule solves at least as well as the base model measures the
rule, not the domain: the compare report flags it.

Ties are broken by a hash of the item and the rule (never by position, which the letter
balance makes uniform anyway), so a rule that cannot tell options apart scores chance.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from workbench.evaluate.stats import prediction_counts
from workbench.evaluate.summary import Accuracy
from workbench.io import sha256_text
from workbench.records import MCItem, StrictModel

LETTERS = "ABCDEFGHIJ"
_STOP = frozenset("a an the of to in on and or is are was be by for with as at it its this "
                  "that which what how why when where who whom does do than from".split())

RULES = {
    "question_overlap": "the option sharing the most words with the question",
    "longest": "the longest option",
    "consensus": "the option sharing the most words with the other options (the centre of "
                 "distractors made by editing the answer)",
}


class ShortcutRow(StrictModel):
    rule: str
    description: str
    accuracy: Accuracy
    predictions: dict[str, int]


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"\w+", text.lower()) if w not in _STOP}


def _scores(rule: str, item: MCItem) -> list[float]:
    opts = [_words(o) for o in item.options]
    if rule == "question_overlap":
        q = _words(item.question)
        return [len(o & q) for o in opts]
    if rule == "longest":
        return [len(o) for o in item.options]
    if rule == "consensus":
        return [sum(len(o & p) / max(len(o | p), 1) for j, p in enumerate(opts) if j != i)
                for i, o in enumerate(opts)]
    raise ValueError(f"unknown shortcut rule {rule!r}; one of {', '.join(RULES)}")


def pick(rule: str, item: MCItem) -> str:
    """The letter `rule` picks for `item` (ties broken by a hash of the item and rule)."""
    scores = _scores(rule, item)
    best = max(scores)
    tied = [i for i, s in enumerate(scores) if s == best]
    return LETTERS[tied[int(sha256_text(f"{rule}:{item.id}")[:8], 16) % len(tied)]]


def shortcut_baselines(items: Sequence[MCItem]) -> list[ShortcutRow]:
    """Every rule's accuracy on `items` (Wilson interval, clustered by shared answer
    sentence as the models' accuracies are) and its prediction distribution."""
    if not items:
        return []
    clusters = [(it.provenance.fact_hash if it.provenance and it.provenance.fact_hash
                 else it.id) for it in items]
    letters = LETTERS[:max(len(it.options) for it in items)]
    out = []
    for rule, text in RULES.items():
        preds = [pick(rule, it) for it in items]
        correct = [p == it.answer for p, it in zip(preds, items, strict=True)]
        out.append(ShortcutRow(rule=rule, description=text,
                               accuracy=Accuracy.of(correct, clusters),
                               predictions=prediction_counts(preds, letters)))
    return out


def best(rows: Sequence[ShortcutRow]) -> ShortcutRow | None:
    return max(rows, key=lambda r: r.accuracy.value, default=None)
