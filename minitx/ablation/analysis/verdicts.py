"""One verdict per arm: better, worse, no difference found, or fragile, from the ladder's multiplier
(robust.ArmAnswer) with the seeds test beside it, and one line saying why the two disagree where
they do. The ladder decides where it can (it spans every size and budget); the seeds test decides
a sweep without a ladder, and a ladder that cannot decide: an arm whose points cover fewer than
MIN_SIZES sizes (two sizes leave the curve's shape free, so its interval has no bound), or whose
interval is unbounded. A verdict never rests on evidence that could not have decided.

Beside the interval, each ladder verdict states its reach (`reach`): the smallest multiplier the
ladder could have told from 1 at that noise (its minimum detectable effect, at the interval's 90%
and 80% power), so "no difference found" says whether it means "equal within x0.9-x1.1" or "too
noisy to say"."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .significance import LEVEL

MIN_SIZES = 3  # sizes an arm's points must cover for the ladder to decide
Z_LEVEL, Z_POWER = 1.645, 0.842  # a two-sided 90% interval; 80% power


@dataclass(frozen=True)
class Verdict:
    word: str  # "better", "worse", "no difference found", "fragile", or why there is none
    ladder: str  # the ladder's side: "better", "worse", "no difference found", "fragile", ""
    seeds: str  # the seeds test's side: "better", "worse", "no difference found", ""
    why: str = ""  # where the two disagree, why (one line)
    reach: str = ""  # the smallest multiplier the ladder could have seen, in words ("" without one)


def seeds_side(test) -> str:
    """The seeds test's answer: lower loss is better; "" without a test."""
    if test is None or math.isnan(test.p_holm):
        return ""
    if test.p_holm >= LEVEL:
        return "no difference found"
    return "better" if test.difference < 0 else "worse"


def ladder_cannot(arm) -> str:
    """Why the ladder cannot decide this arm ("" when it can)."""
    if arm.answer is None:
        return ""
    if arm.sizes < MIN_SIZES:
        return f"the ladder cannot decide with {arm.sizes} sizes (add a size)"
    if not arm.answer.comparison.bounded:
        return "the ladder's interval is unbounded: it cannot decide"
    return ""


def verdict_word(arm) -> str:
    """The arm's verdict in one word, as the report's table gives it."""
    seeds = seeds_side(arm.test)
    if arm.answer is None:
        return "refused" if arm.rate is not None and arm.rate.refused else seeds or "no answer"
    if ladder_cannot(arm):
        return seeds or "no answer"
    return arm.answer.verdict


def reach(comparison) -> str:
    """The minimum detectable multiplier of an interval: the effect that a ladder this noisy
    would find 80% of the time, from the interval's width in log m read as 2 x 1.645 sds."""
    if not comparison.bounded or comparison.high <= comparison.low:
        return ""
    sd = (math.log(comparison.high) - math.log(comparison.low)) / (2 * Z_LEVEL)
    edge = math.exp((Z_LEVEL + Z_POWER) * sd)
    return f"x{1 / edge:.2f} or x{edge:.2f}"


def verdict(arm, rung_size: str, rung_gap: float | None, size_names: list[str]) -> Verdict:
    """`arm`: an analysis.designed.ArmResult; `rung_gap`: the loss difference the ladder's fit
    implies at the seeds rung (the arm's curve minus the baseline's at the rung's compute), None
    without a fit. `size_names`: the plan's sizes, by index."""
    seeds = seeds_side(arm.test)
    word = verdict_word(arm)
    if arm.answer is None:
        if arm.rate is not None and arm.rate.refused:
            return Verdict(word, "", seeds, arm.rate.refused)
        if arm.fit_note:
            return Verdict(word, "", seeds, arm.fit_note if not seeds else "")
        return Verdict(word, "", seeds)
    cannot = ladder_cannot(arm)
    if cannot:
        rests = f"; the verdict rests on the seeds test at {rung_size}" if seeds else "; no seeds test either"
        return Verdict(word, "", seeds, cannot + rests)
    ladder, why = arm.answer.verdict, ""
    if ladder == "fragile":
        size = arm.answer.fragile_size
        why = (
            f"its side of 1 rests on {size_names[size]}: without it the multiplier is {arm.answer.without[size]:.3g}, "
            f"against {arm.answer.comparison.multiplier:.3g} with every size"
        )
    elif seeds and seeds != ladder:
        why = _why(arm, ladder, seeds, rung_size, rung_gap)
    return Verdict(ladder, ladder, seeds, why, reach(arm.answer.comparison))


def _why(arm, ladder: str, seeds: str, rung_size: str, gap: float | None) -> str:
    """Why the seeds test and the ladder disagree."""
    test = arm.test
    half = (test.high - test.low) / 2
    if seeds == "no difference found":
        implied = f"; the ladder's curves differ by {gap:+.4f} there" if gap is not None else ""
        return (
            f"the seeds test sees one rung ({rung_size}, {test.n_arm} and {test.n_base} seeds): its 95% interval "
            f"spans ±{half:.4f} in loss{implied}, so it cannot tell a difference the ladder finds over every size"
        )
    if ladder == "no difference found":
        return (
            f"the seeds test sees one rung ({rung_size}): a difference of {test.difference:+.4f} there; the "
            "ladder's multiplier is one number over every size and finds none on average (see the arm's curve "
            "and its residuals: it may bend)"
        )
    return (
        f"they point opposite ways: the seeds at {rung_size} differ by {test.difference:+.4f}, the ladder's "
        "multiplier is an average over every size; read the arm's points by size before either"
    )
