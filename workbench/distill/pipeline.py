"""QTSA distillation: corpus sections -> Question-Thinking-Solution-Answer samples and a
multiple-choice benchmark (RF-Agent's method, with the quality controls it lacks).

Stages, each a batch of model calls through the call cache (killed at any point, a re-run
makes only the missing calls and ends with the same output):

1. sections: ingest, drop too-short sections, split or skip too-long ones, split the
   sections into training and benchmark sets (disjoint by id and content hash);
2. write: questions per (section, perspective, kind); with `benchmark_per_fact`, held-out
   sections get several MC items per sentence of the text, one per perspective
   - single mode (RF-Agent): the writer writes an MC question with four options, or an
     open question; the answerer reasons in <think>, writes a solution and an <answer>;
   - composed mode (small models): a question call, a one-sentence reference answer call,
     distractors taken from the reference answers of sibling questions, then a rationale
     call that explains the known answer;
3. validate every output deterministically (reject with a reason, never patch);
4. letter balance (shuffle options), verifier (answer the MC item with the text), dedup,
   difficulty; 5. write JSONL, SFT exports, the benchmark and the report.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from workbench.distill import parse
from workbench.distill.config import AgentModel, DistillConfig
from workbench.distill.parse import Reject, format_options
from workbench.distill.quality import (
    balance_letters, difficulty, letter_distribution, near_duplicates, split_sections,
)
from workbench.distill.report import DistillReport
from workbench.domains import DomainPack, load_pack
from workbench.errors import WorkbenchError
from workbench.io import atomic_write_json, atomic_write_text, sha256_text, write_jsonl
from workbench.models.base import ChatModel, GenerationParams, ScoreRequest
from workbench.records import MCItem, Provenance, QTSASample, RunManifest, Section, library_versions

LETTERS = "ABCD"


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

    def fail(self, reason: str) -> None:
        if self.reject is None:
            self.reject = reason


@dataclass
class Stats:
    stages: dict[str, int] = field(default_factory=dict)
    rejects: Counter = field(default_factory=Counter)
    calls: int = 0
    cached_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

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

    def __init__(self, cfg: DistillConfig, default: AgentModel, cache_path: Path | None):
        from workbench.models.cache import CachedModel, CallCache
        from workbench.models.registry import load_model

        self._loaded: dict[str, ChatModel] = {}
        cache = CallCache(cache_path) if cache_path else None
        for agent in ("writer", "answerer", "verifier", "postprocess"):
            mc = getattr(cfg.models, agent) or default
            key = json.dumps(mc.model_dump(), sort_keys=True)
            if key not in self._loaded:
                m = load_model(mc.spec, backend=mc.backend, **mc.options)
                self._loaded[key] = CachedModel(m, cache) if cache else m
            setattr(self, agent, self._loaded[key])

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
    (chunks are whole batches, so the batches and their seeds are the same as in one call)."""
    from workbench.progress import progress

    step = max(1, getattr(model, "batch_size", 16)) * 4
    chunks = [convs[i:i + step] for i in range(0, len(convs), step)]
    gens = []
    for chunk in progress(chunks, desc="model calls", unit="chunk"):
        gens += model.generate(chunk, params)
    stats.count(gens)
    return gens


def _ask(model: ChatModel, tasks: list[Task], convs, params, stats: Stats, handle) -> None:
    """One batch of calls, one per task; `handle(task, text)` stores what it parses or raises
    Reject, which fails that task with the reason (a model error fails it too)."""
    for t, g in zip(tasks, _generate(model, convs, params, stats), strict=True):
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

    _ask(agents.writer, tasks, convs, wp, stats, written)
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
    raws = {}
    for t, g in zip(live, _generate(agents.answerer, convs, ap, stats), strict=True):
        if g.error:
            t.fail("model_error")
        raws[t.id] = g.text
    if cfg.llm_postprocess:
        todo = [t for t in live if t.reject is None]
        convs = [_conv(pack, pack.prompts.postprocess.format(raw=raws[t.id])) for t in todo]
        pp = GenerationParams(max_tokens=cfg.answer_max_tokens + 64, temperature=0.0)
        for t, g in zip(todo, _generate(agents.postprocess, convs, pp, stats), strict=True):
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
    for t, (opts, gold) in zip(mc, balance_letters([(t.options, t.gold) for t in mc], seed),
                               strict=True):
        t.options, t.gold = opts, gold


