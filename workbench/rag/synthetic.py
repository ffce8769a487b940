"""Seeded synthetic corpora for tests and benchmarks (no downloads), in the spirit of
faiss's `contrib.datasets.SyntheticDataset`.

Words follow a Zipf law (s ~ 1.07, as in English text; Zipf 1935, Piantadosi 2014) over a
vocabulary of made-up words, passage lengths are around 60 tokens, and queries mix a
passage's rarer words with common ones. Vectors mimic sentence embeddings: clustered, with a
shared mean direction (real embedding spaces are anisotropic), L2-normalised.
"""

from __future__ import annotations

import numpy as np

_SYL = ["ka", "lo", "mi", "ne", "ru", "ta", "shi", "po", "va", "de", "gu", "zo", "fe", "an",
        "or", "el", "im", "us", "ber", "tor", "qui", "sen", "dal", "mor"]


def make_vocabulary(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < n:
        w = "".join(rng.choice(_SYL, size=rng.integers(1, 5)))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def make_passages(n: int, *, vocab_size: int = 30000, mean_len: int = 60, zipf_s: float = 1.07,
                  seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    vocab = np.array(make_vocabulary(vocab_size, seed))
    ranks = np.arange(1, vocab_size + 1)
    p = ranks ** -zipf_s
    p /= p.sum()
    lengths = np.clip(rng.normal(mean_len, mean_len / 4, size=n).astype(int), 8, None)
    flat = rng.choice(vocab_size, size=int(lengths.sum()), p=p)
    out, pos = [], 0
    for n_tok in lengths:
        out.append(" ".join(vocab[flat[pos:pos + n_tok]]))
        pos += n_tok
    return out


def make_queries(passages: list[str], n: int, *, seed: int = 1) -> list[str]:
    rng = np.random.default_rng(seed)
    qs = []
    for _ in range(n):
        words = passages[rng.integers(len(passages))].split()
        k = int(rng.integers(2, 7))
        picked = list(rng.choice(words, size=min(k, len(words)), replace=False))
        if rng.random() < 0.3:  # a word from elsewhere
            picked.append(passages[rng.integers(len(passages))].split()[0])
        qs.append(" ".join(picked))
    return qs


def make_vectors(n: int, dim: int = 384, *, n_clusters: int = 256, spread: float = 0.6,
                 seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mean_dir = rng.normal(size=dim)
    mean_dir /= np.linalg.norm(mean_dir)
    centroids = rng.normal(size=(n_clusters, dim)) + 2.0 * mean_dir
    assign = rng.integers(n_clusters, size=n)
    x = centroids[assign] + spread * rng.normal(size=(n, dim)) * np.sqrt(dim) / np.sqrt(dim)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32)


def perturb(vectors: np.ndarray, noise: float = 0.3, seed: int = 2) -> np.ndarray:
    """Queries near given vectors (a query resembles, but is not, its passage)."""
    rng = np.random.default_rng(seed)
    q = vectors + noise * rng.normal(size=vectors.shape) / np.sqrt(vectors.shape[1]) * 8
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return q.astype(np.float32)
