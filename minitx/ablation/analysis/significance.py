"""Is an arm's loss different from the baseline's? Welch's t-test over seeds, Holm across arms.

Welch's test does not assume the two arms' seed spreads are equal (a new design may be more or
less stable than the baseline). Testing several arms against one baseline at once, some would
pass by chance: Holm's step-down correction keeps the chance of any false difference at the
level, and is never weaker than Bonferroni.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.01  # modded-nanogpt's bar for a record
SMALLEST_P = sys.float_info.min  # a p too small for a float is this, never 0 (no finite sample gives 0)
CONFIDENCE = 0.95


@dataclass
class Difference:
    """mean(arm) - mean(baseline), its Welch confidence interval and two-sided p."""

    difference: float
    low: float
    high: float
    p: float
    n_arm: int
    n_base: int
    p_holm: float = math.nan

    @property
    def significant(self) -> bool:
        return self.p_holm < LEVEL


def welch(arm: Sequence[float], baseline: Sequence[float], confidence: float = CONFIDENCE) -> Difference:
    """Welch's t-test of two samples of 2 or more values each: nan p (and interval) when both have
    no spread, as no test can say how far apart they are then; a p never 0."""
    from scipy import stats  # heavy: only the report's tests need it

    a, b = list(arm), list(baseline)
    if len(a) < 2 or len(b) < 2:
        raise ValueError("Welch's test needs 2 or more values on each side")
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    var_a = sum((x - mean_a) ** 2 for x in a) / (len(a) - 1)
    var_b = sum((x - mean_b) ** 2 for x in b) / (len(b) - 1)
    se2 = var_a / len(a) + var_b / len(b)
    difference = mean_a - mean_b
    if se2 == 0:  # every seed gave the same loss on both sides: no spread to test a difference against
        return Difference(difference, math.nan, math.nan, math.nan, len(a), len(b))
    df = se2**2 / ((var_a / len(a)) ** 2 / (len(a) - 1) + (var_b / len(b)) ** 2 / (len(b) - 1))
    p = max(float(stats.ttest_ind(a, b, equal_var=False).pvalue), SMALLEST_P)
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * math.sqrt(se2)
    return Difference(difference, difference - half, difference + half, p, len(a), len(b))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's adjusted p-values, in the given order: the k-th smallest of the m p-values that
    are numbers is multiplied by (m - k + 1), made non-decreasing along that order, capped at 1
    and never below SMALLEST_P (a p of 0 is no finite sample's answer). A NaN p (a test with no
    answer) stays NaN and is not counted in m: it is no test, so it neither passes nor makes the
    others harder to pass."""
    numbers = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
    m = len(numbers)
    order = sorted(numbers, key=lambda i: pvalues[i])
    adjusted = [math.nan] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * max(pvalues[i], SMALLEST_P)))
        adjusted[i] = running
    return adjusted


def compare_all(samples: dict[str, Sequence[float]], baseline: str) -> dict[str, Difference]:
    """Each arm with 2 or more values against the baseline, Holm-corrected across those arms."""
    tests = {
        name: welch(values, samples[baseline])
        for name, values in samples.items()
        if name != baseline and len(values) >= 2 and len(samples[baseline]) >= 2
    }
    for difference, adjusted in zip(tests.values(), holm([d.p for d in tests.values()])):
        difference.p_holm = adjusted
    return tests
