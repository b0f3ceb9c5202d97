"""How sure the ladder's answers are: the noise of each point, the parametric bootstrap of the joint
fit, and the intervals read from its draws."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..plan.rates import sd_from_differences
from .curves import Fit, JointFit, _joint_bounds, _joint_of, _joint_residuals, _theta_of, inside_bounds
from .solver import HUBER_DELTA, huber_fit

BOOTSTRAP = 200
INTERVAL = 0.90


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
    except an arm whose seeds show it noisier than the others pooled (an F-test at `level`): it
    keeps its own sd and is left out of the pool (one unstable arm must not widen every
    interval). The test steps down: the noisiest arm is tested against the pool of the rest, and
    once found noisy it leaves the pool before the next is tested, so one very noisy arm cannot
    mask a second (noisy_arms)."""
    logs = {name: np.log(np.asarray(v, dtype=float)) for name, v in seeds.items() if len(v) >= 2}
    if not logs:
        return None
    var = {name: float(np.var(v, ddof=1)) for name, v in logs.items()}
    dof = {name: float(len(v) - 1) for name, v in logs.items()}
    noisy = noisy_arms(var, dof, level)
    pool, pool_dof = _pooled(var, dof, [n for n in logs if n not in noisy])
    return SeedNoise(
        {name: math.sqrt(var[name] if name in noisy else pool) for name in seeds},
        {name: name in noisy for name in seeds},
        {name: dof[name] if name in noisy else pool_dof for name in seeds},
        math.sqrt(pool),
    )


def _pooled(var: dict[str, float], dof: dict[str, float], names) -> tuple[float, float]:
    total = sum(dof[n] for n in names)
    return (sum(dof[n] * var[n] for n in names) / total if total else math.nan), total


def noisy_arms(var: dict[str, float], dof: dict[str, float], level: float = 0.01) -> set[str]:
    """The arms whose seed variance is larger than the pool of the others not yet found noisy
    (F-test, one-sided, at `level`), found one at a time, the most significant first. All noisy
    alike: none is (one pool)."""
    from scipy import stats

    noisy: set[str] = set()
    while True:
        found = {}
        for name in var:
            if name in noisy:
                continue
            rest, rest_dof = _pooled(var, dof, [n for n in var if n != name and n not in noisy])
            if not rest_dof or var[name] <= 0:
                continue
            found[name] = 0.0 if rest == 0 else float(stats.f.sf(var[name] / rest, dof[name], rest_dof))
        if not found or min(found.values()) >= level:
            break
        noisy.add(min(found, key=found.get))
    return set() if len(noisy) == len(var) else noisy


@dataclass
class JointBootstrap:
    """The point fit and its parametric bootstrap refits (theta rows as in fit_joint)."""

    fit: JointFit
    draws: list[JointFit]

    def multipliers(self, arm: int) -> np.ndarray:
        return np.array([d.multiplier(arm) for d in self.draws])

    def comparison(self, arm: int, level: float = INTERVAL) -> Comparison:
        return Comparison(self.fit.multiplier(arm), *interval(self.multipliers(arm), level))


def bootstrap_joint_many(
    points: Sequence[JointFit],
    compute: Sequence[float],
    arm: Sequence[int],
    noises: Sequence[Noise],
    draws: int,
    seed: int = 0,
    delta: float = HUBER_DELTA,
    weighted: bool = False,
    budget: Sequence[int] | None = None,
) -> list[JointBootstrap]:
    """Refits of the joint model to losses drawn about each ladder's point fit with its noise (many
    ladders with the same points: one point fit and noise each), all fitted at once, each started
    at its point fit. `weighted`: each refit divides the residuals by the noise's sd, as a weighted
    point fit did; `budget`: each point's budget group, as the point fits had it (curves.py)."""
    x = np.asarray(compute, dtype=float)
    index = np.asarray(arm, dtype=int)
    group = None if budget is None else np.asarray(budget, dtype=int)
    n_arms, n_budgets = len(points[0].log_m), len(points[0].offsets)
    C0 = points[0].C0
    rng = np.random.default_rng(seed)
    log_y, starts = [], []
    for point, noise in zip(points, noises):
        fitted = np.log(point.loss(x, index, group))
        log_y.append(fitted[None, :] + noise.draw(rng, draws))
        starts.append(np.tile(_theta_of(point, n_budgets), (draws, 1)))
    log_y = np.concatenate(log_y)
    low = np.exp(log_y.min(axis=1))  # each draw's lowest loss
    starts = inside_bounds(np.concatenate(starts), low, n_arms)
    scale = np.repeat(np.stack([n.sd for n in noises]), draws, axis=0) if weighted else None
    residuals = _joint_residuals(np.log(x / C0), index, log_y, n_arms, scale, group, n_budgets)
    theta = huber_fit(residuals, starts, _joint_bounds(low, n_arms, n_budgets), delta)
    fits = [_joint_of(row, C0, n_arms) for row in theta]
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