def _facts(span: Span, seed: int) -> list[str]:
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
        if sp.split == "benchmark" and cfg.benchmark_per_fact:
            for k, fact in enumerate(_facts(sp, seed)):
                for j in range(cfg.benchmark_per_fact):
                    pid = perspectives[(k + j) % len(perspectives)]
                    tasks.append(Task(f"{sp.id}:f{k}:{pid}:mc", sp, pid, "mc",
                                      reference=fact))
            continue
        tasks += [Task(f"{sp.id}:{pid}:{kind}", sp, pid, kind) for pid in perspectives
                  for kind in cfg.kinds
                  if not (kind == "nd" and sp.split == "benchmark")]  # nd of benchmark: unused
    return tasks


def write_from_facts(tasks: list[Task], pack: DomainPack, agents: Agents, cfg: DistillConfig,
                     seed: int, stats: Stats) -> None:
    """Composed mode, answers taken from the text: each task gets a sentence of its span
    as the reference answer (unless it was made with one), and the model writes the
    question that sentence answers, starting with its perspective's word. A question that
    fails validation is asked again with the next seed, up to `write_attempts` calls."""
    by_span: dict[str, list[Task]] = {}
    for t in tasks:
        if t.reference is None:
            by_span.setdefault(t.span.id, []).append(t)
    for span_tasks in by_span.values():
        facts = _facts(span_tasks[0].span, seed)
        for k, t in enumerate(span_tasks):
            if k < len(facts):
                t.reference = facts[k]
            else:
                t.fail("no_fact_left")

    def conv(t: Task):
        p = pack.perspective(t.perspective)
        start = f' Start the question with "{p.question_start}".' if p.question_start else ""
        return _conv(pack, pack.prompts.question_from_fact.format(
            fact=t.reference, domain=pack.title, perspective=p.name, start=start))

    def asked(t: Task, text: str) -> None:
        t.question = parse.parse_question(text)
        parse.check_grounded(t.question, t.reference)

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
        _ask(agents.writer, todo, [conv(t) for t in todo], wp, stats, asked)
        todo = [t for t in todo if t.reject is not None and t.reject != "model_error"]
        if not todo or cfg.writer_temperature == 0:  # greedy: another call writes the same
            break
    stats.stages["written"] = sum(t.reject is None for t in tasks)


def write_composed(tasks: list[Task], pack: DomainPack, agents: Agents, cfg: DistillConfig,
                   seed: int, stats: Stats) -> None:
    if cfg.answer_source == "text":
        write_from_facts(tasks, pack, agents, cfg, seed, stats)
        _rationales(tasks, pack, agents, cfg, seed, stats)
        return
    wp = GenerationParams(max_tokens=min(cfg.writer_max_tokens, 96),
                          temperature=cfg.writer_temperature, seed=seed)
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
    ap = GenerationParams(max_tokens=64, temperature=cfg.answer_temperature, seed=seed)
    convs = [_conv(pack, pack.prompts.reference_answer.format(
        text=t.span.text, question=t.question, domain=pack.title)) for t in live]
    _ask(agents.answerer, live, convs, ap, stats,
         lambda t, text: setattr(t, "reference", parse.parse_sentence(text)))
    _rationales(tasks, pack, agents, cfg, seed, stats)


