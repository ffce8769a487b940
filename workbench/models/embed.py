"""Sentence embeddings (default: the bundled all-MiniLM-L6-v2), normalised for inner product.

Two runtimes give the same vectors: sentence-transformers on PyTorch, and ONNX Runtime over
a graph exported once from the same weights (cached under `$WB_HOME/onnx/`, used only after
its vectors matched PyTorch's on probe texts). On CPU the ONNX runtime is the default when
`onnxruntime` is installed (about 1.6x the passages per second on 2 cores, see
BENCHMARKS.md); `backend="torch"` or `WB_EMBED_BACKEND=torch` forces PyTorch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench import progress  # count through its module: tests replace progress.count
from workbench.errors import WorkbenchError
from workbench.io import atomic_write_json, recover_dir, replace_dir, sha256_file
from workbench.models.local import pick_device
from workbench.models.resolve import resolve_embedder, workbench_home

log = logging.getLogger(__name__)

EXPORT_VERSION = 1  # bump when the exported graph changes
PROGRESS_BATCHES = 4  # PyTorch embedder: batches encoded between two counts (a bar's step)
PARITY_ATOL = 1e-4  # the most an ONNX vector may differ from PyTorch's, per component
_PROBES = ["VSWR of a 75 ohm load on a 50 ohm line", "a", "Smith chart " * 60,
           "The quick brown fox jumps over the lazy dog.", "Ünïcödé τεστ 测试",
           "low-noise amplifier gain compression P1dB", "", "knowledge graph fact check"]


@dataclass
class Embedder:
    identity: str
    model: Any  # sentence_transformers.SentenceTransformer
    batch_size: int = 64
    backend: str = "torch"

    @property
    def dim(self) -> int:
        fn = getattr(self.model, "get_embedding_dimension", None) or \
            self.model.get_sentence_embedding_dimension
        return int(fn())

    def embed(self, texts: Sequence[str], *, show_progress: bool | None = None):
        """float32 array (n, dim), L2-normalised. More texts than a batch show a bar on a
        terminal, or count in the progress lines of a log (texts done of all, with rate and
        time left), encoded PROGRESS_BATCHES batches at a time."""
        import numpy as np

        texts = list(texts)
        if show_progress is None:
            show_progress = len(texts) > self.batch_size
        if not show_progress:
            vecs = self.model.encode(texts, batch_size=self.batch_size,
                                     normalize_embeddings=True, convert_to_numpy=True,
                                     show_progress_bar=False)
            return np.ascontiguousarray(vecs, dtype=np.float32)
        step = self.batch_size * PROGRESS_BATCHES
        parts = []
        with progress.count("embedding", len(texts), "text") as done:
            for i in range(0, len(texts), step):
                part = texts[i:i + step]
                parts.append(self.model.encode(part, batch_size=self.batch_size,
                                               normalize_embeddings=True,
                                               convert_to_numpy=True,
                                               show_progress_bar=False))
                done.add(len(part))
        vecs = np.concatenate(parts) if parts else np.empty((0, self.dim))
        return np.ascontiguousarray(vecs, dtype=np.float32)


@dataclass
class OnnxEmbedder:
    """The same embedder run by ONNX Runtime: BERT-style encoder, masked mean pooling, L2
    normalisation (what the bundled model's sentence-transformers modules do)."""

    identity: str
    session: Any  # onnxruntime.InferenceSession
    tokenizer: Any
    dimension: int
    max_seq_length: int
    batch_size: int = 64
    backend: str = "onnx"
    inputs: list[str] = field(default_factory=list)

    @property
    def dim(self) -> int:
        return self.dimension

    def embed(self, texts: Sequence[str], *, show_progress: bool | None = None):
        """float32 array (n, dim), L2-normalised; batches of similar length."""
        import numpy as np

        texts = list(texts)
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        if not texts:
            return out
        if show_progress is None:  # a bar on a terminal, else counted in a log's lines
            show_progress = len(texts) > self.batch_size
        with progress.count("embedding", len(texts), "text") if show_progress else \
                contextlib.nullcontext() as done:
            self._embed_into(out, texts, done)
        return out

    def _embed_into(self, out, texts: list[str], done) -> None:
        """Embed `texts` into the rows of `out`, counting each batch in `done` (a
        `progress.Counter`, or None)."""
        import numpy as np

        order = np.argsort([len(t) for t in texts], kind="stable")
        starts = range(0, len(texts), self.batch_size)
        # after a call of several batches, the last one hands ONNX Runtime's arena back: kept,
        # it holds the largest batch's activations for the session's life (an index build
        # left 2.3 GB behind; a one-batch call, e.g. a query, keeps its small arena)
        last = starts[-1] if len(starts) > 1 else -1
        for i in starts:
            idx = order[i:i + self.batch_size]
            enc = self.tokenizer([texts[j] for j in idx], padding=True, truncation=True,
                                 max_length=self.max_seq_length, return_tensors="np")
            feed = {k: enc[k].astype(np.int64) for k in self.inputs if k in enc}
            if "token_type_ids" in self.inputs and "token_type_ids" not in feed:
                feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
            hidden = self.session.run(None, feed, _release_arena() if i == last else None)[0]
            mask = enc["attention_mask"][..., None].astype(np.float32)
            vec = (hidden * mask).sum(1) / np.clip(mask.sum(1), 1e-9, None)
            vec /= np.clip(np.linalg.norm(vec, axis=1, keepdims=True), 1e-12, None)
            out[idx] = vec
            if done is not None:
                done.add(len(idx))


def _release_arena():
    """Run options that shrink the CPU arena to what is in use when the run ends."""
    import onnxruntime as ort

    opts = ort.RunOptions()
    opts.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return opts


def load_embedder(spec: str = "minilm", *, device: str = "auto", batch_size: int = 64,
                  backend: str | None = None) -> Embedder | OnnxEmbedder:
    """An embedder for `spec`. `backend`: "auto" (ONNX on CPU when it is installed and its
    export matched PyTorch; else PyTorch), "onnx" or "torch"; default from
    `WB_EMBED_BACKEND`, else "auto"."""
    backend = backend or os.environ.get("WB_EMBED_BACKEND") or "auto"
    if backend not in ("auto", "onnx", "torch"):
        raise WorkbenchError(f"embedder backend {backend!r}: use auto, onnx or torch")
    identity, folder = resolve_embedder(spec)
    dev = pick_device(device)
    if backend == "onnx" or (backend == "auto" and dev == "cpu"):
        try:
            return load_onnx_embedder(identity, Path(folder), batch_size=batch_size)
        except _OnnxUnavailable as e:
            if backend == "onnx":
                raise WorkbenchError(f"embedder {spec!r} on ONNX Runtime: {e}") from None
            log.info("embedder %s on PyTorch: %s", spec, e)
    return _torch_embedder(identity, Path(folder), dev, batch_size)


def _torch_embedder(identity: str, folder: Path, device: str, batch_size: int) -> Embedder:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device=device, local_files_only=True)
    return Embedder(identity=identity, model=model, batch_size=batch_size)


