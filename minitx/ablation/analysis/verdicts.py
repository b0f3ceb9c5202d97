"""One verdict per arm: better, worse, no difference found, or fragile, from the ladder's multiplier
(robust.ArmAnswer) with the seeds test beside it, and one line saying why the two disagree where
they do. The ladder decides where there is one (it spans every size and budget); the seeds test
decides a sweep without a ladder."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .significance import LEVEL


@dataclass(frozen=True)
class Verdict:
    word: str  # "better", "worse", "no difference found", "fragile", or why there is none
    ladder: str  # the ladder's side: "better", "worse", "no difference found", "fragile", ""
    seeds: str  # the seeds test's side: "better", "worse", "no difference found", ""
    why: str = ""  # where the two disagree, why (one line)


def seeds_side(test) -> str:
    """The seeds test's answer: lower loss is better; "" without a test."""
    if test is None or math.isnan(test.p_holm):
        return ""
    if test.p_holm >= LEVEL:
        return "no difference found"
    return "better" if test.difference < 0 else "worse"


def verdict(arm, rung_size: str, rung_gap: float | None, size_names: list[str]) -> Verdict:
    """`arm`: an analysis.designed.ArmResult; `rung_gap`: the loss difference the ladder's fit
    implies at the seeds rung (the arm's curve minus the baseline's at the rung's compute), None
    without a fit. `size_names`: the plan's sizes, by index."""
    seeds = seeds_side(arm.test)
    if arm.answer is None:
        if arm.rate is not None and arm.rate.refused:
            return Verdict("refused", "", seeds, arm.rate.refused)
        if arm.fit_note:
            return Verdict(seeds or "no answer", "", seeds, arm.fit_note if not seeds else "")
        return Verdict(seeds or "no answer", "", seeds)
    ladder = arm.answer.verdict
    if not seeds or seeds == ladder:
        why = ""
        if ladder == "fragile":
            why = _fragile_line(arm, size_names)
        return Verdict(ladder, ladder, seeds, why)
    return Verdict(ladder, ladder, seeds, _why(arm, ladder, seeds, rung_size, rung_gap, size_names))


def _fragile_line(arm, size_names: list[str]) -> str:
    size = arm.answer.fragile_size
    value = arm.answer.without[size]
    return (
        f"its side of 1 rests on {size_names[size]}: without it the multiplier is {value:.3g}, "
        f"against {arm.answer.comparison.multiplier:.3g} with every size"
    )


def _why(arm, ladder: str, seeds: str, rung_size: str, gap: float | None, size_names: list[str]) -> str:
    test = arm.test
    half = (test.high - test.low) / 2
    if ladder == "fragile":
        return _fragile_line(arm, size_names)
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
