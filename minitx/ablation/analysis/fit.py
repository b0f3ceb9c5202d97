"""Scaling fits: one curve shared by every arm, a compute multiplier per arm, intervals that carry
the measured seed noise; a per-arm curve and Chinchilla's L(N, D) as second views.

The joint model (the headline). Every arm follows the baseline's curve with its compute scaled:

    L_k(C) = E + A * (m_k * C / C0)^(-alpha),      m_0 = 1 (the baseline)

so m_k is the compute multiplier itself: the baseline needs m_k times the compute to reach the
loss arm k reaches with C (> 1: the arm is worth more compute than it spends). E, A and alpha are
fitted to all arms' points at once, so an arm equal to the baseline gets m = 1 with a finite
interval; a curve per arm with its own E (the view before this one) cannot say that, since an
arm whose loss lies below the baseline's fitted E "needs infinite compute". The price: m is one
number over the ladder's range, the arm's average shift along log C; the per-arm curves stay as a
check of that (their alpha, and each arm's scatter about the joint curve).

The fit minimises a Huber loss of the residuals in log space, log L_k(C) - log L, from a grid of
12 starts (huber_fit: reweighted Gauss-Newton, many fits at once), with E bounded by the lowest
observed loss, alpha in [0, 3] and |log m| <= log(1e4) (a multiplier at that bound, or with alpha
at 0, has no finite value and prints as "unbounded"). Huber's delta is 1e-3 (OLMo-core's) where
the noise is unknown and 1.345 seed sds where it is measured: as efficient as least squares to 5%
under normal noise, and a diverged run still pulls the curve only linearly. C0 is the geometric
mean of the computes, so the optimiser never meets 1e15.

Intervals come from a parametric bootstrap: new losses drawn about the fitted curves with the
noise the sweep measured, refitted. The noise of a point, in log loss, is the seed sd pooled over
the arms at the seeds rung (an arm whose seeds are noisier by an F-test keeps its own), split into
a part shared by the points of one (arm, size) and a part of its own. The share is
1 - decay_fraction: a size's smaller budgets are decays branched from its longest run, so they
share that run's trunk, everything but their decay. An sd from few seeds is uncertain itself, so
each draw also redraws it (seed_noise, Noise.draw). A 90% interval then means: were the sweep run
again with other seeds, the multiplier found would lie in it 9 times in 10
(tests/ablation/test_ladder.py checks this on 200 simulated ladders with the showcase's noise).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ...errors import UserError

MIN_POINTS = 5
HUBER_DELTA = 1e-3
BOOTSTRAP = 200
INTERVAL = 0.90
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


@contextmanager
def one_blas_thread():
    """BLAS on one thread while fitting: L-BFGS-B calls it on small vectors, and OpenBLAS's
    threads then spin and wait, worst beside training runs (a fit took 10-60x longer, measured)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _huber(r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r**2, delta * (a - 0.5 * delta))


