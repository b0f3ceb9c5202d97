"""Counts in words, for what the commands print: `1 run`, `2 runs`."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`1 run`, `0 runs`, `3 runs`; `plural` where adding an s is wrong (`1 GPU(s)` stays out)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