FLAG_SDS = 4.0  # a replicate pair further apart than this many seed sds marks its point unreliable


@dataclass(frozen=True)
class SizeNoise:
    """Seed noise per size (sd of log loss), from every replicate the plan holds: the seeds at
    their rung, and the pairs of runs of one config with two seeds (the sweep's run against the
    ladder's at the smallest size, the confirmation's against the ladder's at the largest). A
    size with no replicate takes the sd interpolated in log parameters between its measured
    neighbours (the nearest one's beyond them). Arms found noisier at the rung (an F-test,
    stepping down) keep their excess as a factor at every size."""

    sd: tuple[float, ...]  # per size, pooled over the arms
    dof: float  # the freedom of all the replicates together
    measured: dict[int, float]  # size -> the freedom measured there
    factor: dict[str, float]  # arm -> its sd over the pooled one at the rung (1: pooled)
    unreliable: tuple[tuple[str, int, float], ...] = ()  # (arm, size, log difference) of pairs flagged

    def point_sd(self, arm: str, sizes: Sequence[int]) -> np.ndarray:
        return np.asarray(self.sd)[np.asarray(sizes)] * self.factor.get(arm, 1.0)


def size_noise(
    rung_seeds: dict[str, Sequence[float]],
    rung_size: int,
    pairs: dict[int, dict[str, tuple[float, float]]],
    size_params: Sequence[float],
    level: float = 0.01,
    flag: float = FLAG_SDS,
) -> SizeNoise | None:
    """SizeNoise from the rung's seeds (per arm) and the replicate pairs (per size, per arm: the
    two losses). A pair whose log losses differ by more than `flag` times the rung's pooled sd is
    flagged unreliable and left out of its size's sd (an unlucky run is not seed noise: the
    robust fit carries it as lack of fit); where the size's pairs spread more than the rung's seeds
    (their median pair, robustly), the flag counts in that spread. None: no replicate at all."""
    rung = seed_noise(rung_seeds, level) if rung_seeds else None
    sums: dict[int, float] = {}
    dofs: dict[int, float] = {}
    if rung is not None and rung.pooled > 0:
        pooled_dof = next((rung.dof[n] for n in rung.sd if not rung.own[n]), 0.0)
        sums[rung_size], dofs[rung_size] = rung.pooled**2 * pooled_dof, pooled_dof
    reference = rung.pooled if rung is not None and rung.pooled > 0 else None
    differences = {
        size: {arm: math.log(a) - math.log(b) for arm, (a, b) in found.items()}
        for size, found in pairs.items()
    }
    if reference is None:  # no seeds: the pairs' own median spread is the reference
        every = [d for found in differences.values() for d in found.values()]
        reference = sd_from_differences(every) if every else None
    if reference is None or reference <= 0:
        return None
    unreliable = []
    for size, found in differences.items():
        # the size's own spread, robustly (the median pair: an unlucky run moves few of them), where
        # it is larger than the rung's: noise that grows at small sizes is not an unlucky run
        spread = sd_from_differences(list(found.values())) if found else 0.0
        limit = flag * max(reference, spread)
        for arm, d in found.items():
            if abs(d) > limit:
                unreliable.append((arm, size, d))
                continue
            sums[size] = sums.get(size, 0.0) + d * d / 2
            dofs[size] = dofs.get(size, 0.0) + 1
    measured = {s: dofs[s] for s in sorted(dofs) if dofs[s] > 0}
    log_sd = {s: 0.5 * math.log(max(sums[s] / dofs[s], 1e-12)) for s in measured}
    logs = np.log(np.asarray(size_params, dtype=float))
    known = sorted(measured)
    sd = tuple(
        float(np.exp(np.interp(logs[s], logs[known], [log_sd[k] for k in known]))) for s in range(len(logs))
    )
    factor = {}
    if rung is not None and rung.pooled > 0:
        factor = {arm: rung.sd[arm] / rung.pooled for arm in rung.sd if rung.own[arm]}
    return SizeNoise(sd, float(sum(measured.values())), measured, factor, tuple(unreliable))
