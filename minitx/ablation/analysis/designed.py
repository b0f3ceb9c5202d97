"""The analysis of a designed sweep: chosen learning rates, fits, multipliers, tests, diagnostics.

Everything here reads what the finished runs left (their summary.json, diagnostics.json), as
runs/results.py read it for the plan's points, so `--report-only` rebuilds it all without
training. A failed or missing run is simply absent from the fits and tests; the report lists it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import UserError
from ...evaluation.diagnostics import DIAGNOSTICS
from ..plan.ladder import Plan, Point, Rate
from ..runs.results import RunResults
from . import fit, robust
from .curves import _check_points
from .decisions import Accuracy, VerdictScore, decision_accuracy, verdict_score
from .significance import Difference, compare_all
from .uncertainty import SizeNoise, size_noise
from .verdicts import verdict_word


@dataclass
class ArmResult:
    name: str
    lr_losses: dict[float, float | None] = field(default_factory=dict)  # multiplier -> final val loss
    multiplier: float | None = None  # the chosen one (at the sweep's size)
    rate: Rate | None = None  # the whole choice: past the edges, confirmation, rate per size (ladder.py)
    points: list[Point] = field(default_factory=list)  # the ladder's finished points (seed 0)
    curve: fit.Curve | None = None  # the arm's curve under the joint fit, with its bootstrap draws
    own: fit.Fit | None = None  # the arm's own curve (a check of the joint model's shared shape)
    scatter: float | None = None  # rms of the arm's log-loss residuals about the joint curve
    fit_note: str = ""
    compute: fit.Comparison | None = None
    params: fit.Comparison | None = None  # the baseline's parameters at equal loss, over the arm's
    nd: fit.NDFit | None = None  # L(N, D), the second view
    # the baseline's compute for the arm's loss at its largest size, by L(N, D)
    nd_multiplier: float | None = None
    seeds: list[float] = field(default_factory=list)  # losses at the seeds rung
    seed_chose_lr: bool = False  # the rung's first-seed run is the learning-rate sweep's chosen run
    test: Difference | None = None
    diagnostics: dict[str, float] = field(default_factory=dict)  # means over the rung's seeds
    diagnostic_seeds: dict[str, list[float]] = field(default_factory=dict)  # each seed's value at the rung
    answer: robust.ArmAnswer | None = None  # the ladder's multiplier, each size left out, the verdict
    dispersion: float | None = None  # its noise over the seed noise (>= 1: its lack of fit)
    held_out: list[robust.Prediction] = field(default_factory=list)  # its largest size, predicted
    pairs: dict[str, tuple[float, float]] = field(default_factory=dict)  # size -> (ladder, replicate) loss
    # size -> its 3 seeds and their median
    medians: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)
    settled: dict[Path, float] = field(default_factory=dict)  # a point's run directory -> that median
    # the held-out rung's points, predicted
    holdout: list[tuple[Point, robust.Prediction]] = field(default_factory=list)

    @property
    def sizes(self) -> int:
        """The distinct sizes among the arm's fitted points."""
        return len({p.size for p in self.points})

    def point(self, size: str, budget) -> Point | None:
        """The arm's ladder point at (size, budget), None where it has none finished."""
        return next((p for p in self.points if p.size == size and p.budget == budget), None)

    def fitted_loss(self, point: Point, trained: RunResults) -> float | None:
        """The point's loss as the fit uses it: the median of three seeds where a third seed
        settled a far-apart pair, else its run's."""
        return self.settled.get(point.run.directory, trained(point).loss)


@dataclass
class Transfer:
    """How the small scale's answers order the arms at a held-out size (decisions.py): seeds
    averaged first, at the largest budget; `target` per arm, and the three predictors' scores."""

    size: str  # the size predicted
    source: str  # what predicted it: "d32-d48", say
    rung: str  # the largest fitted size (the one-rung predictor)
    target: dict[str, float]  # arm -> mean loss at the size's largest budget
    seeds: dict[str, int]  # arm -> runs averaged there
    curves: Accuracy
    one_rung: Accuracy
    verdicts: VerdictScore | None = None  # only for a rung no verdict saw
    noise: float = math.nan  # sd of one run's log loss there, for "no difference" (nan: none)
    noise_from: str = ""