def _rationales(tasks: list[Task], pack: DomainPack, agents: Agents, cfg: DistillConfig,
                seed: int, stats: Stats) -> None:
    """Options for MC items, then the model explains each known answer step by step."""
    live = [t for t in tasks if t.reject is None]
    _assemble_options(live, seed)
    _balance(live, seed)
    live = [t for t in live if t.reject is None]
    if not cfg.benchmark_rationales:  # held-out items are scored, never trained on
        for t in live:
            if t.span.split == "benchmark" and t.kind == "mc":
                t.thinking, t.answer = "", t.gold
                t.solution = (f"The correct option is {t.gold}: "
                              f"{t.options[LETTERS.index(t.gold)]}")
                t.flags.append("no_rationale")
        live = [t for t in live if t.thinking is None]
    rp = GenerationParams(max_tokens=cfg.answer_max_tokens, temperature=cfg.answer_temperature,
                          seed=seed)
    convs = []
    for t in live:
        opts = format_options(t.options) if t.kind == "mc" else ""
        ans = f"{t.gold}) {t.options[LETTERS.index(t.gold)]}" if t.kind == "mc" else t.reference
        convs.append(_conv(pack, pack.prompts.rationale.format(
            text=t.span.text, question=t.question, options=opts, answer=ans,
            domain=pack.title)))
    def explained(t: Task, text: str) -> None:
        t.thinking = parse.parse_rationale(text)
        if t.kind == "mc":
            t.answer = t.gold
            t.solution = (f"The correct option is {t.gold}: "
                          f"{t.options[LETTERS.index(t.gold)]}")
        else:
            t.solution = t.reference
            t.answer = t.reference.split(". ")[0].rstrip(".") + "."

    _ask(agents.answerer, live, convs, rp, stats, explained)


def _assemble_options(tasks: list[Task], seed: int) -> None:
    """Composed mode: an MC item's distractors are reference answers to sibling questions
    (same section first, then same document, then the rest of the corpus): on topic, from
    the same text where possible, and wrong for this question (the verifier checks)."""
    from workbench.distill.quality import jaccard, shingles

    by_span: dict[str, list[Task]] = {}
    by_doc: dict[str, list[Task]] = {}
    everyone = list(tasks)
    for t in tasks:
        by_span.setdefault(t.span.id, []).append(t)
        by_doc.setdefault(t.span.section.doc_id, []).append(t)
    for t in tasks:
        if t.kind != "mc":
            continue
        mine = shingles(t.reference)
        same = [o for o in by_span[t.span.id] if o is not t]
        doc = [o for o in by_doc[t.span.section.doc_id] if o.span.id != t.span.id]
        rest = [o for o in everyone if o.span.section.doc_id != t.span.section.doc_id]
        picked: list[str] = []
        rng = random.Random(f"{seed}:{t.id}")
        for group in (same, doc, rest):
            rng.shuffle(group)
        for o in same + doc + rest:
            cand = o.reference
            if not cand or cand == t.reference or jaccard(mine, shingles(cand)) >= 0.5:
                continue
            if any(jaccard(shingles(cand), shingles(p)) >= 0.5 for p in picked):
                continue
            picked.append(cand)
            if len(picked) == 3:
                break
        if len(picked) < 3:
            t.fail("no_distractors")
            continue
        t.options = [t.reference, *picked]
        t.gold = "A"  # letter balance moves it
        try:
            parse.check_options(t.options)
        except Reject as r:
            t.fail(r.reason)


# --- stage 4: verify --------------------------------------------------------------------------

