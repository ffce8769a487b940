"""A workspace: one folder per project, holding the uploaded corpus, runs and jobs.

    <workspace>/corpus/   uploaded documents (md, txt, html, pdf, docx, pptx, xlsx, csv, epub)
    <workspace>/runs/     run folders (distillation, indexes, adapters, evaluations)
    <workspace>/jobs/     background jobs (see workbench.jobs)

Uploaded names are reduced to a safe base name, so no upload can write outside the corpus
folder; sizes are capped (each file, and the corpus in all); nothing uploaded is ever
unpickled. The app opens workspaces only inside a root folder fixed when it starts
(`workspace_in`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from workbench.corpus import SUPPORTED
from workbench.errors import DataError, WorkbenchError
from workbench.io import atomic_write_bytes
from workbench.runs import RunLayout

MAX_UPLOAD_MB = 20
MAX_CORPUS_MB = 200  # all documents of one corpus together
MB = 1024 * 1024


def open_workspace(path: str | Path, create: bool = True) -> Path:
    root = Path(path).expanduser().resolve()
    if not root.exists() and not create:
        raise WorkbenchError(f"{root}: no such workspace")
    for sub in ("corpus", "runs", "jobs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    return root


def workspace_in(root: str | Path, path: str | Path, *, create: bool = True) -> Path:
    """Open the workspace `path` (relative to `root`, or absolute) only if it resolves to a
    folder strictly inside `root`: `..` parts, absolute paths elsewhere and symlinks that
    lead out are refused before anything is created."""
    base = Path(root).expanduser().resolve()
    text = str(path).strip()
    if not text:
        raise WorkbenchError(f"give a workspace folder inside {base}")
    p = Path(text)
    if ".." in p.parts:
        raise WorkbenchError(f"{text!r}: '..' is not allowed in a workspace path")
    try:
        target = (p if p.is_absolute() else base / p).resolve()
    except (OSError, ValueError, RuntimeError) as e:  # NUL bytes, symlink loops
        raise WorkbenchError(f"{text!r}: not a usable folder path ({e})") from None
    if target == base:
        raise WorkbenchError(f"{text!r} is the workspace root {base} itself: give a folder "
                             "inside it")
    if not target.is_relative_to(base):
        raise WorkbenchError(f"{text!r} is outside the workspace root {base}: workspaces are "
                             "folders inside it")
    if target.exists() and not target.is_dir():
        raise WorkbenchError(f"{target}: not a folder")
    try:
        return open_workspace(target, create=create)
    except OSError as e:
        raise WorkbenchError(f"{target}: cannot open the workspace ({e.strerror or e})"
                             ) from None


def safe_name(name: str) -> str:
    """A plain file name: no folders, no '..', no control or odd characters."""
    name = unicodedata.normalize("NFKC", name).replace("\\", "/").split("/")[-1]
    name = re.sub(r"[^\w.\- ]", "_", name).strip(" .")
    if not name or name in (".", ".."):
        raise DataError(f"unusable file name {name!r}", code="bad_name")
    return name[:120]


def save_upload(workspace: Path, name: str, data: bytes, *, max_mb: int = MAX_UPLOAD_MB,
                max_corpus_mb: float | None = None) -> Path:
    """Store an upload in the corpus under its safe base name (replacing a file of that
    name): a supported type, at most `max_mb`, and the corpus at most `max_corpus_mb`
    (`MAX_CORPUS_MB` by default) with it; a refusal writes nothing."""
    fname = safe_name(name)
    if Path(fname).suffix.lower() not in SUPPORTED:
        raise DataError(f"{fname}: unsupported type (supported: "
                        f"{', '.join(sorted(set(SUPPORTED)))})", code="unsupported")
    if len(data) > max_mb * 1024 * 1024:
        raise DataError(f"{fname}: {len(data) / 1e6:.1f} MB is over the {max_mb} MB cap",
                        code="too_large")
    corpus = (workspace / "corpus").resolve()
    target = (corpus / fname).resolve()
    if target.parent != corpus:  # belt and braces: never outside the corpus folder
        raise DataError(f"{name!r} would escape the workspace", code="bad_name")
    cap = MAX_CORPUS_MB if max_corpus_mb is None else max_corpus_mb
    total = corpus_bytes(workspace)
    replaced = target.stat().st_size if target.is_file() else 0
    if total - replaced + len(data) > cap * MB:
        raise DataError(f"{fname}: the corpus holds {total / MB:.1f} MB and this file is "
                        f"{len(data) / MB:.1f} MB: over the {cap:g} MB corpus cap (remove "
                        "documents first)", code="corpus_full")
    atomic_write_bytes(target, data)
    return target


BENCHMARK_TYPES = (".jsonl", ".json", ".csv", ".tsv")


def save_benchmark(workspace: Path, name: str, data: bytes, *, max_mb: int = MAX_UPLOAD_MB
                   ) -> Path:
    """Store an uploaded multiple-choice benchmark under <workspace>/benchmarks/ (a safe base
    name, capped size, atomic write); the evaluation reads it as it comes."""
    fname = safe_name(name)
    if Path(fname).suffix.lower() not in BENCHMARK_TYPES:
        raise DataError(f"{fname}: a benchmark is {', '.join(BENCHMARK_TYPES)}",
                        code="unsupported")
    if len(data) > max_mb * 1024 * 1024:
        raise DataError(f"{fname}: {len(data) / 1e6:.1f} MB is over the {max_mb} MB cap",
                        code="too_large")
    folder = (workspace / "benchmarks").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    target = (folder / fname).resolve()
    if target.parent != folder:
        raise DataError(f"{name!r} would escape the workspace", code="bad_name")
    atomic_write_bytes(target, data)
    return target


def corpus_files(workspace: Path) -> list[Path]:
    return sorted(p for p in (workspace / "corpus").iterdir() if p.is_file()
                  and not p.name.startswith("."))


def corpus_bytes(workspace: Path) -> int:
    """The size of every document in the corpus together (what `MAX_CORPUS_MB` caps)."""
    total = 0
    for p in corpus_files(workspace):
        try:
            total += p.stat().st_size
        except OSError:  # removed meanwhile
            pass
    return total


def remove_file(workspace: Path, name: str) -> None:
    target = (workspace / "corpus" / safe_name(name)).resolve()
    if target.parent != (workspace / "corpus").resolve() or not target.exists():
        raise WorkbenchError(f"{name}: not in the corpus")
    target.unlink()


class RunInfo(BaseModel):
    """What one run folder holds, found through `RunLayout` (no path strings)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    name: str
    path: Path
    stages: list[str] = Field(default_factory=list)
    distilled: int | None = None  # accepted samples, from the distill stage's record
    has_samples: bool = False
    has_benchmark: bool = False
    has_sft_data: bool = False
    has_index: bool = False
    has_adapter: bool = False
    has_training_metrics: bool = False  # live per-step metrics or the exported adapter's
    has_eval: dict[str, bool] = Field(default_factory=dict)  # eval / eval_base / eval_sft
    has_report: bool = False
    report: Any = None  # what `read_report` returned (the app passes the compare reader)
    report_error: str | None = None

    @property
    def layout(self) -> RunLayout:
        return RunLayout.at(self.path)