@dataclass
class Analysis:
    baseline: str
    arms: list[ArmResult]
    rung: tuple[str, float | None]
    failed: list[Point]
    notes: list[str]
    noise: fit.SeedNoise | None = None  # the seed noise the intervals carry
    noise_note: str = ""  # where the noise came from, when not from seeds
    joint: fit.JointFit | None = None
    size_noise: SizeNoise | None = None  # the seed noise per size the intervals start from
    held_out_size: str = ""  # the size the held-out check predicts
    lr_seeds: list[int] = field(default_factory=list)  # the seeds of the learning-rate sweep's runs
    rung_seeds: list[int] = field(default_factory=list)  # the seeds of the seeds rung's runs
    data: robust.LadderData | None = None  # the joint fit's points, as fitted
    fitted: list[str] = field(default_factory=list)  # the arms of the joint fit, by its index
    transfer: list[Transfer] = field(default_factory=list)  # decision accuracy at each held-out size

    def arm(self, name: str) -> ArmResult:
        return next(a for a in self.arms if a.name == name)


def analyse(
    plan: Plan,
    phases: tuple[list[Point], list[Point], list[Point]],
    trained: RunResults,
    replicates: list[Point] | tuple = (),
) -> Analysis:
    """`trained`: what each point's run did (its loss, compute, diagnostics); `replicates`: third
    seeds of the points whose replicate pair was flagged unreliable (replicate_points): each such
    point's loss is the median of its three seeds."""
    first, second, third, *rest = phases
    held = rest[0] if rest else []
    ladder = [*second, *third]
    at_rung = [p for p in ladder if (p.size, p.budget) == plan.seeds_rung]
    swept = {p.run.directory for p in first}

    def done(p: Point) -> bool:
        return trained(p).loss is not None

    rates = plan.rates(trained)
    results = [ArmResult(name, rate=rates[name], multiplier=1.0) for name in plan.arms]
    for arm in results:
        if plan.sweep.design.multipliers:
            arm.lr_losses = {m: trained(p).loss for m, p in arm.rate.sweep.items()}
            arm.multiplier = arm.rate.choice.multiplier
        mine = [p for p in ladder if p.arm == arm.name and p.seed == plan.ladder_seed and done(p)]
        arm.points = sorted(unique_points(mine), key=lambda p: trained(p).trained_flops)
        rung_points = [p for p in at_rung if p.arm == arm.name]
        arm.seeds = [trained(p).loss for p in unique_points(rung_points) if done(p)]
        arm.seed_chose_lr = any(p.run.directory in swept and done(p) for p in rung_points)
        values = [v for p in unique_points(rung_points) if (v := trained(p).diagnostics)]
        for key in DIAGNOSTICS:
            if found := [v[key] for v in values if v.get(key) is not None]:
                arm.diagnostics[key] = sum(found) / len(found)
                arm.diagnostic_seeds[key] = found
    failed = [p for p in [*first, *ladder, *held] if not done(p) and trained(p).started]
    analysis = Analysis(plan.arms[0], results, plan.seeds_rung, failed, [])
    analysis.lr_seeds = sorted({p.seed for p in first if done(p)})
    analysis.rung_seeds = sorted({p.seed for p in at_rung if done(p)})
    analysis.noise = fit.seed_noise({a.name: a.seeds for a in results})
    if plan.ladder is not None:
        _fit_all(plan, analysis, trained, replicates)
    tests = compare_all({a.name: a.seeds for a in results}, plan.arms[0])
    for arm in results:
        arm.test = tests.get(arm.name)
    if analysis.data is not None and len(plan.sizes) >= 3:
        _transfer_within(plan, analysis, ladder, trained)
    if held and analysis.data is not None:
        _predict_holdout(plan, analysis, held, trained)
    return analysis


