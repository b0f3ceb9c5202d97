"""Why a diagnostic figure is "-": the reasons, in words, that evaluate's report and plots print for
a layer (missing_notes), and a sweep's tables and bar charts for a variant (missing_diagnostic)."""

from __future__ import annotations


def shown(value: float | None, spec: str) -> str:
    """value formatted by `spec`, or "-" where there is none (what the notes below explain)."""
    return "-" if value is None else format(value, spec)


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


# Why a variant's runs have diagnostics but not this figure (diagnostics.run_diagnostics: None).
NO_MAP = "no layer has a softmax map (gdn alone: a linear recurrence, its map signed)"
NO_FIGURE = {
    "first_token_share": NO_MAP,
    "sink_rate": NO_MAP,
    "entropy": "no layer's map is a probability distribution (gdn has no softmax map; MTA's, after its "
    "post-softmax convolution and head mixing, has weights below 0 or rows above 1)",
}


def missing_diagnostic(entry: dict, key: str) -> str | None:
    """Why a sweep's variant (its table entry) has no value of diagnostic `key` ("–" in the
    table, no bar in its plot), or None where it has one."""
    found = entry.get("diagnostics") or {}
    if found.get(key, (None, None))[0] is not None:
        return None
    if entry["ok"] == 0:
        return "no run finished"
    if entry.get("diagnostics_note"):
        return entry["diagnostics_note"]
    if found.get("massive_ratio", (None, None))[0] is None:  # every diagnosed run has this one
        if entry.get("task_exact_match", (None, None))[0] is not None:
            return "a synthetic task: no held-out text to read"
        return "not computed (the sweep's evaluation did not run for it)"
    return NO_FIGURE.get(key, "none of its runs has it")
