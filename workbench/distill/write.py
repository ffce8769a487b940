"""Distillation's stages 1 and 2: sections to spans, spans to tasks, and the agents' calls that
write each task's question, options, reference and reasoning (single or composed mode).

Every call goes through the call cache (`Agents`), in whole batches, so a killed run re-run
makes only the missing calls; every output is parsed by `workbench.distill.parse`, which
rejects with a reason and never patches; with `distill.constrained` the outputs that have a
shape are generated under it (`workbench.distill.shapes`).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from workbench.distill import parse, perturb, shapes
from workbench.distill.config import AgentModel, DistillConfig
from workbench.distill.parse import Reject, format_options
from workbench.distill.quality import balance_letters, jaccard, shingles
from workbench.domain_packs import DomainPack
from workbench.errors import WorkbenchError
from workbench.io import sha256_text
from workbench.models.backends import load_model
from workbench.models.base import ChatModel, GenerationParams
from workbench.models.cache import CONCURRENT_CHUNKS, CachedModel, CallCache
from workbench.progress import progress
from workbench.records import Section

LETTERS = "ABCD"
T = TypeVar("T")


def known(value: T | None, what: str) -> T:
    """A task's field that an earlier stage set for every task still live (the question once
    written, the reference once answered): None here is a bug of the stage order."""
    assert value is not None, f"{what} is not set yet"
    return value


@dataclass
class Span:
    """The text one set of questions is written from: a section, or a part of a long one."""

    id: str
    section: Section
    text: str
    hash: str
    split: str = "train"


@dataclass
class Task:
    id: str
    span: Span
    perspective: str
    kind: str  # "mc" | "nd"
    question: str | None = None
    options: list[str] | None = None
    gold: str | None = None
    reference: str | None = None
    thinking: str | None = None
    solution: str | None = None
    answer: str | None = None
    reject: str | None = None
    flags: list[str] = field(default_factory=list)
    verifier_pred: str | None = None
    # a held-out item about a training task's sentence ("seen"), and that task's id
    heldout: str | None = None
    twin: str | None = None

    @property
    def split(self) -> str:
        """train, benchmark (a held-out section) or seen (a held-out item of a trained
        sentence)."""
        return self.heldout or self.span.split

    def fail(self, reason: str) -> None:
        if self.reject is None:
            self.reject = reason

    def choice(self) -> tuple[list[str], str]:
        """An MC task's options and correct letter (set for a live one once its options
        are)."""
        return known(self.options, "options"), known(self.gold, "gold")

    def gold_option(self) -> str:
        """The text of an MC task's correct option."""
        options, gold = self.choice()
        return options[LETTERS.index(gold)]


@dataclass
class Stats:
    stages: dict[str, int] = field(default_factory=dict)
    rejects: Counter = field(default_factory=Counter)
    calls: int = 0
    cached_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    rejects_format: int = 0
    rejects_content: int = 0

    def count(self, gens) -> None:
        for g in gens:
            if getattr(g, "cached", False):
                self.cached_calls += 1
            else:
                self.calls += 1
            self.prompt_tokens += g.prompt_tokens
            self.completion_tokens += g.completion_tokens


# --- models -----------------------------------------------------------------------------------

