"""The report of a designed sweep: results.md, results.csv (one row per run) and the plots.

results.md   the learning-rate table, the ladder's fits and multipliers with intervals, the
             seeds rung's differences with Welch's test (Holm-corrected), the diagnostics,
             the ranking at one learning rate against each arm's own, and failed runs
results.csv  every run: arm, size, budget, multiplier, seed, role (sweep, ladder, branch,
             seed), steps, tokens, FLOPs, parameters, final val loss, status, diagnostics
plots        lr_sweep.png, loss_vs_compute.png, and one per diagnostic (diag_*.png)
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from ...fileio import read_json, write_text_atomically
from ..analysis.designed import DIAGNOSTIC_KEYS, DIAGNOSTIC_NAMES, Analysis, share
from ..analysis.significance import CONFIDENCE, LEVEL
from ..plan.ladder import Plan, Point
from ..runs.runner import RUN_FILE

DESIGN_PLOTS = (
    "lr_sweep.png",
    "loss_vs_compute.png",
    *(f"diag_{key}.png" for key in DIAGNOSTIC_KEYS),
    "diag_loss_by_position.png",
)
CSV_FIELDS = [
    "arm", "size", "budget", "multiplier", "seed", "role", "status", "error", "steps", "tokens", "flops",
    "params", "flops_per_token", "final_val_loss", *DIAGNOSTIC_KEYS, "branch_of", "run_dir",
]  # fmt: skip


def _status(point: Point) -> tuple[str, str]:
    if point.loss is not None:
        return "ok", ""
    record = read_json(point.run.directory / RUN_FILE) or {}
    if record.get("status") == "failed":
        return "failed", record.get("error", "")
    return "not run", ""


def csv_text(points: list[Point], diagnostics) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    unique: dict = {}
    for p in points:  # a run once, as first planned (the smallest size's ladder run is a sweep run)
        unique.setdefault(p.run.directory, p)
    for p in unique.values():
        status, error = _status(p)
        found = diagnostics(p) or {}
        writer.writerow(
            {
                "arm": p.arm, "size": p.size, "budget": "" if p.budget is None else f"{p.budget:g}",
                "multiplier": f"{p.multiplier:g}", "seed": p.seed, "role": p.role, "status": status,
                "error": error, "steps": p.steps, "tokens": p.tokens, "flops": f"{p.trained_flops:.4e}",
                "params": p.params, "flops_per_token": f"{p.flops_per_token:.0f}",
                "final_val_loss": "" if p.loss is None else f"{p.loss:.5f}",
                **{k: "" if found.get(k) is None else f"{found[k]:.5g}" for k in DIAGNOSTIC_KEYS},
                "branch_of": "" if p.branch_of is None else p.branch_of.run.directory.name,
                "run_dir": str(p.run.directory),
            }
        )  # fmt: skip
    return out.getvalue()


def _num(value: float | None, fmt: str = "{:.4f}") -> str:
    if value is None:
        return "–"
    if math.isinf(value):
        return "∞"
    return fmt.format(value)


def _interval(value: float, low: float, high: float) -> str:
    return f"{_num(value, '{:.2f}')} [{_num(low, '{:.2f}')}, {_num(high, '{:.2f}')}]"


def _budget_text(plan: Plan, budget: float | None) -> str:
    if budget is None:
        return "the base's steps"
    if plan.ladder is not None and plan.ladder.unit == "tokens_per_param":
        return f"{budget:g} tokens/param"
    return f"{budget:.3g} FLOPs"


def markdown(plan: Plan, analysis: Analysis, title: str, all_points: list[Point]) -> str:
    lines = [f"# {title}", ""]
    design = plan.sweep.design
    n_runs = len({p.run.directory for p in all_points})
    done = len({p.run.directory for p in all_points if p.loss is not None})
    lines += [
        f"{len(plan.arms)} arms, {len(plan.sizes)} size(s), {len(plan.budgets)} budget(s); "
        f"{done} of {n_runs} runs finished. Baseline: **{analysis.baseline}**.",
        "",
    ]
    if design.multipliers:
        lines += _lr_section(plan, analysis, all_points)
    if plan.ladder is not None:
        lines += _ladder_section(plan, analysis)
    lines += _seeds_section(plan, analysis)
    if any(a.diagnostics for a in analysis.arms):
        lines += _diagnostics_section(plan, analysis)
    if design.multipliers:
        lines += _ranking_section(analysis)
    if analysis.failed:
        lines += ["## Failed runs", ""]
        for p in analysis.failed:
            lines.append(f"- {p.run.directory.name}: {_status(p)[1] or 'no summary'}")
        lines.append("")
    lines += ["## How these were measured", ""]
    lines += [f"- {note}" for note in _notes(plan, analysis)]
    return "\n".join(lines).rstrip() + "\n"


def _outcome(point: Point) -> str:
    """A rate's run in a cell: its loss, "diverged", "failed" or "–" (not run)."""
    if point.loss is not None:
        return f"{point.loss:.4f}"
    if point.outcome is None:
        return "–"
    return "diverged" if point.trouble.startswith("diverged") else "failed"