def _means_at(points: list[Point], size: str, budget, trained: RunResults) -> tuple[dict, dict]:
    """Each arm's mean loss over every run the plan holds at (size, budget), and how many."""
    found: dict[str, dict] = {}
    for p in points:
        if p.size == size and p.budget == budget and trained(p).loss is not None:
            found.setdefault(p.arm, {})[p.run.directory] = trained(p).loss
    return (
        {arm: float(np.mean(list(v.values()))) for arm, v in found.items()},
        {arm: len(v) for arm, v in found.items()},
    )


def _confirmed(analysis: Analysis, size: str) -> list[Point]:
    """The confirmation's run at the rate each arm uses at `size` (a second seed of its ladder
    run there), where the plan has one."""
    found = []
    for arm in analysis.arms:
        rate = arm.rate
        if rate is not None and rate.by_size.get(size) in rate.confirm:
            point = rate.confirm[rate.by_size[size]]
            if point.size == size:
                found.append(point)
    return found


def _transfer_within(plan: Plan, analysis: Analysis, points: list[Point], trained: RunResults) -> None:
    """Decision accuracy at the ladder's own largest size, predicted without it (the held-out
    check of robust.predict_held_out), against ranking at the size below: the verdicts saw it."""
    top, largest, below = plan.budgets[-1], plan.sizes[-1].name, plan.sizes[-2].name
    every = [*points, *_confirmed(analysis, largest)]
    target, seeds = _means_at(every, largest, top, trained)
    rung, _ = _means_at(every, below, top, trained)
    predicted = {
        a.name: max(a.held_out, key=lambda q: q.compute).predicted for a in analysis.arms if a.held_out
    }
    names = [a for a in analysis.fitted if a in target and a in predicted and a in rung]
    if len(names) < 2:
        return
    analysis.transfer.append(
        Transfer(
            largest, ", ".join(s.name for s in plan.sizes[:-1]), below,
            {a: target[a] for a in names}, {a: seeds[a] for a in names},
            decision_accuracy([predicted[a] for a in names], [target[a] for a in names]),
            decision_accuracy([rung[a] for a in names], [target[a] for a in names]),
        )
    )  # fmt: skip


def _predict_holdout(plan: Plan, analysis: Analysis, held: list[Point], trained: RunResults) -> None:
    """The held-out rung (ladder.holdout): each arm's points there predicted by the whole fit
    (it never saw them), then read; coverage, and the three predictors' decision accuracy."""
    data, names = analysis.data, analysis.fitted
    ladder_runs = [p for p in held if p.seed == plan.ladder_seed and p.arm in names]
    if not ladder_runs:
        return
    measured = [trained(p).loss for p in ladder_runs]
    groups = budget_groups(plan, ladder_runs) if data.budget is not None else None
    targets = robust.Targets(
        np.asarray([trained(p).trained_flops for p in ladder_runs], dtype=float),
        np.asarray([names.index(p.arm) for p in ladder_runs], dtype=int),
        np.full(len(ladder_runs), len(plan.sizes)),
        np.asarray([[math.nan if v is None else v for v in measured]]),
        groups,
    )
    try:
        predictions = robust.predict(data, targets, draws=fit.BOOTSTRAP, seed=2)[0]
    except UserError as error:
        analysis.notes.append(f"held-out rung {plan.holdout.name}: {error}")
        return
    for p, prediction in zip(ladder_runs, predictions):
        analysis.arm(p.arm).holdout.append((p, prediction))
    top = plan.budgets[-1]
    target, seeds = _means_at(held, plan.holdout.name, top, trained)
    largest = plan.sizes[-1].name
    rung, _ = _means_at(
        [*(p for a in analysis.arms for p in a.points), *_confirmed(analysis, largest)], largest, top, trained
    )
    predicted = {p.arm: q.predicted for p, q in zip(ladder_runs, predictions) if p.budget == top}
    order = [a for a in names if a in target and a in predicted and a in rung]
    if len(order) < 2:
        return
    noise, noise_from = _holdout_noise(held, plan, trained, analysis)
    base = analysis.baseline
    words, diffs, sds = [], [], []
    for name in order[1:] if order[0] == base else []:
        arm = analysis.arm(name)
        words.append(verdict_word(arm))
        diffs.append(math.log(target[name] / target[base]))
        sds.append(noise * math.sqrt(1 / seeds[name] + 1 / seeds[base]))
    analysis.transfer.append(
        Transfer(
            plan.holdout.name, ", ".join(s.name for s in plan.sizes), plan.sizes[-1].name,
            {a: target[a] for a in order}, {a: seeds[a] for a in order},
            decision_accuracy([predicted[a] for a in order], [target[a] for a in order]),
            decision_accuracy([rung[a] for a in order], [target[a] for a in order]),
            verdict_score(words, diffs, sds) if words else None,
            noise, noise_from,
        )
    )  # fmt: skip


