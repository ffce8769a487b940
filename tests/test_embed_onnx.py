"""ONNX Runtime embeddings: the same neighbours as PyTorch, an export made once and reused,
a killed or mismatched export never used."""

import json
import os

import numpy as np
import pytest

from workbench.errors import WorkbenchError
from workbench.models.embed import Embedder, OnnxEmbedder, load_embedder, onnx_cache_dir
from workbench.models.resolve import resolve_embedder


@pytest.fixture(scope="module")
def both():
    return load_embedder("minilm", backend="onnx"), load_embedder("minilm", backend="torch")


def test_same_top10_neighbours_as_pytorch_over_the_rf_corpus(both, rf_sections):
    onnx_emb, torch_emb = both
    assert isinstance(onnx_emb, OnnxEmbedder) and isinstance(torch_emb, Embedder)
    assert onnx_emb.identity == torch_emb.identity and onnx_emb.dim == torch_emb.dim
    texts = [s.text for s in rf_sections]
    a, b = onnx_emb.embed(texts), torch_emb.embed(texts)
    queries = [s.title or s.text[:80] for s in rf_sections]
    qa, qb = onnx_emb.embed(queries), torch_emb.embed(queries)
    top_a = np.argsort(-(qa @ a.T), axis=1, kind="stable")[:, :10]
    top_b = np.argsort(-(qb @ b.T), axis=1, kind="stable")[:, :10]
    same = np.mean([list(x) == list(y) for x, y in zip(top_a, top_b, strict=True)])
    diff = float(np.abs(a - b).max())
    print(f"{len(queries)} queries over {len(texts)} sections: same ordered top-10 "
          f"{same:.1%}; max |Δ| per component {diff:.1e}")
    assert same >= 0.99 and diff < 1e-4
    assert onnx_emb.embed([]).shape == (0, onnx_emb.dim)


def test_export_is_made_once_and_a_killed_or_mismatched_one_is_not_used(tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv("WB_HOME", str(tmp_path))
    identity, folder = resolve_embedder("minilm")
    first = load_embedder("minilm")  # auto on CPU: ONNX
    assert isinstance(first, OnnxEmbedder)
    target = onnx_cache_dir(identity, folder)
    stamp = (target / "model.onnx").stat().st_mtime_ns
    load_embedder("minilm")
    assert (target / "model.onnx").stat().st_mtime_ns == stamp  # reused, not re-exported

    (target / "export.json").unlink()  # as a kill before the export's record was written
    assert isinstance(load_embedder("minilm"), OnnxEmbedder)
    assert (target / "model.onnx").stat().st_mtime_ns != stamp  # redone

    meta = json.loads((target / "export.json").read_text())
    (target / "export.json").write_text(json.dumps({**meta, "parity_ok": False,
                                                    "max_abs_diff": 0.5}))
    assert isinstance(load_embedder("minilm"), Embedder)  # auto falls back to PyTorch
    with pytest.raises(WorkbenchError, match="differed from PyTorch"):
        load_embedder("minilm", backend="onnx")


def test_backend_is_forced_by_argument_or_environment(monkeypatch):
    monkeypatch.setenv("WB_EMBED_BACKEND", "torch")
    assert isinstance(load_embedder("minilm"), Embedder)
    monkeypatch.setenv("WB_EMBED_BACKEND", "bogus")
    with pytest.raises(WorkbenchError, match="auto, onnx or torch"):
        load_embedder("minilm")
    assert os.environ["WB_EMBED_BACKEND"] == "bogus"
