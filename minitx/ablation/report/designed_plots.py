"""Plots of a designed sweep (headless, Agg): loss against learning-rate multiplier, loss against
compute with each arm's fitted curve and its 90% bootstrap band, and one plot per diagnostic."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...evaluation.diagnostics import DIAGNOSTICS
from ...plotting import plain_log_ticks
from ..analysis.designed import Analysis
from ..plan.ladder import Plan, Point
from ..runs.results import RunResults
from .plain_plots import finish, plt  # plain_plots chooses the headless backend before pyplot


def lr_sweep(analysis: Analysis, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm in analysis.arms:
        points = sorted((m, loss) for m, loss in arm.lr_losses.items() if loss is not None)
        if points:
            (line,) = ax.plot(*zip(*points), marker="o", label=arm.name)
            if arm.multiplier is not None and arm.lr_losses.get(arm.multiplier) is not None:
                ax.plot([arm.multiplier], [arm.lr_losses[arm.multiplier]], "*", ms=12, color=line.get_color())
    ax.set_xscale("log", base=2)
    swept = sorted({m for arm in analysis.arms for m in arm.lr_losses})
    if swept:  # a label at every multiplier swept: log ticks alone may label only x1
        ax.set_xticks(swept, [f"x{m:g}" for m in swept])
        ax.xaxis.minorticks_off()
    ax.set_xlabel("learning-rate multiplier (x the base config's)")
    ax.set_ylabel("final val loss")
    finish(fig, ax, path, "Learning-rate sweep (star: each arm's choice)", "no learning-rate sweep")


def loss_vs_compute(plan: Plan, analysis: Analysis, trained: RunResults, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for arm in analysis.arms:
        if not arm.points:
            continue
        x = np.array([trained(p).trained_flops for p in arm.points])
        # each point where the fit has it (a settled one at the median of three seeds); the
        # ladder's own run there, hollow
        y = np.array([arm.fitted_loss(p, trained) for p in arm.points])
        branch = np.array([p.role == "branch" for p in arm.points])
        (line,) = ax.plot([], [], label=arm.name)
        color = line.get_color()
        ax.scatter(x[~branch], y[~branch], color=color, s=18)
        ax.scatter(x[branch], y[branch], color=color, s=18, marker="^")
        if settled := [p for p in arm.points if p.run.directory in arm.settled]:
            ax.scatter([trained(p).trained_flops for p in settled], [trained(p).loss for p in settled],
                       facecolors="none", edgecolors=color, s=18)  # fmt: skip
        if arm.curve is not None:
            grid = np.geomspace(x.min() / 1.3, x.max() * 1.3, 60)
            line.set_data(grid, arm.curve.fit.loss(grid))
            draws = np.array([d.loss(grid) for d in arm.curve.draws])
            low, high = np.percentile(draws, [5, 95], axis=0)
            ax.fill_between(grid, low, high, color=color, alpha=0.15)
    ax.set_xscale("log")
    plain_log_ticks(ax.xaxis)
    ax.tick_params(axis="x", which="both", labelrotation=30)  # "2e+13" labels side by side overlapped
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("final val loss")
    title = "Loss against compute: fits with 90% bootstrap bands (triangles: branches"
    if any(a.settled for a in analysis.arms):
        title += ";\nhollow: a ladder run replaced by the median of three seeds"
    finish(fig, ax, path, title + ")", "no ladder")


def diagnostic_bars(analysis: Analysis, key: str, path: Path) -> None:
    """A bar per arm from zero (a bar's length is its value: a log axis or one cut above zero would
    make 6 against 11 look like a factor of 10), the mean over the rung's seeds with their sd as an
    error bar and each seed as a dot."""
    fig, ax = plt.subplots(figsize=(7, 4))
    arms = [a for a in analysis.arms if key in a.diagnostics]
    names = [a.name for a in arms]
    seeds = [a.diagnostic_seeds.get(key, [a.diagnostics[key]]) for a in arms]
    spread = [float(np.std(v, ddof=1)) if len(v) > 1 else 0.0 for v in seeds]
    ax.bar(names, [a.diagnostics[key] for a in arms], yerr=spread, capsize=4, alpha=0.8)
    for i, values in enumerate(seeds):
        ax.scatter([i] * len(values), values, color="black", s=10, zorder=3)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(DIAGNOSTICS[key])
    ax.tick_params(axis="x", rotation=30)
    title = f"{DIAGNOSTICS[key]} (seeds rung: mean, sd and each of {max(map(len, seeds), default=0)} seeds)"
    finish(fig, ax, path, title, "no diagnostics")


def loss_by_position(analysis: Analysis, points: list[Point], trained: RunResults, rung, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm in analysis.arms:
        found = (trained(p).diagnostics for p in points if p.arm == arm.name and (p.size, p.budget) == rung)
        found = next((f for f in found if f), None)
        if found and found.get("loss_by_position"):
            ax.plot(range(1, len(found["loss_by_position"]) + 1), found["loss_by_position"], label=arm.name)
    ax.set_xscale("log")
    plain_log_ticks(ax.xaxis)
    ax.set_xlabel("position in the sequence")
    ax.set_ylabel("held-out loss")
    finish(fig, ax, path, "Loss by token position (seeds rung, first seed)", "no diagnostics")


def draw_all(plan: Plan, analysis: Analysis, points: list[Point], trained: RunResults, output: Path) -> None:
    """The plots of what the sweep declared (report.designed.design_plots)."""
    if plan.sweep.design.multipliers:
        lr_sweep(analysis, output / "lr_sweep.png")
    if plan.ladder is not None:
        loss_vs_compute(plan, analysis, trained, output / "loss_vs_compute.png")
    for key in DIAGNOSTICS:
        diagnostic_bars(analysis, key, output / f"diag_{key}.png")
    loss_by_position(analysis, points, trained, analysis.rung, output / "diag_loss_by_position.png")