def _holdout_noise(
    held: list[Point], plan: Plan, trained: RunResults, analysis: Analysis
) -> tuple[float, str]:
    """The sd of one run's log loss at the held-out rung: pooled over the arms it seeded twice or
    more, else the largest fitted size's seed noise (said)."""
    runs: dict[str, list[float]] = {}
    for p in held:
        if p.budget == plan.budgets[-1] and trained(p).loss is not None:
            runs.setdefault(p.arm, []).append(math.log(trained(p).loss))
    groups = [v for v in runs.values() if len(v) >= 2]
    dof = sum(len(v) - 1 for v in groups)
    if dof:
        sd = math.sqrt(sum(float(np.sum((np.asarray(v) - np.mean(v)) ** 2)) for v in groups) / dof)
        return sd, f"{len(groups)} arms' seeds there, {dof} degrees of freedom"
    if analysis.size_noise is not None:
        sd = float(analysis.size_noise.sd[-1])
        return sd, f"no arm has two seeds there: {plan.sizes[-1].name}'s seed noise"
    return math.nan, "no seed noise known"


def unique_points(points: list[Point]) -> list[Point]:
    seen: dict = {}
    for p in points:
        seen.setdefault(p.run.directory, p)
    return list(seen.values())


def replicate_points(plan: Plan, analysis: Analysis) -> list[Point]:
    """A third seed for each point whose two seeds (its replicate pair) differ by more than
    uncertainty.FLAG_SDS seed sds: the same config as the ladder's run at the largest budget, with
    the first seed no other run of the plan uses."""
    if analysis.size_noise is None:
        return []
    found = []
    for name, size, _ in analysis.size_noise.unreliable:
        rate = analysis.arm(name).rate
        size_name = plan.sizes[size].name
        if rate is None or size_name not in rate.by_size:
            continue
        seed = plan.ladder_seed + max(1, plan.sweep.seeds)
        found.append(
            plan.point(name, size_name, plan.budgets[-1], rate.by_size[size_name], seed, "replicate")
        )
    return found


def _medians(plan: Plan, fitted: list[ArmResult], trained: RunResults, replicates) -> None:
    """Each arm's ladder point -> the median of its three seeds, where a replicate settled a
    flagged pair (ArmResult.medians, .settled)."""
    for r in replicates:
        arm = next((a for a in fitted if a.name == r.arm), None)
        third = trained(r).loss
        if arm is None or third is None or r.size not in arm.pairs:
            continue
        mine = arm.point(r.size, plan.budgets[-1])
        if mine is None:
            continue
        a, b = arm.pairs[r.size]
        median = float(np.median([a, b, third]))
        arm.medians[r.size] = (a, b, third, median)
        arm.settled[mine.run.directory] = median


