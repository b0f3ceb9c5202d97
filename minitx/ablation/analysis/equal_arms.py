"""Arms that ended equal: two arms whose runs of the same seed (and, in a designed sweep, the same
size, budget and rate) all reached the same final val loss to 4 decimals. Two kinds that really
differ do not; an arm equal to another is most often one whose kind is never used (an override
that names a kind no layer takes, a layers list that overrides it), which the report says."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from itertools import combinations

from ...wording import counted

DECIMALS = 4


def equal_lines(losses: Mapping[str, Mapping[Hashable, float]]) -> list[str]:
    """One line, saying what to check, per pair of arms (in the given order) that share a run (the
    same key: a seed, or a point of the plan) and are equal to DECIMALS, as the report's tables
    show them, in every one they share."""
    lines = []
    for first, second in combinations(losses, 2):
        shared = [key for key in losses[first] if key in losses[second]]
        if shared and all(
            f"{losses[first][k]:.{DECIMALS}f}" == f"{losses[second][k]:.{DECIMALS}f}" for k in shared
        ):
            lines.append(
                f"arms {first} and {second} are equal to {DECIMALS} decimals ({counted(len(shared), 'run')} of the "
                "same seed): is the kind really used? check model.attention.kind and model.attention.layers of each"
            )
    return lines
