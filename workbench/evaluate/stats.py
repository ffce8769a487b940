"""Uncertainty for accuracies and paired comparisons: plain functions over plain values.

Accuracies are proportions of items, so a single one gets a Wilson score interval; two
conditions scored on the same items are compared as paired data (exact McNemar test on the
items where exactly one of them is right, and a paired bootstrap interval for the difference).
Several comparisons at once are corrected with Holm's step-down method.

Items that are not independent (several items asked for one sentence of a text share their
correct option) carry a cluster key: their accuracy gets the Wilson interval at Kish's
effective sample size, and comparisons use an exact sign-flip test over clusters (the exact
McNemar test when every cluster is one item) and a bootstrap over clusters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np

from workbench.text import percent

CONFIDENCE = 0.95
SIGNIFICANCE = 0.05  # the conventional 5% level; `significant` in reports means Holm p < this
# Efron and Tibshirani (1993), An Introduction to the Bootstrap: about 1000 resamples are
# enough for percentile intervals; 2000 halves the Monte-Carlo noise at the 2.5% tails.
BOOTSTRAP_RESAMPLES = 2000
# The most frequent predicted letter's share above which a multiple-choice scoring counts as
# degenerate, and the margin it must exceed that letter's share of the gold answers by: a
# scorer stuck on one letter measures a letter prior, not the items (the bundled 135M model
# under letter scoring answers "A" to all 1,539 items of a four-option exam set).
DEGENERATE_SHARE = 0.8
DEGENERATE_MARGIN = 0.2
# Below this many items the rule stays silent: a letter-unbiased guesser over four options
# puts >= 80% on one letter with probability 4 * P(Bin(10, 1/4) >= 8) = 0.2% at n = 10, but
# 6% at n = 5.
DEGENERATE_MIN_ITEMS = 10


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson_interval(successes: int, n: int, *, confidence: float = CONFIDENCE
                    ) -> tuple[float, float]:
    """Wilson score interval for a proportion (Wilson 1927; Brown, Cai and DasGupta 2001
    recommend it over the normal interval for small n or proportions near 0 or 1)."""
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in 0..{n}, got {successes}")
    lo, hi = _wilson(successes / n, n, _z(confidence))
    return (0.0 if successes == 0 else lo, 1.0 if successes == n else hi)


def _wilson(p: float, n: float, z: float) -> tuple[float, float]:
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def is_clustered(clusters: Sequence[str] | None) -> bool:
    """Whether any two items share a cluster (a source sentence: the same correct option)."""
    return clusters is not None and len(set(clusters)) < len(clusters)


def effective_n(correct: Sequence[bool], clusters: Sequence[str]) -> float:
    """Kish's effective sample size of a clustered proportion: n divided by the design effect,
    the cluster-robust variance of the mean (Miller 2024, "Adding Error Bars to Evals", arXiv
    2411.00640, section 2.2) over the independent-items one; the Wilson interval at this n is
    the design-effect adjustment of Korn and Graubard (1998). A design effect below 1 is taken
    as 1 (clustering never narrows an interval here); all right or all wrong leaves no
    variance to estimate it from, and the number of clusters is used."""
    x = np.asarray(correct, dtype=float)
    n = x.size
    p = x.mean() if n else 0.0
    if n == 0:
        return 0.0
    if p in (0.0, 1.0):  # no variance to estimate a design effect from: count clusters
        return float(len(set(clusters)))
    resid: dict[str, float] = {}
    for v, c in zip(x - p, clusters, strict=True):
        resid[c] = resid.get(c, 0.0) + v
    var_cluster = sum(r * r for r in resid.values()) / n ** 2
    deff = max(1.0, var_cluster / (p * (1 - p) / n))
    return n / deff


def clustered_wilson_interval(correct: Sequence[bool], clusters: Sequence[str], *,
                              confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson interval at the effective sample size (items sharing a cluster count as fewer
    than their number); equal to `wilson_interval` when no two items share a cluster."""
    n = len(correct)
    if n == 0:
        return (0.0, 1.0)
    k = sum(bool(c) for c in correct)
    if not is_clustered(clusters):
        return wilson_interval(k, n, confidence=confidence)
    lo, hi = _wilson(k / n, effective_n(correct, clusters), _z(confidence))
    return (0.0 if k == 0 else float(lo), 1.0 if k == n else float(hi))