class Agents:
    """The model of each agent, loaded once per distinct spec, all behind the call cache."""

    # set by __init__, one per agent (`setattr`, as the agents are named in the config)
    writer: ChatModel
    answerer: ChatModel
    verifier: ChatModel
    postprocess: ChatModel

    def __init__(self, cfg: DistillConfig, default: AgentModel, cache_path: Path | None):
        self._loaded: dict[str, ChatModel] = {}
        cache = CallCache(cache_path) if cache_path else None
        for agent in ("writer", "answerer", "verifier", "postprocess"):
            mc = getattr(cfg.models, agent) or default
            key = json.dumps(mc.model_dump(), sort_keys=True)
            if key not in self._loaded:
                m = load_model(mc.spec, backend=mc.backend, **mc.options)
                self._loaded[key] = CachedModel(m, cache) if cache else m
            setattr(self, agent, self._loaded[key])

        self.constrained: list[str] = []  # agents whose shaped outputs are generated so
        if cfg.constrained is not False:
            for agent in ("writer", "answerer", "verifier", "postprocess"):
                if not self._used(agent, cfg):
                    continue
                if getattr(self, agent).capabilities.constrained:
                    self.constrained.append(agent)
                elif cfg.constrained is True:
                    spec = (getattr(cfg.models, agent) or default).spec
                    raise WorkbenchError(
                        f"distill.constrained is true, but the {agent}'s model ({spec}) cannot "
                        "generate under a grammar; use constrained: auto, or a local or "
                        "OpenAI-compatible backend")

    @staticmethod
    def _used(agent: str, cfg: DistillConfig) -> bool:
        return {"postprocess": cfg.llm_postprocess,
                "verifier": cfg.verifier.enabled and cfg.verifier.method == "generate"
                }.get(agent, True)

    def shaped(self, agent: str, params: GenerationParams, constraint) -> GenerationParams:
        """`params` with `constraint` (a `shapes` function's result) when `agent`'s outputs
        are constrained."""
        if agent not in self.constrained:
            return params
        return params.model_copy(update={"constraint": constraint})

    def identities(self) -> dict[str, str]:
        return {a: getattr(self, a).identity for a in ("writer", "answerer", "verifier",
                                                       "postprocess")}


def _conv(pack: DomainPack, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": pack.prompts.system.format(domain=pack.title)},
            {"role": "user", "content": user}]


# --- stage 1: sections and split --------------------------------------------------------------

def make_spans(sections: list[Section], cfg: DistillConfig, stats: Stats) -> list[Span]:
    spans = []
    for s in sections:
        text = s.text.strip()
        if len(text) < cfg.min_section_chars:
            stats.rejects["section_too_short"] += 1
            continue
        if len(text) <= cfg.max_section_chars:
            spans.append(Span(s.id, s, text, s.content_hash))
            continue
        if cfg.long_sections == "skip":
            stats.rejects["section_too_long"] += 1
            continue
        parts, cur = [], ""
        for para in text.split("\n\n"):
            if cur and len(cur) + len(para) + 2 > cfg.max_section_chars:
                parts.append(cur)
                cur = ""
            cur = f"{cur}\n\n{para}" if cur else para
        parts.append(cur)
        stats.stages["sections_split"] = stats.stages.get("sections_split", 0) + 1
        for i, p in enumerate(parts):
            p = p[:cfg.max_section_chars]
            if len(p) >= cfg.min_section_chars:
                spans.append(Span(f"{s.id}#{i}", s, p, sha256_text(p)[:16]))
    return spans


# --- stage 2: writing -------------------------------------------------------------------------

def _generate(model: ChatModel, convs, params, stats: Stats):
    """The model's generations for `convs`, a few batches at a time under a progress bar
    (chunks are whole batches, and as large as the call cache's chunks for a backend that
    batches continuously, so the batches and their seeds are the same as in one call)."""
    step = max(1, getattr(model, "batch_size", 16)) * CONCURRENT_CHUNKS
    chunks = [convs[i:i + step] for i in range(0, len(convs), step)]
    gens = []
    for chunk in progress(chunks, desc="model calls", unit="chunk"):
        gens += model.generate(chunk, params)
    stats.count(gens)
    return gens


