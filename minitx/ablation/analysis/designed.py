"""The analysis of a designed sweep: chosen learning rates, fits, multipliers, tests, diagnostics.

Everything here reads finished runs (their summary.json, diagnostics.json) through the plan's
points, so `--report-only` rebuilds it all without training. A failed or missing run is simply
absent from the fits and tests; the report lists it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...errors import UserError
from ..plan.ladder import Plan, Point, Rate
from . import fit
from .significance import Difference, compare_all


@dataclass
class ArmResult:
    name: str
    lr_losses: dict[float, float | None] = field(default_factory=dict)  # multiplier -> final val loss
    multiplier: float | None = None  # the chosen one (at the sweep's size)
    rate: Rate | None = None  # the whole choice: past the edges, confirmation, rate per size (ladder.py)
    points: list[Point] = field(default_factory=list)  # the ladder's finished points (seed 0)
    curve: fit.Curve | None = None
    fit_note: str = ""
    compute: fit.Comparison | None = None
    params: fit.Comparison | None = None  # the baseline's parameters at equal loss, over the arm's
    seeds: list[float] = field(default_factory=list)  # losses at the seeds rung
    test: Difference | None = None
    diagnostics: dict[str, float] = field(default_factory=dict)  # means over the rung's seeds


@dataclass
class Analysis:
    baseline: str
    arms: list[ArmResult]
    rung: tuple[str, float | None]
    failed: list[Point]
    notes: list[str]

    def arm(self, name: str) -> ArmResult:
        return next(a for a in self.arms if a.name == name)


DIAGNOSTIC_KEYS = ("first_token_share", "sink_rate", "massive_ratio", "entropy")
DIAGNOSTIC_NAMES = {
    "first_token_share": "first-token share",
    "sink_rate": "sink rate",
    "massive_ratio": "massive act. (max/median)",
    "entropy": "attention entropy (normalised)",
}


def analyse(plan: Plan, phases: tuple[list[Point], list[Point], list[Point]], diagnostics=None) -> Analysis:
    """`diagnostics`: point -> dict or None (the cached diagnostics of its run)."""
    first, second, third = phases
    multipliers = plan.sweep.design.multipliers
    found = plan.rates()
    results = [ArmResult(name, rate=found[name]) for name in plan.arms]
    everything = [*first, *second, *third]
    failed = [p for p in everything if p.loss is None and (p.run.directory / "run.json").is_file()]
    notes: list[str] = []
    for arm in results:
        if multipliers:
            arm.lr_losses = {m: p.loss for m, p in arm.rate.sweep.items()}
            arm.multiplier = arm.rate.choice.multiplier
        else:
            arm.multiplier = 1.0
        seen = set()
        for p in [*second, *third]:
            if p.arm == arm.name and p.seed == plan.ladder_seed and p.loss is not None:
                if p.run.directory not in seen:
                    seen.add(p.run.directory)
                    arm.points.append(p)
        arm.points.sort(key=lambda p: p.trained_flops)
        rung_points = [
            p for p in [*second, *third] if p.arm == arm.name and (p.size, p.budget) == plan.seeds_rung
        ]
        arm.seeds = [p.loss for p in _unique(rung_points) if p.loss is not None]
        if diagnostics is not None:
            values = [diagnostics(p) for p in _unique(rung_points)]
            values = [v for v in values if v]
            for key in DIAGNOSTIC_KEYS:
                found = [v[key] for v in values if v.get(key) is not None]
                if found:
                    arm.diagnostics[key] = sum(found) / len(found)
    if plan.ladder is not None:
        _fit_all(plan, results, notes)
    tests = compare_all({a.name: a.seeds for a in results}, plan.arms[0])
    for arm in results:
        arm.test = tests.get(arm.name)
    return Analysis(plan.arms[0], results, plan.seeds_rung, failed, notes)


def _unique(points: list[Point]) -> list[Point]:
    seen: dict = {}
    for p in points:
        seen.setdefault(p.run.directory, p)
    return list(seen.values())


def _fit_all(plan: Plan, results: list[ArmResult], notes: list[str]) -> None:
    for i, arm in enumerate(results):
        if arm.rate is not None and arm.rate.refused:  # no rate is known to be its best
            arm.fit_note = f"refused: {arm.rate.refused}"
            continue
        try:
            arm.curve = fit.fit_with_bootstrap(
                [p.trained_flops for p in arm.points], [p.loss for p in arm.points], seed=2 * i
            )
        except UserError as error:
            arm.fit_note = f"no fit: {error}"
    baseline = results[0]
    if baseline.curve is None:
        notes.append(f"the baseline {baseline.name} has no fit ({baseline.fit_note}), so no multipliers")
        return
    for arm in results[1:]:
        if arm.curve is not None:
            arm.compute = fit.compare_curves(baseline.curve, arm.curve)
    # The parameter form needs one token ratio across sizes: the largest budget, per parameter.
    if plan.ladder.unit != "tokens_per_param" or len(plan.sizes) < 4:
        notes.append(
            "parameter share at equal loss: needs ladder.budgets in tokens_per_param and 4 or more sizes"
        )
        return
    top = plan.budgets[-1]
    curves = {}
    for i, arm in enumerate(results):
        points = [p for p in arm.points if p.budget == top]
        if len(points) >= 4:
            x, y = [p.params for p in points], [p.loss for p in points]
            curves[arm.name] = fit.fit_with_bootstrap(x, y, seed=100 + 2 * i, min_points=4)
    if baseline.name in curves:
        for arm in results[1:]:
            if arm.name in curves:
                arm.params = fit.compare_curves(curves[baseline.name], curves[arm.name])


def share(comparison: fit.Comparison) -> tuple[float, float, float]:
    """The arm's parameters as a share of the baseline's at equal loss (the reciprocal of the
    parameter multiplier: 0.62 means the arm needs 62% of the baseline's parameters)."""

    def inv(v: float) -> float:
        return 0.0 if math.isinf(v) else (math.inf if v == 0 else 1 / v)

    return inv(comparison.multiplier), inv(comparison.high), inv(comparison.low)
