"""Interval and test statistics against hand-computed values and scipy."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from workbench.evaluate.stats import (
    bootstrap_interval, cluster_bootstrap_difference, clustered_wilson_interval,
    clustered_sign_flip_p, degenerate_reason, discordant_pairs, effective_n, holm, mcnemar_exact,
    mcnemar_items_for_power, paired_bootstrap_difference, prediction_counts, wilson_interval,
)


@pytest.mark.parametrize("k,n", [(0, 12), (3, 10), (50, 100), (97, 100), (12, 12), (1, 1539)])
def test_wilson_matches_scipy(k, n):
    ci = sps.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(ci.low, abs=1e-9) and hi == pytest.approx(ci.high, abs=1e-9)


def test_wilson_by_hand():
    # k = 0: the upper bound is z^2 / (n + z^2)
    z = 1.959963984540054
    assert wilson_interval(0, 12)[1] == pytest.approx(z * z / (12 + z * z))
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(5, 4)


@pytest.mark.parametrize("b,c", [(0, 5), (3, 9), (10, 10), (1, 20), (40, 61)])
def test_mcnemar_exact_matches_scipy_binomial(b, c):
    a = [True] * b + [False] * c + [True] * 7 + [False] * 4
    bb = [False] * b + [True] * c + [True] * 7 + [False] * 4
    assert discordant_pairs(a, bb) == (b, c)
    assert mcnemar_exact(a, bb) == pytest.approx(sps.binomtest(b, b + c, 0.5).pvalue)


def test_mcnemar_by_hand():
    # 0 vs 5 discordant: 2 * (1/2)^5
    assert mcnemar_exact([False] * 5, [True] * 5) == pytest.approx(2 / 32)
    assert mcnemar_exact([True, False], [True, False]) == 1.0  # no discordant pairs


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> monotone 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_bootstrap_is_seeded_and_agrees_with_scipy():
    rng = np.random.default_rng(3)
    x = (rng.random(200) < 0.4).astype(float)
    a = bootstrap_interval(x, seed=7)
    assert a == bootstrap_interval(x, seed=7)
    assert a != bootstrap_interval(x, seed=8)
    ref = sps.bootstrap((x,), np.mean, n_resamples=20000, method="percentile",
                        random_state=1).confidence_interval
    assert a[0] == pytest.approx(ref.low, abs=0.015) and a[1] == pytest.approx(ref.high,
                                                                                 abs=0.015)
    # a binary mean's bootstrap interval is close to Wilson's for n = 200
    lo, hi = wilson_interval(int(x.sum()), len(x))
    assert a[0] == pytest.approx(lo, abs=0.02) and a[1] == pytest.approx(hi, abs=0.02)
    assert bootstrap_interval([0.3] * 5) == (pytest.approx(0.3), pytest.approx(0.3))
    med = bootstrap_interval(x, statistic=lambda m: np.median(m, axis=1))
    assert med[0] <= med[1]


def test_paired_bootstrap_difference():
    a = [True] * 10 + [False] * 30
    b = [True] * 30 + [False] * 10
    diff, (lo, hi) = paired_bootstrap_difference(a, b, seed=0)
    assert diff == pytest.approx(0.5)
    assert lo <= diff <= hi and lo > 0
    # paired: identical answers give a zero-width interval, however low the accuracy
    assert paired_bootstrap_difference(a, a) == (0.0, (0.0, 0.0))
    # the interval is about +-1.96 * sd of the item differences / sqrt(n)
    sd = math.sqrt(0.5 * (1 - 0.5) / 40)
    assert hi - lo == pytest.approx(2 * 1.96 * sd, rel=0.25)


def test_prediction_counts_and_degenerate_rule():
    assert prediction_counts(["A", "C", None, "AB", "A"], "ABCD") == {"A": 2, "B": 0, "C": 1,
                                                                    "D": 0}
    balanced = list("ABCD") * 5
    assert "A is 100.0%" in degenerate_reason(["A"] * 20, balanced)
    assert degenerate_reason(["A"] * 8 + ["B", "C"], list("ABCDABCDAB")) is not None  # 80%
    assert degenerate_reason(["A"] * 7 + ["B", "C", "D"], list("ABCDABCDAB")) is None  # 70%
    # a benchmark whose answers are mostly A: following them is not degenerate
    assert degenerate_reason(["A"] * 20, ["A"] * 18 + ["B", "C"]) is None
    assert degenerate_reason(["A"] * 9, balanced[:9]) is None  # too few items to judge
    assert degenerate_reason([None] * 20, balanced) is None


def test_clustered_intervals_and_tests():
    """Copies of an item add no information: 50 items each asked three times get the interval
    and the test of the 50; singleton clusters change nothing (the sign-flip test over
    clusters is then the exact McNemar test)."""
    rng = np.random.default_rng(0)
    base = [bool(x) for x in rng.random(50) < 0.4]
    tripled = [x for x in base for _ in range(3)]
    by_item = [f"f{i // 3}" for i in range(150)]
    assert effective_n(tripled, by_item) == pytest.approx(50)
    assert effective_n([True] * 150, by_item) == 50  # no variance: count the clusters
    assert clustered_wilson_interval(tripled, by_item) == pytest.approx(
        wilson_interval(sum(base), 50))
    singles = [str(i) for i in range(150)]
    assert clustered_wilson_interval(tripled, singles) == wilson_interval(sum(tripled), 150)
    a = [bool(x) for x in rng.random(150) < 0.5]
    b = [x if r < 0.6 else not x for x, r in zip(a, rng.random(150), strict=True)]
    assert clustered_sign_flip_p(a, b, singles) == pytest.approx(mcnemar_exact(a, b))
    assert clustered_sign_flip_p(a, a, singles) == 1.0
    for k_a, k_b in ((5, 0), (6, 2), (0, 7), (3, 3)):  # few discordant items: still exact
        xa = [True] * k_a + [False] * k_b + [True] * 4
        xb = [False] * k_a + [True] * k_b + [True] * 4
        keys = [str(i) for i in range(k_a + k_b)] + ["shared"] * 4
        assert clustered_sign_flip_p(xa, xb, keys) == pytest.approx(mcnemar_exact(xa, xb))
    # tripled pairs: the clustered test is the test of the 50 originals
    a50, b50 = a[:50], b[:50]
    a3, b3 = [x for x in a50 for _ in range(3)], [x for x in b50 for _ in range(3)]
    assert clustered_sign_flip_p(a3, b3, by_item) == pytest.approx(mcnemar_exact(a50, b50))
    assert mcnemar_exact(a3, b3) < clustered_sign_flip_p(a3, b3, by_item)
    # a cluster of +2 and one of -1: the sums are +-2 +-1, |sum| >= 1 always
    assert clustered_sign_flip_p([True, True, False], [False, False, True],
                                 ["x", "x", "y"]) == 1.0
    diff, (lo, hi) = cluster_bootstrap_difference(a3, b3, by_item, seed=1)
    _, (lo50, hi50) = paired_bootstrap_difference(a50, b50, seed=1)
    _, (lo_naive, hi_naive) = paired_bootstrap_difference(a3, b3, seed=1)
    assert diff == pytest.approx((sum(b50) - sum(a50)) / 50)
    assert hi - lo == pytest.approx(hi50 - lo50, abs=0.03)
    assert hi_naive - lo_naive < 0.7 * (hi - lo)


def _exact_mcnemar_power(p_only_a: float, p_only_b: float, n: int, alpha: float = 0.05) -> float:
    """P(exact two-sided McNemar p < alpha) over n items drawn with these discordant shares."""
    from scipy.stats import binom

    psi = p_only_a + p_only_b
    total = 0.0
    for d in range(n + 1):
        p_d = binom.pmf(d, n, psi)
        if p_d < 1e-12 or d == 0:
            continue
        # rejecting splits of d discordant items: the exact test's two tails
        k = np.arange(d + 1)
        tail = np.minimum(1.0, 2 * np.minimum(binom.cdf(k, d, 0.5), binom.sf(k - 1, d, 0.5)))
        total += p_d * binom.pmf(k, d, p_only_b / psi)[tail < alpha].sum()
    return total


def test_items_for_power_give_that_power_to_the_exact_test():
    """Connor's formula, checked against the exact McNemar test's power computed by
    enumeration: at the size it returns the power is near 80%, and well below it at half."""
    need = mcnemar_items_for_power(10, 20, 100)
    assert 200 < need < 300
    assert 0.75 < _exact_mcnemar_power(0.10, 0.20, need) < 0.86
    assert _exact_mcnemar_power(0.10, 0.20, need // 2) < 0.6
    assert mcnemar_items_for_power(5, 5, 100) is None  # no difference: no size shows it
    # the same difference on items in clusters of two needs twice the items
    assert mcnemar_items_for_power(10, 20, 100, clusters=50) in (2 * need - 1, 2 * need,
                                                                       2 * need + 1)
