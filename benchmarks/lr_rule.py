"""The learning-rate rule of a designed sweep (minitx/ablation/plan/rates.py), tried on sweeps whose
truth is known: a valley in log2(lr) with a cliff above it, and seed noise that grows near the edge
of stability (as the showcase's replicates at x8 showed: +0.085 and +0.042 nats between two seeds
where other pairs differed by at most 0.019).

    python benchmarks/lr_rule.py                  # 2,000 valleys per table, a few minutes
    python benchmarks/lr_rule.py --valleys 4000   # as recorded in benchmarks/RESULTS.md

Each valley, in log loss against x = log2(multiplier):

    mean(x) = FLOOR + c (x - x_opt)^2 + CLIFF_HEIGHT exp((x - x_edge) / CLIFF_WIDTH)
    sd(x)   = S0 (1 + k exp((min(x, x_edge) - x_edge) / w))

with the optimum x_opt anywhere between x1 and x11 (uniform in log), the curvature c 0.008-0.02
per octave squared (the showcase's d32 sweeps: about 0.015), and the edge of stability x_edge 1 to
2.5 octaves above the optimum. The noise stops growing at the edge (past it the cliff and
divergence take over: a run there is never much luckier than one at the edge); a run past the
edge diverges with a probability that grows from 0 at the edge to 1 an octave past it. NOISES
lists the noise shapes, each a table: a moderate growth (k 8, w 0.5) and one as large as the
showcase's x8 pairs (k 20, w 0.6), each `normal` (the extra noise near the edge goes either way)
or `one-sided` (it only ever costs: a seed near the edge is unlucky or not).

A sweep is 7 multipliers, x0.25 to x16, extended past an edge as the rule asks (at most twice);
the last table sweeps [0.5, 1, 2] as the issue's A/A sweep did, where refusals happen.
Per rule, over the valleys:
- A/A flips: two sweeps of the same valley with independent seeds choose different multipliers
  (or one refuses);
- regret: the loss of the ladder's run (a fresh seed) at the chosen rate, minus the expected loss
  of the best rate a sweep can run, in log loss (mean, a diverged ladder run counted as 0.2; and
  how often it exceeds 0.02, a ladder point as unlucky as the showcase's);
- refused: the sweep refused the arm;
- spread: the sd of log2(choice) between the two sweeps of a valley, in octaves.
"at the largest size" rows do the same there (the optimum and the edge an octave lower, as the
showcase's d64 confirmations found): the three confirmation runs at the rule's sweep choice and its
neighbours, chosen by the best of three (the confirmation before) or by the same rule as the sweep.

Every rule sees the same draws (common random numbers), so their differences are the rules'.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minitx.ablation.plan import rates  # noqa: E402

GRID = (0.25, 0.5, 1, 2, 4, 8, 16)
NARROW = (0.5, 1, 2)  # the A/A sweep: run past its top edge up to x8, optima up to x11 beyond it
FLOOR = math.log(2.07)  # the showcase's d32 losses at their best rate
CURVATURE = (0.008, 0.02)
OPTIMUM = (0.0, 3.5)  # x1 to x11.3
EDGE_ABOVE = (1.0, 2.5)  # octaves from the optimum to the edge of stability
CLIFF_HEIGHT, CLIFF_WIDTH = 0.01, 0.4
S0 = 0.004  # seed noise far from the edge, in log loss (the showcase's replicates: at most 0.019 apart)
DIVERGE_OCTAVES = 1.0  # past the edge, a run diverges with probability rising to 1 this far on
LARGEST_SHIFT = -1.0  # the largest size's optimum and edge, in octaves from the sweep size's
BAD = 0.02  # a ladder point this much worse (log loss) than the best swept rate's expectation
POSITIONS = np.arange(-6, 9)  # x of every multiplier a sweep can reach (x1/64 to x256)


@dataclass(frozen=True)
class Noise:
    """How seed noise grows near the edge: sd = S0 (1 + k exp((min(x, edge) - edge) / w))."""

    name: str
    k: float
    w: float
    one_sided: bool  # the extra noise only ever costs (|z|), or goes either way (z)


NOISES = (
    Noise("moderate (sd 0.008 an octave below the edge, 0.036 at it)", 8.0, 0.5, False),
    Noise("moderate, one-sided", 8.0, 0.5, True),
    Noise("as the showcase's x8 pairs (sd 0.019 an octave below the edge, 0.084 at it)", 20.0, 0.6, False),
    Noise("as the showcase's x8 pairs, one-sided", 20.0, 0.6, True),
)


@dataclass(frozen=True)
class Valley:
    optimum: float
    curvature: float
    edge: float
    noise: Noise

    def mean(self, x):
        return (
            FLOOR
            + self.curvature * (x - self.optimum) ** 2
            + CLIFF_HEIGHT * np.exp((x - self.edge) / CLIFF_WIDTH)
        )

    def extra_sd(self, x):
        return S0 * self.noise.k * np.exp(np.minimum(x - self.edge, 0.0) / self.noise.w)

    def expected(self, x):
        """The mean over seeds: the one-sided extra noise costs E|z| = sqrt(2/pi) of its sd."""
        return self.mean(x) + (self.extra_sd(x) * math.sqrt(2 / math.pi) if self.noise.one_sided else 0.0)

    def shifted(self, octaves: float) -> Valley:
        return Valley(self.optimum + octaves, self.curvature, self.edge + octaves, self.noise)


@dataclass
class Seed:
    """One seed's draws at every reachable multiplier (so each rule sees the same runs)."""

    base: np.ndarray
    extra: np.ndarray
    diverge: np.ndarray

    @classmethod
    def draw(cls, rng: np.random.Generator) -> Seed:
        n = len(POSITIONS)
        return cls(rng.standard_normal(n), rng.standard_normal(n), rng.random(n))

    def loss(self, valley: Valley, x: float) -> float:
        """The final val loss (not its log: what rates.py sees) of this seed's run at x."""
        i = int(round(x)) - POSITIONS[0]
        if self.diverge[i] < (x - valley.edge) / DIVERGE_OCTAVES:
            return math.inf
        extra = abs(self.extra[i]) if valley.noise.one_sided else self.extra[i]
        return math.exp(valley.mean(x) + S0 * self.base[i] + valley.extra_sd(x) * extra)


