"""A persisted retrieval index: chunks + BM25 matrix + FAISS index + a manifest.

Layout of an index folder (no pickle anywhere: JSON, JSONL, .npy with allow_pickle=False and
FAISS's own format):

    manifest.json      corpus hash, embedder identity, analyzer and parameters, versions,
                       and the sha256 and size of every other file
    chunks.jsonl       the chunks, in index order
    tokens.jsonl       the analysed tokens of each chunk (rebuilds rank-bm25 without pickle)
    bm25_*.npy/json    the sparse BM25 matrix
    faiss.index        the vectors

A build writes into a temporary sibling folder and renames it into place at the end, so a
build killed half-way leaves nothing that loads as complete. `load` checks the manifest, the
size and hash of every file and the embedder, and refuses with a clear error on any mismatch.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from workbench.errors import DataError, WorkbenchError
from workbench.io import (
    pid_alive,
    read_jsonl,
    recover_dir,
    replace_dir,
    sha256_file,
    sha256_text,
    write_jsonl,
)
from workbench.models.embed import load_embedder
from workbench.progress import progress, stage
from workbench.records import Chunk, Section, StrictModel, library_versions
from workbench.retrieval.analysis import Analyzer
from workbench.retrieval.base import BaseRetriever, ChunkStore
from workbench.retrieval.chunking import chunk_sections, embedder_token_counter
from workbench.retrieval.hybrid import FusionMode, HybridRetriever
from workbench.retrieval.keyword import KeywordRetriever, RankBM25Scorer, SparseBM25
from workbench.retrieval.semantic import SemanticRetriever, load_faiss

FORMAT = "workbench-rag-index/1"
# every file the index format defines (the manifest must list exactly these)
INDEX_FILES = ("bm25_data.npy", "bm25_indices.npy", "bm25_indptr.npy", "bm25_params.json",
               "bm25_vocab.json", "chunks.jsonl", "faiss.index", "tokens.jsonl")
RETRIEVERS = ("keyword", "semantic", "hybrid")


class AnalyzerConfig(StrictModel):
    lowercase: bool = True
    stopwords: str = Field("none", description="none or english")
    stemmer: str = Field("none", description="none or english (needs snowballstemmer)")


class RagConfig(StrictModel):
    """Retrieval settings. The defaults are RF-Agent's: top-3 per configuration; hybrid takes
    the top-15 of each retriever, fuses them and keeps the top-3."""

    embedder: str = Field("minilm", description="Embedder spec (bundled 'minilm' or a folder).")
    chunk_size: int = Field(224, ge=16, description="Chunk size in embedder tokens.")
    chunk_overlap: int = Field(32, ge=0, description="Overlap between chunks, in tokens.")
    analyzer: AnalyzerConfig = Field(default_factory=AnalyzerConfig)
    keyword_backend: str = Field("sparse", description="sparse (fast) or rank_bm25 (reference).")
    index_type: str = Field("flat", description="flat (exact), hnsw or ivf.")
    ef_search: int = Field(64, ge=1, description="HNSW search breadth.")
    nprobe: int = Field(16, ge=1, description="IVF lists probed per query.")
    fusion: FusionMode = Field(FusionMode.RECIPROCAL_RANK)
    rrf_k: int = Field(60, ge=1, description="RRF constant (Cormack et al. 2009).")
    weights: dict[str, float] = Field(default_factory=lambda: {"keyword": 1.0, "semantic": 1.0})
    candidates: int = Field(15, ge=1, description="Hybrid: candidates taken from each retriever.")
    top_k: int = Field(3, ge=1, description="Chunks put into a prompt's context.")
    context_tokens: int = Field(768, ge=16, description="Token budget of a prompt's context.")
    on_error: str = Field("skip", description="Bad corpus files: skip (reported) or fail.")


def corpus_hash(sections: list[Section]) -> str:
    return sha256_text("\n".join(f"{s.id}:{s.content_hash}" for s in sections))[:16]


def _remove_stale_builds(out: Path) -> None:
    """Remove the temporary folders of builds that were killed (their process is gone)."""
    for p in out.parent.glob(f".{out.name}.building-*"):
        pid = p.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)


class RagIndex:
    def __init__(self, folder: Path | None, manifest: dict[str, Any], store: ChunkStore,
                 keyword: KeywordRetriever, semantic, config: RagConfig):
        self.folder, self.manifest, self.store = folder, manifest, store
        self.keyword, self.semantic, self.config = keyword, semantic, config
        self._tokens: list[list[str]] | None = None  # the chunks' terms, kept from a build

    # --- build ----------------------------------------------------------------------------

    @classmethod
    def build(cls, sections: list[Section], out: str | Path | None = None, *,
              config: RagConfig | None = None, embedder=None, semantic: bool = True,
              log=lambda msg: None) -> RagIndex:
        """Chunk, analyse, embed and index `sections` (saved in `out` when given); the
        progress lines name each step of the build with its count. Without `semantic` only
        the keyword part is built (nothing is embedded: what a keyword search needs, in a
        fraction of the time), in memory: an index on disk always has both parts."""
        if out is not None and not semantic:
            raise WorkbenchError("an index without its semantic part is not saved")
        with stage("building the index"):
            return cls._build(sections, out, config=config, embedder=embedder,
                              semantic=semantic, log=log)

    @classmethod
    def _build(cls, sections: list[Section], out: str | Path | None, *,
               config: RagConfig | None, embedder, semantic: bool, log) -> RagIndex:
        cfg = config or RagConfig()
        if not sections:
            raise WorkbenchError("the corpus has no sections to index")
        t0 = time.perf_counter()
        chunks = chunk_sections(sections, chunk_size=cfg.chunk_size, overlap=cfg.chunk_overlap,
                                tokenizer=embedder_token_counter(cfg.embedder))
        log(f"{len(sections)} sections -> {len(chunks)} chunks")
        store = ChunkStore(chunks)
        analyzer = Analyzer(**cfg.analyzer.model_dump())
        tokens = analyzer.batch(progress((c.text for c in chunks), desc="keyword terms",
                                         total=len(chunks), unit="chunk", delay=2))
        empty = [c.id for c, t in zip(chunks, tokens, strict=True) if not t]
        if empty:
            log(f"warning: {len(empty)} chunks have no keyword tokens (e.g. {empty[0]})")
        with stage("keyword index"):
            keyword = KeywordRetriever(store, analyzer, cfg.keyword_backend,
                                       scorer=KeywordRetriever.make_scorer(
                                           tokens, cfg.keyword_backend))
        vectors_of = None
        if semantic:
            embedder = embedder or load_embedder(cfg.embedder)
            t1 = time.perf_counter()
            vectors = embedder.embed([c.text for c in chunks])
            log(f"embedded {len(chunks)} chunks in {time.perf_counter() - t1:.1f}s")
            with stage("vector index"):
                vectors_of = SemanticRetriever(store, embedder, index_type=cfg.index_type,
                                               vectors=vectors, ef_search=cfg.ef_search,
                                               nprobe=cfg.nprobe)
        manifest = {
            "format": FORMAT, "created": time.time(),
            "corpus_hash": corpus_hash(sections), "n_sections": len(sections),
            "n_documents": len({s.doc_id for s in sections}), "n_chunks": len(chunks),
            "embedder": {"spec": cfg.embedder, "identity": embedder.identity,
                         "dim": embedder.dim} if vectors_of is not None else None,
            "analyzer": analyzer.to_json(), "config": cfg.model_dump(mode="json"),
            "versions": library_versions("faiss-cpu", "faiss-gpu", "sentence-transformers",
                                         "numpy", "llama-index-core"),
            "build_seconds": None, "files": {},
        }
        index = cls(None, manifest, store, keyword, vectors_of, cfg)
        if out is not None:
            index._tokens = tokens
            with stage("saving the index"):
                index.save(out)
        manifest["build_seconds"] = time.perf_counter() - t0
        return index

    def save(self, out: str | Path) -> None:
        if self.semantic is None:
            raise WorkbenchError("an index without its semantic part is not saved")
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_builds(out)
        tmp = out.parent / f".{out.name}.building-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            write_jsonl(tmp / "chunks.jsonl", self.store.chunks)
            tokens = self._tokens or self.keyword.analyzer.batch(
                c.text for c in self.store.chunks)
            write_jsonl(tmp / "tokens.jsonl", ({"t": t} for t in tokens))
            scorer = self.keyword.scorer
            sparse = scorer if isinstance(scorer, SparseBM25) else SparseBM25.build(tokens)
            sparse.save(tmp)
            self.semantic.save(tmp)
            files = {p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size}
                     for p in sorted(tmp.iterdir())}
            manifest = dict(self.manifest, files=files)
            # the manifest goes last: a folder without it never loads
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
            replace_dir(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.folder, self.manifest = out, manifest

    # --- load -----------------------------------------------------------------------------

    @classmethod
    def load(cls, folder: str | Path, *, embedder=None, keyword_backend: str | None = None,
             verify: bool = True, semantic: bool = True) -> RagIndex:
        folder = recover_dir(Path(folder))
        mpath = folder / "manifest.json"
        if not folder.is_dir():
            raise WorkbenchError(f"{folder}: no such index folder")
        if not mpath.exists():
            raise WorkbenchError(f"{folder}: not a complete index (no manifest.json; was the "
                                 "build interrupted?) - rebuild it with `workbench rag build`")
        manifest = _checked_manifest(folder, mpath, verify=verify)
        try:
            cfg = RagConfig.model_validate(manifest["config"])
        except ValueError as e:
            raise DataError(f"manifest config: {str(e).splitlines()[0]}", path=str(mpath)
                            ) from None
        chunks = read_jsonl(folder / "chunks.jsonl", Chunk.model_validate)
        store = ChunkStore(chunks)
        try:
            analyzer = Analyzer(**manifest["analyzer"])
        except (ValueError, TypeError) as e:
            raise DataError(f"manifest analyzer: {str(e).splitlines()[0][:200]}",
                            path=str(mpath)) from None
        backend = keyword_backend or cfg.keyword_backend
        scorer: SparseBM25 | RankBM25Scorer
        if backend == "sparse":
            try:
                scorer = SparseBM25.load(folder)
            except (ValueError, OSError, KeyError, TypeError) as e:  # object or bad arrays
                raise DataError(f"unreadable BM25 matrix ({str(e)[:200]}); rebuild the index",
                                path=str(folder)) from None
            if scorer.n_docs != len(chunks):
                raise DataError(f"BM25 matrix covers {scorer.n_docs} chunks, chunks.jsonl "
                                f"has {len(chunks)}", path=str(folder))
        else:
            tokens = [r["t"] for r in read_jsonl(folder / "tokens.jsonl")]
            scorer = RankBM25Scorer(tokens)
        keyword = KeywordRetriever(store, analyzer, backend, scorer=scorer)
        sem = None
        if semantic:
            want = manifest["embedder"]
            embedder = embedder or load_embedder(want["spec"])
            if embedder.identity != want["identity"] or embedder.dim != want["dim"]:
                raise WorkbenchError(
                    f"{folder} was built with embedder {want['identity']} (dim {want['dim']}),"
                    f" not {embedder.identity} (dim {embedder.dim}); use that embedder or "
                    "rebuild the index")
            faiss_index = load_faiss(folder / "faiss.index")
            if faiss_index.ntotal != len(chunks) or faiss_index.d != want["dim"]:
                raise DataError(f"faiss.index holds {faiss_index.ntotal} x {faiss_index.d}, "
                                f"expected {len(chunks)} x {want['dim']}", path=str(folder))
            sem = SemanticRetriever(store, embedder, faiss_index, index_type=cfg.index_type,
                                    ef_search=cfg.ef_search, nprobe=cfg.nprobe)
        return cls(folder, manifest, store, keyword, sem, cfg)

    # --- use ------------------------------------------------------------------------------

    def retriever(self, name: str = "hybrid", *, weights: dict[str, float] | None = None,
                  fusion: str | None = None, candidates: int | None = None,
                  reranker=None) -> BaseRetriever:
        if name == "keyword":
            return self.keyword
        if name in ("semantic", "hybrid") and self.semantic is None:
            raise WorkbenchError("this index was loaded without its semantic part")
        if name == "semantic":
            return self.semantic
        if name == "hybrid":
            return HybridRetriever(
                self.store, {"keyword": self.keyword, "semantic": self.semantic},
                weights=weights or self.config.weights, mode=fusion or self.config.fusion,
                rrf_k=self.config.rrf_k, candidates=candidates or self.config.candidates,
                reranker=reranker)
        raise WorkbenchError(f"unknown retriever {name!r} (expected {', '.join(RETRIEVERS)})")


MAX_MANIFEST_BYTES = 1 << 20


def _regular_file(p: Path) -> None:
    """Refuse an index file that is a link (it could point anywhere), a device, a FIFO or a
    folder: only regular files inside the index folder are ever opened."""
    import stat

    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode):
        raise DataError("is a link; an index holds only regular files (rebuild the index)",
                        path=str(p))
    if not stat.S_ISREG(st.st_mode):
        raise DataError("is not a regular file (a device, FIFO or folder); rebuild the index",
                        path=str(p))


def _checked_manifest(folder: Path, mpath: Path, *, verify: bool) -> dict[str, Any]:
    """The manifest, checked before any other file is opened: it must list exactly the files
    of the index format, as plain names inside the folder, each with its size and sha256, and
    every file must match. Anything else is refused with one line naming the file."""
    _regular_file(mpath)
    if mpath.stat().st_size > MAX_MANIFEST_BYTES:
        raise DataError(f"manifest of {mpath.stat().st_size:,} bytes (an index's is a few "
                        "kilobytes); refused", path=str(mpath))
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"corrupt manifest ({e})", path=str(mpath)) from None
    except RecursionError:
        raise DataError("corrupt manifest (nested too deeply)", path=str(mpath)) from None
    if not isinstance(manifest, dict):
        raise DataError("manifest is not a JSON object", path=str(mpath))
    if manifest.get("format") != FORMAT:
        raise WorkbenchError(f"{folder}: index format {manifest.get('format')!r}, this "
                             f"workbench reads {FORMAT!r}")
    for key, kind in (("files", dict), ("config", dict), ("analyzer", dict),
                      ("embedder", dict)):
        if not isinstance(manifest.get(key), kind):
            raise DataError(f"manifest field {key!r} is missing or not an object",
                            path=str(mpath))
    files = manifest["files"]
    for name in files:
        if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name
                or "\\" in name or Path(name).is_absolute()):
            raise DataError(f"manifest names {name!r}: index files are plain names inside "
                            "the index folder", path=str(mpath))
    if missing := sorted(set(INDEX_FILES) - set(files)):
        raise DataError(f"manifest does not list {', '.join(missing)}; rebuild the index",
                        path=str(mpath))
    if extra := sorted(set(files) - set(INDEX_FILES)):
        raise DataError(f"manifest lists files that are not part of an index: "
                        f"{', '.join(extra)}", path=str(mpath))
    for name in INDEX_FILES:
        meta = files[name]
        if not (isinstance(meta, dict) and isinstance(meta.get("bytes"), int)
                and isinstance(meta.get("sha256"), str)):
            raise DataError(f"manifest entry for {name} needs integer 'bytes' and string "
                            "'sha256'", path=str(mpath))
        p = folder / name
        if not os.path.lexists(p):
            raise DataError("missing index file; rebuild the index", path=str(p))
        _regular_file(p)
        if p.stat().st_size != meta["bytes"]:
            raise DataError(f"size {p.stat().st_size} != {meta['bytes']} in the manifest "
                            "(truncated or replaced); rebuild the index", path=str(p))
        if verify and sha256_file(p) != meta["sha256"]:
            raise DataError("content hash differs from the manifest; rebuild the index",
                            path=str(p))
    present = {p.name for p in folder.iterdir() if p.name != "manifest.json"
               and not p.name.startswith(".")}
    if extra := sorted(present - set(INDEX_FILES)):
        raise DataError(f"files that the manifest does not cover: {', '.join(extra)}",
                        path=str(folder))
    return manifest
