"""Ladders whose truth is known, for checking the method on data it does not assume.

A simulated ladder has the showcase's design (configs/ablation_ladder.yaml: 4 sizes x 3 budgets
of tokens per parameter, a size's budgets branched from one trunk, 3 seeds at d48 @ 20, and the
plan's two replicate pairs: the sweep's run against the ladder's at the smallest size, the
confirmation's against the ladder's at the largest) and the showcase's fitted law. Its noise can
break the method's assumptions on purpose (`Scenario`):

- unlucky trunks: each run (a trunk and its branches) with probability `unlucky` ends
  U(unlucky_low, unlucky_high) higher in log loss, as a rate near the edge of stability does
  on an unlucky seed (two of the showcase's 16 replicate pairs differed by 0.085 and 0.042);
- noise that varies by size (`size_noise`: a factor per size on the seed sd);
- one arm whose curve bends: its log loss tilts linearly in log compute, by `bend` seed sds at
  the ladder's ends, the tilt made orthogonal to what a change of multiplier does to its points,
  so the single multiplier that fits it best is still its planted one (an A/A arm with another
  shape, within noise);
- a budget-dependent bias (`budget_bias`): at equal compute, a short budget (few tokens per
  parameter) ends higher in log loss than a long one, by a constant per budget, or growing with
  size (`bias_growth`: the factor at the largest size over the smallest), as the showcase's d64
  points at 5 tokens/param were (the cause: curves.py).

`run_method` applies the report's own analysis (uncertainty.size_noise, robust.answer) to each
ladder, so the rates printed here are the rates of the code that writes results.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import robust
from .curves import Fit
from .decisions import decision_accuracy, verdict_score
from .uncertainty import size_noise

# The showcase's design: non-embedding parameters per size, tokens per parameter per budget, and
# FLOPs per token ~ 8.45 x parameters (its mha), so compute = tokens x 8.45 N.
SIZES = np.array([24736, 38600, 55536, 98624.0])
TOKENS_PER_PARAM = np.array([5, 10, 20.0])
COMPUTE = (TOKENS_PER_PARAM[None, :] * SIZES[:, None] * 8.45 * SIZES[:, None]).ravel()
SIZE_OF_POINT = np.repeat(np.arange(4), 3)
BUDGET_OF_POINT = np.tile(np.arange(3), 4)
TOP = 2  # the largest budget's index: the trunk's own end
RUNG = 2  # d48: the seeds rung's size
SHARED = 0.8  # 1 - decay_fraction
SEED_SD = 0.0069  # the showcase's pooled seed noise at d48 (sd of log loss)
LAW = Fit(1.547, 0.468, 0.342, 1.64e11)  # the showcase's joint curve (mha)


@dataclass(frozen=True)
class Scenario:
    name: str
    multipliers: tuple[float, ...]  # per arm, the baseline's first (1.0)
    unlucky: float = 0.0
    unlucky_low: float = 0.04
    unlucky_high: float = 0.09
    size_noise: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0)
    bend: dict[int, float] = field(default_factory=dict)  # arm -> its tilt at the ends, in seed sds
    budget_bias: tuple[float, ...] = (0.0, 0.0, 0.0)  # log loss added per budget, at the middle size
    bias_growth: float = 1.0  # the bias at the largest size over the smallest (geometric in between)


@dataclass
class Simulated:
    """What the plan's runs of each ladder gave: the ladder's points, the rung's seeds and the
    replicate pairs, each (ladders, ...)."""

    loss: np.ndarray  # (L, arms * 12)
    seeds: np.ndarray  # (L, arms, 3): the rung's seeds, the ladder's own first
    pairs: dict[int, np.ndarray]  # size -> (L, arms, 2): ladder run, replicate run


def simulate(rng: np.random.Generator, scenario: Scenario, ladders: int) -> Simulated:
    arms = len(scenario.multipliers)
    n = arms * 12
    log_c = np.log(COMPUTE)
    clean = []
    for k, m in enumerate(scenario.multipliers):
        log_y = np.log(LAW.loss(COMPUTE * m))
        if k in scenario.bend:
            clean_c = (COMPUTE * m / LAW.C0) ** (-LAW.alpha) * LAW.A
            along_m = -LAW.alpha * clean_c / (LAW.E + clean_c)  # d log L / d log m at each point
            tilt = log_c - log_c.mean()
            tilt = tilt - (tilt @ along_m) / (along_m @ along_m) * along_m
            log_y = log_y + scenario.bend[k] * SEED_SD * tilt / np.abs(tilt).max()
        clean.append(log_y)
    clean = np.concatenate(clean)
    position = SIZE_OF_POINT / SIZE_OF_POINT.max() - 0.5  # -0.5 at the smallest size, 0.5 at the largest
    bias = np.asarray(scenario.budget_bias)[BUDGET_OF_POINT] * scenario.bias_growth**position
    clean = clean + np.tile(bias, arms)
    factor = np.asarray(scenario.size_noise)[np.tile(SIZE_OF_POINT, arms)]
    sd = SEED_SD * factor
    trunk = np.arange(n) // 3  # arm * 4 + size

    def unlucky(shape) -> np.ndarray:
        hit = rng.random(shape) < scenario.unlucky
        return hit * rng.uniform(scenario.unlucky_low, scenario.unlucky_high, shape)

    common = rng.standard_normal((ladders, arms * 4))[:, trunk]
    own = rng.standard_normal((ladders, n))
    bad = unlucky((ladders, arms * 4))[:, trunk]
    log_y = clean + sd * (math.sqrt(SHARED) * common + math.sqrt(1 - SHARED) * own) + bad

    def another_run(size: int) -> np.ndarray:
        """(L, arms) the top point of another run of each arm at `size` (its own trunk)."""
        at = np.arange(arms) * 12 + size * 3 + TOP
        noise = SEED_SD * scenario.size_noise[size] * rng.standard_normal((ladders, arms))
        return clean[at] + noise + unlucky((ladders, arms))

    rung = np.arange(arms) * 12 + RUNG * 3 + TOP
    seeds = np.stack([log_y[:, rung], another_run(RUNG), another_run(RUNG)], axis=2)
    pairs = {}
    for size in (0, 3):
        at = np.arange(arms) * 12 + size * 3 + TOP
        pairs[size] = np.stack([log_y[:, at], another_run(size)], axis=2)
    return Simulated(np.exp(log_y), np.exp(seeds), {s: np.exp(v) for s, v in pairs.items()})


def ladder_data(sim: Simulated, arms: int, offsets: bool = True) -> tuple[robust.LadderData, list]:
    """The method's view of simulated ladders: each ladder's seed noise per size from its rung
    and pairs (uncertainty.size_noise), as the report measures it; `offsets`: each budget its
    offset (curves.py), False for one curve over every budget (the method before)."""
    names = [str(k) for k in range(arms)]
    sd_rows, dofs, noises = [], [], []
    for row in range(len(sim.loss)):
        rung_seeds = {names[k]: list(sim.seeds[row, k]) for k in range(arms)}
        pairs = {size: {names[k]: tuple(sim.pairs[size][row, k]) for k in range(arms)} for size in sim.pairs}
        noise = size_noise(rung_seeds, RUNG, pairs, list(SIZES))
        noises.append(noise)
        sd_rows.append(np.concatenate([noise.point_sd(names[k], SIZE_OF_POINT) for k in range(arms)]))
        dofs.append(noise.dof)
    data = robust.LadderData(
        np.tile(COMPUTE, arms), np.repeat(np.arange(arms), 12), np.tile(SIZE_OF_POINT, arms), sim.loss,
        np.stack(sd_rows), float(np.median(dofs)), SHARED, np.tile(BUDGET_OF_POINT, arms) if offsets else None,
    )  # fmt: skip
    return data, noises


@dataclass
class Rates:
    """How the method did over many ladders of one scenario."""

    scenario: str
    arms: int  # arm comparisons counted
    daggers: float  # share of the A/A arms given a dagger (better or worse)
    fragile: float  # share of the A/A arms marked fragile
    power: float  # share of the planted arms (m != 1) given the right dagger
    coverage: float  # share of the intervals holding the planted multiplier
    width: float  # median high / low of the intervals
    held_out: float  # share of the held-out rung's predictive intervals holding the measured loss
    bent: float = math.nan  # share of the bending arms (A/A on average) given a dagger
    held_by_budget: tuple[float, ...] = ()  # the held-out coverage at each budget


def _mean(values: list) -> float:
    return float(np.mean(values)) if values else math.nan


def run_method(
    scenario: Scenario,
    ladders: int,
    seed: int,
    draws: int = 100,
    robust_noise: bool = True,
    offsets: bool = True,
) -> Rates:
    """The method's rates on `ladders` simulated ladders of `scenario`; `robust_noise` False: the
    method before robust.py (the rung's seed noise alone, no size left out, no held-out rung);
    `offsets` False: one curve over every budget (before the budgets' offsets)."""
    rng = np.random.default_rng(seed)
    truth = scenario.multipliers
    sim = simulate(rng, scenario, ladders)
    data, _ = ladder_data(sim, len(truth), offsets)
    if not robust_noise:  # then: every point at the rung's pooled seed sd, as measured there
        data = robust.LadderData(
            data.compute, data.arm, data.size, data.loss,
            np.broadcast_to(data.seed_sd[:, data.size == RUNG].min(axis=1, keepdims=True), data.loss.shape),
            data.seed_dof, data.shared, data.budget,
        )  # fmt: skip
    _, answers = robust.answer(data, draws=draws, seed=seed, robust_noise=robust_noise)
    same, planted, covered, widths, fragile, bent = [], [], [], [], [], []
    for row in answers:
        for k, arm in enumerate(row, start=1):
            if k in scenario.bend:
                bent.append(arm.dagger)
            c = arm.comparison
            covered.append(c.low <= truth[k] <= c.high)
            widths.append(c.high / c.low if c.low > 0 else math.inf)
            if truth[k] == 1.0:
                same.append(arm.dagger)
                fragile.append(arm.verdict == "fragile")
            else:
                planted.append(arm.verdict == ("better" if truth[k] > 1 else "worse"))
    held, by_budget = [], {b: [] for b in range(len(TOKENS_PER_PARAM))}
    if robust_noise:
        predictions = robust.predict_held_out(data, draws=draws, seed=seed)
        held = [p.covered for row in predictions for p in row]
        for row in predictions:
            for p in row:  # a size's points come in budget order
                by_budget[int(np.argmin(np.abs(COMPUTE[9:] - p.compute)))].append(p.covered)
    return Rates(
        scenario.name, len(covered), _mean(same), _mean(fragile), _mean(planted), _mean(covered),
        float(np.median(widths)), _mean(held), _mean(bent), tuple(map(_mean, by_budget.values())),
    )  # fmt: skip


@dataclass
class Decisions:
    """How well each predictor orders the arms at the held-out rung (the largest size, its
    largest budget, the ladder's run and its replicate averaged), over many ladders."""

    scenario: str
    curves: float  # decision accuracy of the fitted curves without the held-out size
    one_rung: float  # of ranking at the largest fitted size's largest budget (its seeds averaged)
    verdicts_right: float  # share of better/worse verdicts (without the held-out size) that hold there
    decided: float  # share of arms given a better/worse verdict
    undecided_within: float  # share of "no difference" verdicts within the held-out noise


def decide(scenario: Scenario, ladders: int, seed: int, draws: int = 60, offsets: bool = True) -> Decisions:
    """The three predictors of decisions.py on simulated ladders whose largest size is held out;
    the fit and verdicts see the three smaller sizes only (offsets: as run_method)."""
    rng = np.random.default_rng(seed)
    arms = len(scenario.multipliers)
    sim = simulate(rng, scenario, ladders)
    data, _ = ladder_data(sim, arms, offsets)
    top = int(SIZE_OF_POINT.max())
    target = sim.pairs[top].mean(axis=2)  # (L, arms): the held-out rung's two runs, averaged
    rung = sim.seeds.mean(axis=2)  # (L, arms): the largest fitted size's seeds, averaged (d48)
    predictions = robust.predict_held_out(data, draws=draws, seed=seed)
    _, answers = robust.answer(data.subset(data.size != top), draws=draws, seed=seed)
    noise = SEED_SD * scenario.size_noise[top]  # the sd of a difference of two 2-run means
    curves, one_rung, right, decided, within = [], [], [], [], []
    for row in range(ladders):
        at_top = [p for p in predictions[row] if p.compute == COMPUTE[-1]]
        predicted = [next(p.predicted for p in at_top if p.arm == k) for k in range(arms)]
        curves.append(decision_accuracy(predicted, list(target[row])).share)
        one_rung.append(decision_accuracy(list(rung[row]), list(target[row])).share)
        words = [a.verdict for a in answers[row]]
        score = verdict_score(words, list(np.log(target[row, 1:] / target[row, 0])), noise)
        decided.append(score.decided / len(words))
        if score.decided:
            right.append(score.right / score.decided)
        if score.undecided:
            within.append(score.within_noise / score.undecided)
    return Decisions(scenario.name, *map(_mean, (curves, one_rung, right, decided, within)))


def decision_scenarios() -> list[Scenario]:
    """Arms that differ as the showcase's do (its multipliers, rounded: two near 1, one at 1.2,
    three at 0.25-0.7), so that the order of most pairs is a real question."""
    arms = (1.0, 0.9, 1.2, 0.27, 0.7, 0.25, 1.05, 1.0)
    return [
        Scenario("as assumed", arms),
        Scenario("budget bias (+0.05, +0.025 at 5, 10 tokens/param)", arms, budget_bias=BUDGET_BIAS),
        Scenario("unlucky trunks (p 0.125, +0.04-0.09)", arms, unlucky=0.125),
    ]


# The showcase's budget offsets (fitted: +0.048 and +0.025 in log loss at 5 and 10 tokens/param)
BUDGET_BIAS = (0.05, 0.025, 0.0)


def scenarios() -> list[Scenario]:
    """The misspecified ladders of the known-answer tests: 8 arms, six equal to the baseline and
    one at half its compute (the power), as the showcase has 8."""
    arms = (1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0)
    return [
        Scenario("as assumed", arms),
        Scenario("unlucky trunks (p 0.125, +0.04-0.09)", arms, unlucky=0.125),
        Scenario("noise 2x at the smallest size", arms, size_noise=(2.0, 1.5, 1.0, 0.8)),
        Scenario("an A/A arm whose curve bends (±2 sd)", arms, bend={1: 2.0}),
        Scenario("budget bias (+0.05, +0.025 at 5, 10 tokens/param)", arms, budget_bias=BUDGET_BIAS),
        Scenario("budget bias growing 2x over the sizes", arms, budget_bias=BUDGET_BIAS, bias_growth=2.0),
    ]


# -- a whole designed sweep's runs, simulated --------------------------------------------------------
@dataclass(frozen=True)
class RunsTruth:
    """The truth a simulated sweep's runs are drawn from (`simulated_runs`): Chinchilla's L(N, D)
    (E + A (N/N0)^-a + B (D/D0)^-b, the showcase's mha fitted by chinchilla.py, rounded), not the
    compute law the ladder fits; a learning-rate valley per size (best x4 at the smallest, halving
    per 4x parameters, LR_CURVE in log loss per octave squared); `handicap`: nats added to an arm's
    every run; seed noise in log loss with TRUNK_SHARE of its variance shared by a trunk's branches."""

    handicap: dict[str, float] = field(default_factory=dict)
    sd: float = 0.008
    E: float = 1.2
    A: float = 0.03
    a: float = 1.9
    B: float = 0.8
    b: float = 0.27
    N0: float = 47821.0
    D0: float = 4.78e5
    lr_curve: float = 0.01
    trunk_share: float = 0.8


def simulated_runs(truth: RunsTruth, seed: int):
    """A results source (as runs/results.py's RunResults: call it with a plan's point) whose runs
    are drawn from `truth`, each the same whenever asked: its noise seeded by the run's trunk (its
    arm, size, rate and seed; a branch shares its trunk's) and by the point itself."""
    import zlib

    from ...flops import FLOP_CONVENTION
    from ..runs.results import PointResult

    made: dict = {}

    def draw(key: str) -> float:
        return float(np.random.default_rng([seed, zlib.crc32(key.encode())]).standard_normal())

    def result(point) -> PointResult:
        name = point.run.directory.name
        if name not in made:
            n, d = float(point.params), float(point.tokens)
            loss = truth.E + truth.A * (n / truth.N0) ** -truth.a + truth.B * (d / truth.D0) ** -truth.b
            best = 4.0 * (n / 24736.0) ** (-0.5)
            log_loss = math.log(loss + truth.handicap.get(point.arm, 0.0))
            log_loss += truth.lr_curve * (math.log2(point.multiplier) - math.log2(best)) ** 2
            trunk = f"{point.arm}/{point.size}/{point.multiplier:g}/{point.seed}"
            shared, own = math.sqrt(truth.trunk_share), math.sqrt(1 - truth.trunk_share)
            log_loss += truth.sd * (shared * draw(trunk) + own * draw(name))
            summary = {
                "final_val_loss": math.exp(log_loss),
                "steps": point.steps,
                "flop_convention": FLOP_CONVENTION,
            }
            made[name] = PointResult(summary, {"status": "ok"}, True, point.steps, point.flops, "", None)
        return made[name]

    return result
