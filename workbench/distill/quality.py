"""Quality controls beyond RF-Agent: dedup, letter balance, difficulty, leakage guard."""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

from workbench.records import Section

LETTERS = "ABCD"


# --- near-duplicate questions -----------------------------------------------------------------

def shingles(text: str, n: int = 3) -> set[str]:
    words = re.findall(r"\w+", text.lower())
    if len(words) < n:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def minhash_signatures(sets: Sequence[set[str]], num_perm: int = 64, seed: int = 0
                       ) -> np.ndarray:
    """(n, num_perm) MinHash signatures: universal hashing (a*h + b) mod (2^31 - 1)."""
    prime = np.uint64((1 << 31) - 1)
    rng = np.random.default_rng(seed)
    a = rng.integers(1, int(prime), size=num_perm).astype(np.uint64)
    b = rng.integers(0, int(prime), size=num_perm).astype(np.uint64)
    sig = np.full((len(sets), num_perm), int(prime), dtype=np.uint64)
    for i, s in enumerate(sets):
        if not s:
            continue
        h = np.array([int.from_bytes(hashlib.blake2b(x.encode(), digest_size=8).digest(),
                                     "little") for x in sorted(s)], dtype=np.uint64) % prime
        sig[i] = ((a[:, None] * h[None, :] + b[:, None]) % prime).min(axis=1)
    return sig


def near_duplicates(texts: Sequence[str], *, threshold: float = 0.7, method: str = "minhash",
                    embedder=None, bands: int = 16, seed: int = 0) -> list[int]:
    """Indices to drop: each text that nearly repeats an earlier one (earlier ones are kept).

    minhash: candidates from LSH banding of MinHash signatures over word 3-grams, confirmed
    by exact Jaccard >= threshold. embedding: cosine of normalised embeddings >= threshold.
    """
    n = len(texts)
    if n < 2:
        return []
    drop: set[int] = set()
    if method == "embedding":
        if embedder is None:
            raise ValueError("embedding dedup needs an embedder")
        v = embedder.embed(list(texts), show_progress=False)
        sims = v @ v.T
        for j in range(n):
            if j in drop:
                continue
            for near in np.flatnonzero(sims[j, j + 1:] >= threshold) + j + 1:
                drop.add(int(near))
        return sorted(drop)
    if method != "minhash":
        raise ValueError(f"dedup method must be 'minhash' or 'embedding', got {method!r}")
    sets = [shingles(t) for t in texts]
    sig = minhash_signatures(sets, seed=seed)
    rows = sig.shape[1] // bands
    buckets: dict[tuple, list[int]] = {}
    for i in range(n):
        for bnd in range(bands):
            key = (bnd, sig[i, bnd * rows:(bnd + 1) * rows].tobytes())
            buckets.setdefault(key, []).append(i)
    pairs = {(a, b) for members in buckets.values() if len(members) > 1
             for x, a in enumerate(members) for b in members[x + 1:]}
    for a, b in sorted(pairs):
        if a not in drop and b not in drop and jaccard(sets[a], sets[b]) >= threshold:
            drop.add(b)
    return sorted(drop)


# --- letter balance ---------------------------------------------------------------------------

def balance_letters(items: Sequence[tuple[list[str], str]], seed: int = 0
                    ) -> list[tuple[list[str], str]]:
    """Re-order each item's options so the gold letters are near-uniform over the set.

    Targets are a seeded shuffle of A, B, C, D repeated; each item's correct option moves to
    its target letter and the distractors keep a seeded random order. Single-answer items only.
    """
    targets = [LETTERS[i % 4] for i in range(len(items))]
    random.Random(seed).shuffle(targets)
    out = []
    for k, ((options, gold), target) in enumerate(zip(items, targets, strict=True)):
        if len(gold) != 1:
            out.append((options, gold))
            continue
        correct = options[LETTERS.index(gold)]
        others = [o for i, o in enumerate(options) if LETTERS[i] != gold]
        random.Random(f"{seed}:{k}").shuffle(others)
        t = LETTERS.index(target)
        new = others[:t] + [correct] + others[t:]
        out.append((new, target))
    return out


def letter_distribution(golds: Sequence[str]) -> dict[str, int]:
    c = Counter(golds)
    return {x: c.get(x, 0) for x in LETTERS}


# --- difficulty -------------------------------------------------------------------------------

_FORMULA = re.compile(r"[=^√∑∫πωλΓΔ]|sqrt|log|\d+\s*(?:dB|Hz|MHz|GHz|ohm|Ω|W|V|A|K|%)|\b\d+\.\d+",
                      re.I)
_STEPS = re.compile(r"\b(first|second|then|next|therefore|thus|hence|finally|step \d|so that|"
                    r"substitut|compute|calculate)\w*", re.I)


def difficulty(question: str, solution: str, thinking: str = "",
               advanced_terms: Sequence[str] = ()) -> int:
    """1 (easy) to 5 (hard), a documented heuristic:

    +1 for length (question + solution over 60 words; +1 more over 150),
    +1 if formulas or quantities with units appear (two or more matches),
    +1 for multi-step reasoning (three or more step markers in thinking + solution),
    +1 for two or more advanced domain terms. Starts at 1, capped at 5.
    """
    body = f"{question} {solution}"
    words = len(body.split())
    score = 1 + (words > 60) + (words > 150)
    score += len(_FORMULA.findall(f"{body} {thinking}")) >= 2
    score += len(_STEPS.findall(f"{thinking} {solution}")) >= 3
    low = body.lower()
    score += sum(t.lower() in low for t in advanced_terms) >= 2
    return int(min(score, 5))


# --- leakage guard ----------------------------------------------------------------------------

def split_sections(sections: Sequence[Section], *, benchmark_fraction: float, seed: int
                   ) -> tuple[list[Section], list[Section], int]:
    """(train, benchmark, removed): disjoint by section id AND content hash.

    Sections are assigned by a seeded shuffle of their ids; a training section whose text hash
    equals a benchmark section's (a repeated passage) is removed from training.
    """
    ids = sorted({s.id for s in sections})
    random.Random(seed).shuffle(ids)
    n_bench = round(len(ids) * benchmark_fraction)
    if benchmark_fraction > 0 and n_bench == 0 and len(ids) > 1:
        n_bench = 1
    bench_ids = set(ids[:n_bench])
    bench = [s for s in sections if s.id in bench_ids]
    bench_hashes = {s.content_hash for s in bench}
    train = [s for s in sections if s.id not in bench_ids and s.content_hash not in bench_hashes]
    removed = len(sections) - len(bench) - len(train)
    return train, bench, removed
