import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from workbench.errors import DataError, WorkbenchError
from workbench.retrieval.base import ChunkStore, Filters
from workbench.retrieval.hybrid import HybridRetriever, relative_score_fuse, rrf_fuse
from workbench.retrieval.index import RagConfig, RagIndex
from workbench.records import Chunk

QUERIES = [
    "characteristic impedance of a coaxial cable", "VSWR for reflection coefficient 0.2",
    "skin depth in copper at 1 GHz", "quarter-wave transformer", "return loss 20 dB",
    "open-circuited stub", "mismatch loss", "isolator protects the power amplifier",
    "microstrip width on FR-4", "telegrapher's equations", "phase velocity in polyethylene",
    "slotted line measurement", "why 50 ohms", "attenuation in nepers", "standing wave",
]


def make_queries(n=50):
    base = QUERIES * (n // len(QUERIES) + 1)
    return [f"{q}" if i < len(QUERIES) else f"{q} {i}" for i, q in enumerate(base[:n])]


def test_persist_and_reload_identical_results(rf_index, embedder):
    a = RagIndex.load(rf_index, embedder=embedder)
    b = RagIndex.load(rf_index, embedder=embedder)
    assert a.semantic.index.ntotal == len(a.store) == a.manifest["n_chunks"]
    qs = make_queries(50)
    for name in ("keyword", "semantic", "hybrid"):
        ra, rb = a.retriever(name), b.retriever(name)
        for q in qs:
            ha, hb = ra.retrieve(q, 10), rb.retrieve(q, 10)
            assert [(h.chunk_id, h.score) for h in ha] == [(h.chunk_id, h.score) for h in hb]
    names = {p.name for p in rf_index.iterdir()}
    assert not any(n.endswith((".pkl", ".pickle", ".bin")) for n in names)


def test_built_in_memory_equals_loaded(rf_sections, rf_index, embedder):
    built = RagIndex.build(rf_sections, None, config=RagConfig(chunk_size=96, chunk_overlap=16),
                           embedder=embedder)
    loaded = RagIndex.load(rf_index, embedder=embedder)
    assert [c.id for c in built.store.chunks] == [c.id for c in loaded.store.chunks]
    for q in QUERIES:
        for name in ("keyword", "semantic", "hybrid"):
            x = built.retriever(name).retrieve(q, 5)
            y = loaded.retriever(name).retrieve(q, 5)
            assert [h.chunk_id for h in x] == [h.chunk_id for h in y]
            assert np.allclose([h.score for h in x], [h.score for h in y], atol=1e-6)


def test_a_keyword_searcher_embeds_nothing_and_ranks_as_the_full_index(
        rf_sections, rf_index, embedder, tmp_path, monkeypatch):
    """What a keyword search needs is built without the vectors, in memory: the same chunks
    and keyword rankings as the saved index, no embedder loaded, nothing written. A hybrid
    searcher still builds and saves both parts."""
    from workbench.retrieval import index as index_module
    from workbench.retrieval.search import Searcher

    cfg = RagConfig(chunk_size=96, chunk_overlap=16)
    keyword_only = RagIndex.build(rf_sections, None, config=cfg, semantic=False)
    full = RagIndex.load(rf_index, embedder=embedder)
    assert keyword_only.semantic is None and keyword_only.manifest["embedder"] is None
    for q in QUERIES:
        x, y = (i.retriever("keyword").retrieve(q, 5) for i in (keyword_only, full))
        assert [(h.chunk_id, h.score) for h in x] == [(h.chunk_id, h.score) for h in y]
    with pytest.raises(WorkbenchError, match="loaded without its semantic part"):
        keyword_only.retriever("hybrid")
    with pytest.raises(WorkbenchError, match="not saved"):
        RagIndex.build(rf_sections, tmp_path / "x", config=cfg, semantic=False)
    with pytest.raises(WorkbenchError, match="not saved"):
        keyword_only.save(tmp_path / "y")

    def no_embedder(*a, **k):
        raise AssertionError("a keyword searcher loaded the embedder")

    monkeypatch.setattr(index_module, "load_embedder", no_embedder)
    searcher = Searcher(rf_sections[:20], None, "keyword", log=lambda m: None)
    assert searcher(["characteristic impedance"], 3)[0]
    folder = tmp_path / "kw"
    Searcher(rf_sections[:20], folder, "keyword", log=lambda m: None)
    assert not folder.exists()
    monkeypatch.undo()
    Searcher(rf_sections[:20], folder, "hybrid", log=lambda m: None)
    assert (folder / "manifest.json").is_file() and (folder / "faiss.index").is_file()
    # and the saved one serves a keyword searcher without its vectors
    monkeypatch.setattr(index_module, "load_embedder", no_embedder)
    assert Searcher(rf_sections[:20], folder, "keyword", log=lambda m: None).index.semantic \
        is None
    with pytest.raises(WorkbenchError, match="needs a folder"):
        Searcher(rf_sections[:20], None, "hybrid", log=lambda m: None)


def test_rankings_make_sense(rf_index, embedder):
    idx = RagIndex.load(rf_index, embedder=embedder)
    for name in ("keyword", "semantic", "hybrid"):
        top = idx.retriever(name).retrieve("Voltage standing wave ratio VSWR", 3)
        assert any("Standing Wave" in " ".join(h.heading_path) for h in top), name


def test_truncated_and_tampered_files_are_refused(rf_index, tmp_path, embedder):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(rf_index, broken)
    f = broken / "faiss.index"
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(DataError) as e:
        RagIndex.load(broken, embedder=embedder)
    assert "faiss.index" in str(e.value) and "truncated" in str(e.value)
    shutil.rmtree(broken)
    shutil.copytree(rf_index, broken)
    data = bytearray((broken / "bm25_data.npy").read_bytes())
    data[-1] ^= 0xFF
    (broken / "bm25_data.npy").write_bytes(bytes(data))
    with pytest.raises(DataError, match="bm25_data.npy.*hash"):
        RagIndex.load(broken, embedder=embedder)
    (broken / "manifest.json").unlink()
    with pytest.raises(WorkbenchError, match="not a complete index"):
        RagIndex.load(broken, embedder=embedder)


class OtherEmbedder:
    identity, dim, batch_size = "someone/else", 384, 8


def test_other_embedder_is_refused(rf_index):
    with pytest.raises(WorkbenchError, match="built with embedder .*MiniLM"):
        RagIndex.load(rf_index, embedder=OtherEmbedder())
    # keyword-only loading needs no embedder at all
    idx = RagIndex.load(rf_index, semantic=False)
    assert idx.retriever("keyword").retrieve("skin depth", 1)


def test_failed_build_leaves_nothing_loadable(rf_sections, tmp_path, embedder, monkeypatch):
    from workbench.retrieval import semantic

    def boom(self, folder):
        raise RuntimeError("killed")

    monkeypatch.setattr(semantic.SemanticRetriever, "save", boom)
    out = tmp_path / "idx"
    with pytest.raises(RuntimeError):
        RagIndex.build(rf_sections, out, embedder=embedder)
    assert not out.exists() and list(tmp_path.iterdir()) == []


KILL = """
import sys, time
from workbench.retrieval import semantic
orig = semantic.SemanticRetriever.save
def slow(self, folder):
    orig(self, folder)
    print("SAVING", flush=True)
    time.sleep(60)
semantic.SemanticRetriever.save = slow
from workbench.retrieval.search import build_index
build_index(sys.argv[1], sys.argv[2], log=lambda m: None)
"""


def test_sigkill_mid_build_keeps_previous_index(rf_index, tmp_path, embedder, kill_injection):
    import shutil

    out = tmp_path / "idx"
    shutil.copytree(rf_index, out)
    before = (out / "manifest.json").read_bytes()
    p = subprocess.Popen([sys.executable, "-c", KILL, str(REPO / "datasets" / "rf"), str(out)],
                         stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert p.stdout.readline().strip() == "SAVING"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert (out / "manifest.json").read_bytes() == before
    RagIndex.load(out, embedder=embedder)  # the previous index still loads
    assert list(tmp_path.glob(".idx.building-*"))  # the killed build's leftovers ...
    RagIndex.load(out, embedder=embedder).save(out)
    assert not list(tmp_path.glob(".idx.building-*"))  # ... go at the next build


def _store(n):
    return ChunkStore([Chunk(id=f"c{i}", section_id=f"s{i}", doc_id="d", source="x",
                             text=f"t{i}", content_hash="h") for i in range(n)])


class Fixed:
    """A retriever stub with a fixed ranked list (fusion maths only)."""

    def __init__(self, store, idx, scores):
        self.store, self.idx, self.scores = store, np.array(idx), np.array(scores, float)

    def _search(self, q, k, mask):
        return self.idx[:k], self.scores[:k]

    def _search_batch(self, qs, k, mask):
        return [self._search(q, k, mask) for q in qs]


def test_rrf_with_weights_hand_computed():
    a = (np.array([0, 1, 2]), np.array([9.0, 5.0, 1.0]))
    b = (np.array([2, 0, 3]), np.array([0.9, 0.8, 0.1]))
    fused = rrf_fuse([a, b], [2.0, 1.0], k=60)
    assert fused[0] == pytest.approx(2 / 61 + 1 / 62)
    assert fused[1] == pytest.approx(2 / 62)
    assert fused[2] == pytest.approx(2 / 63 + 1 / 61)
    assert fused[3] == pytest.approx(1 / 63)
    store = _store(4)
    h = HybridRetriever(store, {"kw": Fixed(store, *a), "sem": Fixed(store, *b)},
                        weights={"kw": 2.0, "sem": 1.0})
    assert [x.chunk_id for x in h.retrieve("q", 4)] == ["c0", "c2", "c1", "c3"]
    h2 = HybridRetriever(store, {"kw": Fixed(store, *a), "sem": Fixed(store, *b)},
                         weights={"kw": 1.0, "sem": 3.0})
    # weights change the order: with sem weighted 3x, c2 (sem rank 1) wins
    assert [x.chunk_id for x in h2.retrieve("q", 2)] == ["c2", "c0"]


def test_relative_score_fusion_hand_computed():
    a = (np.array([0, 1, 2]), np.array([9.0, 5.0, 1.0]))
    b = (np.array([2, 0]), np.array([0.9, 0.5]))
    fused = relative_score_fuse([a, b], [1.0, 0.5])
    assert fused[0] == pytest.approx(1.0 + 0.5 * 0.0)
    assert fused[1] == pytest.approx(0.5)
    assert fused[2] == pytest.approx(0.0 + 0.5 * 1.0)


def test_ties_are_deterministic_and_reranker_applies():
    store = _store(4)
    a = (np.array([3, 1]), np.array([1.0, 1.0]))
    b = (np.array([1, 3]), np.array([1.0, 1.0]))
    h = HybridRetriever(store, {"a": Fixed(store, *a), "b": Fixed(store, *b)})
    orders = {tuple(x.chunk_id for x in h.retrieve("q", 2)) for _ in range(3)}
    assert orders == {("c1", "c3")}  # equal RRF scores: chunk position decides
    rr = HybridRetriever(store, {"a": Fixed(store, *a), "b": Fixed(store, *b)},
                         reranker=lambda q, ps: [len(p) + (p == "t3") for p in ps])
    assert [x.chunk_id for x in rr.retrieve("q", 2)] == ["c3", "c1"]


def test_filters_on_all_three_retrievers(rf_index, embedder):
    idx = RagIndex.load(rf_index, embedder=embedder)
    docs = sorted({c.doc_id for c in idx.store.chunks})
    tl = [c for c in idx.store.chunks if c.heading_path[0] == "Transmission Lines"][0]
    for name in ("keyword", "semantic", "hybrid"):
        r = idx.retriever(name)
        hits = r.retrieve("reflection impedance line", 10, Filters(documents=(tl.doc_id,)))
        assert hits and all(h.doc_id == tl.doc_id for h in hits), name
        hits = r.retrieve("reflection impedance line", 10,
                          Filters(heading_prefix=("Reflection and Standing Waves", "VSWR")))
        assert hits == [], name  # no such heading
        hits = r.retrieve("impedance", 10, Filters(heading_prefix=(
            "Reflection and Standing Waves", "Voltage Standing Wave Ratio")))
        assert hits and all(h.heading_path[1] == "Voltage Standing Wave Ratio" for h in hits)
    assert len(docs) >= 2


class _Remembered:
    """`inner`, each list of texts embedded once: builds of the same chunks share vectors."""

    def __init__(self, inner):
        self.inner, self.seen = inner, {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def embed(self, texts, **kw):
        key = tuple(texts)
        if key not in self.seen:
            self.seen[key] = self.inner.embed(texts, **kw)
        return self.seen[key].copy()


def test_hnsw_and_ivf_selectable(rf_sections, embedder, tmp_path):
    # the two builds chunk the corpus alike: its vectors are made once (6 s), each index
    # type is built, saved, loaded and searched as before
    embedder = _Remembered(embedder)
    for kind in ("hnsw", "ivf"):
        idx = RagIndex.build(rf_sections, tmp_path / kind, embedder=embedder,
                             config=RagConfig(index_type=kind, chunk_size=96, chunk_overlap=16))
        again = RagIndex.load(tmp_path / kind, embedder=embedder)
        q = "characteristic impedance"
        assert [h.chunk_id for h in idx.retriever("semantic").retrieve(q, 3)] == \
            [h.chunk_id for h in again.retriever("semantic").retrieve(q, 3)]
        assert json.loads((tmp_path / kind / "manifest.json").read_text())["config"][
            "index_type"] == kind


def _copy_index(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst, json.loads((dst / "manifest.json").read_text())


def _write_manifest(folder, manifest):
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_manifest_must_list_exactly_the_index_files(rf_index, tmp_path, embedder):
    # an entry removed and the file edited: loaded and answered before
    idx, m = _copy_index(rf_index, tmp_path / "a")
    del m["files"]["chunks.jsonl"]
    _write_manifest(idx, m)
    with open(idx / "chunks.jsonl", "a") as fh:
        fh.write("\n")
    with pytest.raises(DataError, match="does not list chunks.jsonl"):
        RagIndex.load(idx, embedder=embedder)
    idx, m = _copy_index(rf_index, tmp_path / "b")
    m["files"] = {}
    _write_manifest(idx, m)
    with pytest.raises(DataError, match="does not list"):
        RagIndex.load(idx, embedder=embedder)
    idx, m = _copy_index(rf_index, tmp_path / "c")
    (idx / "extra.npy").write_bytes(b"x")
    with pytest.raises(DataError, match="does not cover: extra.npy"):
        RagIndex.load(idx, embedder=embedder)


@pytest.mark.parametrize("bad", [
    lambda m: m.update(files={**m["files"], "../../../../etc/passwd": {"bytes": 1,
                                                                       "sha256": "x"}}),
    lambda m: m.update(files={**m["files"], "/etc/passwd": {"bytes": 1, "sha256": "x"}}),
    lambda m: m["files"].update({"chunks.jsonl": {"bytes": "12", "sha256": 5}}),
    lambda m: m.pop("files"),
    lambda m: m.update(files=[]),
    lambda m: m.update(config={"chunk_size": "big"}),
], ids=["dotdot", "absolute", "types", "no-files", "files-list", "bad-config"])
def test_malformed_manifests_are_refused_before_opening_anything(rf_index, tmp_path, bad,
                                                                  monkeypatch, embedder, cli):
    import builtins

    idx, m = _copy_index(rf_index, tmp_path / "i")
    bad(m)
    _write_manifest(idx, m)
    opened = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: (opened.append(str(f)),
                                                               real_open(f, *a, **k))[1])
    with pytest.raises((DataError, WorkbenchError)) as e:
        RagIndex.load(idx, embedder=embedder)
    assert "\n" not in str(e.value)
    assert not [f for f in opened if "passwd" in f]  # the outside file was never opened
    r = cli("rag", "query", str(idx), "vswr")
    assert r.returncode == 3 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_truncated_faiss_index_is_one_line(rf_index, tmp_path, embedder, cli):
    idx, m = _copy_index(rf_index, tmp_path / "t")
    data = (idx / "faiss.index").read_bytes()[:100]
    (idx / "faiss.index").write_bytes(data)
    m["files"]["faiss.index"] = {"bytes": len(data), "sha256": __import__(
        "hashlib").sha256(data).hexdigest()}
    _write_manifest(idx, m)
    r = cli("rag", "query", str(idx), "vswr")
    assert r.returncode in (1, 3) and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


# --- tampered indexes: only regular files inside the folder, arrays checked whole ----------

def _rehash(idx, m, *names):
    import hashlib

    for n in names:
        data = (idx / n).read_bytes()
        m["files"][n] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    _write_manifest(idx, m)


def _tamper_array(name, change):
    def tamper(idx, m):
        import numpy as np

        a = np.load(idx / f"bm25_{name}.npy")
        np.save(idx / f"bm25_{name}.npy", change(a))
        _rehash(idx, m, f"bm25_{name}.npy")
    return tamper


def _link_chunks_to_passwd(idx, m):
    (idx / "chunks.jsonl").unlink()
    (idx / "chunks.jsonl").symlink_to("/etc/passwd")
    _rehash(idx, m, "chunks.jsonl")  # size and hash match: only the link gives it away


def _manifest_is(kind):
    def tamper(idx, m):
        (idx / "manifest.json").unlink()
        if kind == "zero":
            (idx / "manifest.json").symlink_to("/dev/zero")
        elif kind == "fifo":
            os.mkfifo(idx / "manifest.json")
        else:  # 100k-deep
            (idx / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    return tamper


def _vocab_as_dict(idx, m):
    terms = json.loads((idx / "bm25_vocab.json").read_text())
    (idx / "bm25_vocab.json").write_text(json.dumps({t: i for i, t in enumerate(terms)}))
    _rehash(idx, m, "bm25_vocab.json")


def _analyzer(idx, m):
    m["analyzer"]["stopwords"] = "/etc/passwd"
    _write_manifest(idx, m)


TAMPER = {
    "manifest-link-to-dev-zero": (_manifest_is("zero"), "is a link"),
    "manifest-fifo": (_manifest_is("fifo"), "not a regular file"),
    "manifest-100k-deep": (_manifest_is("deep"), "nested too deeply"),
    "chunks-link-to-passwd": (_link_chunks_to_passwd, "is a link"),
    "indices-out-of-range": (_tamper_array("indices", lambda a: a + 10_000), "outside"),
    "indices-negative": (_tamper_array("indices", lambda a: a - a.max() - 1), "outside"),
    "data-cut-short": (_tamper_array("data", lambda a: a[:-5]), "inconsistent lengths"),
    "data-nan": (_tamper_array("data", lambda a: a * float("nan")), "not finite"),
    "indptr-2d": (_tamper_array("indptr", lambda a: a.reshape(1, -1)), "2-D"),
    "indptr-huge": (_tamper_array("indptr", lambda a: a * 10**12), "non-decreasing"),
    "vocab-dict": (_vocab_as_dict, "not a list of terms"),
    "analyzer-stopwords-path": (_analyzer, "manifest analyzer"),
}


@pytest.mark.parametrize("case", list(TAMPER))
def test_a_tampered_index_is_one_line_and_opens_nothing_outside(rf_index, tmp_path, case,
                                                                monkeypatch, cli):
    import builtins

    idx, m = _copy_index(rf_index, tmp_path / "i")
    tamper, needle = TAMPER[case]
    tamper(idx, m)
    opened = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: (opened.append(str(f)),
                                                               real_open(f, *a, **k))[1])
    r = cli("rag", "query", str(idx), "vswr")
    assert r.returncode == 3 and "Traceback" not in r.stderr, r
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr
    assert not [f for f in opened if "passwd" in f or f.startswith("/dev/")]
