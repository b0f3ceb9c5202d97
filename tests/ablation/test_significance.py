"""The seeds test's edge cases (minitx/ablation/analysis/significance.py): two arms whose seeds
have no spread at all get no answer (NaN), never a p of 0 or 1, and Holm's correction never
reports 0: a NaN p stays NaN, a p too small for a float stays above 0. The ordinary cases are in
tests/ablation/test_ladder.py."""

from __future__ import annotations

import math

from minitx.ablation.analysis import significance


def test_no_spread_on_either_side_is_no_answer():
    for arm, baseline in (([2.0, 2.0], [2.1, 2.1, 2.1]), ([2.0, 2.0, 2.0], [2.0, 2.0])):
        result = significance.welch(arm, baseline)
        assert math.isnan(result.p) and math.isnan(result.low) and math.isnan(result.high)
        assert result.difference == sum(arm) / len(arm) - sum(baseline) / len(baseline)
        assert not result.significant  # NaN < LEVEL is False
    # spread on one side is enough for a test
    one_side = significance.welch([2.0, 2.0], [2.1, 2.11, 2.09])
    assert 0 < one_side.p < 1 and one_side.low < one_side.high


def test_holm_never_reports_0_and_keeps_nan():
    tests = significance.compare_all({"base": [2.0, 2.0], "same": [2.0, 2.0], "shift": [2.1, 2.1]}, "base")
    assert all(math.isnan(t.p) and math.isnan(t.p_holm) for t in tests.values())
    adjusted = significance.holm([0.0, math.nan, 0.02])
    assert 0 < adjusted[0] <= significance.SMALLEST_P * 2 and math.isnan(adjusted[1])
    assert adjusted[2] == 0.02  # the larger of m = 2 numbers, times 1
    # a difference far beyond its spread: scipy's p underflows to 0, the test's is above it
    far = significance.welch([1.0, 1.0 + 1e-12, 1.0 - 1e-12] * 40, [9.0, 9.0 + 1e-12, 9.0 - 1e-12] * 40)
    assert far.p > 0 and significance.holm([far.p, 0.5])[0] > 0
