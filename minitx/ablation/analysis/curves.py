"""The curves of loss against compute: one arm's L(C) = E + A (C/C0)^-alpha, and the joint model in
which every arm follows the baseline's curve with its compute scaled by a multiplier m_k:

    L_k(C) = E + A * (m_k * C / C0)^(-alpha),      m_0 = 1 (the baseline)

so m_k is the compute multiplier itself: the baseline needs m_k times the compute to reach the
loss arm k reaches with C (> 1: the arm is worth more compute than it spends).

A ladder whose budgets are ratios of tokens to parameters gives each ratio b its own offset in log
loss, shared by every arm and zero at the largest ratio (`budget`, `n_budgets`):

    log L_k(C, b) = log(E + A (m_k C / C0)^-alpha) + delta_b,      delta_(largest) = 0

A law in compute alone cannot tell a large model trained briefly from a small one trained long at
the same compute; at a fixed ratio it can (Chinchilla's L(N, D) with D = r N is a curve in C for
each r). Measured on the showcase (docs/ablations.md): without the offsets every arm's d64 point
at 5 tokens/param lay above its prediction from d32-d48; trained again straight, at the d48 rate
or at x4, it moved 0.014 of its 0.09 nats. m_k is then the multiplier at equal ratio. E, A and alpha are
fitted to all arms' points at once, so an arm equal to the baseline gets m = 1 with a finite
interval; a curve per arm with its own E cannot say that, since an arm whose loss lies below the
baseline's fitted E "needs infinite compute". The price: m is one number over the ladder's range,
the arm's average shift along log C (uncertainty.py carries how far the points stray from it).

The fit minimises a Huber loss of the residuals in log space, log L_k(C) - log L, each divided by
its point's noise sd where that is known (`scale`; delta 1.345 of them: as efficient as least
squares to 5% under normal noise, and a diverged run still pulls the curve only linearly), from a
grid of 12 starts (solver.huber_fit), with E bounded by the lowest observed loss, alpha in [0, 3]
and |log m| <= log(1e4) (a multiplier at that bound, or with alpha at 0, has no finite value and
prints as "unbounded"). Without a scale the delta is 1e-3 (OLMo-core's). C0 is the geometric
mean of the computes, so the optimiser never meets 1e15.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import UserError
from .solver import HUBER_DELTA, huber, huber_fit

MIN_POINTS = 5
ALPHA_MAX = 3.0
LOG_M_MAX = math.log(1e4)  # a multiplier fitted at this bound is reported as unbounded
FLAT = 1e-6  # an alpha below this is at its bound 0: the loss does not fall with compute


@dataclass(frozen=True)
class Fit:
    """One curve L(C) = E + A (C/C0)^-alpha."""

    E: float
    A: float  # the reducible loss at C0
    alpha: float
    C0: float

    def loss(self, compute: float | np.ndarray) -> float | np.ndarray:
        return self.E + self.A * (np.asarray(compute) / self.C0) ** (-self.alpha)

    def compute_for(self, loss: float) -> float:
        """The compute at which the curve reaches `loss`: inf when it never does (the loss is
        at or below E), nan when the curve is flat (alpha at its bound 0, or no A): a flat curve
        has the same loss at every compute, so no compute is "the" one."""
        if self.alpha <= FLAT or self.A <= 0:
            return math.nan
        if loss <= self.E:
            return math.inf
        return self.C0 * ((loss - self.E) / self.A) ** (-1.0 / self.alpha)

    def as_dict(self) -> dict:
        return {"E": self.E, "A": self.A, "alpha": self.alpha, "C0": self.C0}


# -- the joint model -------------------------------------------------------------------------------
@dataclass(frozen=True)
class JointFit:
    """L_k(C) = E + A (m_k C / C0)^-alpha over arms k = 0 (the baseline, m_0 = 1), 1, 2, ..."""

    E: float
    A: float
    alpha: float
    C0: float
    log_m: tuple[float, ...]  # per arm; log_m[0] = 0
    offsets: tuple[float, ...] = (0.0,)  # per budget group, in log loss; the last (largest) is 0

    def multiplier(self, arm: int) -> float:
        return _ratio(self.log_m[arm], self.alpha)

    def curve(self, arm: int) -> Fit:
        """Arm k's own curve: the shared one with its A scaled by m_k^-alpha."""
        return Fit(self.E, self.A * math.exp(-self.alpha * self.log_m[arm]), self.alpha, self.C0)

    def loss(self, compute, arm, budget=None) -> np.ndarray:
        """Each point's loss: arm k's curve at its compute, times its budget group's offset."""
        arm = np.asarray(arm, dtype=int)
        log_x = np.log(np.asarray(compute, dtype=float) / self.C0) + np.asarray(self.log_m)[arm]
        shift = 0.0 if budget is None else np.asarray(self.offsets)[np.asarray(budget, dtype=int)]
        return (self.E + self.A * np.exp(-self.alpha * log_x)) * np.exp(shift)


