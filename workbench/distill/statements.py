"""Held-out items without a model call: "Which statement about <section> is correct?"

With `distill.benchmark_items: statement` a held-out item is one sentence of the text and three
perturbed copies of it (`workbench.distill.perturb`: a number, an opposite or a term changed,
in a 2 x 2 design, each checked false against the section), under a question that names only
the section's topic. Nothing in the question points at an option, and the options differ only
in the changed facts, so only knowing the fact (or reading the passage) tells them apart.

Two benchmarks come out of one distillation:

- `unseen` (held-out sections, transfer): every sentence of a held-out span that can be
  perturbed, so the benchmark's size is the text's, not the 135M writer's yield;
- `seen` (RF-Agent's item-level protocol): for a seeded `seen_fraction` of the accepted
  training samples, an item on the sentence that sample answers. The training sample teaches
  the fact under its own question; the item tests it under another question with options
  drawn under another seed (how many of them a training item also had is counted).

Statement items are made after the gates, the verifier and dedup (they have no written text
for those to check) and carry the flags `statement` and `no_rationale`.
"""

from __future__ import annotations

from workbench.distill import perturb
from workbench.distill.quality import balance_letters
from workbench.distill.tasks import facts
from workbench.distill.write import LETTERS, Span, Task, known
from workbench.io import sha256_text
from workbench.records import Section


def question_for(section: Section) -> str:
    """The item's question: the section's own (last) heading, nothing of the sentence."""
    topic = section.title.split(" > ")[-1].strip() or section.title.strip()
    return f"Which statement about {topic} is correct?"


def recall_question_for(section: Section) -> str:
    """A recall sample's question: the section's topic, as the statement items name it."""
    topic = section.title.split(" > ")[-1].strip() or section.title.strip()
    return f"What does the text say about {topic}?"


def recall_samples(spans: list[Span], accepted: list[Task], seed: int) -> list[Task]:
    """`distill.recall_samples`: every answer-sized sentence of a training span that no
    accepted sample answers, as an open training sample asking what the text says about
    the section's topic and answered by the sentence; no model call."""
    answered = {t.reference for t in accepted if t.reference}
    out = []
    for sp in spans:
        if sp.split != "train":
            continue
        for k, fact in enumerate(facts(sp, seed)):
            if fact in answered:
                continue
            answered.add(fact)
            t = Task(f"{sp.id}:r{k}", sp, "recall", "nd", reference=fact,
                     question=recall_question_for(sp.section))
            t.thinking, t.solution, t.answer = "", fact, fact
            t.flags += ["recall", "no_rationale"]
            out.append(t)
    return out


class _Vocabularies:
    """Terms to swap in, per span: the span's own words first, then its document's."""

    def __init__(self, sections: list[Section]):
        self._docs: dict[str, list[str]] = {}
        for s in sections:
            self._docs.setdefault(s.doc_id, []).append(s.text)
        self._cache: dict[str, list[str]] = {}

    def of(self, t: Task) -> list[str]:
        if t.span.id not in self._cache:
            self._cache[t.span.id] = perturb.vocabulary(
                t.span.text, *self._docs.get(t.span.section.doc_id, []))
        return self._cache[t.span.id]


def _item(t: Task, vocab: _Vocabularies, seed: str) -> Task | None:
    """`t` made a statement item (its question and options set), or None when its sentence
    has fewer than two changes that read false."""
    t.question = question_for(t.span.section)
    opts = perturb.factorial_options(t.reference or "", t.question, t.span.section.text,
                                     vocab.of(t), seed)
    if opts is None:
        return None
    t.options, t.gold = opts, "A"
    t.thinking, t.answer = "", "A"
    t.flags += ["statement", "no_rationale"]
    return t


def unseen_items(spans: list[Span], sections: list[Section], seed: int) -> list[Task]:
    """Every perturbable answer-sized sentence of the held-out spans, as an item."""
    vocab = _Vocabularies(sections)
    out = []
    for sp in spans:
        if sp.split != "benchmark":
            continue
        for k, fact in enumerate(facts(sp, seed)):
            t = _item(Task(f"{sp.id}:s{k}", sp, "statement", "mc", reference=fact), vocab,
                      f"{seed}:{sp.id}:s{k}")
            if t is not None:
                out.append(t)
    return _balanced(out, seed)


def seen_items(accepted: list[Task], sections: list[Section], share: float, seed: int
               ) -> tuple[list[Task], int]:
    """(items on the sentences of a seeded `share` of the accepted training tasks, one per
    sentence; how many of their distractors a training item of the same sentence also had)."""
    vocab = _Vocabularies(sections)
    trained_options: dict[str, set[str]] = {}
    for t in accepted:
        if t.split == "train" and t.reference:
            trained_options.setdefault(t.reference, set()).update(t.options or ())
    out, shared, done = [], 0, set()
    for t in accepted:
        if t.split != "train" or not t.reference or t.reference in done:
            continue
        if int(sha256_text(f"{seed}:seen:{t.id}")[:8], 16) / 16**8 >= share:
            continue
        done.add(t.reference)
        item = _item(Task(f"{t.id}:seen", t.span, "statement", "mc", reference=t.reference,
                          heldout="seen", twin=t.id), vocab, f"{seed}:seen:{t.id}")
        if item is None:
            continue
        shared += sum(o in trained_options[t.reference]
                      for o in known(item.options, "options")[1:])
        out.append(item)
    return _balanced(out, seed + 1), shared


def _balanced(items: list[Task], seed: int) -> list[Task]:
    """The correct option moved to near-uniform letters; the solution names it."""
    for t, (opts, gold) in zip(items, balance_letters([t.choice() for t in items], seed),
                               strict=True):
        t.options, t.gold, t.answer = opts, gold, gold
        t.solution = f"The correct option is {gold}: {opts[LETTERS.index(gold)]}"
    return items
