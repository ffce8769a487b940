"""Sections into retrieval chunks: token-aware size with overlap (llama-index's
`SentenceSplitter`, counting tokens with the embedder's own tokenizer so a chunk never
exceeds what the embedder reads)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from workbench.io import sha256_text
from workbench.models.resolve import resolve_embedder
from workbench.progress import progress
from workbench.records import Chunk, Section


def embedder_token_counter(embedder_spec: str = "minilm") -> Callable[[str], list[int]]:
    from transformers import AutoTokenizer

    _, folder = resolve_embedder(embedder_spec)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.model_max_length = 10**9  # we only count tokens here
    return lambda s: tok.encode(s, add_special_tokens=False)


def chunk_sections(sections: Iterable[Section], *, chunk_size: int = 224, overlap: int = 32,
                   tokenizer: Callable[[str], list] | None = None) -> list[Chunk]:
    if overlap >= chunk_size:
        raise ValueError(f"chunk overlap ({overlap}) must be smaller than chunk size "
                         f"({chunk_size})")
    from llama_index.core.node_parser import SentenceSplitter

    splitter = SentenceSplitter(chunk_size=chunk_size, chunk_overlap=overlap,
                                tokenizer=tokenizer or embedder_token_counter())

    chunks = []
    # llama-index's splitter counts tokens many times over: ~5 ms a section on 2 cores, so a
    # library of 30,000 abstracts is minutes of chunking (a bar after 2 s, a log's lines)
    for sec in progress(sections, desc="chunking", unit="section", delay=2):
        for i, text in enumerate(splitter.split_text(sec.text)):
            text = text.strip()
            if not text:
                continue
            h = sha256_text(text)[:16]
            chunks.append(Chunk(id="chk-" + sha256_text(f"{sec.id}\x1f{i}\x1f{h}")[:16],
                                section_id=sec.id, doc_id=sec.doc_id, source=sec.source,
                                heading_path=sec.heading_path, text=text, content_hash=h,
                                order=i))
    return chunks