def _fit_all(plan: Plan, analysis: Analysis, trained: RunResults, replicates=()) -> None:
    """The joint fit over the arms with 2 or more points, its bootstrap; each arm's own curve;
    the parameter share; L(N, D) where the ladder allows it."""
    results, notes = analysis.arms, analysis.notes
    baseline = results[0]
    refused = [a for a in results if a.rate is not None and a.rate.refused]  # no rate is known to be its best
    fitted = [a for a in results if len(a.points) >= 2 and a not in refused]
    for arm in results:
        if arm in refused:
            arm.fit_note = f"refused: {arm.rate.refused}"
            continue
        if arm not in fitted:
            arm.fit_note = f"no fit: {len(arm.points)} finished point(s), needs 2 or more"
        try:
            arm.own = fit.fit_curve(
                [trained(p).trained_flops for p in arm.points], [trained(p).loss for p in arm.points]
            )
        except UserError:
            pass  # too few points for a curve of its own; the joint fit may still place it
    if baseline not in fitted:
        notes.append(f"the baseline {baseline.name} has no fit ({baseline.fit_note}), so no multipliers")
        return
    fitted = [baseline, *(a for a in fitted if a is not baseline)]
    for arm in fitted:
        arm.pairs = replicate_pairs(plan, arm, trained)
    _medians(plan, fitted, trained, replicates)
    points = [(k, p) for k, a in enumerate(fitted) for p in a.points]
    x = [trained(p).trained_flops for _, p in points]
    y = [fitted[k].fitted_loss(p, trained) for k, p in points]
    index = [k for k, _ in points]
    size_index = {s.name: i for i, s in enumerate(plan.sizes)}
    sizes = [size_index[p.size] for _, p in points]
    groups = budget_groups(plan, [p for _, p in points])
    shared = 1 - plan.decay_fraction if len(plan.budgets) > 1 else 0.0
    try:
        _check_points(np.asarray(x), np.asarray(y), fit.MIN_POINTS)
        seed_sd, dof = _seed_sd(plan, analysis, fitted, trained, x, y, index, sizes)
        data = robust.LadderData(
            np.asarray(x), np.asarray(index), np.asarray(sizes), np.asarray(y)[None, :], seed_sd[None, :], dof,
            shared, groups,
        )  # fmt: skip
        found, answers = robust.answer(data, draws=fit.BOOTSTRAP, seed=0)
    except UserError as error:
        for arm in fitted:
            arm.fit_note = f"no fit: {error}"
        notes.append(f"no joint fit: {error}")
        return
    joint = analysis.joint = found.joints[0]
    analysis.data, analysis.fitted = data, [a.name for a in fitted]
    boot = found.boots[0]  # the draws the intervals came from: the curves' bands too
    for k, arm in enumerate(fitted):
        mine = [i for i, j in enumerate(index) if j == k]
        arm.curve = fit.Curve(
            joint.curve(k), [d.curve(k) for d in boot.draws], float(max(x[i] for i in mine))
        )
        at = np.asarray([x[i] for i in mine]), [k] * len(mine)
        fitted_here = joint.loss(*at, None if groups is None else groups[mine])
        residuals = [math.log(float(f)) - math.log(y[i]) for f, i in zip(fitted_here, mine)]
        arm.scatter = math.sqrt(sum(r * r for r in residuals) / len(residuals))
        arm.dispersion = float(found.dispersion[0, k])
        if k:
            arm.answer = answers[0][k - 1]
            arm.compute = arm.answer.comparison
    if len(plan.sizes) >= 3 and all(len({p.size for p in a.points}) >= 3 for a in fitted):
        analysis.held_out_size = plan.sizes[-1].name
        try:
            for prediction in robust.predict_held_out(data, draws=fit.BOOTSTRAP, seed=1)[0]:
                fitted[prediction.arm].held_out.append(prediction)
        except UserError as error:
            notes.append(f"held-out rung: {error}")
    _params_share(plan, analysis, fitted, trained)
    _nd_view(plan, analysis, trained)


