"""The retrieval pipeline's run: index the experiment's corpus into the run's index folder (the
library it calls is `workbench.retrieval`)."""

from __future__ import annotations

from pathlib import Path

from workbench.corpus import corpus_hash
from workbench.registry import PipelineResult
from workbench.retrieval.search import build_index
from workbench.runs import outputs_at


def run(cfg, ctx) -> PipelineResult:
    """The registered pipeline: index the experiment's corpus into the run's index folder
    (skipped when the corpus and the settings are unchanged)."""
    out = ctx.layout.folder("rag")
    ctx.stages("rag").run("index", (corpus_hash(cfg.corpus), cfg.rag.model_dump()),
                          lambda: {"chunks": build_index(cfg.corpus, out, cfg.rag,
                                                         log=ctx.log)[0].manifest["n_chunks"]})
    m = _manifest(out)
    return PipelineResult(pipeline="rag", run_dir=str(ctx.layout.root),
                          outputs={"index": str(out)},
                          figures={"chunks": m["n_chunks"], "sections": m["n_sections"]},
                          message=f"built {out}: {m['n_chunks']} chunks from "
                                  f"{m['n_sections']} sections, embedder "
                                  f"{m['embedder']['identity']}, corpus {m['corpus_hash']}")


def _manifest(folder: Path) -> dict:
    import json

    return json.loads(outputs_at("rag", folder).path("manifest").read_text())
