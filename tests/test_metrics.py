import math

import pytest

from workbench.evaluate.metrics import (
    accuracy, hit_at_k, macro_f1, ndcg_at_k, recall_at_k, reciprocal_rank,
)

RANKED = ["d3", "d1", "d7", "d2", "d9"]
REL = {"d1", "d2", "d5"}


def test_hit_recall_mrr_hand_computed():
    assert hit_at_k(RANKED, REL, 1) == 0.0
    assert hit_at_k(RANKED, REL, 2) == 1.0
    assert recall_at_k(RANKED, REL, 2) == pytest.approx(1 / 3)
    assert recall_at_k(RANKED, REL, 5) == pytest.approx(2 / 3)
    assert reciprocal_rank(RANKED, REL) == pytest.approx(1 / 2)
    assert reciprocal_rank(RANKED, REL, k=1) == 0.0
    assert reciprocal_rank(["a", "a", "b"], {"b"}) == pytest.approx(1 / 2)  # dup counts once
    assert recall_at_k(RANKED, set(), 5) == 0.0


def test_ndcg_hand_computed():
    # binary: relevant at ranks 2 and 4; ideal has 3 relevant at ranks 1..3
    dcg = 1 / math.log2(3) + 1 / math.log2(5)
    idcg = 1 + 1 / math.log2(3) + 1 / math.log2(4)
    assert ndcg_at_k(RANKED, REL, 5) == pytest.approx(dcg / idcg)
    # graded: gain 2^rel - 1
    graded = {"d1": 2, "d2": 1}
    dcg = 3 / math.log2(3) + 1 / math.log2(5)
    idcg = 3 + 1 / math.log2(3)
    assert ndcg_at_k(RANKED, graded, 5) == pytest.approx(dcg / idcg)
    assert ndcg_at_k(["x"], {"y"}, 1) == 0.0


def test_accuracy_and_macro_f1_hand_computed():
    gold = ["A", "B", "A", "C"]
    pred = ["A", "B", "B", None]
    assert accuracy(pred, gold) == 0.5
    # A: p=1 r=.5 f=2/3; B: p=.5 r=1 f=2/3; C: 0
    assert macro_f1(pred, gold) == pytest.approx((2 / 3 + 2 / 3 + 0) / 3)
