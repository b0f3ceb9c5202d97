"""What every plot of minitx shares: log axes labelled in plain numbers.

Matplotlib labels a log axis in scientific notation, and where it spans less than a decade it
labels the minor ticks the same way ("8.8x10^0", "2x10^0"): hard to read, and the labels collide.
"""

from __future__ import annotations

from typing import Any

from matplotlib.ticker import LogFormatter


class PlainLogFormatter(LogFormatter):
    """LogFormatter's numbers (8.8, 20, 1e+13), with large ones written short: 1e13, 2e5."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return super().__call__(x, pos).replace("e+0", "e").replace("e+", "e")


def plain_log_ticks(axis: Any) -> None:
    """Label a log-scaled axis (ax.xaxis or ax.yaxis) in plain numbers: 2, 5, 10, 200 (1e13
    where large); minor ticks are labelled only where the axis spans too little for the major ones
    alone, a few at most, so labels never crowd."""
    axis.set_major_formatter(PlainLogFormatter(labelOnlyBase=False))
    axis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
