"""Search over built indexes, as any layer above uses it: build an index from a corpus or from
ready-made sections, open a built folder once and query it in batches, search sections indexed
once and reused while they are unchanged (an agent's `search` tool), and one context provider
per retrieval condition (what evaluation formats into its prompts)."""

from __future__ import annotations

from pathlib import Path

from workbench.corpus import IngestReport, load_sections
from workbench.errors import WorkbenchError
from workbench.records import RetrievalHit
from workbench.retrieval.base import Filters
from workbench.retrieval.context import format_context, token_counter
from workbench.retrieval.index import RagConfig, RagIndex, corpus_hash


def build_index(corpus: str | Path, out: str | Path, config: RagConfig | None = None,
                log=print) -> tuple[RagIndex, IngestReport | None]:
    config = config or RagConfig()
    sections, report = load_sections(corpus, config.on_error)
    if report is not None:
        log(report.summary())
    index = RagIndex.build(sections, out, config=config, log=log)
    return index, report


def index_sections(sections, out: str | Path, log=print):
    """Index ready-made `Section`s (another pipeline's documents, e.g. an ICL demonstration
    bank) with the default retrieval settings."""
    return RagIndex.build(list(sections), out, config=RagConfig(), log=log)


def load_index(index_dir: str | Path) -> RagIndex:
    """A built index folder with every retriever ready (the app's Retrieval page browses it);
    a missing or damaged folder raises."""
    return RagIndex.load(index_dir)


def query_index(index_dir: str | Path, text: str, *, retriever: str = "hybrid", k: int = 10,
                documents: tuple[str, ...] = (), heading_prefix: tuple[str, ...] = (),
                weights: dict[str, float] | None = None) -> list[RetrievalHit]:
    index = RagIndex.load(index_dir, semantic=retriever != "keyword")
    r = index.retriever(retriever, weights=weights)
    return r.retrieve(text, k, Filters(tuple(documents), tuple(heading_prefix)))


class IndexSearch:
    """A built index folder opened once and searched in batches: `search(queries, k)`,
    opened by `open_index(index_dir, retriever)`."""

    def __init__(self, index_dir: str | Path, retriever: str = "hybrid"):
        self.index = RagIndex.load(index_dir, semantic=retriever != "keyword")
        self.name = retriever
        self.retriever = self.index.retriever(retriever)

    def __call__(self, queries: list[str], k: int = 5) -> list[list[RetrievalHit]]:
        return self.retriever.retrieve_batch(list(queries), k)


def open_index(index_dir: str | Path, retriever: str = "hybrid") -> IndexSearch:
    return IndexSearch(index_dir, retriever)


class Searcher:
    """Search an index of ready-made sections from another pipeline (an agent's `search`
    tool). The index is built once in `folder` and reused while the sections' corpus hash is
    unchanged; `searcher(queries, k)` runs a batch. A keyword searcher needs no vectors: it
    loads an index already in `folder` without them, and otherwise builds only the keyword
    part, in memory (no embedding; nothing is written, so `folder` may be None)."""

    def __init__(self, sections, folder: str | Path | None, retriever: str = "hybrid",
                 log=print):
        sections = list(sections)
        index = None
        if folder is not None and (Path(folder) / "manifest.json").exists():
            folder = Path(folder)
            try:
                index = RagIndex.load(folder, semantic=retriever != "keyword")
            except Exception as e:  # noqa: BLE001 - a broken cache is rebuilt, said once
                log(f"{folder}: rebuilding the index ({str(e).splitlines()[0][:160]})")
            if index is not None and index.manifest.get("corpus_hash") != corpus_hash(sections):
                index = None
        if index is None and retriever == "keyword":
            index = RagIndex.build(sections, None, config=RagConfig(), semantic=False, log=log)
        if index is None and folder is None:
            raise WorkbenchError(f"a {retriever} searcher needs a folder for its index")
        self.index = index or RagIndex.build(sections, folder, config=RagConfig(), log=log)
        self.name = retriever
        self.retriever = self.index.retriever(retriever)

    def __call__(self, queries: list[str], k: int = 5) -> list[list[RetrievalHit]]:
        return self.retriever.retrieve_batch(list(queries), k)


class IndexContexts:
    """Retrieval contexts for evaluation prompts (evaluate's context-provider protocol):
    `provider(questions, ranks)` gives one formatted context per question from ranks
    `ranks[0]..ranks[1]` (1-based, inclusive; default 1..top_k, RF-Agent's top 3), within
    the index's context token budget."""

    def __init__(self, index: RagIndex, retriever: str):
        self.index, self.retriever_name = index, retriever
        self.retriever = index.retriever(retriever)
        self.top_k = index.config.top_k
        self._count = token_counter(index)

    def __call__(self, questions, ranks: tuple[int, int] | None = None) -> list[str]:
        lo, hi = ranks or (1, self.top_k)
        hits = self.retriever.retrieve_batch(list(questions), hi)
        return [format_context(h[lo - 1:hi], max_tokens=self.index.config.context_tokens,
                               count_tokens=self._count) for h in hits]


def context_providers(index: str | Path | RagIndex, conditions) -> dict[str, IndexContexts]:
    """One context provider per retrieval condition (keyword, semantic, hybrid) over an
    index; what evaluation formats into its prompts."""
    if not isinstance(index, RagIndex):
        index = RagIndex.load(index)
    return {c: IndexContexts(index, c) for c in conditions if c != "none"}
