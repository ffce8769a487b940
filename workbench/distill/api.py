"""Entry points of the distillation pipeline (one call per CLI command or app action)."""

from __future__ import annotations

import json
from pathlib import Path

from workbench.corpus import corpus_hash
from workbench.distill.config import AgentModel, DistillConfig
from workbench.distill.export import export_sft
from workbench.distill.pipeline import DistillResult, report_markdown, run_distill
from workbench.distill.report import DistillReport
from workbench.domain_packs import pack_path
from workbench.errors import DataError, WorkbenchError
from workbench.formats import STYLES
from workbench.io import append_line, iter_jsonl_raw
from workbench.records import QTSASample
from workbench.registry import PipelineResult
from workbench.runs import RunLayout, file_hash, locate, outputs_at


def resolved_config(cfg) -> DistillConfig:
    """The `distill:` section with the experiment's corpus and domain filled in."""
    dc = cfg.distill
    return dc.model_copy(update={"corpus": dc.corpus or cfg.corpus,
                                 "domain": dc.domain or cfg.domain})


def distill_from_config(cfg, progress=print, *, out: Path | None = None) -> DistillResult:
    """Run distillation for an ExperimentConfig into its run's distill folder."""
    chat = cfg.models.chat
    default = AgentModel(spec=chat.spec, backend=chat.backend, options=chat.options)
    return run_distill(resolved_config(cfg), out or RunLayout.of(cfg).folder("distill"),
                       seed=cfg.seed, default_model=default, cache=cfg.cache.enabled,
                       progress=progress)


def run(cfg, ctx) -> PipelineResult:
    """The registered pipeline: distil unless the corpus, pack, models and settings are the
    same as the last finished run (the call cache makes a changed re-run cheap too)."""
    dc = resolved_config(cfg)
    assert dc.corpus is not None and dc.domain is not None  # the experiment's fill them in
    out = ctx.layout.folder("distill")
    inputs = (cfg.models.chat.model_dump(), cfg.seed, dc.model_dump(), corpus_hash(dc.corpus),
              file_hash(pack_path(dc.domain)))
    ctx.stages("distill").run("distill", inputs, lambda: {"accepted": distill_from_config(
        cfg, progress=ctx.log, out=out).report.accepted.total})
    report, _ = read_report(out)
    a = report.accepted
    return PipelineResult(
        pipeline="distill", run_dir=str(ctx.layout.root),
        outputs={n: str(ctx.layout.artifact("distill", n)) for n in ("benchmark", "sft",
                                                                      "report_md")},
        figures={"accepted": a.total, "mc": a.mc, "nd": a.nd,
                 "benchmark_items": a.benchmark_items},
        message=f"{out}: {a.total} samples accepted ({a.mc} mc, {a.nd} nd), "
                f"{a.benchmark_items} benchmark items; see "
                f"{outputs_at('distill', out).path('report_md')}")


def _run_dir(run: str | Path) -> Path:
    report = locate("distill", "report", run)
    if not report.exists():
        raise WorkbenchError(f"{report.parent}: not a finished distillation run (no "
                             f"{report.name})")
    return report.parent


def load_samples(run: str | Path, *, reviewed: bool = True) -> list[QTSASample]:
    """The run's samples; with `reviewed`, an expert's rejections and edits applied."""
    run = _run_dir(run)
    files = outputs_at("distill", run)
    samples = files.read("samples_mc") + files.read("samples_nd")
    return apply_review(samples, read_review(run)) if reviewed else samples


REVIEW_ACTIONS = ("accept", "reject", "edit")
EDITABLE = ("question", "options", "thinking", "solution", "answer")


def read_review(run: str | Path) -> dict[str, dict]:
    """The latest review decision per sample id (review.jsonl is an append-only log)."""
    import warnings

    f = outputs_at("distill", run).path("review")
    out: dict[str, dict] = {}
    if f.exists():
        for _, row in iter_jsonl_raw(f, torn_tail=lambda e: warnings.warn(
                f"{e} (a review cut short; skipped)", stacklevel=2)):
            out[row["id"]] = row
    return out


def review_sample(run: str | Path, sample_id: str, action: str,
                  fields: dict | None = None, who: str = "expert") -> dict:
    """Record an accept / reject / edit of one sample; edits are validated like the
    pipeline's own records before they are recorded."""
    import time

    if action not in REVIEW_ACTIONS:
        raise WorkbenchError(f"action must be one of {', '.join(REVIEW_ACTIONS)}")
    run = _run_dir(run)
    by_id = {s.id: s for s in load_samples(run, reviewed=False)}
    if sample_id not in by_id:
        raise WorkbenchError(f"no sample {sample_id!r} in {run}")
    row = {"id": sample_id, "action": action, "who": who, "time": time.time()}
    if action == "edit":
        bad = set(fields or {}) - set(EDITABLE)
        if bad or not fields:
            raise WorkbenchError(f"editable fields are {', '.join(EDITABLE)}")
        QTSASample.model_validate({**by_id[sample_id].to_json(), **fields})  # must stay valid
        row["fields"] = fields
    append_line(outputs_at("distill", run).path("review"), json.dumps(row, ensure_ascii=False))
    return row


def apply_review(samples: list[QTSASample], review: dict[str, dict]) -> list[QTSASample]:
    out = []
    for s in samples:
        r = review.get(s.id)
        if r is None or r["action"] == "accept":
            out.append(s if r is None else s.model_copy(update={"flags": [*s.flags,
                                                                          "expert_accepted"]}))
        elif r["action"] == "edit":
            data = {**s.to_json(), **r["fields"], "flags": [*s.flags, "expert_edited"]}
            out.append(QTSASample.model_validate(data))
    return out


def export_run(run: str | Path, out: str | Path, *, fmt: str = "messages",
               style: str = "instruct", kinds: tuple[str, ...] = ("mc", "nd")) -> int:
    if style not in STYLES:
        raise WorkbenchError(f"style must be one of {', '.join(STYLES)}")
    bad = set(kinds) - {"mc", "nd"}
    if bad:
        raise WorkbenchError(f"unknown kinds {sorted(bad)} (mc, nd)")
    return export_sft(load_samples(run), out, fmt=fmt, style=style, kinds=kinds)


def read_report(run: str | Path) -> tuple[DistillReport, str]:
    """A finished distillation's typed report and its markdown."""
    from pydantic import ValidationError

    run = _run_dir(run)
    f = outputs_at("distill", run).path("report")
    try:
        report = DistillReport.model_validate_json(f.read_bytes())
    except ValidationError as e:
        raise DataError(f"not a distillation report of this workbench version "
                        f"({str(e).splitlines()[0]}); re-run the distillation", path=str(f),
                        code="old_schema") from None
    return report, report_markdown(report)
