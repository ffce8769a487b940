"""Entry points of the distillation pipeline (one call per CLI command or app action)."""

from __future__ import annotations

import json
from pathlib import Path

from workbench.distill.config import AgentModel
from workbench.distill.export import STYLES, export_sft
from workbench.distill.pipeline import DistillResult, report_markdown, run_distill
from workbench.errors import WorkbenchError
from workbench.records import QTSASample, read_records


def distill_from_config(cfg, progress=print) -> DistillResult:
    """Run distillation for an ExperimentConfig into `<output_dir>/<name>/distill`."""
    chat = cfg.models.chat
    default = AgentModel(spec=chat.spec, backend=chat.backend, options=chat.options)
    return run_distill(cfg.distill, cfg.run_dir / "distill", seed=cfg.seed,
                       default_model=default, cache=cfg.cache.enabled, progress=progress)


def _run_dir(run: str | Path) -> Path:
    run = Path(run)
    if (run / "distill" / "report.json").exists():
        run = run / "distill"
    if not (run / "report.json").exists():
        raise WorkbenchError(f"{run}: not a finished distillation run (no report.json)")
    return run


def load_samples(run: str | Path) -> list[QTSASample]:
    run = _run_dir(run)
    return read_records(run / "mcQTSA.jsonl", QTSASample) + \
        read_records(run / "ndQTSA.jsonl", QTSASample)


def export_run(run: str | Path, out: str | Path, *, fmt: str = "messages",
               style: str = "instruct", kinds: tuple[str, ...] = ("mc", "nd")) -> int:
    if style not in STYLES:
        raise WorkbenchError(f"style must be one of {', '.join(STYLES)}")
    bad = set(kinds) - {"mc", "nd"}
    if bad:
        raise WorkbenchError(f"unknown kinds {sorted(bad)} (mc, nd)")
    return export_sft(load_samples(run), out, fmt=fmt, style=style, kinds=kinds)


def read_report(run: str | Path) -> tuple[dict, str]:
    run = _run_dir(run)
    report = json.loads((run / "report.json").read_text())
    return report, report_markdown(report)