def budget_groups(plan: Plan, points: list[Point]) -> np.ndarray | None:
    """Each point's budget group for the joint fit (curves.py): its index among the ladder's
    budgets where they are ratios of tokens to parameters (a curve per ratio, offsets shared by
    every arm); None where they are FLOPs (an offset per compute would take the curve's place) or
    there is one budget."""
    ladder = plan.ladder
    if ladder is None or ladder.unit != "tokens_per_param" or len(plan.budgets) < 2:
        return None
    return np.asarray([plan.budgets.index(p.budget) for p in points], dtype=int)


def replicate_pairs(plan: Plan, arm: ArmResult, trained: RunResults) -> dict[str, tuple[float, float]]:
    """The runs the plan holds twice, with two seeds: at the smallest size the sweep's run at the
    rate the ladder uses there, against the ladder's; at the largest, the confirmation's run at
    the rate used there, against the ladder's (same config, steps and schedule; another seed).
    Size -> (the ladder's loss, the replicate's)."""
    rate, found = arm.rate, {}
    if rate is None or not rate.by_size:
        return found
    top = plan.budgets[-1]
    for size, runs in ((plan.sizes[0].name, rate.sweep), (plan.sizes[-1].name, rate.confirm)):
        other = runs.get(rate.by_size.get(size))
        mine = arm.point(size, top)
        if other is None or mine is None or other.run.directory == mine.run.directory:
            continue
        a, b = trained(mine).loss, trained(other).loss
        if a is not None and b is not None:
            found[size] = (a, b)
    return found


def _seed_sd(plan, analysis, fitted, trained, x, y, index, sizes) -> tuple[np.ndarray, float]:
    """Each point's seed noise (sd of log loss) and its freedom: per size from the replicates
    (uncertainty.size_noise); without any, the scatter of a first fit's residuals (said in the
    report)."""
    names = [a.name for a in fitted]
    size_index = {s.name: i for i, s in enumerate(plan.sizes)}
    rung_size = size_index.get(analysis.rung[0], len(plan.sizes) - 1)
    pairs: dict[int, dict[str, tuple[float, float]]] = {}
    for arm in fitted:
        for size, pair in arm.pairs.items():
            pairs.setdefault(size_index[size], {})[arm.name] = pair
    params = [plan.shapes[plan.arms[0], s.name].params for s in plan.sizes]
    measured = size_noise({a.name: a.seeds for a in fitted if len(a.seeds) >= 2}, rung_size, pairs, params)
    if measured is not None:
        analysis.size_noise = measured
        sd = np.concatenate([measured.point_sd(names[k], [sizes[i]]) for i, k in enumerate(index)])
        return sd, measured.dof
    return _fallback_sd(analysis, [names[k] for k in index], x, y, index)  # a name per point


def _fallback_sd(analysis: Analysis, arms: list[str], x, y, index) -> tuple[np.ndarray, float]:
    """The noise (sd of log loss) of each of `arms` and its freedom where no size has replicates:
    the seeds'; without seeds, the scatter of a first fit's residuals about each point (its freedom:
    points less parameters), said in the report."""
    if analysis.noise is not None and analysis.noise.pooled > 0:
        noise = analysis.noise.noise(arms, [0] * len(arms), 0.0)
        return np.asarray(noise.sd, dtype=float), float(noise.dof[0])
    first = fit.fit_joint(x, y, index)
    residuals = [math.log(float(first.curve(k).loss(c))) - math.log(v) for k, c, v in zip(index, x, y)]
    dof = max(1, len(y) - 3 - max(index))
    sd = math.sqrt(sum(r * r for r in residuals) / dof)
    why = "no arm has 2 or more seeds" if analysis.noise is None else "the seeds show no spread"
    analysis.noise_note = (
        f"{why}: the intervals carry the fit's residual scatter instead "
        f"(sd of log loss {sd:.4f}, {dof} degrees of freedom)"
    )
    return np.full(len(y), sd), float(dof)


