"""A workspace: one folder per project, holding the uploaded corpus, runs and jobs.

    <workspace>/corpus/   uploaded documents (md, txt, html, pdf)
    <workspace>/runs/     run folders (distillation, indexes, adapters, evaluations)
    <workspace>/jobs/     background jobs (see workbench.jobs)

Uploaded names are reduced to a safe base name, so no upload can write outside the corpus
folder; sizes are capped; nothing uploaded is ever unpickled.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from workbench.errors import DataError, WorkbenchError
from workbench.io import atomic_write_bytes
from workbench.corpus import SUPPORTED

MAX_UPLOAD_MB = 20


def open_workspace(path: str | Path, create: bool = True) -> Path:
    root = Path(path).expanduser().resolve()
    if not root.exists() and not create:
        raise WorkbenchError(f"{root}: no such workspace")
    for sub in ("corpus", "runs", "jobs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    return root


def safe_name(name: str) -> str:
    """A plain file name: no folders, no '..', no control or odd characters."""
    name = unicodedata.normalize("NFKC", name).replace("\\", "/").split("/")[-1]
    name = re.sub(r"[^\w.\- ]", "_", name).strip(" .")
    if not name or name in (".", ".."):
        raise DataError(f"unusable file name {name!r}", code="bad_name")
    return name[:120]


def save_upload(workspace: Path, name: str, data: bytes, *, max_mb: int = MAX_UPLOAD_MB
                ) -> Path:
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
    atomic_write_bytes(target, data)
    return target


def corpus_files(workspace: Path) -> list[Path]:
    return sorted(p for p in (workspace / "corpus").iterdir() if p.is_file()
                  and not p.name.startswith("."))


def remove_file(workspace: Path, name: str) -> None:
    target = (workspace / "corpus" / safe_name(name)).resolve()
    if target.parent != (workspace / "corpus").resolve() or not target.exists():
        raise WorkbenchError(f"{name}: not in the corpus")
    target.unlink()


def list_runs(workspace: Path) -> list[dict]:
    """Run folders with what they hold and their key figures."""
    import json

    out = []
    for run in sorted((workspace / "runs").iterdir()) if (workspace / "runs").exists() else []:
        if not run.is_dir():
            continue
        info = {"name": run.name, "path": str(run), "stages": []}
        st = run / "stages.json"
        if st.exists():
            info["stages"] = list(json.loads(st.read_text()))
        rep = run / "distill" / "report.json"
        if rep.exists():
            info["distilled"] = json.loads(rep.read_text())["accepted"]["total"]
        r = run / "report.json"
        if r.exists():
            info["table"] = json.loads(r.read_text())["table"]
        info["adapter"] = (run / "adapter" / "adapter_model.safetensors").exists()
        info["index"] = (run / "index" / "manifest.json").exists()
        out.append(info)
    return out
