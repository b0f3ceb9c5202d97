"""Decision accuracy (analysis/decisions.py) against its definition: the share of pairs ordered
as at the target, equal to (Kendall's tau + 1) / 2 without ties; verdicts scored as signs."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from minitx.ablation.analysis.decisions import NOISE_Z, decision_accuracy, verdict_score


def test_decision_accuracy_is_kendalls_tau_rescaled_on_random_orders():
    rng = np.random.default_rng()  # fresh each run: the identity holds for any order
    for n in (2, 3, 8, 13):
        predicted, target = rng.standard_normal(n), rng.standard_normal(n)
        found = decision_accuracy(predicted, target)
        assert found.pairs == n * (n - 1) // 2
        tau = stats.kendalltau(predicted, target).statistic
        assert math.isclose(found.share, (tau + 1) / 2, abs_tol=1e-12)


def test_ties_count_a_half_and_a_missing_arm_is_left_out():
    assert decision_accuracy([1, 1, 3], [1, 2, 3]).agree == 2.5
    found = decision_accuracy([1, math.nan, 3], [1, 2, 3])
    assert (found.agree, found.pairs) == (1, 1)
    assert found.text() == "1 of 1 pairs (100%)"
    assert decision_accuracy([4, 3, 2, 1], [1, 2, 3, 4]).agree == 0


def test_verdicts_are_read_as_signs_and_no_difference_is_scored_apart():
    words = ["better", "worse", "worse", "no difference found", "fragile", "better"]
    diffs = [-0.05, 0.02, -0.01, 0.5 * NOISE_Z * 0.01, 3 * NOISE_Z * 0.01, math.nan]
    found = verdict_score(words, diffs, 0.01)
    assert (found.decided, found.right, found.undecided, found.within_noise) == (3, 2, 2, 1)
    assert (
        found.text() == '2 of 3 better/worse verdicts hold; 1 of 2 "no difference" within the held-out noise'
    )