def huber_fit(
    residuals: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    starts: np.ndarray,
    bounds: np.ndarray,
    delta: float = HUBER_DELTA,
    iterations: int = 400,
) -> np.ndarray:
    """Many independent small Huber fits at once. `residuals` maps parameters (S, P) to the
    log-space residuals (S, n) and their Jacobian (S, n, P); each row minimises
    sum Huber(r) within `bounds` (S, P, 2) from its start. Iteratively reweighted Gauss-Newton:
    the Huber loss is sum w r^2 / 2 with w = min(1, delta / |r|) held at the current r, a damped
    (Levenberg-Marquardt) step solves that least squares, a row keeps a step only if its Huber
    loss fell (else its damping grows), and a step is clipped into the bounds. A fixed point has
    J^T (w r) = J^T psi(r) = 0: the Huber fit's own condition. A bootstrap's 200 refits cost as
    many numpy calls as one; tests/ablation/test_ladder.py checks it against scipy's L-BFGS-B."""
    theta = np.clip(starts.astype(float), bounds[..., 0], bounds[..., 1])
    rows, P = theta.shape
    r, J = residuals(theta, np.arange(rows))
    loss = _huber(r, delta).sum(axis=1)
    damping = np.full(rows, 1e-3)
    active = np.arange(rows)  # the rows still moving: a converged row costs nothing more
    eye = np.eye(P)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"), one_blas_thread():
        for _ in range(iterations):
            if active.size == 0:
                break
            ra, Ja, now = r[active], J[active], theta[active]
            w = np.minimum(1.0, delta / np.maximum(np.abs(ra), 1e-300))
            JtW = np.swapaxes(Ja, 1, 2) * w[:, None, :]
            H = JtW @ Ja
            g = (JtW @ ra[..., None])[..., 0]
            scale = np.maximum(np.diagonal(H, axis1=1, axis2=2), 1e-12)
            system = H + damping[active, None, None] * (scale[:, :, None] * eye) + 1e-15 * eye
            step = -np.linalg.solve(system, g[..., None])[..., 0]
            trial = np.clip(now + np.nan_to_num(step), bounds[active, :, 0], bounds[active, :, 1])
            r_new, J_new = residuals(trial, active)
            loss_new = _huber(r_new, delta).sum(axis=1)
            better = loss_new < loss[active]
            keep = active[better]
            theta[keep], r[keep], J[keep], loss[keep] = (
                trial[better],
                r_new[better],
                J_new[better],
                loss_new[better],
            )
            damping[active] = np.where(better, np.maximum(damping[active] / 3, 1e-9), damping[active] * 4)
            # done: the step moved no parameter by more than 1e-7, or no step can lower the loss
            small = np.max(np.abs(trial - now), axis=1) < 1e-7
            active = active[~(small | (damping[active] > 1e8))]
    return theta


# -- the joint model -------------------------------------------------------------------------------
@dataclass(frozen=True)
class JointFit:
    """L_k(C) = E + A (m_k C / C0)^-alpha over arms k = 0 (the baseline, m_0 = 1), 1, 2, ..."""

    E: float
    A: float
    alpha: float
    C0: float
    log_m: tuple[float, ...]  # per arm; log_m[0] = 0

    def multiplier(self, arm: int) -> float:
        return _ratio(self.log_m[arm], self.alpha)

    def curve(self, arm: int) -> Fit:
        """Arm k's own curve: the shared one with its A scaled by m_k^-alpha."""
        return Fit(self.E, self.A * math.exp(-self.alpha * self.log_m[arm]), self.alpha, self.C0)


def _ratio(log_m: float, alpha: float) -> float:
    """exp(log m), with a fit at the bound read as unbounded and a flat curve as undefined."""
    if alpha <= FLAT:
        return math.nan  # the loss does not depend on compute: no multiplier
    if abs(log_m) >= LOG_M_MAX - 1e-6:
        return math.inf if log_m > 0 else 0.0
    return math.exp(log_m)