def _lr_section(plan: Plan, analysis: Analysis, all_points: list[Point]) -> list[str]:
    ms = sorted({m for arm in analysis.arms for m in arm.lr_losses} | set(plan.sweep.design.multipliers))
    small, large = plan.sizes[0].name, plan.sizes[-1].name
    lines = [
        f"## Learning rate: each arm at its own best (size {small}, {_budget_text(plan, plan.budgets[-1])}, "
        f"seed {plan.sweep.seed})",
        "",
        "| arm | " + " | ".join(f"x{m:g}" for m in ms) + " | chosen |",
        "|---|" + "---:|" * len(ms) + "---|",
    ]
    for arm in analysis.arms:
        cells = []
        for m in ms:
            p = arm.rate.sweep.get(m)
            text = "" if p is None else _outcome(p) + (" ⁺" if m in arm.rate.extended else "")
            cells.append(f"**{text}**" if m == arm.multiplier else text)
        choice = arm.rate.choice
        chosen = "refused" if choice.refused else "–"
        if arm.multiplier is not None:
            chosen = f"x{arm.multiplier:g} ({choice.how})"
        lines.append(f"| {arm.name} | " + " | ".join(cells) + f" | {chosen} |")
    bases = ", ".join(f"{key} {value:g}" for key, value in plan.lr_bases.items())
    lines += [
        "",
        f"x1 is the base config's learning rates ({bases}); a multiplier scales all of them; ⁺ a run past the "
        "sweep's edge. A choice is the "
        "vertex of a parabola in log lr fitted to the lowest loss and up to two multipliers each side, rounded "
        "to a multiplier swept; a best at an edge runs x2 further that way, at most "
        f"{plan.sweep.design.extend} time(s) per arm, then refuses the arm. These runs only choose: the ladder "
        f"trains every point afresh with seed {plan.ladder_seed}.",
        "",
    ]
    if len(plan.sizes) > 1:
        lines += [
            f"Confirmed at {large} ({_budget_text(plan, plan.budgets[-1])}, seed {plan.sweep.seed}): the choice and "
            "its neighbours; the best of the three that neither diverged nor spiked is used there, sizes between "
            "train at the rate interpolated geometrically in parameters.",
            "",
            f"| arm | at {large} | used at " + ", ".join(s.name for s in plan.sizes) + " |",
            "|---|---|---|",
        ]
        for arm in analysis.arms:
            rate = arm.rate
            best = rate.confirmed.multiplier
            tried = ", ".join(
                ("**{}**" if m == best else "{}").format(f"x{m:g} {_outcome(p)}")
                for m, p in sorted(rate.confirm.items())
            )
            used = ", ".join(f"x{rate.by_size[s.name]:g}" for s in plan.sizes) if rate.by_size else "–"
            if rate.refused:
                used = f"refused: {rate.refused}"
            lines.append(f"| {arm.name} | {tried or '–'} | {used} |")
        lines.append("")
    notes = [
        f"- {arm.name}: refused, left out of the fits: {arm.rate.refused}"
        for arm in analysis.arms
        if arm.rate.refused
    ]
    for p in {p.run.directory: p for p in all_points if p.role in ("confirm", "ladder", "seed")}.values():
        if p.trouble:
            notes.append(f"- {p.arm} x{p.multiplier:g} at {p.size} (seed {p.seed}): {p.trouble}")
    if notes:
        lines += ["Refused arms and unstable rates:", "", *notes, ""]
    return lines