Rule = Callable[[dict, int], rates.Choice]


def vertex_rounded(
    outcomes: dict[float, float | None], extended: int, extend: int = rates.EXTEND
) -> rates.Choice:
    """The rule before issue 55: the vertex of the parabola through the lowest run and up to two
    neighbours each side, rounded in log to the nearest swept; the sweep runs past an edge when the
    lowest or the rounded vertex is at it, and refuses the arm there after `extend` such runs."""
    ms = sorted(outcomes)
    finite = {m: v for m, v in outcomes.items() if v is not None and math.isfinite(v)}
    if not finite:
        return rates.Choice(refused="every multiplier swept diverged")
    lowest = min(finite, key=finite.get)
    i = ms.index(lowest)
    near = {m: finite[m] for m in ms[max(0, i - 2) : i + 3] if m in finite}
    chosen = lowest
    if len(near) >= 3:
        x = np.log2(np.array(sorted(near), dtype=float))
        a, b, _ = np.polyfit(x, [near[m] for m in sorted(near)], 2)
        if a > 1e-12:
            vertex = 2 ** np.clip(-b / (2 * a), x[0], x[-1])
            chosen = min(near, key=lambda m: abs(math.log2(m / vertex)))
    for edge, step in ((ms[-1], 2.0), (ms[0], 0.5)):
        if edge in (lowest, chosen):
            if extended < extend:
                return rates.Choice(next=edge * step)
            return rates.Choice(refused="at an edge")
    return rates.Choice(chosen, "vertex rounded")


def lowest_run(outcomes: dict[float, float | None], extended: int) -> rates.Choice:
    """The lowest run, past the edges as rates.choose (for scale: what one lucky seed moves most)."""
    choice = rates.choose(outcomes, extended)
    if choice.multiplier is None:
        return choice
    finite = {m: v for m, v in outcomes.items() if math.isfinite(v)}
    return rates.Choice(min(finite, key=finite.get), "lowest")


def margin_rule(margin: float) -> Rule:
    return lambda outcomes, extended: rates.choose(outcomes, extended, margin=margin)


def sweep(valley: Valley, seed: Seed, rule: Rule, grid=GRID) -> rates.Choice:
    outcomes = {m: seed.loss(valley, math.log2(m)) for m in grid}
    while True:
        choice = rule(outcomes, len(outcomes) - len(grid))
        if choice.next is None:
            return choice
        outcomes[choice.next] = seed.loss(valley, math.log2(choice.next))


def best_of_three(outcomes: dict[float, tuple[float | None, str]], size: str) -> rates.Choice:
    usable = {m: loss for m, (loss, _) in outcomes.items() if math.isfinite(loss)}
    if not usable:
        return rates.Choice(refused="none usable")
    return rates.Choice(min(usable, key=usable.get), "best of 3")


@dataclass
class Tally:
    flips: int = 0
    pairs: int = 0
    refused: int = 0
    sweeps: int = 0
    regrets: list = None
    spread: list = None
    diverged: int = 0

    def __post_init__(self):
        self.regrets, self.spread = [], []

    def row(self, name: str) -> str:
        regrets = np.array(self.regrets)
        return (
            f"| {name} | {100 * self.flips / self.pairs:.1f}% | {regrets.mean():.4f} | "
            f"{100 * np.mean(regrets > BAD):.1f}% | {100 * self.diverged / max(1, len(regrets)):.1f}% | "
            f"{100 * self.refused / self.sweeps:.1f}% | {math.sqrt(np.mean(self.spread)) if self.spread else 0:.2f} |"
        )

    def count(self, first: float | None, second: float | None, regrets: list[float]) -> None:
        self.pairs += 1
        self.sweeps += 2
        self.refused += (first is None) + (second is None)
        self.flips += first != second
        if first is not None and second is not None:
            self.spread.append((math.log2(first) - math.log2(second)) ** 2 / 2)
        for regret in regrets:
            if math.isfinite(regret):
                self.regrets.append(regret)
            else:
                self.diverged += 1
                self.regrets.append(BAD * 10)  # a diverged ladder run: counted as a bad point