def _joint_residuals(log_u: np.ndarray, arm: np.ndarray, log_y: np.ndarray, n_arms: int):
    """The joint model's log-space residuals and Jacobian for stacked parameters theta
    (S, 3 + n_arms - 1) = E, log A, alpha, log m_1, ...; log_y (S, n): the losses each row fits."""
    one_hot = (arm[:, None] == np.arange(1, n_arms)[None, :]).astype(float)  # (n, K-1)

    def residuals(theta: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        E, log_A, alpha = theta[:, 0:1], theta[:, 1:2], theta[:, 2:3]
        log_x = log_u[None, :] + theta[:, 3:] @ one_hot.T  # log(m C / C0) of each point
        power = np.exp(log_A - alpha * log_x)  # A (m C / C0)^-alpha
        predicted = np.maximum(E + power, 1e-12)
        J = np.empty((*log_x.shape, theta.shape[1]))  # d log L / d theta
        J[..., 0] = 1 / predicted
        J[..., 1] = power / predicted
        J[..., 2] = -power * log_x / predicted
        J[..., 3:] = (-alpha * power / predicted)[..., None] * one_hot[None]
        return np.log(predicted) - log_y[rows], J

    return residuals


def _joint_bounds(low: np.ndarray, n_arms: int) -> np.ndarray:
    """(S, P, 2): E in [0, the row's lowest loss], log A in [-12, 6], alpha in [0, 3], |log m|
    at most LOG_M_MAX."""
    rows = len(low)
    bounds = np.empty((rows, 2 + n_arms, 2))
    bounds[:, 0] = np.stack([np.zeros(rows), low], axis=1)
    bounds[:, 1] = (-12.0, 6.0)
    bounds[:, 2] = (0.0, ALPHA_MAX)
    bounds[:, 3:] = (-LOG_M_MAX, LOG_M_MAX)
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
) -> JointFit:
    """The Huber fit in log space of the joint model (module doc) from a grid of 12 starts;
    `arm` gives each point's arm (0: the baseline). Every arm needs a point."""
    x, y = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    index = np.asarray(arm, dtype=int)
    _check_points(x, y, min_points)
    return fit_joint_many(x, y[None, :], index, n_arms, C0, delta)[0]


def fit_joint_many(
    compute: np.ndarray,
    loss: np.ndarray,
    arm: np.ndarray,
    n_arms: int | None = None,
    C0: float | None = None,
    delta: float = HUBER_DELTA,
) -> list[JointFit]:
    """fit_joint of many ladders with the same points (`loss` (L, n): one ladder a row) at once."""
    x, y = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    n_arms = int(arm.max()) + 1 if n_arms is None else n_arms
    C0 = C0 or float(np.exp(np.mean(np.log(x))))
    low = y.min(axis=1)
    grid = [(e_share, alpha) for e_share in (0.0, 0.5, 0.9) for alpha in (0.1, 0.3, 0.6, 1.0)]
    starts = np.zeros((len(y), len(grid), 2 + n_arms))
    for j, (e_share, alpha) in enumerate(grid):
        E = e_share * low
        starts[:, j, 0] = E
        starts[:, j, 1] = np.log(np.maximum(y.mean(axis=1) - E, 1e-6))
        starts[:, j, 2] = alpha
    log_y = np.repeat(np.log(y), len(grid), axis=0)  # row l * 12 + j: ladder l from start j
    residuals = _joint_residuals(np.log(x / C0), arm, log_y, n_arms)
    rows = len(log_y)
    bounds = _joint_bounds(np.repeat(low, len(grid)), n_arms)
    theta = huber_fit(residuals, starts.reshape(rows, -1), bounds, delta)
    value = _huber(residuals(theta, np.arange(rows))[0], delta).sum(axis=1).reshape(len(y), len(grid))
    best = theta.reshape(len(y), len(grid), -1)[np.arange(len(y)), value.argmin(axis=1)]
    return [_joint_of(row, C0) for row in best]


def _joint_of(theta: np.ndarray, C0: float) -> JointFit:
    return JointFit(
        float(theta[0]), float(math.exp(theta[1])), float(theta[2]), C0, (0.0, *map(float, theta[3:]))
    )


def fit_curve(
    compute: Sequence[float],
    loss: Sequence[float],
    C0: float | None = None,
    min_points: int = MIN_POINTS,
) -> Fit:
    """One arm's own curve L(C) = E + A (C/C0)^-alpha: the joint model with one arm."""
    return fit_joint(compute, loss, [0] * len(compute), 1, C0, min_points).curve(0)