def verify(tasks: list[Task], pack: DomainPack, agents: Agents, cfg: DistillConfig,
           stats: Stats) -> None:
    mc = [t for t in tasks if t.reject is None and t.kind == "mc"]
    convs = [_conv(pack, pack.prompts.verifier.format(
        text=t.span.text, question=t.question, options=format_options(t.options),
        domain=pack.title)) for t in mc]
    if cfg.verifier.method == "loglik":
        scores = agents.verifier.score([ScoreRequest(c, list(LETTERS)) for c in convs])
        preds = [LETTERS[max(range(4), key=lambda i: row[i].logprob)] for row in scores]
    else:
        gens = _generate(agents.verifier, convs, GenerationParams(max_tokens=8), stats)
        preds = []
        for g in gens:
            try:
                preds.append(parse.normalise_letters(g.text.strip()[:12]))
            except Reject:
                preds.append("?")
    agree = 0
    for t, p in zip(mc, preds, strict=True):
        t.verifier_pred = p
        if p == t.gold:
            agree += 1
        elif cfg.verifier.on_disagree == "reject":
            t.fail("verifier_disagrees")
        else:
            t.flags.append("verifier_disagrees")
    stats.stages["verified_mc"] = len(mc)
    stats.stages["verifier_agreed"] = agree


# --- the run ----------------------------------------------------------------------------------

@dataclass
class DistillResult:
    run_dir: Path
    report: DistillReport
    samples: list[QTSASample]
    benchmark: list[MCItem]


def run_distill(cfg: DistillConfig, run_dir: str | Path, *, seed: int = 0,
                default_model: AgentModel | None = None, sections: list[Section] | None = None,
                cache: bool = True, progress=lambda msg: None) -> DistillResult:
    from workbench.corpus import load_sections

    t_start = time.perf_counter()
    run_dir = Path(run_dir)
    if not cfg.corpus or not cfg.domain:
        raise WorkbenchError("distill.corpus and distill.domain must be set (the experiment's "
                             "`corpus` and `domain` fill them in)")
    pack = load_pack(cfg.domain)
    perspectives = cfg.perspectives or [p.id for p in pack.perspectives]
    for pid in perspectives:
        pack.perspective(pid)  # unknown ids fail before any model call
    check_breadth(cfg, pack, perspectives)
    run_dir.mkdir(parents=True, exist_ok=True)
    stats = Stats()
    ingest_report = None
    if sections is None:
        sections, ingest_report = load_sections(cfg.corpus)
    if cfg.max_sections:
        sections = sections[:cfg.max_sections]
    if not sections:
        raise WorkbenchError(f"{cfg.corpus}: the corpus has no sections")
    stats.stages["sections"] = len(sections)
    train_secs, bench_secs, removed = split_sections(
        sections, benchmark_fraction=cfg.benchmark_fraction, seed=seed)
    split_of = {s.id: "train" for s in train_secs} | {s.id: "benchmark" for s in bench_secs}
    spans = [sp for sp in make_spans(sections, cfg, stats) if sp.section.id in split_of]
    for sp in spans:
        sp.split = split_of[sp.section.id]
    stats.stages["spans"] = len(spans)
    progress(f"{len(sections)} sections ({len(bench_secs)} benchmark, {len(train_secs)} train,"
             f" {removed} removed as repeats), {len(spans)} spans")
    tasks = make_tasks(spans, perspectives, cfg, seed)
    stats.stages["tasks"] = len(tasks)
    agents = Agents(cfg, default_model or AgentModel(), run_dir / "calls.sqlite" if cache
                    else None)
    progress(f"{len(tasks)} tasks; writing ({cfg.mode} mode)")
    (write_single if cfg.mode == "single" else write_composed)(tasks, pack, agents, cfg, seed,
                                                               stats)
    live = [t for t in tasks if t.reject is None]
    stats.stages["parsed_and_answered"] = len(live)
    # validate references and stems once more on the final fields
    for t in live:
        try:
            t.question = parse.check_question(t.question)
            parse.check_grounded(t.question, t.span.text)
        except Reject as r:
            t.fail(r.reason)
            continue
        for attr in ("thinking", "solution"):
            text, changed = parse.rewrite_numbered_refs(getattr(t, attr))
            if changed:
                setattr(t, attr, text)
                t.flags.append("rewrote_references")
    mc = [t for t in tasks if t.reject is None and t.kind == "mc"]
    if cfg.verifier.enabled and mc:
        progress(f"verifying {len(mc)} multiple-choice items")
        verify(tasks, pack, agents, cfg, stats)
    live = [t for t in tasks if t.reject is None]
    stats.stages["validated"] = len(live)
    # dedup across the corpus (which covers duplicates within a section)
    drop = set(near_duplicates([t.question for t in live], threshold=cfg.dedup.threshold,
                               method=cfg.dedup.method,
                               embedder=_embedder(cfg) if cfg.dedup.method == "embedding"
                               else None, seed=seed))
    for i in drop:
        live[i].fail("duplicate_question")
    stats.stages["dedup_removed"] = len(drop)
    accepted = [t for t in tasks if t.reject is None]
    stats.stages["accepted"] = len(accepted)
    for t in tasks:
        if t.reject:
            stats.rejects[t.reject] += 1
    samples = [_to_sample(t, pack, agents) for t in accepted]
    bench = [MCItem(id=s.id, question=s.question, options=s.options, answer=s.answer,
                    difficulty=s.difficulty, provenance=s.provenance)
             for s in samples if s.kind == "mc" and s.split == "benchmark"][:cfg.benchmark_size]
    report = _report(cfg, pack, stats, samples, bench, agents, ingest_report, removed,
                     time.perf_counter() - t_start, seed)
    _write_outputs(run_dir, cfg, samples, bench, report, seed, sections)
    return DistillResult(run_dir, report, samples, bench)


