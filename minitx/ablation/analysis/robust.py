"""Answers that survive a ladder that is not a perfect curve.

No real ladder lies on its fitted curve within seed noise: a trunk trained at an unlucky rate,
noise that grows at small sizes, an arm whose curve bends a little differently. Seed noise
measured at one rung then understates how far the points stray, and intervals built from it alone
give daggers to arms that equal the baseline. Three guards, each a small pure function here:

1. **Noise at least the arm's own lack of fit** (`fit_robust`). Each point's noise is its seed
   noise (per size, from the replicates the plan already has: uncertainty.SizeNoise) times its
   arm's dispersion lambda_k = max(1, rms of the arm's residuals in seed sds), estimated as in a
   quasi-likelihood fit: sum of squared standardised residuals over the points' share of the
   freedom left after the fit. The fit is weighted by these sds (Huber at 1.345 of them) and
   redone once with the raised noise. In the bootstrap an arm whose noise was raised draws its
   sd from that estimate's own uncertainty: a chi-square with the freedom of its residuals,
   counted by trunk (the budgets of one size share one run, so they are worth about
   sum b^2 / (b + b (b - 1) rho^2) independent points, rho the shared share of variance).
2. **Leave one size out** (`without_each_size`): the point fit again without each size. A dagger
   needs the interval to exclude 1 *and* every such refit to stay on the same side of 1; an arm
   whose interval excludes 1 but whose side one size decides is *fragile*, with that size named.
3. **A held-out rung** (`predict_held_out`): the whole method applied without the largest size,
   predicting each arm's loss there with a 90% predictive interval (the refits' curves at that
   compute, plus a new point's noise), to set beside what was measured.

Each function takes many ladders with the same points at once (rows of `loss`), so the
calibration simulations (simulation.py) run the report's own code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .curves import JointFit, fit_joint_many
from .uncertainty import INTERVAL, Comparison, JointBootstrap, Noise, bootstrap_joint_many, interval

DELTA_SDS = 1.345  # Huber's delta in noise sds: 95% as efficient as least squares under normal noise
PARAMETERS = 3  # E, A, alpha, shared by every arm (each arm but the baseline adds its log m)


@dataclass(frozen=True)
class LadderData:
    """The points of one ladder design: compute, arm (0: the baseline) and size (0: the smallest)
    of each; `loss` (L, n): one or many ladders' losses at those points; `seed_sd` (L, n): each
    point's seed noise (sd of log loss), with `seed_dof` degrees of freedom; `shared`: the share
    of a point's noise variance common to the points of its trunk (an arm at one size)."""

    compute: np.ndarray
    arm: np.ndarray
    size: np.ndarray
    loss: np.ndarray
    seed_sd: np.ndarray
    seed_dof: float
    shared: float
    budget: np.ndarray | None = None  # each point's tokens-per-parameter group (curves.py); None: one

    @property
    def n_arms(self) -> int:
        return int(self.arm.max()) + 1

    @property
    def n_budgets(self) -> int:
        return 1 if self.budget is None else int(self.budget.max()) + 1

    @property
    def trunk(self) -> np.ndarray:
        """Each point's trunk: its arm at its size."""
        return self.arm * (int(self.size.max()) + 1) + self.size

    def subset(self, keep: np.ndarray) -> LadderData:
        return LadderData(
            self.compute[keep], self.arm[keep], self.size[keep], self.loss[:, keep], self.seed_sd[:, keep],
            self.seed_dof, self.shared, None if self.budget is None else self.budget[keep],
        )  # fmt: skip

    def fit(self, scale: np.ndarray, start: list[JointFit] | None = None, keep=None) -> list[JointFit]:
        """The weighted joint fit of every ladder (its points `keep`, default all), with its
        budget groups: the same n_budgets whatever the subset, so fits stay comparable."""
        part = self if keep is None else self.subset(keep)
        scale = scale if keep is None else scale[:, keep]
        return fit_joint_many(
            part.compute, part.loss, part.arm, self.n_arms, delta=DELTA_SDS, scale=scale, start=start,
            budget=part.budget, n_budgets=self.n_budgets,
        )  # fmt: skip

    def bootstrap(self, fits: RobustFit, draws: int, seed: int) -> list[JointBootstrap]:
        return bootstrap_joint_many(
            fits.joints, self.compute, self.arm, fits.noises, draws, seed, DELTA_SDS, weighted=True,
            budget=self.budget,
        )  # fmt: skip