@dataclass(frozen=True)
class Noise:
    """The noise of each point's log loss: its sd, the share of its variance common to the
    points of its group (an arm at one size: one trunk), the group of each point, and the
    estimate each sd comes from with that estimate's degrees of freedom (None: sd known)."""

    sd: np.ndarray  # (n,)
    shared: float
    group: np.ndarray  # (n,) ints
    source: np.ndarray | None = None  # (n,) ints: the estimate of each point's sd
    dof: Sequence[float] = ()  # per estimate

    def draw(self, rng: np.random.Generator, draws: int) -> np.ndarray:
        """(draws, n) noise: sqrt(shared) of each group's draw plus sqrt(1 - shared) of its own.
        An sd estimated from few seeds is itself uncertain: each draw scales it by
        sqrt(dof / chi2(dof)), the spread of the sd that could have given the estimate, so the
        intervals carry that too (with 2 seeds' worth of freedom the tails are wide, as they are)."""
        groups = int(self.group.max()) + 1
        common = rng.standard_normal((draws, groups))[:, self.group]
        own = rng.standard_normal((draws, len(self.sd)))
        sd = np.broadcast_to(self.sd, (draws, len(self.sd)))
        if self.source is not None:
            dof = np.asarray(self.dof, dtype=float)
            scale = np.sqrt(dof / rng.chisquare(dof, (draws, len(dof))))
            sd = sd * scale[:, self.source]
        return sd * (math.sqrt(self.shared) * common + math.sqrt(1 - self.shared) * own)


@dataclass(frozen=True)
class SeedNoise:
    """The measured seed noise of each arm (sd of log loss over its seeds at the seeds rung):
    seed_noise says how it is estimated."""

    sd: dict[str, float]
    own: dict[str, bool]  # True: the arm's own sd; False: the pooled one
    dof: dict[str, float]  # the freedom of each arm's sd: its seeds less one, or the pool's
    pooled: float  # the sd the arms share

    def noise(self, arms: Sequence[str], group: Sequence[int], shared: float) -> Noise:
        """The Noise of points of `arms` (one name a point) in groups `group`: estimate 0 is the
        pooled sd, shared by the arms that use it (one draw of its sd serves them all)."""
        sources = ["", *[name for name in self.sd if self.own[name]]]
        source = np.array([sources.index(name if self.own[name] else "") for name in arms])
        median_dof = next((self.dof[n] for n in self.sd if not self.own[n]), 1.0)
        dof = [median_dof, *[self.dof[name] for name in sources[1:]]]
        sd = np.array([self.sd[name] for name in arms])
        return Noise(sd, shared, np.asarray(group, dtype=int), source, dof)


def seed_noise(seeds: dict[str, Sequence[float]], level: float = 0.01) -> SeedNoise | None:
    """SeedNoise of each arm's final losses over seeds (None: no arm has 2 or more). The arms
    share one level, their pooled variance (unbiased, with the freedom of all their seeds),
    except an arm whose seeds show it noisier than the others pooled (an F-test at `level`):
    it keeps its own sd and is left out of the pool (one unstable arm must not widen every
    interval)."""
    from scipy import stats

    logs = {name: np.log(np.asarray(v, dtype=float)) for name, v in seeds.items() if len(v) >= 2}
    if not logs:
        return None
    var = {name: float(np.var(v, ddof=1)) for name, v in logs.items()}
    dof = {name: float(len(v) - 1) for name, v in logs.items()}

    def pooled(names) -> tuple[float, float]:
        total = sum(dof[n] for n in names)
        return (sum(dof[n] * var[n] for n in names) / total if total else math.nan), total

    noisy = set()
    for name in logs:
        rest, rest_dof = pooled([n for n in logs if n != name])
        if (
            rest_dof
            and var[name] > 0
            and (rest == 0 or stats.f.sf(var[name] / rest, dof[name], rest_dof) < level)
        ):
            noisy.add(name)
    if len(noisy) == len(logs):
        noisy = set()  # all alike noisy: one pool
    pool, pool_dof = pooled([n for n in logs if n not in noisy])
    return SeedNoise(
        {name: math.sqrt(var[name] if name in noisy else pool) for name in seeds},
        {name: name in noisy for name in seeds},
        {name: dof[name] if name in noisy else pool_dof for name in seeds},
        math.sqrt(pool),
    )