def _embedder(cfg: DistillConfig):
    from workbench.models.embed import load_embedder

    return load_embedder("minilm")


def _to_sample(t: Task, pack: DomainPack, agents: Agents) -> QTSASample:
    models = agents.identities()
    if not t.verifier_pred:
        models.pop("verifier", None)
    models.pop("postprocess", None)
    prov = Provenance(section_id=t.span.section.id, span_hash=t.span.hash,
                      doc_id=t.span.section.doc_id, perspective=t.perspective, models=models,
                      prompt_version=pack.prompt_version, domain=pack.name,
                      fact_hash=sha256_text(t.reference)[:16] if t.reference else None)
    sid = "q-" + sha256_text(f"{t.id}\x1f{t.question}")[:16]
    return QTSASample(id=sid, kind=t.kind, question=t.question, options=t.options,
                      thinking=t.thinking, solution=t.solution, answer=t.answer,
                      difficulty=difficulty(t.question, t.solution, t.thinking,
                                            pack.advanced_terms),
                      provenance=prov, split=t.span.split, flags=list(t.flags))


def _report(cfg, pack, stats: Stats, samples, bench, agents, ingest_report, removed, seconds,
            seed) -> DistillReport:
    mc = [s for s in samples if s.kind == "mc"]
    accepted = len(samples)
    verified = stats.stages.get("verified_mc", 0)
    return DistillReport.model_validate({
        "domain": pack.name, "prompt_version": pack.prompt_version, "mode": cfg.mode,
        "seed": seed, "models": agents.identities(),
        "sections": stats.stages.get("sections", 0),
        "sections_skipped_by_ingest": [list(x) for x in (ingest_report.skipped
                                                           if ingest_report else [])],
        "benchmark_overlap_removed": removed,
        "stages": stats.stages,
        "rejects": dict(sorted(stats.rejects.items(), key=lambda kv: -kv[1])),
        "accepted": {"total": accepted, "mc": len(mc), "nd": accepted - len(mc),
                     "train": sum(s.split == "train" for s in samples),
                     "benchmark_items": len(bench)},
        "verifier": {"checked": verified, "agreed": stats.stages.get("verifier_agreed", 0),
                     "agreement": (stats.stages.get("verifier_agreed", 0) / verified
                                   if verified else None),
                     "method": cfg.verifier.method, "on_disagree": cfg.verifier.on_disagree},
        "dedup_removed": stats.stages.get("dedup_removed", 0),
        "letter_balance": letter_distribution([s.answer for s in mc]),
        "difficulty_histogram": {str(k): sum(s.difficulty == k for s in samples)
                                 for k in range(1, 6)},
        "model_calls": {"made": stats.calls, "from_cache": stats.cached_calls,
                        "prompt_tokens": stats.prompt_tokens,
                        "completion_tokens": stats.completion_tokens,
                        "calls_per_accepted": ((stats.calls + stats.cached_calls) / accepted
                                               if accepted else None),
                        "tokens_per_accepted": ((stats.prompt_tokens + stats.completion_tokens)
                                                / accepted if accepted else None)},
        "seconds": round(seconds, 1),
    })