class _OnnxUnavailable(Exception):
    pass


def _st_layout(folder: Path) -> tuple[int, int]:
    """(max_seq_length, dimension) of a sentence-transformers folder whose modules are
    Transformer → mean Pooling → Normalize; anything else stays on PyTorch."""
    try:
        modules = json.loads((folder / "modules.json").read_text())
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        pooling = next(m["path"] for m in modules if m["type"].endswith("Pooling"))
        pool = json.loads((folder / pooling / "config.json").read_text())
        seq = json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"]
    except (OSError, ValueError, KeyError, StopIteration) as e:
        raise _OnnxUnavailable(f"not a plain sentence-transformers folder ({e})") from None
    mean = pool.get("pooling_mode_mean_tokens", pool.get("pooling_mode") == "mean")
    if kinds != ["Transformer", "Pooling", "Normalize"] or not mean:
        raise _OnnxUnavailable(f"modules {kinds} with pooling {pool}: only mean pooling "
                               "+ Normalize is exported")
    dim = pool.get("word_embedding_dimension") or pool.get("embedding_dimension")
    return int(seq), int(dim)


def _source_key(folder: Path) -> str:
    weights = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin"))
    if not weights:
        raise _OnnxUnavailable(f"{folder}: no weights file")
    import hashlib

    h = hashlib.sha256(f"v{EXPORT_VERSION}".encode())
    for p in weights:
        h.update(p.name.encode() + sha256_file(p).encode())
    return h.hexdigest()[:16]


def onnx_cache_dir(identity: str, folder: Path) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in identity)[:60]
    return workbench_home() / "onnx" / f"{safe}-{_source_key(folder)}"


