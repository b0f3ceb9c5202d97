"""Log axes are labelled in plain numbers (minitx/plotting.py), not matplotlib's 8.8x10^0."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from minitx.plotting import plain_log_ticks  # noqa: E402


def labels(low: float, high: float) -> list[str]:
    fig, ax = plt.subplots()
    ax.plot([low, high], [low, high])
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    fig.canvas.draw()
    bottom, top = ax.get_ylim()
    ticks = ax.get_yticklabels(minor=False) + ax.get_yticklabels(minor=True)
    shown = [t.get_text() for t in ticks if bottom <= t.get_position()[1] <= top]
    plt.close(fig)
    return [t for t in shown if t]


@pytest.mark.parametrize(
    "low, high, some",
    [
        (5.3, 9.1, {"6", "8"}),  # less than a decade: minor ticks labelled, plainly
        (3.0, 2000.0, {"10", "100", "1000"}),
        (2.2e13, 6e13, {"3e13", "4e13"}),  # training FLOPs
    ],
)
def test_log_ticks_are_plain_numbers(low, high, some):
    shown = labels(low, high)
    assert some <= set(shown), shown
    assert not any("times" in t or "^" in t or "$" in t or "e+" in t for t in shown), shown
    assert len(shown) <= 9  # a few labels, not one per minor tick