def _ratio(log_m: float, alpha: float) -> float:
    """exp(log m), with a fit at the bound read as unbounded and a flat curve as undefined."""
    if alpha <= FLAT:
        return math.nan  # the loss does not depend on compute: no multiplier
    if abs(log_m) >= LOG_M_MAX - 1e-6:
        return math.inf if log_m > 0 else 0.0
    return math.exp(log_m)


def _groups(budget: np.ndarray | None, n: int, n_budgets: int) -> np.ndarray:
    """(n, G-1): each point's budget group as a one-hot over the groups with an offset (all but
    the last, the reference)."""
    group = np.full(n, n_budgets - 1) if budget is None else np.asarray(budget, dtype=int)
    return (group[:, None] == np.arange(n_budgets - 1)[None, :]).astype(float)


def _joint_residuals(
    log_u: np.ndarray,
    arm: np.ndarray,
    log_y: np.ndarray,
    n_arms: int,
    scale: np.ndarray | None = None,
    budget: np.ndarray | None = None,
    n_budgets: int = 1,
):
    """The joint model's log-space residuals and Jacobian for stacked parameters theta
    (S, 3 + n_arms - 1 + n_budgets - 1) = E, log A, alpha, log m_1, ..., delta_0, ...; log_y
    (S, n): the losses each row fits; scale (S, n): each point's noise sd, the residual is divided
    by (None: not scaled); budget (n): each point's budget group (None: all the reference)."""
    one_hot = (arm[:, None] == np.arange(1, n_arms)[None, :]).astype(float)  # (n, K-1)
    groups = _groups(budget, len(log_u), n_budgets)  # (n, G-1)
    m_end = 2 + n_arms

    def residuals(theta: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        E, log_A, alpha = theta[:, 0:1], theta[:, 1:2], theta[:, 2:3]
        log_x = log_u[None, :] + theta[:, 3:m_end] @ one_hot.T  # log(m C / C0) of each point
        power = np.exp(log_A - alpha * log_x)  # A (m C / C0)^-alpha
        predicted = np.maximum(E + power, 1e-12)
        J = np.empty((*log_x.shape, theta.shape[1]))  # d log L / d theta
        J[..., 0] = 1 / predicted
        J[..., 1] = power / predicted
        J[..., 2] = -power * log_x / predicted
        J[..., 3:m_end] = (-alpha * power / predicted)[..., None] * one_hot[None]
        J[..., m_end:] = groups[None]
        r = np.log(predicted) + theta[:, m_end:] @ groups.T - log_y[rows]
        if scale is None:
            return r, J
        return r / scale[rows], J / scale[rows][..., None]

    return residuals


def _joint_bounds(low: np.ndarray, n_arms: int, n_budgets: int = 1) -> np.ndarray:
    """(S, P, 2): E in [0, the row's lowest loss], log A in [-12, 6], alpha in [0, 3], |log m|
    at most LOG_M_MAX, each budget's offset within a factor e of the reference's."""
    rows = len(low)
    bounds = np.empty((rows, 1 + n_arms + n_budgets, 2))
    bounds[:, 0] = np.stack([np.zeros(rows), low], axis=1)
    bounds[:, 1] = (-12.0, 6.0)
    bounds[:, 2] = (0.0, ALPHA_MAX)
    bounds[:, 3 : 2 + n_arms] = (-LOG_M_MAX, LOG_M_MAX)
    bounds[:, 2 + n_arms :] = (-1.0, 1.0)
    return bounds


def _check_points(x: np.ndarray, y: np.ndarray, min_points: int) -> None:
    if len(x) < min_points:
        raise UserError(f"a fit of loss against compute needs {min_points} or more points, got {len(x)}")
    if len(set(x.tolist())) < 3:
        raise UserError("a fit of loss against compute needs points at 3 or more distinct computes")
    if not (np.all(np.isfinite(y)) and np.all(y > 0) and np.all(x > 0)):
        raise UserError("a fit of loss against compute needs positive, finite losses and computes")


def fit_joint(
    compute: Sequence[float],
    loss: Sequence[float],
    arm: Sequence[int],
    n_arms: int | None = None,
    C0: float | None = None,
    min_points: int = MIN_POINTS,
    delta: float = HUBER_DELTA,
    scale: Sequence[float] | None = None,
    budget: Sequence[int] | None = None,
) -> JointFit:
    """The Huber fit in log space of the joint model (module doc) from a grid of 12 starts;
    `arm` gives each point's arm (0: the baseline). Every arm needs a point. `scale`: each
    point's noise sd (residuals divided by it; delta then counts in sds); `budget`: each point's
    tokens-per-parameter group (0 the smallest), None for one group."""
    x, y = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    index = np.asarray(arm, dtype=int)
    _check_points(x, y, min_points)
    rows = None if scale is None else np.asarray(scale, dtype=float)[None, :]
    group = None if budget is None else np.asarray(budget, dtype=int)
    return fit_joint_many(x, y[None, :], index, n_arms, C0, delta, rows, budget=group)[0]


def fit_joint_many(
    compute: np.ndarray,
    loss: np.ndarray,
    arm: np.ndarray,
    n_arms: int | None = None,
    C0: float | None = None,
    delta: float = HUBER_DELTA,
    scale: np.ndarray | None = None,
    start: Sequence[JointFit] | None = None,
    budget: np.ndarray | None = None,
    n_budgets: int | None = None,
) -> list[JointFit]:
    """fit_joint of many ladders with the same points (`loss` (L, n): one ladder a row) at once;
    `scale` (L, n): each point's noise sd, or None; `start`: one fit per ladder to start from
    instead of the grid (a refit of nearly the same problem: a twelfth of the work); `budget`
    (n): each point's budget group, `n_budgets` how many (default: the largest group + 1)."""
    x, y = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    n_arms = int(arm.max()) + 1 if n_arms is None else n_arms
    if n_budgets is None:
        n_budgets = 1 if budget is None else int(np.max(budget)) + 1
    C0 = C0 or (start[0].C0 if start else float(np.exp(np.mean(np.log(x)))))
    low = y.min(axis=1)
    if start is not None:
        grid = [None]
        starts = inside_bounds(np.array([_theta_of(f, n_budgets) for f in start]), low, n_arms)[:, None]
    else:
        grid = [(e_share, alpha) for e_share in (0.0, 0.5, 0.9) for alpha in (0.1, 0.3, 0.6, 1.0)]
        starts = np.zeros((len(y), len(grid), 1 + n_arms + n_budgets))
        for j, (e_share, alpha) in enumerate(grid):
            starts[:, j, 0] = e_share * low
            starts[:, j, 1] = np.log(np.maximum(y.mean(axis=1) - e_share * low, 1e-6))
            starts[:, j, 2] = alpha
    log_y = np.repeat(np.log(y), len(grid), axis=0)  # row l * 12 + j: ladder l from start j
    scales = None if scale is None else np.repeat(np.broadcast_to(scale, y.shape), len(grid), axis=0)
    residuals = _joint_residuals(np.log(x / C0), arm, log_y, n_arms, scales, budget, n_budgets)
    rows = len(log_y)
    bounds = _joint_bounds(np.repeat(low, len(grid)), n_arms, n_budgets)
    theta = huber_fit(residuals, starts.reshape(rows, -1), bounds, delta)
    value = huber(residuals(theta, np.arange(rows))[0], delta).sum(axis=1).reshape(len(y), len(grid))
    best = theta.reshape(len(y), len(grid), -1)[np.arange(len(y)), value.argmin(axis=1)]
    return [_joint_of(row, C0, n_arms) for row in best]


def inside_bounds(starts: np.ndarray, low: np.ndarray, n_arms: int) -> np.ndarray:
    """Stacked parameters (S, P) moved strictly inside their bounds: E below the row's lowest loss
    `low`, each log m off its bound."""
    starts[:, 0] = np.minimum(starts[:, 0], 0.99 * low)
    starts[:, 3 : 2 + n_arms] = np.clip(starts[:, 3 : 2 + n_arms], -LOG_M_MAX + 0.5, LOG_M_MAX - 0.5)
    return starts


def _theta_of(fit: JointFit, n_budgets: int = 1) -> list[float]:
    """The stacked parameters of a fit (E, log A, alpha, log m_1, ..., delta_0, ...)."""
    offsets = list(fit.offsets[:-1]) if len(fit.offsets) == n_budgets else [0.0] * (n_budgets - 1)
    return [fit.E, math.log(fit.A), fit.alpha, *fit.log_m[1:], *offsets]


def _joint_of(theta: np.ndarray, C0: float, n_arms: int | None = None) -> JointFit:
    n_arms = len(theta) - 2 if n_arms is None else n_arms
    log_m = (0.0, *map(float, theta[3 : 2 + n_arms]))
    offsets = (*map(float, theta[2 + n_arms :]), 0.0)
    return JointFit(float(theta[0]), float(math.exp(theta[1])), float(theta[2]), C0, log_m, offsets)


def fit_curve(
    compute: Sequence[float],
    loss: Sequence[float],
    C0: float | None = None,
    min_points: int = MIN_POINTS,
) -> Fit:
    """One arm's own curve L(C) = E + A (C/C0)^-alpha: the joint model with one arm."""
    return fit_joint(compute, loss, [0] * len(compute), 1, C0, min_points).curve(0)