def load_onnx_embedder(identity: str, folder: Path, *, batch_size: int = 64) -> OnnxEmbedder:
    try:
        import onnxruntime as ort
    except ImportError:
        raise _OnnxUnavailable("onnxruntime is not installed") from None
    from transformers import AutoTokenizer

    seq_len, dim = _st_layout(folder)
    target = onnx_cache_dir(identity, folder)
    meta = _read_meta(target)
    if meta is None:
        meta = export_onnx(folder, target, seq_len)
    if not meta.get("parity_ok"):
        raise _OnnxUnavailable(f"the export at {target} differed from PyTorch by "
                               f"{meta.get('max_abs_diff')} (> {PARITY_ATOL:g})")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    session = _session(ort, target / "model.onnx")
    return OnnxEmbedder(identity=identity, session=session, tokenizer=tokenizer,
                        dimension=dim, max_seq_length=seq_len, batch_size=batch_size,
                        inputs=[i.name for i in session.get_inputs()])


def _session(ort, path: Path):
    import torch

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, torch.get_num_threads())
    opts.inter_op_num_threads = 1
    # memory planned per input shape only adds a block per shape, and ours vary (512
    # passages: peak 1.6 GB instead of 2.2 GB, 1% slower; BENCHMARKS.md)
    opts.enable_mem_pattern = False
    # intra-op threads that sleep when they wait, as the workbench's OpenMP teams do
    # (`workbench.openmp`): a spinning one burns the core another process needs
    spin = os.environ.get("OMP_WAIT_POLICY", "").lower() == "active"
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _read_meta(target: Path) -> dict[str, Any] | None:
    """The export's record, or None when there is no finished export (a folder without its
    record, written last, is a killed export and is redone)."""
    recover_dir(target)
    try:
        meta = json.loads((target / "export.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if (target / "model.onnx").is_file() and isinstance(meta, dict) else None


def export_onnx(folder: Path, target: Path, max_seq_length: int) -> dict[str, Any]:
    """Export the encoder of `folder` to `target/model.onnx` (tmp folder, then renamed in),
    and record how far its vectors are from PyTorch's on the probe texts."""
    import shutil
    import tempfile

    import numpy as np

    try:
        import onnx  # noqa: F401 - torch's exporter needs it
        import onnxruntime as ort
    except ImportError as e:
        raise _OnnxUnavailable(f"{e.name} is not installed") from None
    import torch
    from transformers import AutoModel, AutoTokenizer

    log.info("exporting %s to ONNX (once)", folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        tok = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModel.from_pretrained(str(folder)).eval()
        enc = tok(["an example", "a second, longer example"], padding=True,
                  return_tensors="pt")
        names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in enc]

        class Encoder(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, *args):
                return self.m(**dict(zip(names, args, strict=True))).last_hidden_state

        axes = {n: {0: "batch", 1: "tokens"} for n in [*names, "hidden"]}
        with torch.no_grad():
            torch.onnx.export(Encoder(model), tuple(enc[n] for n in names),
                              str(tmp / "model.onnx"), input_names=names,
                              output_names=["hidden"], dynamic_axes=axes, opset_version=17,
                              dynamo=False)
        onnx_emb = OnnxEmbedder(identity="probe", session=_session(ort, tmp / "model.onnx"),
                                tokenizer=tok, dimension=model.config.hidden_size,
                                max_seq_length=max_seq_length, inputs=names)
        ref = _torch_embedder("probe", folder, "cpu", 8).embed(_PROBES, show_progress=False)
        diff = float(np.abs(onnx_emb.embed(_PROBES, show_progress=False) - ref).max())
        meta = {"version": EXPORT_VERSION, "source": str(folder), "max_abs_diff": diff,
                "parity_ok": diff <= PARITY_ATOL, "probes": len(_PROBES)}
        atomic_write_json(tmp / "export.json", meta)  # last: marks the export finished
        replace_dir(tmp, target, ours=True)  # the model cache
    except _OnnxUnavailable:
        raise
    except Exception as e:  # noqa: BLE001 - any exporter failure means: stay on PyTorch
        raise _OnnxUnavailable(f"export failed ({type(e).__name__}: {e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not meta["parity_ok"]:
        log.warning("ONNX export of %s differs from PyTorch by %.2g; staying on PyTorch",
                    folder, diff)
    return meta
