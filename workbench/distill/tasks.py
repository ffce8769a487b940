"""The tasks of a distillation: one per (span, perspective, kind), each with the sentence of
its span it asks for (composed mode with answers from the text), capped, and the held-out
tasks of the `benchmark_per_fact` and `seen_fraction` protocols."""

from __future__ import annotations

import random

from workbench.distill import perturb
from workbench.distill.config import DistillConfig
from workbench.distill.write import Span, Task
from workbench.domain_packs import DomainPack
from workbench.errors import WorkbenchError
from workbench.io import sha256_text


def facts(span: Span, seed: int) -> list[str]:
    """Answer-sized sentences of a span, in a seeded order (a training span uses one per
    (perspective, kind) task; a held-out span with `benchmark_per_fact` uses them all)."""
    import re as _re

    sents = [x.strip() for x in _re.split(r"(?<=[.!?])\s+(?=[A-Z])", span.text)
             if 50 <= len(x.strip()) <= 260 and not x.strip().startswith("#")]
    random.Random(f"{seed}:{span.id}").shuffle(sents)
    return sents


def check_breadth(cfg: DistillConfig, pack: DomainPack, perspectives: list[str]) -> None:
    """`benchmark_per_fact` items of one sentence must be asked differently: one perspective
    each, and (from two up) each with its own `question_start`, with `{start}` in the
    prompt; identical prompts would write the same question, which dedup then drops."""
    n = cfg.benchmark_per_fact
    if n > len(perspectives):
        raise WorkbenchError(f"distill.benchmark_per_fact is {n} but only {len(perspectives)} "
                             "perspectives are used: each of a sentence's items is asked from "
                             "another perspective")
    if n < 2:
        return
    starts = [pack.perspective(p).question_start for p in perspectives]
    if "{start}" not in pack.prompts.question_from_fact or None in starts \
            or len(set(starts)) < len(starts):
        raise WorkbenchError(
            f"distill.benchmark_per_fact is {n}: the {pack.name} pack's perspectives "
            f"{', '.join(perspectives)} need distinct question_start words (they have "
            f"{starts}) and its question_from_fact prompt a {{start}} field, else a sentence's "
            "items are written from the same prompt")


def make_tasks(spans: list[Span], perspectives: list[str], cfg: DistillConfig,
               seed: int) -> list[Task]:
    """One task per (span, perspective, kind); with `benchmark_per_fact`, a held-out span
    instead gets `benchmark_per_fact` MC tasks per answer-sized sentence, each from another
    perspective (the sentence is their shared reference answer)."""
    tasks = []
    for sp in spans:
        if sp.split == "benchmark" and cfg.benchmark_items == "statement":
            continue  # its items are made without a model call (distill.statements)
        if sp.split == "benchmark" and cfg.benchmark_per_fact:
            for k, fact in enumerate(facts(sp, seed)):
                for j in range(cfg.benchmark_per_fact):
                    pid = perspectives[(k + j) % len(perspectives)]
                    tasks.append(Task(f"{sp.id}:f{k}:{pid}:mc", sp, pid, "mc",
                                      reference=fact))
            continue
        tasks += [Task(f"{sp.id}:{pid}:{kind}", sp, pid, kind) for pid in perspectives
                  for kind in cfg.kinds
                  if not (kind == "nd" and sp.split == "benchmark")]  # nd of benchmark: unused
    tasks = _cap_train(tasks, cfg.max_train_tasks, seed)
    if cfg.mode == "composed" and cfg.answer_source == "text":
        assign_facts(tasks, seed, _perturbable(spans) if cfg.distractors == "perturbed"
                     else None)
    if cfg.benchmark_items == "statement":  # seen items come from the accepted samples
        return tasks
    return tasks + _seen_tasks(tasks, perspectives, cfg.seen_fraction, seed)