def _by_params(model: ChatModel, convs, params, stats: Stats):
    """`_generate` where `params` may be one per conversation (constraints differ by kind or
    perspective): one call per distinct params, in first-seen order, results in input order;
    with shared params it is exactly one `_generate`."""
    if isinstance(params, GenerationParams):
        return _generate(model, convs, params, stats)
    groups: dict[GenerationParams, list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault(p, []).append(i)
    out = [None] * len(convs)
    for p, idx in groups.items():
        for i, g in zip(idx, _generate(model, [convs[i] for i in idx], p, stats), strict=True):
            out[i] = g
    return out


def _ask(model: ChatModel, tasks: list[Task], convs, params, stats: Stats, handle) -> None:
    """One batch of calls, one per task (`params` shared or one per task); `handle(task,
    text)` stores what it parses or raises Reject, which fails that task with the reason (a
    model error fails it too)."""
    for t, g in zip(tasks, _by_params(model, convs, params, stats), strict=True):
        try:
            if g.error:
                raise Reject("model_error", g.error)
            handle(t, g.text)
        except Reject as r:
            t.fail(r.reason)


def write_single(tasks: list[Task], pack: DomainPack, agents: Agents, cfg: DistillConfig,
                 seed: int, stats: Stats) -> None:
    wp = GenerationParams(max_tokens=cfg.writer_max_tokens, temperature=cfg.writer_temperature,
                          seed=seed)
    convs = []
    for t in tasks:
        p = pack.perspective(t.perspective)
        tpl = pack.prompts.writer_mc if t.kind == "mc" else pack.prompts.writer_nd
        convs.append(_conv(pack, tpl.format(text=t.span.text, perspective=p.name,
                                            focus=p.focus, domain=pack.title)))
    def written(t: Task, text: str) -> None:
        if t.kind == "mc":
            t.question, t.options, t.gold = parse.parse_mc_block(text)
        else:
            t.question = parse.parse_question(text)

    wps = [agents.shaped("writer", wp, shapes.mc_block(wp.max_tokens) if t.kind == "mc"
                         else shapes.written_question(wp.max_tokens)) for t in tasks]
    _ask(agents.writer, tasks, convs, wps, stats, written)
    _balance(tasks, seed)
    live = [t for t in tasks if t.reject is None]
    stats.stages["written"] = len(live)
    ap = GenerationParams(max_tokens=cfg.answer_max_tokens, temperature=cfg.answer_temperature,
                          seed=seed)
    convs = [_conv(pack, pack.prompts.answerer.format(
        text=t.span.text, question=t.question,
        options=format_options(t.options) if t.options else "",
        answer_hint=" (the letter of the correct option)" if t.kind == "mc" else "",
        domain=pack.title)) for t in live]
    aps = [agents.shaped("answerer", ap, shapes.answerer(ap.max_tokens, t.kind == "mc"))
           for t in live]
    raws = {}
    for t, g in zip(live, _by_params(agents.answerer, convs, aps, stats), strict=True):
        if g.error:
            t.fail("model_error")
        raws[t.id] = g.text
    if cfg.llm_postprocess:
        todo = [t for t in live if t.reject is None]
        convs = [_conv(pack, pack.prompts.postprocess.format(raw=raws[t.id])) for t in todo]
        pp = GenerationParams(max_tokens=cfg.answer_max_tokens + 64, temperature=0.0)
        pps = [agents.shaped("postprocess", pp, shapes.postprocess(pp.max_tokens,
                                                                   t.kind == "mc"))
               for t in todo]
        for t, g in zip(todo, _by_params(agents.postprocess, convs, pps, stats), strict=True):
            try:
                obj = parse.parse_postprocess_json(g.text)
                t.thinking, t.solution = obj["thinking"], obj["solution"]
                t.answer = parse.normalise_letters(obj["answer"]) if t.kind == "mc" \
                    else obj["answer"]
            except Reject as r:
                t.fail(r.reason)
    else:
        for t in live:
            if t.reject is not None:
                continue
            try:
                t.thinking, t.solution, t.answer = parse.parse_answerer(
                    raws[t.id], multiple_choice=t.kind == "mc")
            except Reject as r:
                t.fail(r.reason)
    for t in live:
        if t.reject is None and t.kind == "mc" and t.answer != t.gold:
            t.fail("answerer_disagrees_with_writer")


def _balance(tasks: list[Task], seed: int) -> None:
    """Move each MC item's correct option to a seeded, near-uniform target letter, before any
    reasoning mentions letters."""
    mc = [t for t in tasks if t.reject is None and t.kind == "mc"]
    for t, (opts, gold) in zip(mc, balance_letters([t.choice() for t in mc], seed),
                               strict=True):
        t.options, t.gold = opts, gold


def write_from_facts(tasks: list[Task], pack: DomainPack, agents: Agents, cfg: DistillConfig,
                     seed: int, stats: Stats) -> None:
    """Composed mode, answers taken from the text: each task gets a sentence of its span
    as the reference answer (unless it was made with one), and the model writes the
    question that sentence answers, starting with its perspective's word. A question that
    fails validation is asked again with the next seed, up to `write_attempts` calls.
    `distill.tasks.make_tasks` gave each task its sentence."""
    for t in tasks:
        if t.reference is None:
            t.fail("no_fact_left")

    def conv(t: Task):
        p = pack.perspective(t.perspective)
        start = f' Start the question with "{p.question_start}".' if p.question_start else ""
        return _conv(pack, pack.prompts.question_from_fact.format(
            fact=t.reference, domain=pack.title, perspective=p.name, start=start))

    def asked(t: Task, text: str) -> None:
        t.question = parse.parse_question(text)
        parse.check_grounded(t.question, known(t.reference, "reference"))

    todo = [t for t in tasks if t.reject is None]
    for attempt in range(cfg.write_attempts):
        if attempt:
            stats.stages["write_retries"] = stats.stages.get("write_retries", 0) + len(todo)
            for t in todo:
                t.reject = None
        # attempt k > 0 draws from its own seed, not from another run's (seed + k would be)
        wp = GenerationParams(max_tokens=min(cfg.writer_max_tokens, 96),
                              temperature=cfg.writer_temperature,
                              seed=seed if attempt == 0 else
                              int(sha256_text(f"{seed}:write-attempt:{attempt}")[:8], 16))
        wps = [agents.shaped("writer", wp, shapes.question(
            wp.max_tokens, pack.perspective(t.perspective).question_start)) for t in todo]
        _ask(agents.writer, todo, [conv(t) for t in todo], wps, stats, asked)
        todo = [t for t in todo if t.reject is not None and t.reject != "model_error"]
        if not todo or cfg.writer_temperature == 0:  # greedy: another call writes the same
            break
    stats.stages["written"] = sum(t.reject is None for t in tasks)


def write_composed(tasks: list[Task], pack: DomainPack, agents: Agents, cfg: DistillConfig,
                   seed: int, stats: Stats, before_rationales=None) -> None:
    """Questions, reference answers, options, then rationales. `before_rationales(tasks)`
    runs once the questions and options are final and before any rationale call (the
    quality gates, so no call is spent on a question they remove)."""
    if cfg.answer_source == "text":
        write_from_facts(tasks, pack, agents, cfg, seed, stats)
        _rationales(tasks, pack, agents, cfg, seed, stats, before_rationales)
        return
    wp = GenerationParams(max_tokens=min(cfg.writer_max_tokens, 96),
                          temperature=cfg.writer_temperature, seed=seed)
    wp = agents.shaped("writer", wp, shapes.question(wp.max_tokens))
    convs = []
    for t in tasks:
        p = pack.perspective(t.perspective)
        convs.append(_conv(pack, pack.prompts.question.format(
            text=t.span.text, perspective=p.name, focus=p.focus, domain=pack.title)))
    _ask(agents.writer, tasks, convs, wp, stats,
         lambda t, text: setattr(t, "question", parse.parse_question(text)))
    live = [t for t in tasks if t.reject is None]
    stats.stages["written"] = len(live)
    # one sentence: 64 tokens is plenty
    ap = agents.shaped("answerer", GenerationParams(
        max_tokens=64, temperature=cfg.answer_temperature, seed=seed), shapes.sentence(64))
    convs = [_conv(pack, pack.prompts.reference_answer.format(
        text=t.span.text, question=t.question, domain=pack.title)) for t in live]
    _ask(agents.answerer, live, convs, ap, stats,
         lambda t, text: setattr(t, "reference", parse.parse_sentence(text)))
    _rationales(tasks, pack, agents, cfg, seed, stats, before_rationales)


def _rationales(tasks: list[Task], pack: DomainPack, agents: Agents, cfg: DistillConfig,
                seed: int, stats: Stats, before=None) -> None:
    """Options for MC items, then (after `before`, e.g. the gates) the model explains each
    known answer step by step."""
    live = [t for t in tasks if t.reject is None]
    if cfg.distractors == "perturbed":
        _perturbed_options(live, seed)
    else:
        _assemble_options(live, seed)
    _balance(live, seed)
    if before is not None:
        before(tasks)
    live = [t for t in live if t.reject is None]
    if not cfg.benchmark_rationales:  # held-out items are scored, never trained on
        for t in live:
            if t.split != "train" and t.kind == "mc":
                t.thinking, t.answer = "", t.gold
                t.solution = f"The correct option is {t.gold}: {t.gold_option()}"
                t.flags.append("no_rationale")
        live = [t for t in live if t.thinking is None]
    rp = GenerationParams(max_tokens=cfg.answer_max_tokens, temperature=cfg.answer_temperature,
                          seed=seed)
    convs = []
    for t in live:
        opts = format_options(t.choice()[0]) if t.kind == "mc" else ""
        ans = f"{t.gold}) {t.gold_option()}" if t.kind == "mc" else t.reference
        convs.append(_conv(pack, pack.prompts.rationale.format(
            text=t.span.text, question=t.question, options=opts, answer=ans,
            domain=pack.title)))
    def explained(t: Task, text: str) -> None:
        t.thinking = parse.parse_rationale(text)
        if t.kind == "mc":
            t.answer = t.gold
            t.solution = f"The correct option is {t.gold}: {t.gold_option()}"
        else:
            t.solution = known(t.reference, "reference")
            t.answer = t.solution.split(". ")[0].rstrip(".") + "."

    _ask(agents.answerer, live, convs, rp, stats, explained)


def _assemble_options(tasks: list[Task], seed: int) -> None:
    """Composed mode: an MC item's distractors are reference answers to sibling questions
    (same section first, then same document, then the rest of the corpus): on topic, from
    the same text where possible, and wrong for this question (the verifier checks)."""
    by_span: dict[str, list[Task]] = {}
    by_doc: dict[str, list[Task]] = {}
    everyone = list(tasks)
    for t in tasks:
        by_span.setdefault(t.span.id, []).append(t)
        by_doc.setdefault(t.span.section.doc_id, []).append(t)
    for t in tasks:
        if t.kind != "mc":
            continue
        reference = known(t.reference, "reference")
        mine = shingles(reference)
        same = [o for o in by_span[t.span.id] if o is not t]
        doc = [o for o in by_doc[t.span.section.doc_id] if o.span.id != t.span.id]
        rest = [o for o in everyone if o.span.section.doc_id != t.span.section.doc_id]
        picked: list[str] = []
        rng = random.Random(f"{seed}:{t.id}")
        for group in (same, doc, rest):
            rng.shuffle(group)
        for o in same + doc + rest:
            cand = o.reference
            if not cand or cand == reference or jaccard(mine, shingles(cand)) >= 0.5:
                continue
            if any(jaccard(shingles(cand), shingles(p)) >= 0.5 for p in picked):
                continue
            picked.append(cand)
            if len(picked) == 3:
                break
        if len(picked) < 3:
            t.fail("no_distractors")
            continue
        t.options = [reference, *picked]
        t.gold = "A"  # letter balance moves it
        try:
            parse.check_options(t.options)
        except Reject as r:
            t.fail(r.reason)


def _perturbed_options(tasks: list[Task], seed: int) -> None:
    """An MC item's options: its sentence and three perturbed copies that the section
    contradicts (`workbench.distill.perturb`); an item whose sentence has fewer than two
    changes that read false fails (no_distractors), and is never padded with a true
    sentence."""
    docs: dict[str, list[str]] = {}
    for t in tasks:
        texts = docs.setdefault(t.span.section.doc_id, [])
        if t.span.text not in texts:
            texts.append(t.span.text)
    vocab: dict[str, list[str]] = {}
    for t in tasks:
        if t.kind != "mc":
            continue
        if t.span.id not in vocab:
            vocab[t.span.id] = perturb.vocabulary(t.span.text, *docs[t.span.section.doc_id])
        opts = perturb.factorial_options(known(t.reference, "reference"), t.question or "",
                                         t.span.section.text, vocab[t.span.id],
                                         f"{seed}:{t.id}")
        if opts is None:
            t.fail("no_distractors")
            continue
        t.options, t.gold = opts, "A"  # letter balance moves it
        try:
            parse.check_options(t.options)
        except Reject as r:
            t.fail(r.reason)
