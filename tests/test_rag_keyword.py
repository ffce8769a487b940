"""Our sparse BM25 vs rank-bm25's BM25Okapi: same scores (1e-9) and same top-10, ties aware."""

import numpy as np
import pytest

from workbench.rag.synthetic import make_passages, make_queries
from workbench.retrieval.analysis import Analyzer
from workbench.retrieval.base import ChunkStore, top_k
from workbench.retrieval.keyword import KeywordRetriever, RankBM25Scorer, SparseBM25


def tie_aware_same_top(ref: np.ndarray, ours: np.ndarray, k: int = 10) -> bool:
    """Same top-k up to reordering within equal scores: the sets of scores agree and every
    doc we rank in the top k has a reference score at least the reference k-th score."""
    ref_top = np.sort(ref)[::-1][:k]
    our_idx, _ = top_k(ours, k)
    return bool(np.allclose(np.sort(ref[our_idx])[::-1], ref_top, atol=1e-9, rtol=0))


@pytest.fixture(scope="module")
def corpus():
    passages = make_passages(3000, vocab_size=5000, seed=3)
    queries = make_queries(passages, 250, seed=4)
    queries += ["", "zzzz-not-a-word", passages[0].split()[0] + " " + passages[0].split()[0]]
    return passages, queries


def test_scores_and_top10_match_rank_bm25_on_250_queries(corpus):
    passages, queries = corpus
    an = Analyzer()
    toks = an.batch(passages)
    ours, ref = SparseBM25.build(toks), RankBM25Scorer(toks)
    assert len(queries) >= 200
    same_top = 0
    for q in queries:
        qt = an(q)
        a, b = ours.scores(qt), ref.scores(qt)
        assert np.max(np.abs(a - b)) <= 1e-9, q
        same_top += tie_aware_same_top(b, a)
        # and the exact order when ties are broken by position
        assert top_k(a, 10)[0].tolist() == top_k(b, 10)[0].tolist()
    assert same_top == len(queries)


def test_epsilon_floor_for_very_common_terms():
    # "the" is in 4 of 5 docs: negative IDF, floored at epsilon * mean IDF as in rank-bm25
    docs = [["the", "cat"], ["the", "dog"], ["the", "bird"], ["the", "fish"], ["a", "cow"]]
    ours, ref = SparseBM25.build(docs), RankBM25Scorer(docs)
    for q in (["the"], ["the", "cat"], ["cow"], ["the", "the"]):
        assert np.allclose(ours.scores(q), ref.scores(q), atol=1e-12)


def test_rank_bm25_backend_is_selectable_and_agrees(corpus):
    passages, queries = corpus
    from workbench.records import Chunk

    chunks = [Chunk(id=f"c{i}", section_id=f"s{i}", doc_id="d", source="x", text=t,
                    content_hash=str(i)) for i, t in enumerate(passages[:500])]
    store = ChunkStore(chunks)
    fast = KeywordRetriever(store, backend="sparse")
    slow = KeywordRetriever(store, backend="rank_bm25")
    for q in queries[:50]:
        a, b = fast.retrieve(q, 10), slow.retrieve(q, 10)
        assert [h.chunk_id for h in a] == [h.chunk_id for h in b]
        assert all(abs(x.score - y.score) < 1e-9 for x, y in zip(a, b))
        assert all(h.score != 0 for h in a)  # non-matching chunks are not hits


def test_analyzer_options_and_cjk():
    an = Analyzer()
    assert an("The Smith-chart, VSWR's use") == ["the", "smith", "chart", "vswr's", "use"]
    assert Analyzer(lowercase=False)("VSWR") == ["VSWR"]
    assert Analyzer(stopwords="english")("the impedance of a line") == ["impedance", "line"]
    zh = an("特性阻抗是电压与电流之比")
    assert zh == list("特性阻抗是电压与电流之比")
    assert an("50欧姆的同轴电缆") == ["50", "欧", "姆", "的", "同", "轴", "电", "缆"]
    assert an("インピーダンス整合") != [] and an("임피던스 정합") != []
    with pytest.raises(ValueError):
        Analyzer(stopwords="french")


def test_keyword_retrieval_on_cjk_text():
    from workbench.records import Chunk

    texts = ["传输线的特性阻抗由电感和电容决定", "噪声系数描述放大器增加的噪声", "天线增益与方向性有关"]
    store = ChunkStore([Chunk(id=f"c{i}", section_id="s", doc_id="d", source="x", text=t,
                              content_hash="h") for i, t in enumerate(texts)])
    hits = KeywordRetriever(store).retrieve("噪声系数", 3)
    assert hits[0].chunk_id == "c1"


def test_top_k_matches_a_full_sort_with_ties():
    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.integers(1, 5000))
        s = rng.integers(0, int(rng.integers(1, 50)), size=n).astype(float)  # many ties
        if trial % 3 == 0:
            s = rng.normal(size=n)
        k = int(rng.integers(1, 40))
        mask = rng.random(n) < 0.5 if trial % 4 == 0 else None
        idx, sc = top_k(s, k, mask)
        allowed = np.arange(n) if mask is None else np.flatnonzero(mask)
        ref = allowed[np.lexsort((allowed, -s[allowed]))][:k]
        assert idx.tolist() == ref.tolist() and sc.tolist() == s[ref].tolist()