def _params_share(plan: Plan, analysis: Analysis, fitted: list[ArmResult], trained: RunResults) -> None:
    """The parameter form needs one token ratio across sizes: the largest budget, per parameter;
    the joint model of loss against parameters there gives each arm's parameter multiplier."""
    if plan.ladder.unit != "tokens_per_param" or len(plan.sizes) < 4:
        analysis.notes.append(
            "parameter share at equal loss: needs ladder.budgets in tokens_per_param and 4 or more sizes"
        )
        return
    top = plan.budgets[-1]
    arms = [a for a in fitted if sum(p.budget == top for p in a.points) >= 2]
    if not arms or arms[0] is not fitted[0]:
        return
    points = [(k, p) for k, a in enumerate(arms) for p in a.points if p.budget == top]
    index = [k for k, _ in points]
    size_index = {s.name: i for i, s in enumerate(plan.sizes)}
    x, y = [float(p.params) for _, p in points], [trained(p).loss for _, p in points]
    noise = analysis.size_noise
    if noise is not None:  # the same noise as the compute multipliers: per size, raised to each arm's scatter
        sd = np.array([noise.point_sd(arms[k].name, [size_index[p.size]])[0] for k, p in points])
        dof = noise.dof
    else:
        sd, dof = _fallback_sd(analysis, [arms[k].name for k in index], x, y, index)
    data = robust.LadderData(
        np.asarray(x), np.asarray(index), np.asarray([size_index[p.size] for _, p in points]),
        np.asarray(y)[None, :], sd[None, :], dof, 0.0,  # separate runs: no trunk shared
    )  # fmt: skip
    try:
        _check_points(np.asarray(x), np.asarray(y), 4)
        _, answers = robust.answer(data, draws=fit.BOOTSTRAP, seed=1)
    except UserError as error:
        analysis.notes.append(f"parameter share at equal loss: {error}")
        return
    for k, arm in enumerate(arms[1:], start=1):
        arm.params = answers[0][k - 1].comparison


def _nd_view(plan: Plan, analysis: Analysis, trained: RunResults) -> None:
    """L(N, D) per arm where the ladder has 3 or more sizes and budgets; the baseline's compute
    for each arm's fitted loss at the arm's largest size (more tokens, same size), over the arm's."""
    if len(plan.sizes) < 3 or len(plan.budgets) < 3:
        return
    base_points = analysis.arms[0].points
    if not base_points:
        return
    N0 = float(np.exp(np.mean([math.log(p.params) for p in base_points])))
    D0 = float(np.exp(np.mean([math.log(p.tokens) for p in base_points])))
    for arm in analysis.arms:
        if arm.sizes < 3 or len({p.budget for p in arm.points}) < 3:
            continue
        try:
            arm.nd = fit.fit_nd([p.params for p in arm.points], [p.tokens for p in arm.points],
                                [trained(p).loss for p in arm.points], N0, D0)  # fmt: skip
        except UserError:
            continue
    base = analysis.arms[0]
    if base.nd is None:
        return
    for arm in analysis.arms[1:]:
        if arm.nd is None:
            continue
        last = max(arm.points, key=lambda p: trained(p).trained_flops)
        same_size = next((p for p in base.points if p.size == last.size), None)
        if same_size is None:
            continue
        loss = float(arm.nd.loss(last.params, last.tokens))
        tokens = base.nd.tokens_for(same_size.params, loss)
        per_token = trained(same_size).trained_flops / same_size.tokens
        arm.nd_multiplier = tokens * per_token / trained(last).trained_flops  # nan: flat in D


def share(comparison: fit.Comparison) -> tuple[float, float, float]:
    """The arm's parameters as a share of the baseline's at equal loss (the reciprocal of the
    parameter multiplier: 0.62 means the arm needs 62% of the baseline's parameters)."""

    def inv(v: float) -> float:
        return 0.0 if math.isinf(v) else (math.inf if v == 0 else 1 / v)

    return inv(comparison.multiplier), inv(comparison.high), inv(comparison.low)
