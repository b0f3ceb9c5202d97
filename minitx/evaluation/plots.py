"""The plots of one evaluation: loss against context length, loss by position, needle heatmap,
diagnostics.

Headless (the Agg backend). Each figure is a (file name, draw) pair where
draw(file) saves the PNG into an open binary file, so the caller can write it atomically.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from ..plotting import plain_log_ticks  # noqa: E402
from .missing import missing_notes, shown  # noqa: E402


def _save(fig, file) -> None:
    fig.tight_layout()
    fig.savefig(file, format="png", dpi=120)
    plt.close(fig)


def _measured(by_length: dict) -> dict[int, dict]:
    return {int(length): entry for length, entry in by_length.items() if "skipped" not in entry}


def loss_vs_length(result: dict) -> Callable:
    def draw(file) -> None:
        fig, ax = plt.subplots(figsize=(6, 4))
        measured = _measured(result["by_length"])
        ax.plot(list(measured), [e["loss"] for e in measured.values()], marker="o")
        ax.axvline(result["model"]["block_size"], color="grey", linestyle="--", label="block_size (trained)")
        skipped = [int(length) for length, e in result["by_length"].items() if "skipped" in e]
        if skipped:
            ax.set_title("skipped: " + ", ".join(map(str, skipped)), fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(measured), [str(n) for n in measured])  # the lengths measured, as numbers
        ax.minorticks_off()
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("loss (nats per token)")
        ax.grid(alpha=0.3)
        ax.legend()
        _save(fig, file)

    return draw


def loss_by_position(result: dict) -> Callable:
    def draw(file) -> None:
        fig, ax = plt.subplots(figsize=(6, 4))
        for length, entry in _measured(result["by_length"]).items():
            if "by_position" not in entry:
                continue
            curve = entry["by_position"]
            middles = [(s + e - 1) / 2 + 1 for s, e in zip(curve["start"], curve["end"])]  # +1: log axis
            ax.plot(middles, curve["loss"], marker=".", label=f"context {length}")
        ax.axvline(result["model"]["block_size"] + 1, color="grey", linestyle="--", label="block_size")
        ax.set_xscale("log", base=2)
        plain_log_ticks(ax.xaxis)
        ax.set_xlabel("tokens before the target + 1")
        ax.set_ylabel("loss (nats per token)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        _save(fig, file)

    return draw


def needle_heatmap(heatmap: dict) -> Callable:
    def draw(file) -> None:
        fig, ax = plt.subplots(figsize=(6, 4))
        # skipped lengths: blank
        grid = [[float("nan") if a is None else a for a in row] for row in heatmap["accuracy"]]
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(len(heatmap["lengths"])), [str(n) for n in heatmap["lengths"]])
        ax.set_yticks(range(len(heatmap["depths"])), [f"{d:.0%}" for d in heatmap["depths"]])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("depth of the needle")
        fig.colorbar(image, label="exact match")
        _save(fig, file)

    return draw


def diagnostics(figures: dict, kinds: list[str]) -> Callable:
    """Per layer the massive-activation ratio and the attention entropy; the loss by position."""

    def draw(file) -> None:
        fig, (ratio, entropy, loss) = plt.subplots(1, 3, figsize=(12, 3.6))
        layers = range(len(figures["massive"]))
        ratio.bar(layers, [entry["ratio"] for entry in figures["massive"]])
        ratio.set_yscale("log")
        plain_log_ticks(ratio.yaxis)
        ratio.set_ylabel("max |h| / median |h|")
        by_layer = [float("nan") if e is None else e for e in figures["entropy_by_layer"]]
        entropy.plot(layers, by_layer, marker="o")
        entropy.set_ylim(0, 1.05)
        entropy.set_ylabel("attention entropy / log(keys seen)")
        missing = [i for i, e in enumerate(figures["entropy_by_layer"]) if e is None]
        if missing:  # say why a layer has no point, in the panel (missing.missing_notes' words)
            where = f"no point at layer{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}: "
            why = "\n".join(textwrap.wrap(where + "; ".join(missing_notes(figures, kinds)), 48))
            entropy.text(0.5, 0.5, why, ha="center", va="center", fontsize=7, transform=entropy.transAxes)
        for ax in (ratio, entropy):
            ax.set_xlabel("layer")
            ax.set_xticks(list(layers))
        losses = figures["loss_by_position"]
        loss.plot(range(1, len(losses) + 1), losses)
        loss.set_xlabel("tokens of context")
        loss.set_ylabel("loss (nats per token)")
        title = f"first-token share {shown(figures['first_token_share'], '.3f')}, "
        title += f"sink rate {shown(figures['sink_rate'], '.0%')}"
        if figures["first_token_share"] is None:
            title += " (no layer has a softmax map to read them from)"
        fig.suptitle(title, fontsize=10)
        for ax in (ratio, entropy, loss):
            ax.grid(alpha=0.3)
        _save(fig, file)

    return draw


def figures(result: dict) -> Iterator[tuple[str, Callable]]:
    measured = _measured(result.get("by_length") or {})
    if measured:
        yield "loss_vs_length.png", loss_vs_length(result)
    if any("by_position" in entry for entry in measured.values()):
        yield "loss_by_position.png", loss_by_position(result)
    task = result.get("task") or {}
    if task.get("heatmap"):
        yield "needle_accuracy.png", needle_heatmap(task["heatmap"])
    if result.get("diagnostics"):
        yield "diagnostics.png", diagnostics(result["diagnostics"], result["model"]["layers"])
