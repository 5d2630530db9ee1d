"""The distillation ship rule on paired dev rows (issue 56): a student ships only when it beats
the student config alone by more than the paired standard error of the difference."""

from __future__ import annotations

import numpy as np
import pytest

from xdpx.distill.plan import decide
from xdpx.metrics import paired_comparison

pytestmark = pytest.mark.unit


def _preds(n: int, a_only: int, b_only: int, both: int, seed: int = 0):
    """Gold labels of 3 classes and two models' predictions with the given agreement counts:
    ``a_only`` texts only A gets right, ``b_only`` only B, ``both`` both, the rest neither."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    wrong = (y + 1) % 3
    a, b = wrong.copy(), wrong.copy()
    idx = rng.permutation(n)
    ia, ib, ic = (
        idx[:a_only],
        idx[a_only : a_only + b_only],
        idx[a_only + b_only : a_only + b_only + both],
    )
    a[ia], a[ic], b[ib], b[ic] = y[ia], y[ic], y[ib], y[ic]
    return y, a, b


def test_accuracy_difference_se_and_mcnemar_by_hand():
    y, a, b = _preds(218, a_only=10, b_only=6, both=170)
    c = paired_comparison(y, a, b)
    assert (c["a_only"], c["b_only"], c["n"]) == (10, 6, 218)
    assert c["a"] == pytest.approx(180 / 218) and c["b"] == pytest.approx(176 / 218)
    assert c["diff"] == pytest.approx(4 / 218)
    d = np.r_[np.ones(10), -np.ones(6), np.zeros(202)]
    assert c["se"] == pytest.approx(d.std(ddof=1) / np.sqrt(218))
    # McNemar's exact test: 10 of 16 discordant texts, two-sided binomial at 1/2
    from math import comb

    p = 2 * sum(comb(16, k) for k in range(10, 17)) / 2**16
    assert c["p"] == pytest.approx(p) and c["method"] == "McNemar exact"


def test_bootstrap_se_of_accuracy_matches_the_analytic_one():
    y, a, b = _preds(600, a_only=40, b_only=25, both=400, seed=1)
    exact = paired_comparison(y, a, b, "accuracy")
    eye = np.eye(3)
    boot = paired_comparison(y, a, b, "macro_recall", eye[a], eye[b], resamples=400)
    assert boot["method"].startswith("paired bootstrap")
    assert exact["se"] == pytest.approx(0.0134, abs=0.001)
    # macro recall of balanced classes moves with accuracy: the same size of SE
    assert boot["se"] == pytest.approx(exact["se"], rel=0.25)


def test_identical_models_have_zero_se():
    y, a, _ = _preds(100, 30, 0, 40)
    c = paired_comparison(y, a, a.copy())
    assert c["diff"] == 0 and c["se"] == 0 and c["p"] == 1.0 and c["z"] == 0


def test_lengths_must_agree():
    with pytest.raises(ValueError, match="lengths"):
        paired_comparison(np.zeros(3, int), np.zeros(3, int), np.zeros(2, int))


def _decide(a_only: int, b_only: int, n: int = 218):
    y, s, a = _preds(n, a_only, b_only, both=150)
    dev = paired_comparison(y, s, a)
    grid = [{"run": "a0.5-t2-k0", "alpha": 0.5, "temperature": 2.0, "copies": 0, "dev": dev["a"], "best_epoch": 2}]  # fmt: skip
    metrics = lambda acc: {"dev": {"accuracy": acc}, "test": {"accuracy": acc}}  # noqa: E731
    return decide(
        grid, metrics(dev["b"]), metrics(0.9), metrics(dev["a"]), "accuracy", {"dev": dev}
    )


def test_a_dev_lead_inside_one_paired_se_keeps_alone():
    # 20newsgroups-lt's shipped student led by 4 of 218 dev texts (84.40 vs 82.57); with 24
    # texts on which the two disagree that lead is 0.8 paired SE, so alone is kept
    d = _decide(a_only=14, b_only=10)
    assert 0.7 < d["paired"]["dev"]["z"] < 0.9
    assert d["dev"]["student"] > d["dev"]["alone"]
    assert d["shipped"] == "alone" and d["run"] == "alone"
    assert d["reason"].startswith("keeps alone: ") and "paired SE" in d["reason"]


def test_a_lead_above_one_paired_se_ships():
    d = _decide(a_only=14, b_only=2)
    assert d["paired"]["dev"]["diff"] > d["paired"]["dev"]["se"] > 0
    assert d["shipped"] == "student" and d["run"] == "a0.5-t2-k0"
    assert d["test_kept_share"] == pytest.approx(
        (d["test"]["student"] - d["test"]["alone"]) / (0.9 - d["test"]["alone"])
    )


def test_without_paired_rows_the_plain_rule_applies():
    d = _decide(a_only=10, b_only=6)
    grid, a, t, s = d["grid"], {"dev": {"accuracy": 0.5}}, {"dev": {"accuracy": 0.9}}, {"dev": {"accuracy": 0.6}}  # fmt: skip
    plain = decide(grid, a, t, s, "accuracy")
    assert plain["shipped"] == "student" and "no per-text rows" in plain["reason"]
