"""Each arm's learning rate, chosen so that it holds at every size: pure functions of the outcomes
of its runs (ladder.py plans the runs and reads their outcomes; these decide).

An outcome is a finite final val loss, `math.inf` for a run that diverged or failed (no rate it
gives is usable), or None for a run not finished yet (a decision then waits).

1. **Sweep, past its edges.** The arm trains at every multiplier on the smallest size. When the
   lowest loss is at the smallest or largest multiplier swept, one more multiplier is run that
   way, x2 beyond the edge, at most `extend` times; still at an edge after that, the arm is
   refused: no rate is known to be its best, so its fits would compare it at a handicap.
2. **A choice from several runs.** A parabola in log2(multiplier) is fitted by least squares to
   the lowest point and its finite neighbours up to two multipliers each side (three to five
   runs); its vertex, rounded (in log) to the nearest multiplier swept, is the choice. Noise of
   one run moves a vertex fitted to five by less than it moves the lowest of seven, at no extra
   run; with only three points the vertex always rounds to the lowest (it lies within half a
   step of it), and a parabola that opens downwards (noise over a flat minimum) falls back to the
   lowest point.
3. **Confirmation at the largest size.** The choice and its two neighbours in the sweep are
   trained at the largest size; the best of the three that neither diverged nor spiked is used
   there. None usable: the arm is refused.
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
SPIKE_NATS = 0.3
SMOOTH = 3
NOISE_SIGMAS = 6  # a spike rises this many times the noise of a smoothed point, at least SPIKE_NATS


@dataclass(frozen=True)
class Choice:
    """The decision the sweep's outcomes allow so far: a multiplier, a run still to make (`next`),
    a refusal, or nothing yet (pending: a run not finished)."""

    multiplier: float | None = None
    how: str = ""  # "fit over 5 runs, vertex x2.6" or "lowest of 3 runs"
    next: float | None = None  # the multiplier to run past an edge
    refused: str = ""

    @property
    def pending(self) -> bool:
        return self.multiplier is None and self.next is None and not self.refused


def fitted_vertex(losses: dict[float, float]) -> float | None:
    """The vertex (a multiplier) of the least-squares parabola in log2(multiplier) through the
    given finite losses, clipped to their range; None when it opens downwards or is flat."""
    x = np.log2(np.array(sorted(losses), dtype=float))
    y = np.array([losses[m] for m in sorted(losses)], dtype=float)
    a, b, _ = np.polyfit(x, y, 2)
    if not a > 1e-12:
        return None
    return float(2 ** np.clip(-b / (2 * a), x[0], x[-1]))


def choose(outcomes: dict[float, float | None], extended: int, extend: int = EXTEND) -> Choice:
    """The multiplier the sweep's outcomes choose (`extended`: how many it already ran past its
    own list). A choice at an edge (the lowest or the fitted) asks for the next run past it, or
    refuses the arm when `extend` runs past the edges were spent."""
    if not outcomes or any(v is None for v in outcomes.values()):
        return Choice()
    ms = sorted(outcomes)
    finite = {m: v for m, v in outcomes.items() if v is not None and math.isfinite(v)}
    if not finite:
        return Choice(refused="every multiplier swept diverged or failed")
    lowest = min(finite, key=finite.get)
    i = ms.index(lowest)
    near = {m: finite[m] for m in ms[max(0, i - FIT_REACH) : i + FIT_REACH + 1] if m in finite}
    vertex = fitted_vertex(near) if len(near) >= 3 else None
    if vertex is None:
        chosen, how = lowest, f"lowest of {len(finite)} runs"
    else:
        chosen = min(near, key=lambda m: abs(math.log2(m / vertex)))
        how = f"fit over {len(near)} runs, vertex x{vertex:.3g}"
    for edge, step, side in ((ms[-1], 2.0, "largest"), (ms[0], 0.5, "smallest")):
        if edge in (lowest, chosen):
            if extended < extend:
                return Choice(next=edge * step)
            return Choice(
                refused=f"its best rate is still the {side} swept (x{edge:g}) after {extended} multiplier(s) "
                "past the sweep's edges; widen lr_sweep.multipliers or raise lr_sweep.extend"
            )
    return Choice(chosen, how)


def neighbours(multipliers: Sequence[float], chosen: float) -> list[float]:
    """The chosen multiplier and the swept ones next to it (a choice is never at an edge)."""
    ms = sorted(multipliers)
    i = ms.index(chosen)
    return ms[max(0, i - 1) : i + 2]


def best_confirmed(outcomes: dict[float, tuple[float | None, str]], size: str) -> Choice:
    """The best of the multipliers trained at the largest size: outcome and instability ("" when
    none) per multiplier; a run that diverged, spiked or failed is never the best."""
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
    best = min(usable, key=usable.get)
    return Choice(best, f"best of {len(outcomes)} at {size}")


def interpolated(low: float, high: float, n_low: float, n_high: float, n: float) -> float:
    """The multiplier at n parameters on the power law through (n_low, low) and (n_high, high),
    to three significant figures (it names run folders)."""
    if low == high or n_low == n_high:
        return low
    t = math.log(n / n_low) / math.log(n_high / n_low)
    return float(f"{low * (high / low) ** t:.3g}")


def instability(steps: Sequence[int], losses: Sequence[float], margin: float = SPIKE_NATS) -> str:
    """ "" for a healthy logged training-loss curve, else what went wrong, in words. The rise that
    counts as a spike is `margin` or NOISE_SIGMAS times the noise of a smoothed point, whichever is
    larger: a small batch's loss is noisy, and its running minimum lies that much lower by chance.
    The noise comes from the curve itself, robustly: the median step-to-step change (a spike moves
    few of them) is 0.6745 sqrt(2) sigma for independent noise."""
    for step, loss in zip(steps, losses):
        if not math.isfinite(loss):
            return f"diverged: training loss {loss} at step {step}"
    if len(losses) < 2:
        return ""
    sigma = float(np.median(np.abs(np.diff(losses)))) / (0.6745 * math.sqrt(2))
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
