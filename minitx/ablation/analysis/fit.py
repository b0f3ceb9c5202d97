"""Scaling fits: loss against compute per arm, bootstrapped, and the compute multiplier.

    L(C) = E + A * (C / C0)^(-alpha)

C0 is a fixed reference compute (the geometric mean of the points), so A is the reducible loss
there and the optimiser never meets numbers like 1e15. The fit minimises a Huber loss (delta
1e-3) of the residuals in log space, log L(C) - log L, by L-BFGS-B from a grid of starts, with
E bounded by the lowest observed loss (a curve cannot flatten above its own points) and alpha
in [0, 3]. Fewer than MIN_POINTS points are refused: three parameters need room to be tested.

The compute multiplier of an arm (> 1: the arm is worth more compute than it spends): its
fitted loss at its largest compute C_v, the compute C_eq the baseline's curve needs for that
loss, and C_eq / C_v. Its interval comes from refitting both arms on bootstrap resamples of
their points. An arm whose loss the baseline cannot reach at any compute (below the baseline's
E) has an unbounded multiplier, reported as infinity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ...errors import UserError

MIN_POINTS = 5
HUBER_DELTA = 1e-3
BOOTSTRAP = 100
INTERVAL = 0.90


@dataclass(frozen=True)
class Fit:
    E: float
    A: float  # the reducible loss at C0
    alpha: float
    C0: float

    def loss(self, compute: float | np.ndarray) -> float | np.ndarray:
        return self.E + self.A * (np.asarray(compute) / self.C0) ** (-self.alpha)

    def compute_for(self, loss: float) -> float:
        """The compute at which the curve reaches `loss` (inf when it never does)."""
        if loss <= self.E or self.alpha <= 0 or self.A <= 0:
            return math.inf
        return self.C0 * ((loss - self.E) / self.A) ** (-1.0 / self.alpha)

    def as_dict(self) -> dict:
        return {"E": self.E, "A": self.A, "alpha": self.alpha, "C0": self.C0}


@contextmanager
def one_blas_thread():
    """BLAS on one thread while fitting: L-BFGS-B calls it on vectors of three, and OpenBLAS's
    threads then spin and wait, worst beside training runs (a fit took 10-60x longer, measured)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _huber(r: np.ndarray, delta: float) -> np.ndarray:
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r**2, delta * (a - 0.5 * delta))


def fit_curve(
    compute: Sequence[float],
    loss: Sequence[float],
    C0: float | None = None,
    start: Fit | None = None,
    min_points: int = MIN_POINTS,
) -> Fit:
    """The Huber fit in log space of L(C) = E + A (C/C0)^-alpha to the points (see module doc),
    from a grid of starts, or from `start` and one other (a bootstrap refit near its point fit)."""
    from scipy.optimize import minimize  # heavy: only a designed sweep's analysis needs it

    x, y = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    if len(x) < min_points:
        raise UserError(f"a fit of loss against compute needs {min_points} or more points, got {len(x)}")
    C0 = C0 or float(np.exp(np.mean(np.log(x))))
    u, log_y = x / C0, np.log(y)
    log_u = np.log(u)
    low = float(y.min())

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        E, log_A, alpha = theta
        power = np.exp(log_A - alpha * log_u)  # A u^-alpha
        predicted = np.maximum(E + power, 1e-12)
        r = np.log(predicted) - log_y
        psi = np.clip(r, -HUBER_DELTA, HUBER_DELTA)  # the Huber loss's derivative
        grad = np.array([psi / predicted, psi * power / predicted, -psi * power * log_u / predicted]).sum(
            axis=1
        )
        return float(_huber(r, HUBER_DELTA).sum()), grad

    bounds = [(0.0, low), (-12.0, 6.0), (0.0, 3.0)]
    starts = []
    for e_share in (0.0, 0.5, 0.9):
        for alpha in (0.1, 0.3, 0.6, 1.0):
            E = e_share * low
            starts.append([E, math.log(max(float(np.mean(y)) - E, 1e-6)), alpha])
    if start is not None:
        E = min(start.E, low)
        starts = [[E, math.log(max(start.A, 1e-6)), start.alpha], starts[9]]
    best = None
    with one_blas_thread():
        for theta in starts:
            result = minimize(objective, np.array(theta), jac=True, method="L-BFGS-B", bounds=bounds)
            if best is None or result.fun < best.fun:
                best = result
    E, log_A, alpha = best.x
    return Fit(float(E), float(math.exp(log_A)), float(alpha), C0)