@dataclass
class JointBootstrap:
    """The point fit and its parametric bootstrap refits (theta rows as in fit_joint)."""

    fit: JointFit
    draws: list[JointFit]

    def multipliers(self, arm: int) -> np.ndarray:
        return np.array([d.multiplier(arm) for d in self.draws])

    def comparison(self, arm: int, level: float = INTERVAL) -> Comparison:
        return Comparison(self.fit.multiplier(arm), *interval(self.multipliers(arm), level))


def bootstrap_joint(
    point: JointFit,
    compute: Sequence[float],
    arm: Sequence[int],
    noise: Noise,
    draws: int | None = None,
    seed: int = 0,
    delta: float = HUBER_DELTA,
) -> JointBootstrap:
    """Refits of the joint model to losses drawn about `point`'s curves with `noise`, all
    fitted at once, each started at the point fit (module doc)."""
    draws = BOOTSTRAP if draws is None else draws
    return bootstrap_joint_many([point], compute, arm, [noise], draws, seed, delta)[0]


def bootstrap_joint_many(
    points: Sequence[JointFit],
    compute: Sequence[float],
    arm: Sequence[int],
    noises: Sequence[Noise],
    draws: int,
    seed: int = 0,
    delta: float = HUBER_DELTA,
) -> list[JointBootstrap]:
    """bootstrap_joint of many ladders with the same points (one point fit and noise each)."""
    x = np.asarray(compute, dtype=float)
    index = np.asarray(arm, dtype=int)
    n_arms = len(points[0].log_m)
    C0 = points[0].C0
    rng = np.random.default_rng(seed)
    log_y, starts = [], []
    for point, noise in zip(points, noises):
        fitted = np.log(point.curve(0).loss(x * np.exp(np.asarray(point.log_m)[index])))
        log_y.append(fitted[None, :] + noise.draw(rng, draws))
        start = [point.E, math.log(point.A), point.alpha, *point.log_m[1:]]
        starts.append(np.tile(start, (draws, 1)))
    log_y, starts = np.concatenate(log_y), np.concatenate(starts)
    # each start strictly inside its bounds: E below the draw's lowest loss, log m off its bound
    low = np.exp(log_y.min(axis=1))
    starts[:, 0] = np.minimum(starts[:, 0], 0.99 * low)
    starts[:, 3:] = np.clip(starts[:, 3:], -LOG_M_MAX + 0.5, LOG_M_MAX - 0.5)
    residuals = _joint_residuals(np.log(x / C0), index, log_y, n_arms)
    theta = huber_fit(residuals, starts, _joint_bounds(low, n_arms), delta)
    fits = [_joint_of(row, C0) for row in theta]
    return [JointBootstrap(point, fits[i * draws : (i + 1) * draws]) for i, point in enumerate(points)]


# -- intervals ------------------------------------------------------------------------------------
def interval(values: Sequence[float], level: float = INTERVAL) -> tuple[float, float]:
    """The central `level` interval of bootstrap draws by order statistics, no interpolation (a
    bound is a value some draw took, or inf): with n draws and k = floor((1 - level) / 2 (n + 1)),
    the k-th smallest and the k-th largest (symmetric: with 60 draws the 3rd from each end).
    NaN draws sort last, as if larger than any number: a draw with no answer cannot bound the
    interval above."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return math.nan, math.nan
    v = np.sort(np.where(np.isnan(v), math.inf, v))
    n = len(v)
    k = max(1, math.floor((1 - level) / 2 * (n + 1) + 1e-9))
    return float(v[k - 1]), float(v[n - k])


@dataclass
class Comparison:
    """An arm against the baseline: the multiplier and its interval."""

    multiplier: float
    low: float
    high: float

    @property
    def excludes_one(self) -> bool:
        return self.low > 1 or self.high < 1

    @property
    def bounded(self) -> bool:
        return 0 < self.low and self.high < math.inf


@dataclass
class Curve:
    """An arm's curve under the joint fit, its bootstrap draws and the largest x among its points."""

    fit: Fit
    draws: list[Fit]
    largest: float


