"""Each arm's learning rate, chosen so that it holds at every size: pure functions of the outcomes
of its runs (ladder.py plans the runs and reads their outcomes; these decide).

An outcome is a finite final val loss, `math.inf` for a run that diverged or failed (no rate it
gives is usable), or None for a run not finished yet (a decision then waits).

1. **Sweep, past its edges.** The arm trains at every multiplier on the smallest size. When its
   lowest finite loss is at the smallest or largest multiplier swept, one more multiplier is run
   that way, x2 beyond the edge, at most `extend` times; still there after that, the arm is
   refused: no rate is known to be its best, so its fits would compare it at a handicap. Only the
   lowest run decides this: a fitted minimum past an edge whose lowest run is inside (a flat top)
   is a rate to take, not a refusal.
2. **The rule: the smallest rate within MARGIN of the fitted minimum.** A parabola in
   log2(multiplier) is fitted by least squares to the lowest finite run and its finite neighbours
   up to FIT_REACH multipliers each side (three to five runs); the choice is the smallest of those
   multipliers whose loss on the parabola lies within MARGIN (relative) of the parabola's minimum
   over their range (the one lowest on the parabola when the margin holds none). The flat side of a
   minimum is the safe side: the edge of stability is above it, where a rate too high costs most
   and a seed's outcome varies most (a lucky run there pulls a vertex up). With fewer than three
   finite runs, or a parabola that does not open upwards (noise over a flat minimum), the margin is
   taken about the lowest run instead. benchmarks/lr_rule.py chose MARGIN on simulated sweeps whose
   seed noise grows near the edge: against the vertex rounded to the nearest multiplier (the rule
   before it) fewer A/A pairs choose differently and the ladder's run at the choice loses less. **A
   parabola that misfits its runs is reported, not trusted**: the choice's own measured loss may
   lie at most TOLERANCE (relative) above the lowest measured run; past that the margin is taken
   about the lowest run instead, and the sentence says so.
3. **The same rule at the largest size.** The choice and its two neighbours in the sweep (the three
   nearest it, when it is the smallest or largest swept) are trained at the largest size, and the
   same rule over those that neither diverged nor spiked gives the rate used there. None usable:
   the arm is refused.
4. **Sizes between** train at the rate interpolated geometrically in parameters between the
   sweep size's choice and the largest size's: a power law lr(N) through the two measured sizes.
5. **Instability.** A run diverged when its loss is not finite; it spiked when its logged
   training loss, smoothed over SMOOTH logged steps, rises above its own running minimum by more
   than SPIKE_NATS, or NOISE_SIGMAS times the curve's own noise where that is larger (a healthy
   run's loss falls; a small batch's loss is noisy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

EXTEND = 2  # multipliers run past the sweep's edges, per arm, before it is refused (lr_sweep.extend)
FIT_REACH = 2  # multipliers each side of the lowest that the parabola sees
MARGIN = 0.005  # the relative loss a choice may give up for a smaller rate (benchmarks/lr_rule.py)
# A choice's measured loss above the lowest run by more than this says the parabola misfits its
# runs: twice the margin, about 2 sds of one run's seed noise on the showcase (sd of log loss
# 0.004-0.007). The showcase's gqa (x4 0.9% above a lucky x8) keeps its choice; a small design's
# baseline (x2 2.1% above x4, issue 61) does not.
TOLERANCE = 0.01
SPIKE_NATS = 0.3
SMOOTH = 3
NOISE_SIGMAS = 6  # a spike rises this many times the noise of a smoothed point, at least SPIKE_NATS


@dataclass(frozen=True)
class Choice:
    """The decision the sweep's outcomes allow so far: a multiplier, a run still to make (`next`),
    a refusal, or nothing yet (pending: a run not finished)."""

    multiplier: float | None = None
    how: str = ""  # "within 0.5% of the fitted minimum x5.8 over 5 runs", "... of the lowest of 4 runs"
    next: float | None = None  # the multiplier to run past an edge
    refused: str = ""

    @property
    def pending(self) -> bool:
        return self.multiplier is None and self.next is None and not self.refused


def fitted_parabola(losses: dict[float, float]) -> np.poly1d | None:
    """The least-squares parabola in log2(multiplier) through the given finite losses (three or
    more); None when it does not open upwards (no minimum to measure a margin from)."""
    if len(losses) < 3:
        return None
    x = np.log2(np.array(sorted(losses), dtype=float))
    y = np.array([losses[m] for m in sorted(losses)], dtype=float)
    parabola = np.poly1d(np.polyfit(x, y, 2))
    return parabola if parabola.coeffs[0] > 1e-12 else None


def within_margin(losses: dict[float, float], margin: float = MARGIN) -> tuple[float, str]:
    """The rule (2. above), at every size, over the given multipliers (finite losses, one or
    more): the multiplier it chooses, with a sentence saying how."""
    ms = sorted(losses)
    parabola = fitted_parabola(losses)
    if parabola is None:
        values = [losses[m] for m in ms]
        floor, where = min(values), f"the lowest of {len(ms)} run{'s' if len(ms) > 1 else ''}"
    else:
        x = np.log2(np.array(ms, dtype=float))
        vertex = float(np.clip(-parabola.coeffs[1] / (2 * parabola.coeffs[0]), x[0], x[-1]))
        values = [float(v) for v in parabola(x)]
        floor = float(parabola(vertex))
        where = f"the fitted minimum x{2**vertex:.3g} over {len(ms)} runs"
    limit = max(floor + margin * abs(floor), min(values))
    chosen = next(m for m, value in zip(ms, values) if value <= limit)
    lowest = min(ms, key=losses.get)
    if parabola is not None and losses[chosen] > losses[lowest] + TOLERANCE * abs(losses[lowest]):
        above = 100 * (losses[chosen] / losses[lowest] - 1)
        limit = losses[lowest] + margin * abs(losses[lowest])
        misfit = chosen
        chosen = next(m for m in ms if losses[m] <= limit)
        return chosen, (
            f"within {100 * margin:.2g}% of the lowest of {len(ms)} runs (the parabola misfit them: its choice "
            f"x{misfit:g} measured {above:.1f}% above x{lowest:g})"
        )
    return chosen, f"within {100 * margin:.2g}% of {where}"


def choose(
    outcomes: dict[float, float | None], extended: int, extend: int = EXTEND, margin: float = MARGIN
) -> Choice:
    """What the sweep's outcomes decide (1. and 2. above; `extended`: how many multipliers it
    already ran past its own list)."""
    if not outcomes or any(v is None for v in outcomes.values()):
        return Choice()
    ms = sorted(outcomes)
    finite = {m: v for m, v in outcomes.items() if v is not None and math.isfinite(v)}
    if not finite:
        return Choice(refused="every multiplier swept diverged or failed")
    lowest = min(finite, key=finite.get)
    for edge, step, side in ((ms[-1], 2.0, "largest"), (ms[0], 0.5, "smallest")):
        if lowest == edge and len(ms) > 1:
            if extended < extend:
                return Choice(next=edge * step)
            return Choice(
                refused=f"its best rate is still the {side} swept (x{edge:g}) after {extended} multiplier(s) "
                "past the sweep's edges; widen lr_sweep.multipliers or raise lr_sweep.extend"
            )
    i = ms.index(lowest)
    near = {m: finite[m] for m in ms[max(0, i - FIT_REACH) : i + FIT_REACH + 1] if m in finite}
    return Choice(*within_margin(near, margin))


def neighbours(multipliers: Sequence[float], chosen: float) -> list[float]:
    """The chosen multiplier and the swept ones next to it: three, centred on the choice, or the
    three nearest it when it is the smallest or largest swept (a flat side can choose an edge)."""
    ms = sorted(multipliers)
    i = ms.index(chosen)
    start = min(max(0, i - 1), max(0, len(ms) - 3))
    return ms[start : start + 3]


def best_confirmed(
    outcomes: dict[float, tuple[float | None, str]], size: str, margin: float = MARGIN
) -> Choice:
    """The multiplier used at the largest size: the same rule as the sweep's (`within_margin`)
    over the runs trained there, outcome and instability ("" when none) per multiplier; a run
    that diverged, spiked or failed is left out of the fit and never chosen."""
    if any(loss is None and not trouble for loss, trouble in outcomes.values()):
        return Choice()
    usable = {
        m: loss
        for m, (loss, trouble) in outcomes.items()
        if loss is not None and math.isfinite(loss) and not trouble
    }
    if not usable:
        tried = ", ".join(f"x{m:g}" for m in sorted(outcomes))
        return Choice(refused=f"every rate tried at {size} ({tried}) diverged, spiked or failed")
    chosen, how = within_margin(usable, margin)
    return Choice(chosen, f"{how} at {size}")


def interpolated(low: float, high: float, n_low: float, n_high: float, n: float) -> float:
    """The multiplier at n parameters on the power law through (n_low, low) and (n_high, high),
    to three significant figures (it names run folders)."""
    if low == high or n_low == n_high:
        return low
    t = math.log(n / n_low) / math.log(n_high / n_low)
    return float(f"{low * (high / low) ** t:.3g}")


def sd_from_differences(differences: Sequence[float]) -> float:
    """The sd of one value from differences of two independent ones (replicate pairs, or a noisy
    curve's steps), robustly: the median |difference| is 0.6745 sqrt(2) sd."""
    return float(np.median(np.abs(differences))) / (0.6745 * math.sqrt(2))


def instability(steps: Sequence[int], losses: Sequence[float], margin: float = SPIKE_NATS) -> str:
    """ "" for a healthy logged training-loss curve, else what went wrong, in words. The rise that
    counts as a spike is `margin` or NOISE_SIGMAS times the noise of a smoothed point, whichever is
    larger: a small batch's loss is noisy, and its running minimum lies that much lower by chance.
    The noise comes from the curve itself, robustly: the median step-to-step change (a spike moves
    few of them) gives sigma (sd_from_differences)."""
    for step, loss in zip(steps, losses):
        if not math.isfinite(loss):
            return f"diverged: training loss {loss} at step {step}"
    if len(losses) < 2:
        return ""
    sigma = sd_from_differences(np.diff(losses))
    limit = max(margin, NOISE_SIGMAS * sigma / math.sqrt(SMOOTH))
    smooth = [float(np.mean(losses[max(0, i - SMOOTH + 1) : i + 1])) for i in range(len(losses))]
    low = math.inf
    for i, value in enumerate(smooth):
        if i >= SMOOTH and value > low + limit:
            return (
                f"spiked: training loss {value:.3f} (mean of {SMOOTH} logged) at step {steps[i]}, "
                f"{value - low:.2f} above its running minimum {low:.3f}"
            )
        low = min(low, value)
    return ""
