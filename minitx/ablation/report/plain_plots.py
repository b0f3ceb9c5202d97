"""Plots of an ablation table (see table.aggregate): loss curves, cost against quality, loss against
context, and a bar chart per diagnostic.

Headless on purpose (the Agg backend): sweeps run on servers and in tests.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402

from ...evaluation.missing import missing_diagnostic  # noqa: E402
from ...plotting import plain_log_ticks  # noqa: E402
from ...wording import counted  # noqa: E402
from ..analysis.table import length_key  # noqa: E402


def _finished(table: list[dict]) -> list[dict]:
    return [entry for entry in table if entry["ok"] > 0]


def save(fig, path: Path, **layout) -> None:
    fig.tight_layout(**layout)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def finish(fig, ax, path: Path, title: str, empty: str, **legend) -> None:
    """Title a plot, give it a legend where it has labels (`legend`: where it goes), or say why it
    is empty, and write it."""
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.lines or ax.patches or ax.collections:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, **legend)
    else:
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes)
    save(fig, path)


BESIDE = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0}  # a legend covering no line


def loss_curves(table: list[dict], path: Path) -> None:
    """Validation loss against tokens seen, one line per variant (mean over seeds, +-std band)."""
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for entry in _finished(table):
        if not entry["curve"]:
            continue
        tokens, mean, std = np.array(entry["curve"]).T
        label = f"{entry['variant']} ({counted(entry['ok'], 'seed')})"
        (line,) = ax.plot(tokens, mean, marker="o", markersize=3, label=label)
        if std.any():
            ax.fill_between(tokens, mean - std, mean + std, color=line.get_color(), alpha=0.2)
    ax.ticklabel_format(useOffset=False)
    ax.set_xlabel("tokens seen")
    ax.set_ylabel("validation loss")
    finish(fig, ax, path, "Validation loss (mean over seeds)", "no finished runs", **BESIDE)


def cost_quality(table: list[dict], path: Path) -> None:
    """Quality against two costs: training throughput and KV-cache bytes per token. Quality is
    exact-match accuracy where every variant has one (tasks with targets, such as the toy task),
    else the best validation loss."""
    panels = [
        ("tokens_per_s", "training tokens/s (higher is cheaper)"),
        ("kv_bytes_per_token", "KV cache bytes per token (lower is cheaper)"),
    ]
    entries = _finished(table)
    if entries and all(e["val_accuracy"][0] is not None for e in entries):
        quality, quality_label = "val_accuracy", "exact-match accuracy, final (higher is better)"
    else:
        quality, quality_label = "best_val_loss", "best validation loss (lower is better)"
    entries = [e for e in entries if e[quality][0] is not None]
    fig, axes = plt.subplots(1, len(panels), figsize=(11, 4.5))
    for ax, (key, label) in zip(axes, panels):
        for entry in entries:
            (x, x_std), (y, y_std) = entry[key], entry[quality]
            if x is None:
                continue
            ax.errorbar(x, y, xerr=x_std, yerr=y_std, fmt="o", capsize=3)
            ax.annotate(entry["variant"], (x, y), textcoords="offset points", xytext=(5, 5), fontsize=9)
        ax.ticklabel_format(useOffset=False, style="plain")
        ax.set_xlabel(label)
        ax.set_ylabel(quality_label)
        ax.grid(alpha=0.3)
        if not entries:
            ax.text(0.5, 0.5, "no finished runs", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle("Cost against quality (mean ± std over seeds)")
    save(fig, path)


def loss_vs_context(table: list[dict], lengths: list[int], path: Path) -> None:
    """Held-out loss against the context length it was scored at, one line per variant (mean over
    seeds, ±std bars); a length a variant cannot run is left out of its line."""
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for entry in _finished(table):
        points = [(n, *entry.get(length_key(n), (None, None))) for n in lengths]
        points = [(n, mean, std or 0.0) for n, mean, std in points if mean is not None]
        if points:
            n, mean, std = zip(*points)
            ax.errorbar(n, mean, yerr=std, marker="o", markersize=4, capsize=3, label=entry["variant"])
    ax.set_xscale("log", base=2)
    plain_log_ticks(ax.xaxis)
    if lengths:
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.minorticks_off()  # the lengths scored, and no other label
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("held-out loss")
    finish(fig, ax, path, "Loss against context length (mean over seeds)", "no evaluated runs", **BESIDE)


def diagnostic_bars(table: list[dict], key: str, heading: str, path: Path) -> None:
    """One diagnostic, a bar per variant (mean over seeds, ±std where 2 or more seeds have it);
    a variant without it has no bar, and a note under the plot says which and why."""
    entries, missing = [], {}
    for entry in table:
        if reason := missing_diagnostic(entry, key):
            missing.setdefault(reason, []).append(entry["variant"])
        else:
            entries.append(entry)
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(table) + 2), 4 + 0.3 * len(missing)))
    if entries:
        means = [e["diagnostics"][key][0] for e in entries]
        stds = [e["diagnostics"][key][1] or 0.0 for e in entries]
        ax.bar([e["variant"] for e in entries], means, yerr=stds, capsize=3, color="tab:blue", alpha=0.8)
        if key == "massive_ratio" and min(means) > 0:
            ax.set_yscale("log")  # ratios run from a few to thousands
            plain_log_ticks(ax.yaxis)
        ax.tick_params(axis="x", labelrotation=30)
    else:
        ax.text(0.5, 0.5, "no diagnostics", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel(heading)
    ax.set_title(f"{heading} (mean over seeds)")
    ax.grid(alpha=0.3, axis="y")
    rect = (0, 0, 1, 1)  # tight_layout's own
    if missing:
        lines = [f"no bar: {', '.join(names)}: {reason}" for reason, names in missing.items()]
        text = "\n".join(textwrap.fill(line, 110, subsequent_indent="    ") for line in lines)
        fig.text(0.01, 0.01, text, fontsize=7, va="bottom", ha="left")
        rect = (0, 0.03 + 0.045 * text.count("\n") + 0.04, 1, 1)
    save(fig, path, rect=rect)