def bootstrap_fits(
    compute: Sequence[float],
    loss: Sequence[float],
    resamples: int | None = None,
    seed: int = 0,
    min_points: int = MIN_POINTS,
) -> list[Fit]:
    """Fits to resamples of the points drawn with replacement (resamples that hold fewer than
    three distinct computes cannot pin three parameters and are drawn again)."""
    x, y = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    resamples = BOOTSTRAP if resamples is None else resamples
    rng = np.random.default_rng(seed)
    C0 = float(np.exp(np.mean(np.log(x))))
    point = fit_curve(x, y, C0, min_points=min_points)
    fits: list[Fit] = []
    while len(fits) < resamples:
        pick = rng.integers(0, len(x), len(x))
        if len(set(x[pick])) < 3:
            continue
        fits.append(fit_curve(x[pick], y[pick], C0, start=point, min_points=min_points))
    return fits


def multiplier(baseline: Fit, arm: Fit, compute: float) -> float:
    """C_eq / C_v: the baseline's compute for the arm's fitted loss at `compute`, over `compute`."""
    return baseline.compute_for(float(arm.loss(compute))) / compute


def interval(values: Sequence[float], level: float = INTERVAL) -> tuple[float, float]:
    """The central `level` percentile interval (infinite values sort last)."""
    tail = (1 - level) / 2 * 100
    finite = np.nan_to_num(
        np.asarray(values, dtype=float), nan=np.inf, posinf=_HUGE
    )  # percentiles of inf are nan
    low, high = (math.inf if v >= _HUGE else float(v) for v in np.percentile(finite, [tail, 100 - tail]))
    return low, high


_HUGE = 1e300


@dataclass
class Comparison:
    """An arm against the baseline: the multiplier at the arm's largest compute, its interval."""

    multiplier: float
    low: float
    high: float
    compute: float

    @property
    def excludes_one(self) -> bool:
        return self.low > 1 or self.high < 1


@dataclass
class Curve:
    """An arm's fit, its bootstrap refits and the largest x (compute) among its points."""

    fit: Fit
    draws: list[Fit]
    largest: float


def fit_with_bootstrap(
    x: Sequence[float],
    loss: Sequence[float],
    resamples: int | None = None,
    seed: int = 0,
    min_points: int = MIN_POINTS,
) -> Curve:
    return Curve(
        fit_curve(x, loss, min_points=min_points),
        bootstrap_fits(x, loss, resamples, seed, min_points),
        float(max(x)),
    )


def compare_curves(baseline: Curve, arm: Curve) -> Comparison:
    """The arm's multiplier at its largest x against the baseline, with the interval of the
    paired bootstrap refits. x is compute; it may as well be parameters at a fixed token ratio
    (the multiplier is then the baseline's parameters for the arm's loss over the arm's)."""
    at = arm.largest
    draws = [multiplier(b, a, at) for b, a in zip(baseline.draws, arm.draws)]
    return Comparison(multiplier(baseline.fit, arm.fit, at), *interval(draws), at)


def compare(
    base_points: tuple[Sequence[float], Sequence[float]],
    arm_points: tuple[Sequence[float], Sequence[float]],
    resamples: int | None = None,
    seed: int = 0,
) -> Comparison:
    """compare_curves of two sets of (compute, loss) points."""
    return compare_curves(
        fit_with_bootstrap(*base_points, resamples, seed),
        fit_with_bootstrap(*arm_points, resamples, seed + 1),
    )
