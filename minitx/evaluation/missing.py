"""Why a diagnostic figure is "-": the reasons, in words, that the report and the plots both print."""

from __future__ import annotations

# Why a layer's entropy is "-" (diagnostics.run_diagnostics' entropy_missing), in words.
MISSING_ENTROPY = {
    "no softmax map": "a {kinds} layer has no softmax map (a linear recurrence: its map is signed and "
    "unnormalised), so no first-token share, sink rate or entropy; those figures are the softmax layers'",
    "not a distribution": "{kinds}'s map, the one its values read after the post-softmax convolution and "
    "head mixing, has weights below 0 or rows above 1: no probability distribution, so no entropy",
    "one key": "a {kinds} layer: every row sees one key, whose entropy is 0 of at most 0: no figure",
}


def missing_notes(figures: dict, kinds: list[str]) -> list[str]:
    """One line per reason a layer's entropy is "-", naming the kinds of those layers."""
    found = figures.get("entropy_missing")
    if found is None:  # figures of an older minitx: only gdn layers had none, for want of a map
        found = ["no softmax map" if k == "gdn" else None for k in kinds]
    notes = []
    for reason, text in MISSING_ENTROPY.items():
        named = list(dict.fromkeys(k for k, r in zip(kinds, found) if r == reason))
        if named:
            notes.append(text.format(kinds="/".join(named)))
    return notes
