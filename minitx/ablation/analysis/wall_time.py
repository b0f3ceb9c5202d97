"""What a sweep cost in time, from its runs' records (run.json: process_seconds, and finished_at
since minitx kept it): one line for its report.

The wall time is the union of the runs' spans (each from finished_at - process_seconds to
finished_at): the time during which some run was training. A sweep run in one go is that long
(its evaluations after the runs aside); one stopped and resumed a day later does not count the
day between. Beside it, the training processes' seconds summed, which --parallel runs overlap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime

from ...wording import counted, duration


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _end(value) -> float | None:
    """finished_at (ISO 8601, as runner.finish_record writes it) in seconds, None where absent."""
    try:
        return datetime.fromisoformat(str(value)).timestamp() if value else None
    except ValueError:
        return None


def _times(runs: Iterable[tuple[object, object]]) -> tuple[list[float], list[tuple[float, float]]]:
    """The process seconds of the runs' (finished_at, process_seconds) that recorded some, and
    the (start, end) spans of those that also kept an end time."""
    seconds, spans = [], []
    for finished_at, process_seconds in runs:
        length, end = _number(process_seconds), _end(finished_at)
        if length is not None:
            seconds.append(length)
            if end is not None:
                spans.append((end - length, end))
    return seconds, spans


def covered(spans: Iterable[tuple[float, float]]) -> float:
    """The length of the union of (start, end) spans."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def wall_time(runs: Iterable[tuple[object, object]]) -> str:
    """One line of a sweep's time from its runs' (finished_at, process_seconds), "" when none
    recorded a time."""
    seconds, spans = _times(runs)
    if not seconds:
        return ""
    summed = f"{duration(sum(seconds))} of training processes in all ({counted(len(seconds), 'run')})"
    if not spans:
        return f"time: {summed}; its runs kept no end time (an earlier minitx), so no wall time"
    untimed = len(seconds) - len(spans)
    missing = f"; {untimed} run(s) kept no end time and are not in it" if untimed else ""
    return (
        f"wall time: {duration(covered(spans))} with some run training (the union of the runs' spans, "
        f"{counted(len(spans), 'run')}{missing}), {summed}"
    )


def phase_times(phases: Mapping[str, Iterable[tuple[object, object]]]) -> str:
    """ "learning rates 12 min 03 s, ladder 20 min 11 s": each phase's wall time, from its runs'
    (finished_at, process_seconds) as wall_time reads them; "" where no phase has one."""
    parts = []
    for name, runs in phases.items():
        spans = _times(runs)[1]
        if spans:
            parts.append(f"{name} {duration(covered(spans))}")
    return ", ".join(parts)
