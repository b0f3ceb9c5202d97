"""Counts and times in words, for what the commands print: `1 run`, `2 runs`, `46 min 51 s`."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`1 run`, `0 runs`, `3 runs`; `plural` where adding an s is wrong (`1 GPU(s)` stays out)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def duration(seconds: float, compact: bool = False) -> str:
    """`2 h 05 min`, `46 min 51 s`, `42 s` (a report's sentence); compact, `2h05m`, `46m51s`,
    `42s` (the width of a log column). Whole seconds: no fractions."""
    hours, rest = divmod(int(round(seconds)), 3600)
    minutes, secs = divmod(rest, 60)
    h, m, s, gap = ("h", "m", "s", "") if compact else (" h", " min", " s", " ")
    if hours:
        return f"{hours}{h}{gap}{minutes:02d}{m}"
    return f"{minutes}{m}{gap}{secs:02d}{s}" if minutes else f"{secs}{s}"
