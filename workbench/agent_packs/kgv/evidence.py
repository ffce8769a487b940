"""What the KGV agent searches, and how a run says which.

The evidence is, first found first:

- a retrieval index made by `workbench rag build` (keyword, semantic or hybrid; config
  `agent.index`, or `--index PATH` on `workbench agent run|eval kgv`): searched as it is,
  with `agent.retriever`, through `retrieval.search.open_index` (nothing is
  rebuilt or written beside it); a verdict cites its passages (chunk ids) with their source
  documents;
- the data folder's `documents.jsonl` (the pack's entries), or its `documents/` folder (any
  corpus format);
- the graph's own facts, one entry per subject entity.

The last three are indexed once in the run's `agent/index` by `retrieval.search.Searcher`, and
a verdict cites their entries (document ids). Every task carries the description of its
evidence (`evidence_source`), so trajectories, `agent run` and the report name it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from workbench.agent_packs.kgv import graph as G
from workbench.corpus import ingest
from workbench.errors import WorkbenchError
from workbench.io import read_jsonl
from workbench.records import Section
from workbench.runs import file_hash

Kind = Literal["index", "documents.jsonl", "documents", "graph"]
# what breaks when an index folder's files are damaged (the rag reader names the file)
_BROKEN = (WorkbenchError, OSError, ValueError, RuntimeError, KeyError, TypeError)


@dataclass
class Evidence:
    """Where the evidence comes from: a built index (`docs` None) or entries to index."""

    kind: Kind
    path: Path
    docs: list[Any] | None = None

    @property
    def cites(self) -> Literal["passage", "entry"]:
        """What a verdict cites: an index's passages (chunk ids) or the entries' ids."""
        return "passage" if self.kind == "index" else "entry"

    def describe(self, retriever: str) -> str:
        """One line for a person: what was searched, and how."""
        n = len(self.docs or ())
        what = {"index": f"prebuilt index {self.path}",
                "documents.jsonl": f"{self.path} ({n} entries)",
                "documents": f"documents folder {self.path} ({n} sections)",
                "graph": f"the graph's own facts ({self.path.name}: {n} entity entries)",
                }[self.kind]
        return f"{what}, {retriever} retrieval"


def index_evidence(path: str | Path) -> Evidence:
    """A prebuilt index as the evidence; a path that is no folder is one line naming it."""
    path = Path(path)
    if not path.is_dir():
        why = "not a folder" if path.exists() else "no such folder"
        raise WorkbenchError(f"agent.index {path}: {why}; give a folder made by `workbench "
                             f"rag build CORPUS -o {path}`")
    return Evidence("index", path)


def folder_evidence(folder: Path, graph: Any, wordings: dict[str, Any]) -> Evidence:
    """The evidence a KG data folder holds: documents.jsonl, documents/, else the graph's own
    facts; none of them is one line naming the folder."""
    if (folder / "documents.jsonl").is_file():
        return Evidence("documents.jsonl", folder / "documents.jsonl",
                        read_jsonl(folder / "documents.jsonl", Section.model_validate))
    if (folder / "documents").is_dir():
        rep = ingest(folder / "documents")
        if not rep.sections:
            raise WorkbenchError(f"{folder / 'documents'}: no readable document "
                                 f"({rep.summary()})")
        return Evidence("documents", folder / "documents", rep.sections)
    if graph is not None:
        return Evidence("graph", folder / graph.source, G.entity_documents(graph, wordings))
    raise WorkbenchError(f"{folder}: no evidence: add a graph (.nt, .ttl, .tsv), a "
                         "documents/ folder or documents.jsonl, or give a built index "
                         "(agent.index)")


class IndexSearch:
    """The `search` tool's backend over a prebuilt index: `search(queries, k) -> hits`,
    through `retrieval.search.open_index` (the index is opened once, by `check`, and
    searched in batches). Each (query, k) is asked once per process (the teacher's samples
    and the conditions repeat the same rewrites)."""

    def __init__(self, folder: Path, retriever: str):
        self.folder, self.retriever = folder, retriever
        # an opened index's search: (queries, k) -> each query's hits
        self._search: Callable[[list[str], int], list[list[Any]]] | None = None
        self._seen: dict[tuple[str, int], list[Any]] = {}

    def __call__(self, queries: list[str], k: int = 5) -> list[list[Any]]:
        if self._search is None:
            self.check()
        search = self._search
        assert search is not None  # check() opened the index or raised
        new = list(dict.fromkeys(q for q in queries if (q, k) not in self._seen))
        if new:
            for q, hits in zip(new, search(new, k)):
                self._seen[(q, k)] = hits
        return [self._seen[(q, k)] for q in queries]

    def check(self) -> None:
        """Open the index once (manifest, every file's size and hash, the embedder for
        semantic or hybrid retrieval): a missing or broken one is one line naming it."""
        from workbench.retrieval.search import open_index

        try:
            search = open_index(self.folder, self.retriever)
            search(["index check"], 1)
            self._search = search
        except _BROKEN as e:
            why = " ".join(str(e).split())[:300] or type(e).__name__
            hint = "" if "rebuild" in why else "; rebuild it with `workbench rag build`"
            raise WorkbenchError(f"agent.index {self.folder}: not a usable index "
                                 f"({why}){hint}") from None


def searcher(evidence: Evidence, folder: Path, retriever: str, log=print):
    """The search behind the agent's tool: the index as it is, or the entries indexed once in
    `folder` (the run's agent/index) and reused while they are unchanged."""
    from workbench.retrieval.search import Searcher

    if evidence.docs is None:
        search = IndexSearch(evidence.path, retriever)
        search.check()
        return search
    return Searcher(evidence.docs, folder, retriever, log=log)


def index_key(evidence: Evidence) -> str | None:
    """What identifies an index for the stage keys (its manifest lists every file's hash):
    None for entries, which the data folder's hash covers."""
    return file_hash(evidence.path / "manifest.json") if evidence.kind == "index" else None
