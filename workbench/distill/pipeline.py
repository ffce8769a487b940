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

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.corpus import load_sections
from workbench.distill import gates, parse, shapes, statements
from workbench.distill.config import AgentModel, DistillConfig
from workbench.distill.export import export_sft
from workbench.distill.likelihood import question_likelihoods
from workbench.distill.parse import Reject, format_options
from workbench.distill.quality import (
    difficulty,
    jaccard,
    letter_distribution,
    near_duplicates,
    shingles,
    split_sections,
)
from workbench.distill.report import DistillReport, report_markdown
from workbench.distill.statements import recall_samples
from workbench.distill.tasks import check_breadth, make_tasks
from workbench.distill.write import (
    LETTERS,
    Agents,
    Span,
    Stats,
    Task,
    _conv,
    _generate,
    known,
    make_spans,
    write_composed,
    write_single,
)
from workbench.domain_packs import DomainPack, load_pack
from workbench.errors import WorkbenchError
from workbench.io import sha256_text
from workbench.models.base import ChatModel, GenerationParams, ScoreRequest
from workbench.models.embed import load_embedder
from workbench.records import MCItem, Provenance, QTSASample, RunManifest, Section, library_versions
from workbench.runs import outputs_at

__all__ = ["DistillResult", "report_markdown", "run_distill", "verify"]


# --- stage 4: verify --------------------------------------------------------------------------

def verify(tasks: list[Task], pack: DomainPack, agents: Agents, cfg: DistillConfig,
           stats: Stats) -> None:
    mc = [t for t in tasks if t.reject is None and t.kind == "mc"]
    convs = [_conv(pack, pack.prompts.verifier.format(
        text=t.span.text, question=t.question, options=format_options(t.choice()[0]),
        domain=pack.title)) for t in mc]
    if cfg.verifier.method == "loglik":
        scores = agents.verifier.score([ScoreRequest(c, list(LETTERS)) for c in convs])
        preds = [LETTERS[max(range(4), key=lambda i: row[i].logprob)] for row in scores]
    else:
        gens = _generate(agents.verifier, convs, agents.shaped(
            "verifier", GenerationParams(max_tokens=8), shapes.letter()), stats)
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


