"""The retrieval pipeline's entry points: one call per CLI command or app action."""

from __future__ import annotations

from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.rag.base import Filters
from workbench.rag.index import RagConfig, RagIndex
from workbench.rag.ingest import IngestReport, ingest
from workbench.records import RetrievalHit, Section, read_records


def load_sections(corpus: str | Path, on_error: str = "skip") -> tuple[list[Section],
                                                                        IngestReport | None]:
    """Sections from a corpus folder/file, or from a `Section` JSONL file."""
    corpus = Path(corpus)
    if corpus.suffix == ".jsonl":
        return read_records(corpus, Section), None
    report = ingest(corpus, on_error=on_error)
    if not report.sections:
        raise WorkbenchError(f"{corpus}: no readable sections ({report.summary()})")
    return report.sections, report


def build_index(corpus: str | Path, out: str | Path, config: RagConfig | None = None,
                log=print) -> tuple[RagIndex, IngestReport | None]:
    config = config or RagConfig()
    sections, report = load_sections(corpus, config.on_error)
    if report is not None:
        log(report.summary())
    index = RagIndex.build(sections, out, config=config, log=log)
    return index, report


def query_index(index_dir: str | Path, text: str, *, retriever: str = "hybrid", k: int = 10,
                documents: tuple[str, ...] = (), heading_prefix: tuple[str, ...] = (),
                weights: dict[str, float] | None = None) -> list[RetrievalHit]:
    index = RagIndex.load(index_dir, semantic=retriever != "keyword")
    r = index.retriever(retriever, weights=weights)
    return r.retrieve(text, k, Filters(tuple(documents), tuple(heading_prefix)))
