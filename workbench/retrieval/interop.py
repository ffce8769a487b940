"""llama-index interop, both ways.

- `as_llamaindex(retriever)`: one of ours as a llama-index `BaseRetriever` (so a llama-index
  query engine or `QueryFusionRetriever` can use it).
- `LlamaIndexRetriever(li_retriever, store)`: a llama-index retriever as one of ours; nodes
  whose id is a chunk of `store` map to it, others are added to the store from the node.
- `LlamaIndexEmbedding(embedder)`: our embedder as a llama-index embedding model, so a
  llama-index `VectorStoreIndex` can be built offline with the bundled MiniLM.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workbench.io import sha256_text
from workbench.records import Chunk
from workbench.retrieval.base import BaseRetriever, ChunkStore


def chunk_to_node(chunk: Chunk):
    from llama_index.core.schema import TextNode

    return TextNode(id_=chunk.id, text=chunk.text, metadata={
        "section_id": chunk.section_id, "doc_id": chunk.doc_id, "source": chunk.source,
        "heading_path": " > ".join(chunk.heading_path)},
        excluded_embed_metadata_keys=["section_id", "doc_id", "source", "heading_path"],
        excluded_llm_metadata_keys=["section_id", "doc_id"])


def as_llamaindex(retriever: BaseRetriever, k: int = 10):
    from llama_index.core.retrievers import BaseRetriever as LIBaseRetriever
    from llama_index.core.schema import NodeWithScore

    class WorkbenchLIRetriever(LIBaseRetriever):
        def __init__(self, inner: BaseRetriever, top_k: int):
            super().__init__()
            self._inner, self._k = inner, top_k

        def _retrieve(self, query_bundle):
            hits = self._inner.retrieve(query_bundle.query_str, self._k)
            store = self._inner.store
            return [NodeWithScore(node=chunk_to_node(store.chunks[store.index_of[h.chunk_id]]),
                                  score=h.score) for h in hits]

    return WorkbenchLIRetriever(retriever, k)


class LlamaIndexRetriever(BaseRetriever):
    name = "llamaindex"

    def __init__(self, li_retriever, store: ChunkStore | None = None, name: str | None = None):
        super().__init__(store or ChunkStore([]))
        self.li = li_retriever
        if name:
            self.name = name

    def _index_of(self, node) -> int:
        i = self.store.index_of.get(node.node_id)
        if i is not None:
            return i
        meta = node.metadata or {}
        text = node.get_content()
        heading = meta.get("heading_path", "")
        chunk = Chunk(id=node.node_id, section_id=str(meta.get("section_id", node.node_id)),
                      doc_id=str(meta.get("doc_id") or node.ref_doc_id or node.node_id),
                      source=str(meta.get("source", meta.get("file_path", ""))),
                      heading_path=heading.split(" > ") if heading else [],
                      text=text, content_hash=sha256_text(text)[:16])
        self.store.chunks.append(chunk)
        self.store.index_of[chunk.id] = len(self.store.chunks) - 1
        return len(self.store.chunks) - 1

    def _search(self, query, k, mask):
        nodes = self.li.retrieve(query)
        idx = np.array([self._index_of(n.node) for n in nodes], dtype=np.int64)
        scores = np.array([n.score if n.score is not None else 0.0 for n in nodes])
        if mask is not None:
            keep = np.array([i < len(mask) and mask[i] for i in idx], dtype=bool)
            idx, scores = idx[keep], scores[keep]
        order = np.lexsort((idx, -scores))[:k]
        return idx[order], scores[order]


def LlamaIndexEmbedding(embedder) -> Any:  # a class factory, named as the class it makes
    from llama_index.core.base.embeddings.base import BaseEmbedding

    class _Emb(BaseEmbedding):
        def _get_query_embedding(self, query: str):
            return embedder.embed([query], show_progress=False)[0].tolist()

        async def _aget_query_embedding(self, query: str):
            return self._get_query_embedding(query)

        def _get_text_embedding(self, text: str):
            return embedder.embed([text], show_progress=False)[0].tolist()

        def _get_text_embeddings(self, texts):
            return embedder.embed(texts, show_progress=False).tolist()

    return _Emb(model_name=embedder.identity, embed_batch_size=embedder.batch_size)