def regret(valley: Valley, ladder: Seed, chosen: float | None, candidates) -> list[float]:
    if chosen is None:
        return []
    best = min(valley.expected(math.log2(m)) for m in candidates)
    return [math.log(ladder.loss(valley, math.log2(chosen))) - best]


def simulate(rules: dict[str, Rule], valleys: int, seed: int, noise: Noise, grid=GRID) -> tuple[dict, dict]:
    """Tallies per rule for the sweep of `grid` (the choice at the smallest size) and the
    confirmation (the rate used at the largest size, by the best of three or by the rule)."""
    rng = np.random.default_rng(seed)
    at_sweep = {name: Tally() for name in rules}
    confirm_rules = {"best of 3 (old)": best_of_three, "the rule": rates.best_confirmed}
    ends = [2.0**k for k in range(1, rates.EXTEND + 1)]
    reach = [grid[0] / k for k in ends] + list(grid) + [grid[-1] * k for k in ends]  # what a sweep can run
    at_largest = {name: Tally() for name in confirm_rules}
    for _ in range(valleys):
        optimum = rng.uniform(*OPTIMUM)
        valley = Valley(optimum, rng.uniform(*CURVATURE), optimum + rng.uniform(*EDGE_ABOVE), noise)
        seeds = [Seed.draw(rng) for _ in range(2)]
        ladder = Seed.draw(rng)
        confirm_seeds, confirm_ladder = [Seed.draw(rng) for _ in range(2)], Seed.draw(rng)
        for name, rule in rules.items():
            first, second = (sweep(valley, s, rule, grid).multiplier for s in seeds)
            regrets = regret(valley, ladder, first, reach) + regret(valley, ladder, second, reach)
            at_sweep[name].count(first, second, regrets)
        # the largest size: the new rule's sweep choice, confirmed by each confirmation rule
        chosen = sweep(valley, seeds[0], margin_rule(rates.MARGIN), grid).multiplier
        if chosen is None or grid != GRID:
            continue
        large = valley.shifted(LARGEST_SHIFT)
        tried = rates.neighbours(GRID, chosen) if chosen in GRID else [chosen]
        for name, rule in confirm_rules.items():
            picks = []
            for s in confirm_seeds:
                outcomes = {m: (s.loss(large, math.log2(m)), "") for m in tried}
                outcomes = {m: (v, "" if math.isfinite(v) else "diverged") for m, (v, _) in outcomes.items()}
                picks.append(rule(outcomes, "largest").multiplier)
            regrets = regret(large, confirm_ladder, picks[0], tried) + regret(
                large, confirm_ladder, picks[1], tried
            )
            at_largest[name].count(picks[0], picks[1], regrets)
    return at_sweep, at_largest


HEADER = (
    "| rule | A/A flips | mean regret | regret > 0.02 | ladder run diverged | refused | spread (octaves) |\n"
    "|---|---:|---:|---:|---:|---:|---:|"
)


def rules_compared() -> dict[str, Rule]:
    rules: dict[str, Rule] = {"vertex rounded (old)": vertex_rounded, "lowest run": lowest_run}
    for margin in (0.0, 0.0025, 0.005, 0.01, 0.02):
        name = f"within {100 * margin:g}% (smallest)"
        rules[name + (" **coded**" if margin == rates.MARGIN else "")] = margin_rule(margin)
    return rules


def table(noise: Noise, valleys: int, seed: int, grid=GRID) -> str:
    at_sweep, at_largest = simulate(rules_compared(), valleys, seed, noise, grid)
    swept = ", ".join(f"x{m:g}" for m in grid)
    lines = [f"### Noise {noise.name}; sweep {swept}", "", HEADER]
    lines += [tally.row(name) for name, tally in at_sweep.items()]
    if grid == GRID:
        lines += [tally.row(f"at the largest size: {name}") for name, tally in at_largest.items()]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--valleys", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=55)
    args = parser.parse_args(argv)
    print(
        f"{platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}; {args.valleys} "
        f"valleys per table, seed {args.seed}; rates.MARGIN {rates.MARGIN}"
    )
    for noise in NOISES:
        print("\n" + table(noise, args.valleys, args.seed), flush=True)
    print("\n" + table(NOISES[0], args.valleys, args.seed, NARROW))


if __name__ == "__main__":
    main()
