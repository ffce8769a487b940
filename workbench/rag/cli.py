"""`workbench rag ...` commands besides `run` (which the registry adds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from workbench.cli_options import ConfigArg, ConfigOpt, SetOpt, load
from workbench.io import atomic_write_json, check_made_here
from workbench.progress import quiet_libraries
from workbench.rag.evaluate import evaluate_retrievers, format_table, read_qrels
from workbench.runs import outputs_at

RetrieverOpt = Annotated[str, typer.Option("--retriever", "-r",
                                           help="keyword, semantic or hybrid.")]


def register(group: typer.Typer) -> None:
    @group.command("build")
    def build(corpus: Annotated[Path, typer.Argument(help="Corpus folder/file, or Section "
                                                          "JSONL.")],
              out: Annotated[Path, typer.Option("--out", "-o", help="Index folder to write.")],
              config: ConfigArg = None, config_opt: ConfigOpt = None,
              set_: SetOpt = None):
        """Chunk a corpus and build the keyword (BM25), semantic (FAISS) and hybrid indexes
        into any folder."""
        from workbench.retrieval.index import RagConfig
        from workbench.retrieval.search import build_index

        quiet_libraries()
        given = config or config_opt or set_
        cfg = load(config, config_opt, set_).rag if given else RagConfig()
        # before any work: never a user's folder
        check_made_here(out, (outputs_at("rag", out).declared("manifest").path,))
        index, _ = build_index(corpus, out, cfg, log=lambda m: typer.echo(m, err=True))
        m = index.manifest
        typer.echo(f"built {out}: {m['n_chunks']} chunks from {m['n_sections']} sections, "
                   f"embedder {m['embedder']['identity']}, corpus {m['corpus_hash']}")

    @group.command("query")
    def query(index: Annotated[Path, typer.Argument(help="Index folder.")],
              text: Annotated[str, typer.Argument(help="The query.")],
              retriever: RetrieverOpt = "hybrid",
              k: Annotated[int, typer.Option("-k", help="Hits to return.", min=1,
                                            max=1000)] = 10,
              doc: Annotated[list[str] | None, typer.Option(
                  help="Only these documents (id or source path; repeatable).")] = None,
              heading: Annotated[str | None, typer.Option(
                  help="Only under this heading path, e.g. 'Reflection > VSWR'.")] = None,
              json_out: Annotated[bool, typer.Option(
                  "--json", help="One JSON object per hit, with its document path and "
                                 "text.")] = False):
        """Query an index; prints rank, score, heading path and chunk id (with --json also
        the document path and the chunk's text)."""
        from workbench.retrieval.search import query_index

        quiet_libraries()
        prefix = tuple(h.strip() for h in heading.split(">")) if heading else ()
        hits = query_index(index, text, retriever=retriever, k=k, documents=tuple(doc or ()),
                           heading_prefix=prefix)
        for h in hits:
            if json_out:
                typer.echo(json.dumps({"rank": h.rank, "chunk_id": h.chunk_id,
                                       "score": h.score, "section_id": h.section_id,
                                       "document": h.doc_id, "source": h.source,
                                       "heading_path": h.heading_path, "text": h.text},
                                      ensure_ascii=False))
            else:
                typer.echo(f"{h.rank:>3} {h.score:9.4f}  {' > '.join(h.heading_path)}  "
                           f"[{h.chunk_id}]")

    @group.command("eval")
    def evaluate(index: Annotated[Path, typer.Argument(help="Index folder.")],
                 qrels: Annotated[Path, typer.Option(help="Qrels: JSONL, or TREC with "
                                                          "--queries.")],
                 queries: Annotated[Path | None, typer.Option(
                     help="Query texts for TREC qrels (TSV id<TAB>text or JSONL).")] = None,
                 level: Annotated[str, typer.Option(help="Relevance level: chunk, section or "
                                                         "doc.")] = "chunk",
                 out: Annotated[Path | None, typer.Option(
                     help="Write summary and per-query JSON here.")] = None):
        """Hit@k, Recall@k, MRR and nDCG@k of the three retrievers side by side."""
        from workbench.retrieval.index import RagIndex

        quiet_libraries()
        qs = read_qrels(qrels, queries)
        idx = RagIndex.load(index)
        summary = evaluate_retrievers({n: idx.retriever(n) for n in ("keyword", "semantic",
                                                                      "hybrid")}, qs,
                                      level=level)
        typer.echo(f"{len(qs)} queries, relevance at {level} level\n" + format_table(summary))
        if out:
            atomic_write_json(out, summary)