def report_markdown(report: DistillReport) -> str:
    r = report.model_dump(mode="json")
    lines = [f"# Distillation report ({r['domain']}, {r['mode']} mode)", "",
             f"Prompt version `{r['prompt_version']}`, seed {r['seed']}, "
             f"{r['seconds']} s.", "", "## Yield per stage", "", "| stage | count |",
             "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r["stages"].items()]
    lines += ["", "## Accepted", "", "| | count |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r["accepted"].items()]
    lines += ["", "## Rejects by reason", "", "| reason | count |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r["rejects"].items()] or ["| (none) | 0 |"]
    v = r["verifier"]
    agreement = f"{v['agreement']:.1%}" if v["agreement"] is not None else "n/a"
    lines += ["", "## Quality", "",
              f"- verifier ({v['method']}, {v['on_disagree']}): {v['agreed']}/{v['checked']} "
              f"agreed ({agreement})",
              f"- near-duplicate questions removed: {r['dedup_removed']}",
              f"- benchmark/train overlap removed: {r['benchmark_overlap_removed']} sections",
              "- gold letters: " + ", ".join(f"{k} {n}" for k, n in
                                             r["letter_balance"].items()),
              "- difficulty (1-5): " + ", ".join(f"{k}: {n}" for k, n in
                                                 r["difficulty_histogram"].items()),
              "", "## Model calls", ""]
    c = r["model_calls"]
    lines += [f"- made {c['made']}, from cache {c['from_cache']}; tokens: prompt "
              f"{c['prompt_tokens']}, completion {c['completion_tokens']}"]
    if c["calls_per_accepted"] is not None:
        lines += [f"- per accepted sample: {c['calls_per_accepted']:.1f} calls, "
                  f"{c['tokens_per_accepted']:.0f} tokens"]
    lines += ["", "Models: " + ", ".join(f"{k} `{m}`" for k, m in r["models"].items())]
    return "\n".join(lines) + "\n"


def _write_outputs(run_dir: Path, cfg, samples, bench, report, seed, sections) -> None:
    from workbench.distill.export import export_sft

    write_jsonl(run_dir / "mcQTSA.jsonl", [s for s in samples if s.kind == "mc"])
    write_jsonl(run_dir / "ndQTSA.jsonl", [s for s in samples if s.kind == "nd"])
    write_jsonl(run_dir / "benchmark.jsonl", bench)
    write_jsonl(run_dir / "sections.jsonl", sections)
    for style in ("instruct", "thinking"):
        export_sft(samples, run_dir / "sft" / f"{style}_mixed.messages.jsonl", fmt="messages",
                   style=style, kinds=("mc", "nd"))
    atomic_write_json(run_dir / "report.json", report.model_dump(mode="json"))
    atomic_write_text(run_dir / "report.md", report_markdown(report))
    manifest = RunManifest(run_id=run_dir.name, kind="distill", config=cfg.model_dump(
        mode="json"), input_hashes={"sections": sha256_text("".join(
            s.content_hash for s in sections))[:16]}, versions=library_versions(), seed=seed,
        status="completed", outputs={"samples": len(samples), "benchmark": len(bench)})
    atomic_write_json(run_dir / "manifest.json", manifest.to_json())