def run_info(run: str | Path, *, read_report: Callable[[Path], Any] | None = None
             ) -> RunInfo:
    """One run folder's `RunInfo`. `read_report` (e.g. the compare experiment's typed
    reader, which this layer may not import) fills `report`; its error goes to
    `report_error`, so one broken report never hides the run."""
    lay = RunLayout.at(run)
    state = lay.stages().stages
    distill = state.get("distill/distill")
    accepted = distill.info.get("accepted") if distill is not None else None
    info = RunInfo(
        name=lay.name, path=lay.root, stages=list(state),
        distilled=accepted.get("total") if isinstance(accepted, dict) else accepted,
        has_samples=lay.has("distill", "report"), has_benchmark=lay.has("distill", "benchmark"),
        has_sft_data=lay.has("distill", "sft"), has_index=lay.has("rag", "manifest"),
        has_adapter=lay.has("train", "weights"),
        has_training_metrics=lay.has("train", "live") or lay.has("train", "metrics"),
        has_eval={name: lay.has(pipe, art) for name, pipe, art in (
            ("eval", "eval", "summary"), ("eval_base", "compare", "eval_base"),
            ("eval_sft", "compare", "eval_sft"), ("eval_base_seen", "compare", "eval_base_seen"),
            ("eval_sft_seen", "compare", "eval_sft_seen"))},
        has_report=lay.has("compare", "report"))
    if info.has_report and read_report is not None:
        try:
            info.report = read_report(lay.root)
        except Exception as e:  # noqa: BLE001 - shown next to the run, never a crash
            info.report_error = str(e)
    return info


def list_runs(workspace: Path, *, read_report: Callable[[Path], Any] | None = None
              ) -> list[RunInfo]:
    """Every run folder under `<workspace>/runs`, whoever made it (the CLI or the app)."""
    root = Path(workspace) / "runs"
    if not root.exists():
        return []
    return [run_info(p, read_report=read_report) for p in sorted(root.iterdir())
            if p.is_dir() and not p.name.startswith(".")]


def streamlit_command(script: str | Path, *, host: str = "127.0.0.1", port: int = 8501
                      ) -> list[str]:
    """The command that serves the app: XSRF protection and CORS on, uploads capped, no
    usage statistics, headless."""
    import sys

    return [sys.executable, "-m", "streamlit", "run", str(script), "--server.address", host,
            "--server.port", str(port), "--server.headless", "true",
            "--server.enableXsrfProtection", "true", "--server.enableCORS", "true",
            "--server.maxUploadSize", str(MAX_UPLOAD_MB), "--browser.gatherUsageStats",
            "false", "--global.developmentMode", "false"]
