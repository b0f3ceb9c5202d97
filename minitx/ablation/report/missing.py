"""Why a variant shows "–" for a diagnostic: the reasons the table's notes and the bar charts both give."""

from __future__ import annotations

# Why a variant's runs have diagnostics but not this figure (diagnostics.run_diagnostics: None).
NO_FIGURE = {
    "first_token_share": "no layer has a softmax map (gdn alone: a linear recurrence, its map signed)",
    "sink_rate": "no layer has a softmax map (gdn alone: a linear recurrence, its map signed)",
    "entropy": "no layer's map is a probability distribution (gdn has no softmax map; MTA's, after its "
    "post-softmax convolution and head mixing, has weights below 0 or rows above 1)",
}


def missing_diagnostic(entry: dict, key: str) -> str | None:
    """Why a variant has no value of diagnostic `key` ("–" in the table, no bar in its plot), or
    None where it has one."""
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