def _verifier_rejects(tasks: list[Task], agents: Agents, cfg: DistillConfig) -> list[dict]:
    """What a person needs to check the verifier's rejections (`distill verifier-check`):
    the text it read, the question, the options, the keyed and the verifier's letter. Kept
    samples carry the rest in mcQTSA.jsonl."""
    who = f"{agents.identities()['verifier']} ({cfg.verifier.method})"
    return [{"task": t.id, "section_id": t.span.section.id, "section": t.span.section.title,
             "span_hash": t.span.hash, "text": t.span.text, "question": t.question,
             "options": list(t.options or []), "gold": t.gold, "verifier": t.verifier_pred,
             "decider": who}
            for t in tasks if t.reject == "verifier_disagrees"]


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
    t_start = time.perf_counter()
    run_dir = Path(run_dir)
    pack, perspectives = _pack(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    stats = Stats()
    sections, corpus_sections, ingest_report = _sections(cfg, sections, stats)
    spans, removed = _spans(sections, cfg, seed, stats, progress)
    tasks = make_tasks(spans, perspectives, cfg, seed)
    stats.stages["tasks"] = len(tasks)
    agents = Agents(cfg, default_model or AgentModel(),
                    outputs_at("distill", run_dir).path("calls") if cache else None)
    progress(f"{len(tasks)} tasks; writing ({cfg.mode} mode)")
    gate_rows: list[dict] = []

    def check_questions(ts: list[Task]) -> None:
        """The final questions' checks and the quality gates: in composed mode before the
        rationale calls (none is spent on a question they remove), in single mode (one call
        writes everything) after writing."""
        _recheck_questions(ts, stats)
        gate_rows.extend(apply_gates(ts, corpus_sections, pack, cfg, stats, agents.verifier,
                                     progress))
        if gate_rows:
            progress(f"quality gates: {stats.stages['gates_removed']} of "
                     f"{stats.stages['gates_checked']} questions removed")

    if cfg.mode == "single":
        write_single(tasks, pack, agents, cfg, seed, stats)
        check_questions(tasks)
    else:
        write_composed(tasks, pack, agents, cfg, seed, stats, before_rationales=check_questions)
    _rewrite_references(tasks)
    mc = [t for t in tasks if t.reject is None and t.kind == "mc"]
    if cfg.verifier.enabled and mc:
        progress(f"verifying {len(mc)} multiple-choice items")
        verify(tasks, pack, agents, cfg, stats)
    _dedup(tasks, cfg, seed, stats)
    _check_seen(tasks, cfg, stats)
    accepted = _tally(tasks, stats)
    if cfg.recall_samples:
        recall = recall_samples(spans, accepted, seed)
        stats.stages["recall_samples"] = len(recall)
        accepted += recall
        progress(f"recall samples: {len(recall)} sentences no written question answers")
    if cfg.benchmark_items == "statement":
        accepted += _statement_items(spans, corpus_sections, accepted, cfg, seed, stats)
        progress(f"statement items: {stats.stages['statement_unseen']} unseen, "
                 f"{stats.stages['statement_seen']} seen")
    outputs_at("distill", run_dir).write("verifier", _verifier_rejects(tasks, agents, cfg))
    samples = [_to_sample(t, pack, agents) for t in accepted]
    bench, seen = (_items(samples, split, cfg.benchmark_size) for split in ("benchmark",
                                                                          "seen"))
    by_id = {t.id: t for t in tasks}
    for row in gate_rows:
        row["final"] = by_id[row["task"]].reject or "accepted"
    report = _report(cfg, pack, stats, samples, bench, agents, ingest_report, removed,
                     time.perf_counter() - t_start, seed, gate_rows, seen)
    _write_outputs(run_dir, cfg, samples, bench, report, seed, sections, seen)
    outputs_at("distill", run_dir).write("gates", gate_rows)
    return DistillResult(run_dir, report, samples, bench)


def _items(samples: list[QTSASample], split: str, cap: int) -> list[MCItem]:
    return [MCItem(id=s.id, question=s.question, options=s.options, answer=s.answer,
                   difficulty=s.difficulty, provenance=s.provenance)
            for s in samples if s.kind == "mc" and s.split == split][:cap]


def _statement_items(spans: list[Span], corpus: list[Section], accepted: list[Task],
                     cfg: DistillConfig, seed: int, stats: Stats) -> list[Task]:
    """The held-out items of `benchmark_items: statement` (`workbench.distill.statements`),
    made from the text and the accepted training samples, no model call."""
    unseen = statements.unseen_items(spans, corpus, seed)
    seen, shared = statements.seen_items(accepted, corpus, cfg.seen_fraction, seed) \
        if cfg.seen_fraction else ([], 0)
    stats.stages |= {"statement_unseen": len(unseen), "statement_seen": len(seen),
                     "seen_distractors_also_trained": shared}
    return unseen + seen


def _check_seen(tasks: list[Task], cfg: DistillConfig, stats: Stats) -> None:
    """A `seen` item stays only if its training twin was accepted (else its fact is not in
    the training data) and its question is not a near-duplicate of any accepted training
    question (word 3-gram Jaccard at the dedup threshold): it must test the fact, not
    recall a trained question."""
    seen = [t for t in tasks if t.heldout == "seen" and t.reject is None]
    if not seen:
        return
    by_id = {t.id: t for t in tasks}
    train = [shingles(known(t.question, "question")) for t in tasks
             if t.split == "train" and t.reject is None]
    for t in seen:
        if by_id[known(t.twin, "twin")].reject is not None:
            t.fail("seen_twin_rejected")
        elif any(jaccard(shingles(known(t.question, "question")), q) >= cfg.dedup.threshold
                 for q in train):
            t.fail("seen_near_training")
    stats.stages["seen_kept"] = sum(t.reject is None for t in seen)


def _pack(cfg: DistillConfig) -> tuple[DomainPack, list[str]]:
    """The domain pack and the perspectives to write from; every problem with them fails
    here, before any model call."""
    if not cfg.corpus or not cfg.domain:
        raise WorkbenchError("distill.corpus and distill.domain must be set (the experiment's "
                             "`corpus` and `domain` fill them in)")
    pack = load_pack(cfg.domain)
    perspectives = cfg.perspectives or [p.id for p in pack.perspectives]
    for pid in perspectives:
        pack.perspective(pid)
    check_breadth(cfg, pack, perspectives)
    return pack, perspectives


def _sections(cfg: DistillConfig, sections: list[Section] | None, stats: Stats):
    """(the sections to distil, the whole corpus's sections, the ingest report or None)."""
    ingest_report = None
    if sections is None:
        assert cfg.corpus  # _pack checked it
        sections, ingest_report = load_sections(cfg.corpus)
    corpus_sections = sections  # a document's vocabulary is all of it (foreign_words gate)
    if cfg.max_sections:
        sections = sections[:cfg.max_sections]
    if not sections:
        raise WorkbenchError(f"{cfg.corpus}: the corpus has no sections")
    stats.stages["sections"] = len(sections)
    return sections, corpus_sections, ingest_report


def _spans(sections: list[Section], cfg: DistillConfig, seed: int, stats: Stats,
           progress) -> tuple[list[Span], int]:
    """(the spans to write from, each marked train or benchmark, how many sections were
    removed as repeats of a benchmark section)."""
    train_secs, bench_secs, removed = split_sections(
        sections, benchmark_fraction=cfg.benchmark_fraction, seed=seed)
    split_of = {s.id: "train" for s in train_secs} | {s.id: "benchmark" for s in bench_secs}
    spans = [sp for sp in make_spans(sections, cfg, stats) if sp.section.id in split_of]
    for sp in spans:
        sp.split = split_of[sp.section.id]
    stats.stages["spans"] = len(spans)
    progress(f"{len(sections)} sections ({len(bench_secs)} benchmark, {len(train_secs)} train,"
             f" {removed} removed as repeats), {len(spans)} spans")
    return spans, removed


def _recheck_questions(tasks: list[Task], stats: Stats) -> None:
    """Validate the final questions once more (stem, grounding in the span)."""
    live = [t for t in tasks if t.reject is None]
    stats.stages["parsed_and_answered"] = len(live)
    for t in live:
        try:
            t.question = parse.check_question(known(t.question, "question"))
            parse.check_grounded(t.question, t.span.text)
        except Reject as r:
            t.fail(r.reason)


def _rewrite_references(tasks: list[Task]) -> None:
    """Numbered references ("step 2", "(3)") in rationales rewritten to plain words."""
    for t in tasks:
        if t.reject is not None:
            continue
        for attr in ("thinking", "solution"):
            text, changed = parse.rewrite_numbered_refs(getattr(t, attr))
            if changed:
                setattr(t, attr, text)
                t.flags.append("rewrote_references")


def _dedup(tasks: list[Task], cfg: DistillConfig, seed: int, stats: Stats) -> None:
    """Fail near-duplicate questions across the corpus (which covers duplicates within a
    section)."""
    live = [t for t in tasks if t.reject is None]
    stats.stages["validated"] = len(live)
    drop = set(near_duplicates([known(t.question, "question") for t in live],
                               threshold=cfg.dedup.threshold, method=cfg.dedup.method,
                               embedder=_embedder(cfg) if cfg.dedup.method == "embedding"
                               else None, seed=seed))
    for i in drop:
        live[i].fail("duplicate_question")
    stats.stages["dedup_removed"] = len(drop)


def _tally(tasks: list[Task], stats: Stats) -> list[Task]:
    """Count the accepted tasks and the rejects by reason (format vs content); returns the
    accepted ones."""
    accepted = [t for t in tasks if t.reject is None]
    stats.stages["accepted"] = len(accepted)
    for t in tasks:
        if t.reject:
            stats.rejects[t.reject] += 1
    rejected = [t.reject for t in tasks if t.reject]
    stats.rejects_format = sum(r in shapes.FORMAT_REASONS for r in rejected)
    stats.rejects_content = len(rejected) - stats.rejects_format
    return accepted


# --- stage 3b: quality gates ------------------------------------------------------------------

def _answer_text(t: Task) -> str:
    """What the question's answer says: the reference sentence, the gold option, the written
    answer (content words may occur there; names must occur in the section)."""
    parts = [t.reference or ""]
    if t.kind == "mc" and t.options and t.gold and len(t.gold) == 1:
        parts.append(t.options[LETTERS.index(t.gold)])
    elif t.kind == "nd":
        parts.append(t.answer or "")
    return "\n".join(p for p in parts if p)


def apply_gates(tasks: list[Task], corpus: list[Section], pack: DomainPack, cfg: DistillConfig,
                stats: Stats, scorer: ChatModel | None = None, progress=lambda msg: None
                ) -> list[dict]:
    """Every live question through the enabled gates (`workbench.distill.gates`): stripped
    in place, or failed with the first failing gate's reason; then the questions every rule
    kept through the likelihood gate, scored by `scorer`. Returns one row per question with
    every gate's verdict and its likelihood score (gates.jsonl)."""
    active = cfg.gates.active()
    live = [t for t in tasks if t.reject is None]
    stats.stages["gates_checked"] = len(live) if active else 0
    stats.stages["gates_removed"] = 0
    if not active:
        return []
    doc_stems: dict[str, set[str]] = {}
    for s in corpus:
        doc_stems.setdefault(s.doc_id, set()).update(gates.stems(f"{s.title}\n{s.text}"))
    rows = []
    for t in live:
        sec = t.span.section
        ctx = gates.Context(section_text=sec.text, headings=sec.title, answer=_answer_text(t),
                            perspective=pack.perspective(t.perspective).name,
                            document_stems=doc_stems.get(sec.doc_id))
        res = gates.check(known(t.question, "question"), ctx, enabled=active,
                          min_share=cfg.gates.min_content_share,
                          max_foreign=cfg.gates.max_foreign_words,
                          min_letters=cfg.gates.foreign_min_letters)
        row: dict[str, Any] = {"task": t.id, "section_id": sec.id, "section": sec.title,
                               "kind": t.kind, "split": t.split, "question": t.question}
        if res.question != t.question:
            row["stripped_to"] = res.question
            t.question = res.question
            t.flags.append("stripped_prefix")
        first = res.removed_by
        if first:
            t.fail(first.reason)
            stats.stages["gates_removed"] += 1
        row["removed_by"] = first.gate if first else None
        row["verdicts"] = {v.gate: v.to_json() for v in res.verdicts}
        rows.append(row)
    if "likelihood" in active:
        _likelihood_gate([(t, r) for t, r in zip(live, rows, strict=True) if t.reject is None],
                         scorer, cfg, stats, progress)
    return rows


def _likelihood_gate(kept: list[tuple[Task, dict]], scorer: ChatModel | None,
                     cfg: DistillConfig, stats: Stats, progress=lambda msg: None) -> None:
    """The questions the rules kept, scored after their span's text in one batch
    (`workbench.distill.likelihood`); the unlikely ones fail. A model that cannot score
    passes every question, each verdict saying it was not scored."""
    if not kept:
        return
    if scorer is None or not scorer.capabilities.score:
        for _, row in kept:
            row["verdicts"]["likelihood"] = gates.Verdict(
                "likelihood", "pass", "not_scored", "the verifier's model cannot score "
                "continuations").to_json()
        return
    floor = cfg.gates.min_likelihood
    t0 = time.perf_counter()
    scores = question_likelihoods(scorer, [(t.span.text, known(t.question, "question"))
                                           for t, _ in kept])
    stats.stages["gates_scored"] = len(kept)
    progress(f"likelihood gate: {len(kept)} questions from {len({t.span.id for t, _ in kept})}"
             f" spans scored in {time.perf_counter() - t0:.1f} s")
    for (t, row), sc in zip(kept, scores, strict=True):
        row["likelihood"] = sc.to_json()
        if sc.mean < floor:
            v = gates.Verdict("likelihood", "reject", "unlikely_question",
                              f"{sc.mean:.2f} < {floor:g} per token")
            t.fail(v.reason)
            stats.stages["gates_removed"] += 1
            row["removed_by"] = "likelihood"
        else:
            v = gates.Verdict("likelihood", "pass")
        row["verdicts"]["likelihood"] = v.to_json()


def gates_summary(cfg: DistillConfig, rows: list[dict]) -> dict:
    """The report's `gates` part: per gate, its rule, how many questions it failed, removed
    (as the first gate they failed) and stripped, and the removed questions."""
    gc = cfg.gates
    out = []
    for name in gates.GATES:
        on = name in gc.active()
        verdicts = [r["verdicts"][name] for r in rows if name in r["verdicts"]]
        removed = [r for r in rows if r["removed_by"] == name]
        out.append({
            "name": name, "enabled": on,
            "rule": gates.rule_text(name, min_share=gc.min_content_share,
                                    max_foreign=gc.max_foreign_words,
                                    min_letters=gc.foreign_min_letters,
                                    min_likelihood=gc.min_likelihood),
            "checked": len(verdicts),
            "failed": sum(v["action"] == "reject" for v in verdicts),
            "removed": len(removed),
            "stripped": sum(v["action"] == "strip" for v in verdicts),
            "examples": [{"question": r["question"], "reason": r["verdicts"][name]["reason"],
                          "detail": r["verdicts"][name].get("detail", ""),
                          "section_id": r["section_id"], "section": r["section"],
                          "task": r["task"]} for r in removed[:gc.examples]]})
    return {"enabled": bool(gc.active()), "checked": len(rows),
            "removed": sum(r["removed_by"] is not None for r in rows),
            "stripped": sum("stripped_to" in r for r in rows),
            "accepted_examples": [r.get("stripped_to", r["question"]) for r in rows
                                  if r.get("final") == "accepted"][:10],
            "gates": out}


def _embedder(cfg: DistillConfig):
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
                      difficulty=difficulty(known(t.question, "question"),
                                            known(t.solution, "solution"),
                                            known(t.thinking, "thinking"), pack.advanced_terms),
                      provenance=prov, split=t.split, flags=list(t.flags))