def _ladder_section(plan: Plan, analysis: Analysis) -> list[str]:
    lines = [
        "## The ladder: loss against compute",
        "",
        "L(C) = E + A (C / C0)^-alpha per arm (Huber in log space, 100 bootstrap refits); the compute "
        "multiplier is the baseline's compute for the arm's fitted loss at its largest compute, over that "
        "compute, with its 90% bootstrap interval (> 1: the arm is worth more compute than it spends).",
        "",
        "| arm | points (branches) | E | A | alpha | compute multiplier [90%] | params share at equal loss [90%] |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for arm in analysis.arms:
        branches = sum(p.role == "branch" for p in arm.points)
        if arm.curve is None:
            lines.append(f"| {arm.name} | {len(arm.points)} ({branches}) | {arm.fit_note or '–'} | | | | |")
            continue
        f = arm.curve.fit
        if arm.name == analysis.baseline:
            multiplier, params = "1 (baseline)", "1 (baseline)"
        else:
            c = arm.compute
            multiplier = (
                "–"
                if c is None
                else _interval(c.multiplier, c.low, c.high) + (" †" if c.excludes_one else "")
            )
            params = "–" if arm.params is None else _interval(*share(arm.params))
        lines.append(
            f"| {arm.name} | {len(arm.points)} ({branches}) | {f.E:.3f} | {f.A:.3f} | {f.alpha:.3f} | "
            f"{multiplier} | {params} |"
        )
    c0 = next((a.curve.fit.C0 for a in analysis.arms if a.curve), None)
    lines += [
        "",
        "† the interval excludes 1." + (f" C0 = {c0:.3g} FLOPs." if c0 else ""),
        "Parameter share: the arm's non-embedding parameters over the baseline's at equal loss, from "
        "L(N) fitted over the sizes at the largest budget (< 1: the arm needs fewer).",
        "",
    ]
    rows = ["| size | " + " | ".join(analysis.arms[i].name for i in range(len(analysis.arms))) + " |"]
    rows.append("|---|" + "---:|" * len(analysis.arms))
    for size in plan.sizes:
        cells = [f"{plan.shapes[a, size.name].params:,}" for a in plan.arms]
        rows.append(f"| {size.name} params | " + " | ".join(cells) + " |")
        for budget in plan.budgets:
            cells = []
            for arm in analysis.arms:
                p = next((q for q in arm.points if q.size == size.name and q.budget == budget), None)
                cells.append("–" if p is None else f"{p.loss:.4f}" + (" ᵇ" if p.role == "branch" else ""))
            rows.append(f"| {size.name} @ {_budget_text(plan, budget)} | " + " | ".join(cells) + " |")
    return [
        *lines,
        "Final val loss per point (ᵇ: a decay branched from the size's longest run):",
        "",
        *rows,
        "",
    ]


def _seeds_section(plan: Plan, analysis: Analysis) -> list[str]:
    size, budget = analysis.rung
    where = f"size {size}, {_budget_text(plan, budget)}" if plan.ladder else "the sweep's budget"
    level = f"{CONFIDENCE:.0%}"
    lines = [
        f"## Seeds: differences from {analysis.baseline} ({where})",
        "",
        f"Welch's t-test of each arm's final val loss against {analysis.baseline}'s over seeds, p Holm-corrected "
        f"across arms; **bold**: significant at p < {LEVEL}.",
        "",
        f"| arm | seeds | loss mean ± std | difference [{level}] | p | p (Holm) |",
        "|---|---:|---|---|---:|---:|",
    ]
    for arm in analysis.arms:
        n = len(arm.seeds)
        mean = sum(arm.seeds) / n if n else None
        std = math.sqrt(sum((x - mean) ** 2 for x in arm.seeds) / (n - 1)) if n > 1 else None
        cell = "–" if mean is None else f"{mean:.4f}" + (f" ± {std:.4f}" if std is not None else "")
        t = arm.test
        if arm.name == analysis.baseline or t is None:
            note = "baseline" if arm.name == analysis.baseline else "needs 2+ seeds"
            lines.append(f"| {arm.name} | {n} | {cell} | {note} | | |")
            continue
        diff = f"{t.difference:+.4f} [{t.low:+.4f}, {t.high:+.4f}]"
        p_holm = f"{t.p_holm:.2g}"
        if t.significant:
            diff, p_holm = f"**{diff}**", f"**{p_holm}**"
        lines.append(f"| {arm.name} | {n} | {cell} | {diff} | {t.p:.2g} | {p_holm} |")
    return [*lines, ""]


def _diagnostics_section(plan: Plan, analysis: Analysis) -> list[str]:
    lines = [
        "## Diagnostics (held-out text, through each kind's materialised attention; mean over the seeds rung)",
        "",
        "| arm | " + " | ".join(DIAGNOSTIC_NAMES[k] for k in DIAGNOSTIC_KEYS) + " |",
        "|---|" + "---:|" * len(DIAGNOSTIC_KEYS),
    ]
    for arm in analysis.arms:
        cells = [_num(arm.diagnostics.get(k), "{:.3f}") for k in DIAGNOSTIC_KEYS]
        lines.append(f"| {arm.name} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _ranking_section(analysis: Analysis) -> list[str]:
    at_one = {a.name: a.lr_losses.get(1.0) for a in analysis.arms}
    own = {a.name: (sum(a.seeds) / len(a.seeds) if a.seeds else None) for a in analysis.arms}
    if any(v is None for v in at_one.values()) or any(v is None for v in own.values()):
        return []
    rank_one = {name: i + 1 for i, name in enumerate(sorted(at_one, key=at_one.get))}
    rank_own = {name: i + 1 for i, name in enumerate(sorted(own, key=own.get))}
    lines = [
        "## Ranking: one learning rate against each arm's own",
        "",
        "| arm | rank at x1 (lr sweep) | rank at its own lr (seeds rung) | moved |",
        "|---|---:|---:|---|",
    ]
    for name in rank_own:
        moved = rank_one[name] - rank_own[name]
        lines.append(
            f"| {name} | {rank_one[name]} | {rank_own[name]} | {'' if not moved else f'{moved:+d}'} |"
        )
    return [*lines, ""]


def _notes(plan: Plan, analysis: Analysis) -> list[str]:
    notes = [
        "loss: each run's final val loss (the training command's validation at its last step)",
        f"compute: training FLOPs = steps x {plan.tokens_per_step:,} tokens per step x the arm's FLOPs per token "
        "(Transformer.flops_per_token at block_size: 6 per matmul parameter plus each kind's own attention work)",
    ]
    if plan.ladder is not None:
        notes.append(
            f"schedule: warmup-stable-decay (decay over the last {plan.decay_fraction:g} of each run's steps); "
            "each smaller budget is a decay branched from the size's longest run at that budget's decay start"
        )
        if plan.ladder.unit == "tokens_per_param":
            notes.append(
                f"budgets: tokens per non-embedding parameter of {analysis.baseline} at each size, times its FLOPs "
                "per token: every arm of a size gets the same compute, in its own number of steps"
            )
    if plan.sweep.match:
        notes.append(
            f"match: {plan.sweep.match}: each arm's MLP width set to the baseline's budget at each size"
        )
    notes += analysis.notes
    return notes


def write_design_results(
    plan: Plan, analysis: Analysis, all_points: list[Point], title: str, diagnostics
) -> None:
    from . import designed_plots

    output = plan.output
    write_text_atomically(output / "results.csv", csv_text(all_points, diagnostics))
    write_text_atomically(output / "results.md", markdown(plan, analysis, title, all_points))
    designed_plots.draw_all(plan, analysis, all_points, diagnostics, output)


def plot_paths(output: Path) -> list[Path]:
    return [output / name for name in DESIGN_PLOTS]
