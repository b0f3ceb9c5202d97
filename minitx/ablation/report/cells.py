"""How a sweep's report writes its numbers in a cell (losses, multipliers, intervals, budgets) and
its cells in a table's row."""

from __future__ import annotations

import math

from ..plan.ladder import Plan


def row(*cells: object) -> str:
    """One row of a markdown table."""
    return "| " + " | ".join(map(str, cells)) + " |"


def num(value: float | None, fmt: str = "{:.4f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if math.isinf(value):
        return "unbounded"
    return fmt.format(value)


def ratio(value: float | None) -> str:
    """A multiplier or share: three significant figures, a word where there is no number (0 and
    inf are the two ends of log scale: a fit or draw at the multiplier's bound)."""
    if value is None or math.isnan(value):
        return "–"
    if value == 0 or math.isinf(value):
        return "unbounded"
    if 0.01 <= value < 1000:
        return f"{value:.3g}" if value < 10 else f"{value:.1f}"
    return f"{value:.2g}"


def interval_text(value: float, low: float, high: float) -> str:
    return f"{ratio(value)} [{ratio(low)}, {ratio(high)}]"


def budget_text(plan: Plan, budget: float | None) -> str:
    if budget is None:
        return "the base's steps"
    if plan.ladder is not None and plan.ladder.unit == "tokens_per_param":
        return f"{budget:g} tokens/param"
    return f"{budget:.3g} FLOPs"