def _report(cfg, pack, stats: Stats, samples, bench, agents, ingest_report, removed, seconds,
            seed, gate_rows=(), seen=()) -> DistillReport:
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
        "rejects_format": stats.rejects_format,
        "rejects_content": stats.rejects_content,
        "constrained": agents.constrained,
        "accepted": {"total": accepted, "mc": len(mc), "nd": accepted - len(mc),
                     "train": sum(s.split == "train" for s in samples),
                     "benchmark_items": len(bench), "seen_items": len(seen)},
        "verifier": {"checked": verified, "agreed": stats.stages.get("verifier_agreed", 0),
                     "agreement": (stats.stages.get("verifier_agreed", 0) / verified
                                   if verified else None),
                     "method": cfg.verifier.method, "on_disagree": cfg.verifier.on_disagree},
        "dedup_removed": stats.stages.get("dedup_removed", 0),
        "gates": gates_summary(cfg, list(gate_rows)),
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


def _write_outputs(run_dir: Path, cfg, samples, bench, report, seed, sections, seen=()
                   ) -> None:
    files = outputs_at("distill", run_dir)
    files.write("samples_mc", [s for s in samples if s.kind == "mc"])
    files.write("samples_nd", [s for s in samples if s.kind == "nd"])
    files.write("benchmark", bench)
    if cfg.seen_fraction:
        files.write("benchmark_seen", seen)
    files.write("sections", sections)
    for style, name in (("instruct", "sft"), ("thinking", "sft_thinking")):
        export_sft(samples, files.path(name), fmt="messages", style=style, kinds=("mc", "nd"))
    files.write("report", report.model_dump(mode="json"))
    files.write("report_md", report_markdown(report))
    manifest = RunManifest(run_id=run_dir.name, kind="distill", config=cfg.model_dump(
        mode="json"), input_hashes={"sections": sha256_text("".join(
            s.content_hash for s in sections))[:16]}, versions=library_versions(), seed=seed,
        status="completed", outputs={"samples": len(samples), "benchmark": len(bench),
                                     "benchmark_seen": len(seen)},
        models=report.models)
    files.write("manifest", manifest.to_json())
