"""Sentence embeddings (default: the bundled all-MiniLM-L6-v2), normalised for inner product."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.models.resolve import resolve_embedder


@dataclass
class Embedder:
    identity: str
    model: Any  # sentence_transformers.SentenceTransformer
    batch_size: int = 64

    @property
    def dim(self) -> int:
        fn = getattr(self.model, "get_embedding_dimension", None) or \
            self.model.get_sentence_embedding_dimension
        return int(fn())

    def embed(self, texts: Sequence[str], *, show_progress: bool | None = None):
        """float32 array (n, dim), L2-normalised."""
        import numpy as np

        from workbench.progress import bars_enabled

        if show_progress is None:
            show_progress = bars_enabled() and len(texts) > self.batch_size
        vecs = self.model.encode(list(texts), batch_size=self.batch_size,
                                 normalize_embeddings=True, convert_to_numpy=True,
                                 show_progress_bar=show_progress)
        return np.ascontiguousarray(vecs, dtype=np.float32)


def load_embedder(spec: str = "minilm", *, device: str = "auto", batch_size: int = 64) -> Embedder:
    from sentence_transformers import SentenceTransformer

    from workbench.models.local import pick_device

    identity, folder = resolve_embedder(spec)
    model = SentenceTransformer(str(folder), device=pick_device(device), local_files_only=True)
    return Embedder(identity=identity, model=model, batch_size=batch_size)
