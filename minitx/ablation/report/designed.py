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
from collections.abc import Sequence

from ...evaluation.diagnostics import DIAGNOSTICS
from ...files.atomic import write_text_atomically
from ...flops import FLOP_CONVENTION
from ..analysis.designed import Analysis, unique_points
from ..analysis.equal_arms import equal_lines
from ..analysis.significance import CONFIDENCE, LEVEL
from ..analysis.table import device_label, mean_std, run_status
from ..analysis.wall_time import phase_times, wall_time
from ..plan.ladder import Plan, Point
from ..plan.rates import MARGIN
from ..runs.results import PointResult, RunResults
from .cells import budget_text, num, row
from .ladder import (
    held_out_section,
    holdout_section,
    ladder_section,
    noise_note,
    noise_section,
    verdict_section,
)
from .plain import DIAGNOSTIC_PLOTS, format_cell
from .written import WrittenReport

DESIGN_PLOTS = ("lr_sweep.png", "loss_vs_compute.png", *DIAGNOSTIC_PLOTS, "diag_loss_by_position.png")


def design_plots(plan: Plan) -> tuple[str, ...]:
    """The plots of this sweep (of DESIGN_PLOTS): the learning-rate sweep's only with lr_sweep, loss
    against compute only with a ladder; no blank plot for what the file did not declare."""
    drawn = {
        "lr_sweep.png": bool(plan.sweep.design.multipliers),
        "loss_vs_compute.png": plan.ladder is not None,
    }
    return tuple(name for name in DESIGN_PLOTS if drawn.get(name, True))


CSV_FIELDS = [
    "arm", "size", "budget", "multiplier", "seed", "role", "status", "error", "steps", "tokens", "flops",
    "params", "flops_per_token", "flop_convention", "final_val_loss", *DIAGNOSTICS, "branch_of", "device",
    "run_dir",
]  # fmt: skip


