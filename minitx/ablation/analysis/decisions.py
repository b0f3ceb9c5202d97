"""Does the small-scale answer hold at the held-out rung? Decision accuracy, as DataDecide (AI2,
2025) defines it for choosing between recipes: the share of pairs of arms whose order at the small
scale matches their order at the target, each arm's seeds averaged first. It equals
(Kendall's tau + 1) / 2 over the arms; a pair tied on either side counts a half.

Three predictors of the held-out order are scored the same way (analysis/designed.py):
(a) the ladder's fitted curves, each arm's predicted loss at the held-out point;
(b) ranking at the largest fitted rung alone (its largest budget), the cheapest rule;
(c) the verdicts against the baseline: a "better" or "worse" is right when the held-out
    difference from the baseline has its sign; "no difference found" (and "fragile") claims no
    side, so it is scored apart: it agrees when the held-out difference lies within that rung's
    own noise (NOISE_Z sds of a difference of two runs there).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

NOISE_Z = 1.96  # a difference within this many sds of the held-out rung's noise is "none seen"


@dataclass(frozen=True)
class Accuracy:
    """Pairs ordered as at the target, of how many (a tie counts a half)."""

    agree: float
    pairs: int

    @property
    def share(self) -> float:
        return self.agree / self.pairs if self.pairs else math.nan

    def text(self) -> str:
        agree = f"{self.agree:g}"
        return f"{agree} of {self.pairs} pairs ({self.share:.0%})" if self.pairs else "no pairs"


def decision_accuracy(predicted: Sequence[float], target: Sequence[float]) -> Accuracy:
    """The pairs (i < j) whose order in `predicted` is their order in `target`; lower is better
    in both. A pair tied in either counts a half; an arm with a missing (nan) value is left out."""
    predicted, target = [float(v) for v in predicted], [float(v) for v in target]
    keep = [i for i in range(len(target)) if not (math.isnan(predicted[i]) or math.isnan(target[i]))]
    agree, pairs = 0.0, 0
    for a, i in enumerate(keep):
        for j in keep[a + 1 :]:
            pairs += 1
            p = (predicted[i] > predicted[j]) - (predicted[i] < predicted[j])
            t = (target[i] > target[j]) - (target[i] < target[j])
            agree += 0.5 if p == 0 or t == 0 else float(p == t)
    return Accuracy(agree, pairs)


@dataclass(frozen=True)
class VerdictScore:
    """The verdicts read as predictions of the held-out difference from the baseline."""

    decided: int  # better or worse
    right: int  # of those, the held-out difference has the verdict's sign
    undecided: int  # no difference found, or fragile
    within_noise: int  # of those, the held-out difference lies within its rung's noise

    def text(self) -> str:
        parts = []
        if self.decided:
            parts.append(f"{self.right} of {self.decided} better/worse verdicts hold")
        if self.undecided:
            parts.append(f'{self.within_noise} of {self.undecided} "no difference" within the held-out noise')
        return "; ".join(parts) or "no verdicts"


def verdict_score(
    verdicts: Sequence[str], difference: Sequence[float], noise: float | Sequence[float]
) -> VerdictScore:
    """`verdicts`: each arm's word against the baseline; `difference`: its held-out loss minus
    the baseline's (nan: not measured, left out); `noise`: the sd of such a difference there,
    one for all or one per arm."""
    noises = [float(noise)] * len(verdicts) if isinstance(noise, (int, float)) else list(noise)
    decided = right = undecided = within = 0
    for word, diff, noise in zip(verdicts, map(float, difference), noises):
        if math.isnan(diff):
            continue
        if word in ("better", "worse"):
            decided += 1
            right += (diff < 0) if word == "better" else (diff > 0)
        elif word in ("no difference found", "fragile"):
            undecided += 1
            within += abs(diff) <= NOISE_Z * noise
    return VerdictScore(decided, right, undecided, within)