def bootstrap_interval(values: Sequence[float], *,
                       statistic: Callable[[np.ndarray], np.ndarray] | None = None,
                       n_resamples: int = BOOTSTRAP_RESAMPLES, confidence: float = CONFIDENCE,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic` (default the mean) over `values`.

    `statistic` receives a (resamples, n) array and returns one value per row. The same seed
    gives the same interval."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("bootstrap_interval needs at least one value")
    stat = statistic or (lambda a: a.mean(axis=1))
    rng = np.random.default_rng(seed)
    out = np.empty(n_resamples)
    step = max(1, 2_000_000 // x.size)  # bound the index matrix to ~16 MB
    for lo in range(0, n_resamples, step):
        hi = min(lo + step, n_resamples)
        out[lo:hi] = stat(x[rng.integers(0, x.size, size=(hi - lo, x.size))])
    alpha = (1 - confidence) / 2
    low, high = np.quantile(out, [alpha, 1 - alpha])
    return (float(low), float(high))


def discordant_pairs(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> tuple[int, int]:
    """(items only a gets right, items only b gets right)."""
    only_a = sum(bool(a) and not bool(b) for a, b in zip(correct_a, correct_b, strict=True))
    only_b = sum(bool(b) and not bool(a) for a, b in zip(correct_a, correct_b, strict=True))
    return only_a, only_b


def mcnemar_exact(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> float:
    """Two-sided exact McNemar p-value: under "no difference" each discordant item is equally
    likely to favour a or b, so the smaller count is Binomial(discordant, 1/2) (McNemar 1947;
    the exact form is the one to use when discordant pairs are few)."""
    only_a, only_b = discordant_pairs(correct_a, correct_b)
    n = only_a + only_b
    if n == 0:
        return 1.0
    k = min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def mcnemar_items_for_power(only_a: int, only_b: int, n: int, *, clusters: int | None = None,
                            alpha: float = SIGNIFICANCE, power: float = 0.8) -> int | None:
    """Items a paired comparison would need for McNemar's test to find, with probability
    `power` at two-sided level `alpha`, the difference observed on `n` items (only_a / only_b
    items only one side gets right), by Connor's (1987) formula: n = (z_a sqrt(psi) + z_b
    sqrt(psi - d^2))^2 / d^2 with psi the discordant share and d the difference. With clusters,
    times Kish's design effect n / clusters. None when the observed difference is zero."""
    if n <= 0 or only_a == only_b:
        return None
    psi, delta = (only_a + only_b) / n, abs(only_b - only_a) / n
    z_a, z_b = NormalDist().inv_cdf(1 - alpha / 2), NormalDist().inv_cdf(power)
    items = (z_a * math.sqrt(psi) + z_b * math.sqrt(max(psi - delta ** 2, 0.0))) ** 2 / delta ** 2
    return math.ceil(items * (n / clusters if clusters else 1.0))


def paired_bootstrap_difference(correct_a: Sequence[bool], correct_b: Sequence[bool], *,
                                n_resamples: int = BOOTSTRAP_RESAMPLES,
                                confidence: float = CONFIDENCE, seed: int = 0
                                ) -> tuple[float, tuple[float, float]]:
    """Accuracy of b minus accuracy of a on the same items, with a percentile bootstrap
    interval that resamples items (keeping each item's pair together)."""
    diff = [float(bool(b)) - float(bool(a)) for a, b in zip(correct_a, correct_b, strict=True)]
    if not diff:
        raise ValueError("paired_bootstrap_difference needs at least one item")
    return (sum(diff) / len(diff), bootstrap_interval(diff, n_resamples=n_resamples,
                                                      confidence=confidence, seed=seed))


def clustered_sign_flip_p(correct_a: Sequence[bool], correct_b: Sequence[bool],
                          clusters: Sequence[str]) -> float:
    """Two-sided p-value of an exact randomisation test for paired items in clusters: under
    "no difference" the sign of each cluster's d_k = (items only a gets right) - (items only b
    gets right) is as likely + as -, and p = P(|sum of +-d_k| >= |sum of d_k|), computed
    exactly by convolving the clusters one at a time (Durkalski et al. 2003 give the
    chi-square form of the same idea; the exact form stays valid when discordant items are
    few). With one item per cluster it is the exact McNemar test."""
    d: dict[str, int] = {}
    for a, b, c in zip(correct_a, correct_b, clusters, strict=True):
        d[c] = d.get(c, 0) + int(bool(a) and not bool(b)) - int(bool(b) and not bool(a))
    return sign_flip_p(list(d.values()))


def sign_flip_p(differences: Sequence[int]) -> float:
    """Two-sided p-value of the exact sign-flip (paired permutation) test of integer paired
    differences (e.g. search calls per claim, after minus before): under "no difference"
    each difference is as likely + as -, and p = P(|sum of +-d_i| >= |sum of d_i|), computed
    exactly by convolving the differences one at a time."""
    steps = [abs(int(v)) for v in differences if v]
    if not steps:
        return 1.0
    total = sum(steps)
    dist = np.zeros(2 * total + 1)  # P(sum = s) at index s + total
    dist[total] = 1.0
    for v in steps:
        dist = 0.5 * (np.roll(dist, v) + np.roll(dist, -v))  # no wrap: |sum| <= total
    observed = abs(sum(int(v) for v in differences))
    sums = np.abs(np.arange(-total, total + 1))
    return float(min(1.0, dist[sums >= observed].sum()))


def cluster_bootstrap_difference(correct_a: Sequence[bool], correct_b: Sequence[bool],
                                 clusters: Sequence[str], *,
                                 n_resamples: int = BOOTSTRAP_RESAMPLES,
                                 confidence: float = CONFIDENCE, seed: int = 0
                                 ) -> tuple[float, tuple[float, float]]:
    """As `paired_bootstrap_difference`, resampling whole clusters (with every item pair in
    them) instead of items: the interval for items that are not independent."""
    sums: dict[str, float] = {}
    sizes: dict[str, int] = {}
    for a, b, c in zip(correct_a, correct_b, clusters, strict=True):
        sums[c] = sums.get(c, 0.0) + float(bool(b)) - float(bool(a))
        sizes[c] = sizes.get(c, 0) + 1
    if not sums:
        raise ValueError("cluster_bootstrap_difference needs at least one item")
    keys = list(sums)
    s, m = np.array([sums[k] for k in keys]), np.array([sizes[k] for k in keys], dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(keys), size=(n_resamples, len(keys)))
    stats = s[idx].sum(axis=1) / m[idx].sum(axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(stats, [alpha, 1 - alpha])
    return float(s.sum() / m.sum()), (float(low), float(high))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm (1979) step-down adjusted p-values, in the input order; an adjusted p below the
    level controls the family-wise error rate at that level."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def prediction_counts(predictions: Sequence[str | None], letters: str) -> dict[str, int]:
    """How often each letter was predicted (every letter listed, zeros included); answers that
    are not one of `letters` (unparsed, several letters) are left out."""
    counts = dict.fromkeys(letters, 0)
    for p in predictions:
        if p in counts:
            counts[p] += 1
    return counts


def degenerate_reason(predictions: Sequence[str | None], golds: Sequence[str]) -> str | None:
    """Why a scoring looks degenerate, or None: the most frequent predicted letter has at
    least DEGENERATE_SHARE of all predictions and DEGENERATE_MARGIN more than its share of
    the gold answers (so a benchmark whose answers really are mostly one letter is not
    flagged). Silent below DEGENERATE_MIN_ITEMS items."""
    n = len(predictions)
    if n < DEGENERATE_MIN_ITEMS:
        return None
    counts: dict[str, int] = {}
    for p in predictions:
        if p is not None:
            counts[p] = counts.get(p, 0) + 1
    if not counts:
        return None
    top = max(sorted(counts), key=lambda k: counts[k])
    share = counts[top] / n
    gold_share = sum(g == top for g in golds) / max(len(golds), 1)
    if share >= DEGENERATE_SHARE - 1e-9 and share - gold_share > DEGENERATE_MARGIN + 1e-9:
        return f"{top} is {percent(share)} of predictions (gold {percent(gold_share)})"
    return None


@dataclass(frozen=True)
class Agreement:
    """Cohen's kappa between two raters of the same yes/no decisions (a judge and a person),
    with a percentile bootstrap interval over the items and the confusion table behind it.
    `kappa` is None when chance agreement is 1 (both raters gave one and the same answer to
    every item): agreement beyond chance is then undefined, not perfect."""

    n: int
    kappa: float | None
    ci_low: float | None
    ci_high: float | None
    observed: float
    expected: float
    confusion: dict[str, int]

    def to_json(self) -> dict:
        return asdict(self)


def _kappa_rows(codes: np.ndarray) -> np.ndarray:
    """Kappa of each row of pair codes (2 * first rater + second rater); NaN where chance
    agreement is 1."""
    n = codes.shape[1]
    c = np.stack([(codes == k).sum(axis=1) for k in range(4)], axis=1).astype(float)
    nn, ny, yn, yy = c[:, 0], c[:, 1], c[:, 2], c[:, 3]
    po = (yy + nn) / n
    pe = ((yy + yn) * (yy + ny) + (nn + ny) * (nn + yn)) / n ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(pe < 1 - 1e-12, (po - pe) / (1 - pe), np.nan)


def cohens_kappa(first: Sequence[bool], second: Sequence[bool], *,
                 n_resamples: int = BOOTSTRAP_RESAMPLES, confidence: float = CONFIDENCE,
                 seed: int = 0) -> Agreement:
    """Cohen's kappa of two raters' yes/no decisions on the same items (`first[i]` and
    `second[i]` rate item i), its bootstrap interval over items, and the confusion table
    (keys `yes/yes`, `yes/no`, `no/yes`, `no/no`: first rater's answer, then second's)."""
    if len(first) != len(second):
        raise ValueError(f"{len(first)} and {len(second)} ratings: the raters must rate the "
                         "same items")
    if not first:
        raise ValueError("cohens_kappa needs at least one rated item")
    codes = np.array([2 * bool(a) + bool(b) for a, b in zip(first, second, strict=True)])
    n = codes.size
    counts = {label: int((codes == k).sum()) for k, label in
              ((3, "yes/yes"), (2, "yes/no"), (1, "no/yes"), (0, "no/no"))}
    observed = (counts["yes/yes"] + counts["no/no"]) / n
    k = float(_kappa_rows(codes[None, :])[0])
    first_yes, second_yes = (counts["yes/yes"] + counts["yes/no"]) / n, \
        (counts["yes/yes"] + counts["no/yes"]) / n
    expected = first_yes * second_yes + (1 - first_yes) * (1 - second_yes)
    if math.isnan(k):
        return Agreement(n, None, None, None, observed, expected, counts)
    rng = np.random.default_rng(seed)
    ks = _kappa_rows(codes[rng.integers(0, n, size=(n_resamples, n))])
    ks = ks[~np.isnan(ks)]
    alpha = (1 - confidence) / 2
    low, high = (np.quantile(ks, [alpha, 1 - alpha]) if ks.size else (np.nan, np.nan))
    return Agreement(n, k, float(low), float(high), observed, expected, counts)