def csv_text(points: list[Point], trained: RunResults) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    # a run once, as first planned (the smallest size's ladder run is a sweep run)
    for p in unique_points(points):
        result = trained(p)
        status, error = run_status(result.loss is not None, result.record)
        found = result.diagnostics or {}
        writer.writerow(
            {
                "arm": p.arm, "size": p.size, "budget": "" if p.budget is None else f"{p.budget:g}",
                "multiplier": f"{p.multiplier:g}", "seed": p.seed, "role": p.role, "status": status,
                "error": error, "steps": result.trained_steps,
                "tokens": result.trained_steps * (p.tokens // p.steps),
                "flops": f"{result.trained_flops:.4e}", "params": p.params,
                "flops_per_token": f"{p.flops_per_token:.0f}", "flop_convention": FLOP_CONVENTION,
                "final_val_loss": "" if result.loss is None else f"{result.loss:.5f}",
                **{k: "" if found.get(k) is None else f"{found[k]:.5g}" for k in DIAGNOSTICS},
                "branch_of": "" if p.branch_of is None else p.branch_of.run.directory.name,
                "device": device_label((result.summary or {}).get("device"), result.record.get("gpus")) or "",
                "run_dir": str(p.run.directory),
            }
        )  # fmt: skip
    return out.getvalue()


def markdown(
    plan: Plan,
    analysis: Analysis,
    title: str,
    all_points: list[Point],
    trained: RunResults,
    given: Sequence[str] = (),
) -> str:
    """`given`: what the runs were given besides the sweep file (runner.given_arguments), listed last."""
    lines = [f"# {title}", ""]
    design = plan.sweep.design
    n_runs = len({p.run.directory for p in all_points})
    done = len({p.run.directory for p in all_points if trained(p).loss is not None})
    lines += [
        f"{len(plan.arms)} arms, {len(plan.sizes)} size(s), {len(plan.budgets)} budget(s); "
        f"{done} of {n_runs} runs finished. Baseline: **{analysis.baseline}**.",
        "",
    ]
    equal = equal_lines(_losses_by_run(plan, all_points, trained))
    lines += [*(f"**Note:** {line}." for line in equal), *([""] if equal else [])]
    lines += verdict_section(plan, analysis)
    if design.multipliers:
        lines += _lr_section(plan, analysis, all_points, trained)
    if plan.ladder is not None:
        lines += ladder_section(plan, analysis, trained)
        lines += held_out_section(plan, analysis)
        lines += holdout_section(plan, analysis)
        lines += noise_section(plan, analysis)
    lines += _seeds_section(plan, analysis)
    if any(a.diagnostics for a in analysis.arms):
        lines += _diagnostics_section(plan, analysis)
    if design.multipliers:
        lines += _ranking_section(analysis)
    if analysis.failed:
        errors = [
            f"- {p.run.directory.name}: {run_status(False, trained(p).record)[1] or 'no summary'}"
            for p in analysis.failed
        ]
        lines += ["## Failed runs", "", *errors, ""]
    lines += ["## How these were measured", ""]
    lines += [f"- {note}" for note in _notes(plan, analysis, all_points, trained)]
    lines += [f"- {line}" for line in given]
    return "\n".join(lines).rstrip() + "\n"


def _losses_by_run(plan: Plan, all_points: list[Point], trained: RunResults) -> dict[str, dict[tuple, float]]:
    """Each arm's finished runs by what else names them (size, budget, rate, seed and role): two
    arms' runs of one key differ in nothing but the arm."""
    found: dict[str, dict[tuple, float]] = {arm: {} for arm in plan.arms}
    for p in all_points:
        loss = trained(p).loss
        if loss is not None and p.arm in found:
            found[p.arm][p.size, p.budget, p.multiplier, p.seed, p.role] = loss
    return found


# The phase each role of run is trained in (plan.ladder.PHASES, by index), for the wall time by
# phase; a replicate (a third seed) is trained after them all.
PHASE_OF_ROLE = {
    "sweep": 0, "confirm": 0, "ladder": 1, "seed": 1, "branch": 2, "holdout": 3, "holdout-seed": 3, "holdout-branch": 4,
}  # fmt: skip


def _time_note(plan: Plan, all_points: list[Point], trained: RunResults) -> str:
    """The sweep's wall time, and each phase's (analysis/wall_time.py)."""
    names = dict(plan.phases())
    times, phases = [], {}
    for p in {p.run.directory: p for p in all_points}.values():
        record = trained(p).record
        times.append((record.get("finished_at"), record.get("process_seconds")))
        phase = names.get(PHASE_OF_ROLE.get(p.role), "third seeds")
        phases.setdefault(phase, []).append(times[-1])
    total = wall_time(times)
    by_phase = phase_times(phases)
    return f"{total}; by phase: {by_phase}" if total and by_phase and len(phases) > 1 else total


def _outcome(result: PointResult) -> str:
    """A rate's run in a cell: its loss, "diverged", "failed" or "–" (not run)."""
    if result.loss is not None:
        return f"{result.loss:.4f}"
    if result.outcome is None:
        return "–"
    return "diverged" if result.trouble.startswith("diverged") else "failed"


def _lr_section(plan: Plan, analysis: Analysis, all_points: list[Point], trained: RunResults) -> list[str]:
    ms = sorted({m for arm in analysis.arms for m in arm.lr_losses} | set(plan.sweep.design.multipliers))
    small, large = plan.sizes[0].name, plan.sizes[-1].name
    lines = [
        f"## Learning rate: each arm at its own best (size {small}, {budget_text(plan, plan.budgets[-1])}, "
        f"seed {plan.sweep.seed})",
        "",
        row("arm", *(f"x{m:g}" for m in ms), "chosen"),
        "|---|" + "---:|" * len(ms) + "---|",
    ]
    for arm in analysis.arms:
        cells = []
        finite = {m: trained(p).loss for m, p in arm.rate.sweep.items() if trained(p).loss is not None}
        lowest = min(finite, key=finite.get) if finite else None
        for m in ms:
            p = arm.rate.sweep.get(m)
            text = "" if p is None else _outcome(trained(p))
            if m == lowest:
                text = f"**{text}**"
            if p is not None and m in arm.rate.extended:
                text += " ⁺"
            if m == arm.multiplier and p is not None:
                text += " ✓"
            cells.append(text)
        choice = arm.rate.choice
        chosen = "refused" if choice.refused else "–"
        if arm.multiplier is not None:
            chosen = f"x{arm.multiplier:g} ({choice.how})"
        lines.append(row(arm.name, *cells, chosen))
    bases = ", ".join(f"{key} {value:g}" for key, value in plan.lr_bases.items())
    lines += [
        "",
        f"x1 is the base config's learning rates ({bases}); a multiplier scales all of them; **bold** the "
        "lowest loss of the row, ✓ the multiplier chosen (the rule below need not take the lowest run); ⁺ a run "
        "past the sweep's edge. The choice: a parabola in log lr fitted to the lowest run and up to two "
        f"multipliers each side, and the smallest of those multipliers whose loss on it lies within {MARGIN:.1%} of "
        "its minimum over them (the flat side below a minimum is the safe side: the edge of stability is above "
        "it). Only a lowest run at an edge runs x2 further that way, at most "
        f"{plan.sweep.design.extend} time(s) per arm, then refuses the arm. These runs only choose: the ladder "
        f"trains every point afresh with seed {plan.ladder_seed}.",
        "",
    ]
    if len(plan.sizes) > 1:
        lines += [
            f"Confirmed at {large} ({budget_text(plan, plan.budgets[-1])}, seed {plan.sweep.seed}): the choice and "
            "its neighbours; the same rule over those that neither diverged nor spiked gives the rate used there "
            "(in bold), sizes between train at the rate interpolated geometrically in parameters.",
            "",
            f"| arm | at {large} | used at " + ", ".join(s.name for s in plan.sizes) + " |",
            "|---|---|---|",
        ]
        for arm in analysis.arms:
            rate = arm.rate
            best = rate.confirmed.multiplier
            tried = ", ".join(
                ("**{}**" if m == best else "{}").format(f"x{m:g} {_outcome(trained(p))}")
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
        if trained(p).trouble:
            notes.append(f"- {p.arm} x{p.multiplier:g} at {p.size} (seed {p.seed}): {trained(p).trouble}")
    if notes:
        lines += ["Refused arms and unstable rates:", "", *notes, ""]
    return lines


def _seeds_section(plan: Plan, analysis: Analysis) -> list[str]:
    size, budget = analysis.rung
    where = f"size {size}, {budget_text(plan, budget)}" if plan.ladder else "the sweep's budget"
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
        n, cell = len(arm.seeds), format_cell(*mean_std(arm.seeds), "{:.4f}")
        t = arm.test
        if arm.name == analysis.baseline or t is None:
            note = "baseline" if arm.name == analysis.baseline else "needs 2+ seeds"
            lines.append(f"| {arm.name} | {n} | {cell} | {note} | | |")
            continue
        diff = f"{t.difference:+.4f} [{t.low:+.4f}, {t.high:+.4f}]"
        p_holm = num(t.p_holm, "{:.2g}")
        if t.significant:
            diff, p_holm = f"**{diff}**", f"**{p_holm}**"
        lines.append(f"| {arm.name} | {n} | {cell} | {diff} | {num(t.p, '{:.2g}')} | {p_holm} |")
    lines.append("")
    both = sorted(set(analysis.lr_seeds) & set(analysis.rung_seeds))
    if both:
        seeds = ", ".join(str(s) for s in both)
        chose = [a.name for a in analysis.arms if a.seed_chose_lr]
        where = (
            f"for {', '.join(chose)} the run at this rung is the chosen sweep run itself, the lowest of "
            f"{len(plan.sweep.design.multipliers)} noisy runs, so its loss is biased low"
            if chose
            else f"its runs here are not sweep runs (the sweep trained at size {plan.sizes[0].name}), so only "
            "the rate, not these losses, was selected on it"
        )
        lines += [
            f"Seed {seeds} chose the learning rates (the sweep's runs) and counts in this test too: {where}.",
            "",
        ]
    elif analysis.lr_seeds and analysis.rung_seeds:
        chose = ", ".join(str(s) for s in sorted(set(analysis.lr_seeds)))
        counted = ", ".join(str(s) for s in sorted(set(analysis.rung_seeds)))
        lines += [
            f"Seed {chose} chose the learning rates and does not count in this test (its seeds: {counted}).",
            "",
        ]
    return lines


def _diagnostics_section(plan: Plan, analysis: Analysis) -> list[str]:
    lines = [
        "## Diagnostics (held-out text, through each kind's materialised attention; mean over the seeds rung)",
        "",
        row("arm", *DIAGNOSTICS.values()),
        "|---|" + "---:|" * len(DIAGNOSTICS),
    ]
    for arm in analysis.arms:
        lines.append(row(arm.name, *(num(arm.diagnostics.get(k), "{:.3f}") for k in DIAGNOSTICS)))
    return [*lines, ""]


def _ranking_section(analysis: Analysis) -> list[str]:
    at_one = {a.name: a.lr_losses.get(1.0) for a in analysis.arms}
    own = {a.name: mean_std(a.seeds)[0] for a in analysis.arms}
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
        lines.append(row(name, rank_one[name], rank_own[name], f"{moved:+d}" if moved else ""))
    return [*lines, ""]


def _notes(plan: Plan, analysis: Analysis, all_points: list[Point], trained: RunResults) -> list[str]:
    vocabularies = ", ".join(f"{v:,}" for v in sorted(set(plan.vocabularies.values())))
    notes = [
        "loss: each run's final val loss (the training command's validation at its last step)",
        f"compute: training FLOPs = steps x {plan.tokens_per_step:,} tokens per step x the arm's FLOPs per token "
        f"(Transformer.flops_per_token at block_size, convention {FLOP_CONVENTION}: 6 per matmul weight, the output "
        f"layer's at the data's vocabulary of {vocabularies or 'n/a'} tokens, plus each kind's attention work over "
        "the pairs its queries see; docs/attention.md#training-flops-per-token)",
    ]
    runs = {
        p.run.directory: trained(p).recorded_convention for p in all_points if trained(p).recorded_convention
    }
    older = sorted({c for c in runs.values() if c != FLOP_CONVENTION})
    if older:
        count = sum(c != FLOP_CONVENTION for c in runs.values())
        notes.append(
            f"{count} of {len(runs)} finished runs were recorded under the FLOP count {', '.join(older)} "
            f"(summary.json without flop_convention: each kind's code as it ran on its device): their steps gave "
            f"equal compute by that count, not by {FLOP_CONVENTION}; their compute here is their steps counted by "
            f"{FLOP_CONVENTION}"
        )
    if plan.ladder is not None:
        notes.append(
            f"schedule: warmup-stable-decay (decay over the last {plan.decay_fraction:g} of each run's steps); "
            "each smaller budget is a decay branched from the size's longest run at that budget's decay start"
        )
        if plan.ladder.unit == "tokens_per_param":
            notes.append(
                f"budgets: tokens per non-embedding parameter of {plan.sweep.variants[0].name} at each size, "
                "times its FLOPs per token: every arm of a size gets the same compute, in its own number of steps"
            )
        notes.append(noise_note(plan, analysis))
    if plan.sweep.match:
        # the arm `match` sized the others to: the file's first (make_plan, budget.py), whichever arm
        # the report's baseline is (ablate --baseline)
        reference = plan.sweep.variants[0] if plan.ladder is not None else plan.sweep.reference
        matched = reference.name if reference is not None else plan.arms[0]
        notes.append(
            f"match: {plan.sweep.match}: each arm's MLP width set to {matched}'s budget at each size"
        )
    spent = _time_note(plan, all_points, trained)
    return [*notes, *([spent] if spent else []), *analysis.notes]


def write_design_results(
    plan: Plan,
    analysis: Analysis,
    all_points: list[Point],
    title: str,
    trained: RunResults,
    given: Sequence[str] = (),
) -> WrittenReport:
    """`trained`: what each point's run did, as the analysis read it (runs/results.py)."""
    from . import designed_plots

    output = plan.output
    write_text_atomically(output / "results.csv", csv_text(all_points, trained))
    text = markdown(plan, analysis, title, all_points, trained, given)
    write_text_atomically(output / "results.md", text)
    designed_plots.draw_all(plan, analysis, all_points, trained, output)
    return WrittenReport(output, text, design_plots(plan))