@dataclass
class RobustFit:
    """The fit of each ladder: the joint curve, each arm's dispersion (>= 1) and its freedom, and
    the noise its bootstrap draws (per ladder)."""

    joints: list[JointFit]
    dispersion: np.ndarray  # (L, arms)
    dispersion_dof: np.ndarray  # (arms,)
    noises: list[Noise]
    sd: np.ndarray  # (L, n): each point's noise as the intervals carry it
    boots: list[JointBootstrap] = field(default_factory=list)  # per ladder, once answer() drew them


def trunk_freedom(data: LadderData) -> np.ndarray:
    """Per arm: how many independent points its residuals are worth, its trunks counted by the
    shared share rho (b points of one trunk: b^2 / (b + b (b - 1) rho^2), Satterthwaite's)."""
    rho2 = data.shared**2
    worth = np.zeros(data.n_arms)
    for trunk in np.unique(data.trunk):
        members = data.trunk == trunk
        b = int(members.sum())
        worth[data.arm[members][0]] += b * b / (b + b * (b - 1) * rho2)
    return worth


def dispersion(data: LadderData, joints: list[JointFit]) -> tuple[np.ndarray, np.ndarray]:
    """Each arm's dispersion lambda (>= 1) per ladder and its degrees of freedom: the rms of its
    residuals in seed sds, over the share of the freedom the fit leaves (P of n parameters)."""
    n, arms = len(data.compute), data.n_arms
    left = max(1e-3, 1 - (PARAMETERS + arms - 1 + data.n_budgets - 1) / n)
    z2 = (residuals(data, joints) / data.seed_sd) ** 2
    counts = np.bincount(data.arm, minlength=arms)
    sums = np.stack([np.bincount(data.arm, weights=row, minlength=arms) for row in z2])
    lam = np.sqrt(sums / np.maximum(counts * left, 1e-9))
    return np.maximum(1.0, lam), np.maximum(1.0, trunk_freedom(data) * left)


def residuals(data: LadderData, joints: list[JointFit]) -> np.ndarray:
    """(L, n) log-loss residuals, fitted minus measured."""
    return np.stack([np.log(j.loss(data.compute, data.arm, data.budget)) for j in joints]) - np.log(data.loss)


def fit_robust(data: LadderData, raise_noise: bool = True) -> RobustFit:
    """The weighted joint fit with each arm's noise raised to its lack of fit (module doc, 1);
    `raise_noise` False: the seed noise alone (the method before this one, for comparison)."""
    joints = data.fit(data.seed_sd)
    lam, dof = dispersion(data, joints)
    if not raise_noise:
        lam = np.ones_like(lam)
    sd = data.seed_sd * lam[:, data.arm]
    if raise_noise:  # refit with the raised noise, from the first fit; its dispersion is the one used
        joints = data.fit(sd, start=joints)
        lam, dof = dispersion(data, joints)
        sd = data.seed_sd * lam[:, data.arm]
    # estimate 0: the seed noise; arm k's own estimate (source k + 1) where its noise was raised
    dofs = [data.seed_dof, *map(float, dof)]
    sources = np.where(lam[:, data.arm] > 1.0, data.arm + 1, 0)
    noises = [Noise(sd[row], data.shared, data.trunk, sources[row], dofs) for row in range(len(data.loss))]
    return RobustFit(joints, lam, dof, noises, sd)


@dataclass
class ArmAnswer:
    """One arm's answer from the ladder: its multiplier with the interval, the multiplier with each
    size left out, and the verdict they allow together."""

    comparison: Comparison
    without: dict[int, float] = field(default_factory=dict)  # size left out -> multiplier
    dispersion: float = 1.0

    @property
    def fragile_size(self) -> int | None:
        """The size whose removal puts the multiplier on the other side of 1 (the farthest), or None."""
        m = self.comparison.multiplier
        if not (m > 0 and math.isfinite(m)) or m == 1:
            return None
        side = math.copysign(1.0, math.log(m))
        crossed = {s: v for s, v in self.without.items() if not (v > 0 and side * math.log(v) > 0)}
        if not crossed:
            return None
        return min(crossed, key=lambda s: side * math.log(crossed[s]) if crossed[s] > 0 else -math.inf)

    @property
    def verdict(self) -> str:
        """ "better", "worse", "fragile" or "no difference found"."""
        c = self.comparison
        if not c.excludes_one:
            return "no difference found"
        if self.fragile_size is not None:
            return "fragile"
        return "better" if c.low > 1 else "worse"

    @property
    def dagger(self) -> bool:
        return self.verdict in ("better", "worse")


