"""Arms that ended equal: two arms whose runs of the same seed (and, in a designed sweep, the same
size, budget and rate) all reached the same final val loss to 4 decimals. Two kinds that really
differ do not; an arm equal to another is most often one whose kind is never used (an override
that names a kind no layer takes, a layers list that overrides it), which the report says."""

from __future__ import annotations

from collections.abc import Hashable, Mapping

DECIMALS = 4


def _shown(loss: float) -> str:
    return f"{loss:.{DECIMALS}f}"  # as the report's tables show it


def equal_pairs(losses: Mapping[str, Mapping[Hashable, float]]) -> list[tuple[str, str, int]]:
    """(arm, arm, runs compared) for each pair of arms, in the given order, that share a run (the
    same key: a seed, or a point of the plan) and are equal to DECIMALS in every one they share."""
    arms = list(losses)
    pairs = []
    for i, first in enumerate(arms):
        for second in arms[i + 1 :]:
            shared = [key for key in losses[first] if key in losses[second]]
            if shared and all(_shown(losses[first][key]) == _shown(losses[second][key]) for key in shared):
                pairs.append((first, second, len(shared)))
    return pairs


def equal_lines(losses: Mapping[str, Mapping[Hashable, float]]) -> list[str]:
    """One line per pair of equal arms, saying what to check."""
    return [
        f"arms {first} and {second} are equal to {DECIMALS} decimals ({n} run{'s' if n > 1 else ''} of the same "
        "seed): is the kind really used? check model.attention.kind and model.attention.layers of each"
        for first, second, n in equal_pairs(losses)
    ]