# -- Chinchilla's L(N, D), a second view ------------------------------------------------------
@dataclass(frozen=True)
class NDFit:
    """L(N, D) = E + A (N/N0)^-a + B (D/D0)^-b (Chinchilla's third approach)."""

    E: float
    A: float
    a: float
    B: float
    b: float
    N0: float
    D0: float

    def loss(self, N, D):
        return (
            self.E
            + self.A * (np.asarray(N) / self.N0) ** (-self.a)
            + self.B * (np.asarray(D) / self.D0) ** (-self.b)
        )

    def tokens_for(self, N: float, loss: float) -> float:
        """The tokens at which a model of N parameters reaches `loss` (inf: never; nan: flat in D)."""
        if self.b <= FLAT or self.B <= 0:
            return math.nan
        reducible = loss - self.E - self.A * (N / self.N0) ** (-self.a)
        if reducible <= 0:
            return math.inf
        return self.D0 * (reducible / self.B) ** (-1.0 / self.b)


def fit_nd(
    params: Sequence[float],
    tokens: Sequence[float],
    loss: Sequence[float],
    N0: float | None = None,
    D0: float | None = None,
) -> NDFit:
    """The Huber fit in log space of L(N, D), written as log L = LSE(e, log A - a log n,
    log B - b log d) (n, d: N and D over their geometric means) so every term stays positive,
    from a grid of 3^4 starts in (e, a, b, the split of the reducible loss). N0, D0: the
    reference sizes (default: the points' geometric means). Needs points at
    3 or more sizes and 3 or more token counts: five parameters need both axes to vary."""
    N, D, y = (np.asarray(v, dtype=float) for v in (params, tokens, loss))
    if len(set(N.tolist())) < 3 or len(set(D.tolist())) < 3 or len(y) < 7:
        raise UserError("L(N, D) needs 3 or more sizes and 3 or more token counts (7 or more points)")
    N0 = N0 or float(np.exp(np.mean(np.log(N))))  # given: A and B comparable across arms
    D0 = D0 or float(np.exp(np.mean(np.log(D))))
    log_n, log_d, log_y = np.log(N / N0), np.log(D / D0), np.log(y)
    low = float(y.min())

    def residuals(theta: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        e, la, a, lb, b = (theta[:, i : i + 1] for i in range(5))
        terms = np.stack([np.broadcast_to(e, (len(theta), len(y))), la - a * log_n, lb - b * log_d])
        top = terms.max(axis=0)
        weights = np.exp(terms - top)
        share = weights / weights.sum(axis=0)  # d log L / d each term
        J = np.stack([share[0], share[1], -share[1] * log_n, share[2], -share[2] * log_d], axis=-1)
        return top + np.log(weights.sum(axis=0)) - log_y, J  # log L, the LSE, minus log y

    starts = []
    for e_share in (0.3, 0.6, 0.9):
        for a in (0.1, 0.4, 1.0):
            for b in (0.1, 0.4, 1.0):
                for split in (0.25, 0.5, 0.75):
                    rest = max(float(np.mean(y)) - e_share * low, 1e-3)
                    starts.append(
                        [math.log(e_share * low), math.log(split * rest), a, math.log((1 - split) * rest), b]
                    )
    starts = np.array(starts)
    bounds = np.empty((len(starts), 5, 2))
    bounds[:] = [(-10.0, math.log(low)), (-12.0, 6.0), (0.0, ALPHA_MAX), (-12.0, 6.0), (0.0, ALPHA_MAX)]
    theta = huber_fit(residuals, starts, bounds)
    e, la, a, lb, b = theta[int(np.argmin(_huber(residuals(theta, np.arange(len(theta)))[0]).sum(axis=1)))]
    return NDFit(math.exp(e), math.exp(la), float(a), math.exp(lb), float(b), N0, D0)