def _perturbable(spans: list[Span]):
    """`can_perturb(span, sentence)`: whether the sentence has two changes that read false
    against its section (the question, not written yet, may still rule one out)."""
    docs: dict[str, list[str]] = {}
    for sp in spans:
        texts = docs.setdefault(sp.section.doc_id, [])
        if sp.text not in texts:
            texts.append(sp.text)
    vocab: dict[str, list[str]] = {}

    def can_perturb(span: Span, sentence: str) -> bool:
        if span.id not in vocab:
            vocab[span.id] = perturb.vocabulary(span.text, *docs[span.section.doc_id])
        return perturb.factorial_options(sentence, "", span.section.text, vocab[span.id],
                                         "check") is not None
    return can_perturb


def assign_facts(tasks: list[Task], seed: int, can_perturb=None) -> None:
    """Each task without a reference gets the next answer-sized sentence of its span (in the
    span's seeded order); a task left without one fails (no_fact_left). With
    `can_perturb(span, sentence)` (perturbed distractors), MC tasks choose first among the
    sentences that can be perturbed, so no writer call is spent on an MC question whose
    options cannot be made; open (nd) tasks then take the rest of those first (a seen item
    can be made only of a sentence that can be perturbed)."""
    by_span: dict[str, list[Task]] = {}
    for t in tasks:
        if t.reference is None and t.reject is None:
            by_span.setdefault(t.span.id, []).append(t)
    for span_tasks in by_span.values():
        span = span_tasks[0].span
        sents = facts(span, seed)
        if can_perturb is None:
            for k, t in enumerate(span_tasks):
                if k < len(sents):
                    t.reference = sents[k]
                else:
                    t.fail("no_fact_left")
            continue
        ok = [x for x in sents if can_perturb(span, x)]
        rest = [x for x in sents if x not in ok]
        order = ok + rest  # open tasks too: a trained fact the seen items can test
        used: set[str] = set()
        for t in sorted(span_tasks, key=lambda t: t.kind != "mc"):  # MC tasks choose first
            pick = next((x for x in order if x not in used), None)
            if pick is None or (t.kind == "mc" and pick not in ok):
                t.fail("no_fact_left" if pick is None else "no_distractors")
                continue
            used.add(pick)
            t.reference = pick


def _seen_tasks(tasks: list[Task], perspectives: list[str], share: float, seed: int
                ) -> list[Task]:
    """RF-Agent's item-level hold-out: for a seeded `share` of the training tasks that have a
    sentence, one more MC task about the same sentence, asked from the next perspective, held
    out as the `seen` benchmark (the training task teaches the fact; this one tests it)."""
    if not share:
        return []
    out = []
    for t in tasks:
        if t.split != "train" or t.reference is None or t.reject is not None:
            continue
        if int(sha256_text(f"{seed}:seen:{t.id}")[:8], 16) / 16**8 >= share:
            continue
        i = perspectives.index(t.perspective) if t.perspective in perspectives else -1
        pid = perspectives[(i + 1) % len(perspectives)]
        out.append(Task(f"{t.id}:seen:{pid}", t.span, pid, "mc", reference=t.reference,
                        heldout="seen", twin=t.id))
    return out


def _cap_train(tasks: list[Task], cap: int | None, seed: int) -> list[Task]:
    """At most `cap` training tasks: round-robin over (perspective, kind) groups, each in a
    seeded order; benchmark tasks all kept; the original order otherwise."""
    train = [t for t in tasks if t.span.split != "benchmark"]
    if cap is None or len(train) <= cap:
        return tasks
    groups: dict[tuple[str, str], list[Task]] = {}
    for t in sorted(train, key=lambda t: sha256_text(f"{seed}:{t.id}")):
        groups.setdefault((t.perspective, t.kind), []).append(t)
    keep: set[str] = set()
    queues = [groups[k] for k in sorted(groups)]
    while len(keep) < cap:
        for q in queues:
            if q and len(keep) < cap:
                keep.add(q.pop(0).id)
    return [t for t in tasks if t.span.split == "benchmark" or t.id in keep]