def without_each_size(data: LadderData, sd: np.ndarray, start: list[JointFit]) -> dict[int, list[JointFit]]:
    """The point fit of every ladder again without each size (its weights kept, started from the
    full fit); a size whose removal leaves too few points for a fit is skipped."""
    found = {}
    for s in np.unique(data.size):
        keep = data.size != s
        part = data.subset(keep)
        if len(set(part.compute.tolist())) < 3 or len(np.unique(part.arm)) < data.n_arms:
            continue
        found[int(s)] = data.fit(sd, start=start, keep=keep)
    return found


def answer(
    data: LadderData, draws: int = 200, seed: int = 0, level: float = INTERVAL, robust_noise: bool = True
) -> tuple[RobustFit, list[list[ArmAnswer]]]:
    """Each ladder's robust fit and, per arm but the baseline, its answer (module doc, 1 and 2).
    `robust_noise` False: the seed noise alone, and no size left out (the method before)."""
    robust = fit_robust(data, robust_noise)
    boots = robust.boots = data.bootstrap(robust, draws, seed)
    loso = without_each_size(data, robust.sd, robust.joints) if robust_noise else {}
    answers = [
        [
            ArmAnswer(
                boot.comparison(k, level),
                {s: fits[row].multiplier(k) for s, fits in loso.items()},
                float(robust.dispersion[row, k]),
            )
            for k in range(1, data.n_arms)
        ]
        for row, boot in enumerate(boots)
    ]
    return robust, answers


@dataclass(frozen=True)
class Prediction:
    """An arm's loss at a held-out point: predicted, its predictive interval, and measured."""

    arm: int
    size: int
    compute: float
    measured: float
    predicted: float
    low: float
    high: float

    @property
    def covered(self) -> bool:
        return self.low <= self.measured <= self.high


def predict_held_out(
    data: LadderData, draws: int = 200, seed: int = 1, level: float = INTERVAL
) -> list[list[Prediction]]:
    """The method applied without the largest size, each ladder's arms predicted at that size's
    points (module doc, 3)."""
    top = int(data.size.max())
    held = data.size == top
    targets = Targets(data.compute[held], data.arm[held], data.size[held], data.loss[:, held],
                      None if data.budget is None else data.budget[held])  # fmt: skip
    return predict(data.subset(~held), targets, draws, seed, level)


@dataclass(frozen=True)
class Targets:
    """Points to predict: compute, arm, size and budget group of each, and what was measured
    there (L, m), one row per ladder as LadderData.loss."""

    compute: np.ndarray
    arm: np.ndarray
    size: np.ndarray
    measured: np.ndarray
    budget: np.ndarray | None = None


def predict(
    data: LadderData, targets: Targets, draws: int = 200, seed: int = 1, level: float = INTERVAL
) -> list[list[Prediction]]:
    """Each ladder's fit (the whole method on `data`) predicting the `targets`, none of which it
    saw. The predictive interval carries the refits' spread of the curve and a new point's noise:
    the arm's noise at the largest size fitted (its seed sd times the arm's dispersion: nothing
    measured at a target is used), its sd redrawn from its freedom."""
    robust = fit_robust(data)
    boots = data.bootstrap(robust, draws, seed)
    rng = np.random.default_rng(seed + 1)
    below = int(data.size.max())
    found = []
    for row, boot in enumerate(boots):
        row_found = []
        for i in range(len(targets.compute)):
            k = int(targets.arm[i])
            b = None if targets.budget is None else targets.budget[i : i + 1]
            near = (data.arm == k) & (data.size == below)
            sd = float(np.mean(robust.sd[row][near])) if near.any() else float(np.mean(robust.sd[row]))
            dof = float(robust.dispersion_dof[k]) if robust.dispersion[row, k] > 1 else data.seed_dof
            c = targets.compute[i : i + 1]
            curves = np.array([float(d.loss(c, [k], b)[0]) for d in boot.draws])
            spread = sd * np.sqrt(dof / rng.chisquare(dof, draws)) * rng.standard_normal(draws)
            low, high = interval(curves * np.exp(spread), level)
            point = float(robust.joints[row].loss(c, [k], b)[0])
            measured = float(targets.measured[row, i])
            row_found.append(Prediction(k, int(targets.size[i]), float(c[0]), measured, point, low, high))
        found.append(row_found)
    return found
