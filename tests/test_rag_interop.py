"""llama-index interop both ways, with real llama-index retrievers and query machinery."""

import pytest

from workbench.retrieval.index import RagIndex
from workbench.retrieval.interop import (
    LlamaIndexEmbedding, LlamaIndexRetriever, as_llamaindex, chunk_to_node,
)


@pytest.fixture(scope="module")
def idx(rf_index, embedder):
    return RagIndex.load(rf_index, embedder=embedder)


def test_ours_inside_llamaindex(idx):
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.response_synthesizers import get_response_synthesizer
    from llama_index.core.llms import MockLLM
    from llama_index.core.retrievers import QueryFusionRetriever

    for name in ("keyword", "semantic", "hybrid"):
        ours = idx.retriever(name)
        li = as_llamaindex(ours, k=5)
        nodes = li.retrieve("voltage standing wave ratio")
        hits = ours.retrieve("voltage standing wave ratio", 5)
        assert [n.node.node_id for n in nodes] == [h.chunk_id for h in hits]
        assert [n.score for n in nodes] == [h.score for h in hits]
    # a llama-index query engine runs on our retriever (MockLLM: no model download)
    engine = RetrieverQueryEngine(retriever=as_llamaindex(idx.retriever("hybrid"), 3),
                                  response_synthesizer=get_response_synthesizer(llm=MockLLM()))
    resp = engine.query("What is VSWR?")
    assert len(resp.source_nodes) == 3
    # and llama-index's own fusion over our two retrievers
    fusion = QueryFusionRetriever([as_llamaindex(idx.keyword, 15),
                                   as_llamaindex(idx.semantic, 15)], llm=MockLLM(),
                                  mode="reciprocal_rerank", num_queries=1, similarity_top_k=3,
                                  use_async=False)
    assert len(fusion.retrieve("skin depth")) == 3


def test_llamaindex_retriever_as_ours(idx, embedder):
    from llama_index.core import VectorStoreIndex

    nodes = [chunk_to_node(c) for c in idx.store.chunks]
    li_index = VectorStoreIndex(nodes, embed_model=LlamaIndexEmbedding(embedder))
    wrapped = LlamaIndexRetriever(li_index.as_retriever(similarity_top_k=5), idx.store,
                                  name="li-vector")
    for q in ["characteristic impedance of coax", "return loss", "skin effect"]:
        theirs = wrapped.retrieve(q, 5)
        ours = idx.semantic.retrieve(q, 5)
        assert [h.chunk_id for h in theirs] == [h.chunk_id for h in ours]
        assert theirs[0].retriever == "li-vector" and theirs[0].section_id == ours[0].section_id
    # nodes unknown to our store become chunks of it
    from llama_index.core.schema import TextNode

    foreign = VectorStoreIndex([TextNode(id_="n1", text="Friis formula for cascaded noise")],
                               embed_model=LlamaIndexEmbedding(embedder))
    w = LlamaIndexRetriever(foreign.as_retriever(similarity_top_k=1))
    (hit,) = w.retrieve("noise figure cascade", 1)
    assert hit.chunk_id == "n1" and "Friis" in hit.text
