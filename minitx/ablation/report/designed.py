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
from collections.abc import Sequence

from ...evaluation.diagnostics import DIAGNOSTIC_KEYS, DIAGNOSTIC_NAMES
from ...files.atomic import write_text_atomically
from ...flops import FLOP_CONVENTION
from ..analysis.curves import ALPHA_MAX, FLAT
from ..analysis.designed import Analysis, share
from ..analysis.significance import CONFIDENCE, LEVEL
from ..analysis.table import device_label
from ..analysis.verdicts import Verdict, verdict
from ..plan.ladder import Plan, Point
from ..plan.rates import MARGIN
from ..runs.results import PointResult, RunResults

DESIGN_PLOTS = (
    "lr_sweep.png",
    "loss_vs_compute.png",
    *(f"diag_{key}.png" for key in DIAGNOSTIC_KEYS),
    "diag_loss_by_position.png",
)
CSV_FIELDS = [
    "arm", "size", "budget", "multiplier", "seed", "role", "status", "error", "steps", "tokens", "flops",
    "params", "flops_per_token", "flop_convention", "final_val_loss", *DIAGNOSTIC_KEYS, "branch_of", "device",
    "run_dir",
]  # fmt: skip


def _status(result: PointResult) -> tuple[str, str]:
    if result.loss is not None:
        return "ok", ""
    if result.record.get("status") in ("failed", "cancelled"):  # cancelled: its SLURM job
        return result.record["status"], result.record.get("error", "")
    return "not run", ""


def run_device(result: PointResult) -> str | None:
    """Where the run trained, with the machine's GPUs it was given (table.device_label)."""
    return device_label((result.summary or {}).get("device"), result.record.get("gpus"))


def csv_text(points: list[Point], trained: RunResults) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    unique: dict = {}
    for p in points:  # a run once, as first planned (the smallest size's ladder run is a sweep run)
        unique.setdefault(p.run.directory, p)
    for p in unique.values():
        result = trained(p)
        status, error = _status(result)
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
                **{k: "" if found.get(k) is None else f"{found[k]:.5g}" for k in DIAGNOSTIC_KEYS},
                "branch_of": "" if p.branch_of is None else p.branch_of.run.directory.name,
                "device": run_device(result) or "",
                "run_dir": str(p.run.directory),
            }
        )  # fmt: skip
    return out.getvalue()


def _num(value: float | None, fmt: str = "{:.4f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if math.isinf(value):
        return "unbounded"
    return fmt.format(value)


def _ratio(value: float | None) -> str:
    """A multiplier or share: three significant figures, a word where there is no number (0 and
    inf are the two ends of log scale: a fit or draw at the multiplier's bound)."""
    if value is None or math.isnan(value):
        return "–"
    if value == 0 or math.isinf(value):
        return "unbounded"
    if 0.01 <= value < 1000:
        return f"{value:.3g}" if value < 10 else f"{value:.1f}"
    return f"{value:.2g}"


def _interval(value: float, low: float, high: float) -> str:
    return f"{_ratio(value)} [{_ratio(low)}, {_ratio(high)}]"


def _budget_text(plan: Plan, budget: float | None) -> str:
    if budget is None:
        return "the base's steps"
    if plan.ladder is not None and plan.ladder.unit == "tokens_per_param":
        return f"{budget:g} tokens/param"
    return f"{budget:.3g} FLOPs"


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
    lines += _verdict_section(plan, analysis)
    if design.multipliers:
        lines += _lr_section(plan, analysis, all_points, trained)
    if plan.ladder is not None:
        lines += _ladder_section(plan, analysis, trained)
        lines += _held_out_section(plan, analysis)
        lines += _noise_section(plan, analysis)
    lines += _seeds_section(plan, analysis)
    if any(a.diagnostics for a in analysis.arms):
        lines += _diagnostics_section(plan, analysis)
    if design.multipliers:
        lines += _ranking_section(analysis)
    if analysis.failed:
        lines += ["## Failed runs", ""]
        for p in analysis.failed:
            lines.append(f"- {p.run.directory.name}: {_status(trained(p))[1] or 'no summary'}")
        lines.append("")
    lines += ["## How these were measured", ""]
    lines += [f"- {note}" for note in _notes(plan, analysis, all_points, trained)]
    lines += [f"- {line}" for line in given]
    return "\n".join(lines).rstrip() + "\n"


def _outcome(result: PointResult) -> str:
    """A rate's run in a cell: its loss, "diverged", "failed" or "–" (not run)."""
    if result.loss is not None:
        return f"{result.loss:.4f}"
    if result.outcome is None:
        return "–"
    return "diverged" if result.trouble.startswith("diverged") else "failed"


def verdicts(plan: Plan, analysis: Analysis) -> dict[str, Verdict]:
    """Each arm but the baseline's verdict (analysis/verdicts.py)."""
    size, budget = analysis.rung
    compute = plan.compute.get((size, budget)) if plan.ladder is not None else None
    found = {}
    for arm in analysis.arms:
        if arm.name == analysis.baseline:
            continue
        gap = None
        if analysis.joint is not None and compute and arm.curve is not None:
            base = analysis.arms[0].curve
            gap = float(arm.curve.fit.loss(compute) - base.fit.loss(compute)) if base is not None else None
        found[arm.name] = verdict(arm, size, gap, [s.name for s in plan.sizes])
    return found


def _verdict_section(plan: Plan, analysis: Analysis) -> list[str]:
    found = verdicts(plan, analysis)
    if not found:
        return []
    size, budget = analysis.rung
    where = f"{size}, {_budget_text(plan, budget)}" if plan.ladder else "the sweep's budget"
    lines = [
        "## Verdicts",
        "",
        f"Each arm against **{analysis.baseline}**. "
        + (
            "The ladder decides (every size and budget, each arm at its own rate): **better** or **worse** when "
            "the compute multiplier's 90% interval excludes 1 and no size left out moves it to the other side "
            "of 1; **fragile** when one size decides its side; else **no difference found**. "
            if plan.ladder is not None
            else ""
        )
        + f"The seeds test (Welch, Holm-corrected, p < {LEVEL}) at {where} stands beside it.",
        "",
        "| arm | verdict | compute multiplier [90%] | without each size | seeds test | why they differ |",
        "|---|---|---|---|---|---|",
    ]
    for arm in analysis.arms:
        if arm.name not in found:
            continue
        v = found[arm.name]
        c = arm.answer.comparison if arm.answer else None
        multiplier = "–" if c is None else _interval(c.multiplier, c.low, c.high)
        without = "–"
        if arm.answer and arm.answer.without:
            values = [v for v in arm.answer.without.values()]
            without = f"{_ratio(min(values))}–{_ratio(max(values))}"
        test = arm.test
        seeds = "–" if test is None else f"{test.difference:+.4f}, p (Holm) {_num(test.p_holm, '{:.2g}')}"
        if v.seeds:
            seeds += f": {v.seeds}"
        lines.append(f"| {arm.name} | **{v.word}** | {multiplier} | {without} | {seeds} | {v.why} |")
    return [*lines, ""]


def _held_out_section(plan: Plan, analysis: Analysis) -> list[str]:
    predictions = [p for arm in analysis.arms for p in arm.held_out]
    if not predictions:
        return []
    below = ", ".join(s.name for s in plan.sizes[:-1])
    inside = sum(p.covered for p in predictions)
    lines = [
        f"## A held-out rung: {analysis.held_out_size} predicted from {below}",
        "",
        f"The same fit and noise model without {analysis.held_out_size}, each arm's loss predicted at its "
        f"{analysis.held_out_size} points with a 90% predictive interval (the refits' curves there plus a new "
        f"point's noise, as measured at {plan.sizes[-2].name}); **{inside} of {len(predictions)}** measured losses "
        "fall inside (on simulated ladders such intervals hold 85-95%: benchmarks/ladder_calibration.py).",
        "",
        "| arm | "
        + " | ".join(f"@ {_budget_text(plan, b)}: measured, predicted [90%]" for b in plan.budgets)
        + " |",
        "|---|" + "---|" * len(plan.budgets),
    ]
    for arm in analysis.arms:
        if not arm.held_out:
            continue
        by_compute = sorted(arm.held_out, key=lambda p: p.compute)
        cells = [
            f"{p.measured:.4f}, {p.predicted:.4f} [{p.low:.4f}, {p.high:.4f}]" + ("" if p.covered else " ✗")
            for p in by_compute
        ]
        lines.append(f"| {arm.name} | " + " | ".join(cells) + " |")
    return [*lines, "", "✗: the measured loss lies outside its predictive interval.", ""]


def _noise_section(plan: Plan, analysis: Analysis) -> list[str]:
    noise = analysis.size_noise
    if noise is None:
        return []
    lines = [
        "## Seed noise by size, from the replicates the plan holds",
        "",
        f"At {plan.sizes[0].name} the sweep's run at the rate the ladder uses there and the ladder's run are one "
        f"config with two seeds; so are the confirmation's and the ladder's at {plan.sizes[-1].name}; the seeds "
        f"rung ({analysis.rung[0]}) has its seeds. A size without replicates takes the sd interpolated in log "
        "parameters. Each point's noise in the intervals is its size's sd times its arm's dispersion (the arm's "
        "scatter about the joint curve in those sds, at least 1).",
        "",
        "| size | freedom | sd of log loss |",
        "|---|---:|---:|",
    ]
    for i, size in enumerate(plan.sizes):
        freedom = noise.measured.get(i)
        lines.append(
            f"| {size.name} | {'interpolated' if freedom is None else f'{freedom:g}'} | {noise.sd[i]:.4f} |"
        )
    pairs = [
        f"{arm.name} at {size}: {a:.4f} and {b:.4f}"
        for arm in analysis.arms
        for size, (a, b) in arm.pairs.items()
    ]
    lines.append("")
    if pairs:
        lines += ["Replicate pairs (the ladder's run, then the other seed's): " + "; ".join(pairs) + ".", ""]
    if noise.factor:
        own = ", ".join(f"{arm} x{f:.2f}" for arm, f in noise.factor.items())
        lines += [f"Arms noisier at the rung (F-test stepping down, p < 0.01) keep their excess: {own}.", ""]
    for arm, size, d in noise.unreliable:
        name = plan.sizes[size].name
        settled = analysis.arm(arm).medians.get(name)
        then = (
            f"a third seed ran there ({settled[2]:.4f}), and the ladder's point is the median of the three, "
            f"{settled[3]:.4f}"
            if settled
            else "no third seed has run there (a sweep runs one; --report-only of older runs and --from-csv cannot), "
            "so the point keeps the ladder's run"
        )
        lines.append(
            f"- **unreliable**: {arm} at {name}: its two seeds differ by {d:+.3f} in log loss, more than 4 sds of "
            f"the noise (the rung's, or that size's where larger): left out of that size's sd (an unlucky run is "
            f"lack of fit, which the arm's dispersion carries); {then}"
        )
    if noise.unreliable:
        lines.append("")
    return lines


def _lr_section(plan: Plan, analysis: Analysis, all_points: list[Point], trained: RunResults) -> list[str]:
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
        lines.append(f"| {arm.name} | " + " | ".join(cells) + f" | {chosen} |")
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
            f"Confirmed at {large} ({_budget_text(plan, plan.budgets[-1])}, seed {plan.sweep.seed}): the choice and "
            "its neighbours; the same rule over those that neither diverged nor spiked gives the rate used there "
            "(in bold), sizes between "
            "train at the rate interpolated geometrically in parameters.",
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


def _ladder_section(plan: Plan, analysis: Analysis, trained: RunResults) -> list[str]:
    joint = analysis.joint
    shape = (
        f"E {joint.E:.3f}, A {joint.A:.3f}, alpha {joint.alpha:.3f}, C0 {joint.C0:.3g} FLOPs"
        if joint
        else "no joint fit"
    )
    lines = [
        "## The ladder: loss against compute",
        "",
        "One curve for every arm, L_arm(C) = E + A (m_arm C / C0)^-alpha with m = 1 for "
        f"{analysis.baseline} ({shape}; Huber in log space): an arm's **compute multiplier** m is the "
        f"compute {analysis.baseline} needs for the arm's loss, over the arm's compute (> 1: the arm is worth "
        f"more compute than it spends). Its 90% interval comes from {_draws()} refits to losses redrawn "
        "about the fit with each point's noise: its size's seed noise, raised to the arm's own scatter where that "
        "is larger (the dispersion; see the notes). † the interval excludes 1 and no size left out moves the "
        "multiplier to the other side of 1; *fragile*: one size decides its side.",
        "",
        "| arm | points (branches) | sizes | compute multiplier [90%] | without "
        + ", ".join(s.name for s in plan.sizes)
        + " | params share at equal loss [90%] | own curve: E, alpha | scatter about the curve | dispersion |",
        "|---|---:|---:|---|---|---|---|---:|---:|",
    ]
    fragile = False
    for arm in analysis.arms:
        branches = sum(p.role == "branch" for p in arm.points)
        head = f"| {arm.name} | {len(arm.points)} ({branches}) | {arm.sizes} |"
        own = "–" if arm.own is None else f"{arm.own.E:.3f}, {arm.own.alpha:.3f}"
        if arm.curve is None:
            lines.append(f"{head} {arm.fit_note or '–'} | | | {own} | | |")
            continue
        without = "–"
        if arm.name == analysis.baseline:
            multiplier, params = "1 (baseline)", "1 (baseline)"
        else:
            c, answer = arm.compute, arm.answer
            multiplier = "–" if c is None else _interval(c.multiplier, c.low, c.high)
            if answer is not None and answer.dagger:
                multiplier += " †"
            elif answer is not None and answer.verdict == "fragile":
                multiplier += f" *fragile: {plan.sizes[answer.fragile_size].name}*"
            if answer is not None and answer.without:
                without = ", ".join(_ratio(answer.without.get(i, math.nan)) for i in range(len(plan.sizes)))
            params = "–" if arm.params is None else _interval(*share(arm.params))
        if arm.sizes < 3:
            multiplier += " (2 sizes: fragile)" if arm.sizes == 2 else " (1 size: fragile)"
            fragile = True
        scatter = "–" if arm.scatter is None else f"{arm.scatter:.4f}"
        dispersion = "–" if arm.dispersion is None else f"{arm.dispersion:.2f}"
        lines.append(f"{head} {multiplier} | {without} | {params} | {own} | {scatter} | {dispersion} |")
    sd = analysis.noise.pooled if analysis.noise else None
    lines += [
        "",
        "Parameter share: the arm's non-embedding parameters over the baseline's at equal loss, from the "
        "same joint form in N over the sizes at the largest budget (< 1: the arm needs fewer).",
        "Own curve: each arm fitted alone (E + A (C/C0)^-alpha, 5 or more points), a check of the shared shape. "
        "Scatter: rms of the arm's log-loss residuals about its joint curve"
        + (f", to set beside the seed noise (sd of log loss {sd:.4f} at the rung): much larger says the arm's "
           "curve has another shape or a point had an unlucky run, and its multiplier is an average over the "
           "ladder." if sd else ".")
        + " Dispersion: the arm's noise in the intervals over its seed noise (its scatter in seed sds, over the "
        "freedom the fit leaves; at least 1). Without each size: the multiplier refitted with that size left out.",
    ]  # fmt: skip
    if fragile:
        lines.append(
            "Fragile: an arm whose points cover fewer than 3 sizes pins its place on the curve by too few "
            "independent runs (a size's budgets share one trunk); read its multiplier as a rough guide."
        )
    lines.append("")
    rows = ["| size | " + " | ".join(analysis.arms[i].name for i in range(len(analysis.arms))) + " |"]
    rows.append("|---|" + "---:|" * len(analysis.arms))
    for size in plan.sizes:
        cells = [f"{plan.shapes[a, size.name].params:,}" for a in plan.arms]
        rows.append(f"| {size.name} params | " + " | ".join(cells) + " |")
        for budget in plan.budgets:
            cells = []
            for arm in analysis.arms:
                p = next((q for q in arm.points if q.size == size.name and q.budget == budget), None)
                cells.append(
                    "–" if p is None else f"{trained(p).loss:.4f}" + (" ᵇ" if p.role == "branch" else "")
                )
            rows.append(f"| {size.name} @ {_budget_text(plan, budget)} | " + " | ".join(cells) + " |")
    return [
        *lines,
        "Final val loss per point (ᵇ: a decay branched from the size's longest run):",
        "",
        *rows,
        "",
        *_steps_table(plan, analysis, trained),
        *_nd_section(analysis),
    ]


def _draws() -> int:
    from ..analysis import fit

    return fit.BOOTSTRAP


def _steps_table(plan: Plan, analysis: Analysis, trained: RunResults) -> list[str]:
    """What equal compute bought each arm: the steps and tokens of each point (as trained)."""
    rows = [
        f"Steps and tokens at equal compute (tokens = steps x {plan.tokens_per_step:,}; an arm whose "
        "token costs more FLOPs trains fewer steps):",
        "",
        "| size @ budget | FLOPs | " + " | ".join(a.name for a in analysis.arms) + " |",
        "|---|---:|" + "---:|" * len(analysis.arms),
    ]
    for size in plan.sizes:
        for budget in plan.budgets:
            cells = []
            for arm in analysis.arms:
                p = next((q for q in arm.points if q.size == size.name and q.budget == budget), None)
                if p is None:
                    cells.append("–")
                    continue
                steps = trained(p).trained_steps
                cells.append(f"{steps:,} · {_count(steps * plan.tokens_per_step)}")
            compute = plan.compute.get((size.name, budget))
            flops = "–" if compute is None else f"{compute:.3g}"
            rows.append(
                f"| {size.name} @ {_budget_text(plan, budget)} | {flops} | " + " | ".join(cells) + " |"
            )
    return [*rows, "", "Each cell: steps · tokens.", ""]


def _count(n: float) -> str:
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def _at_bound(exponent: float) -> bool:
    return exponent <= FLAT or exponent >= ALPHA_MAX - 1e-6


def _exponent(value: float) -> str:
    return f"{value:.3f}" + (" ‡" if _at_bound(value) else "")


def _nd_section(analysis: Analysis) -> list[str]:
    arms = [a for a in analysis.arms if a.nd is not None]
    if not arms:
        return []
    lines = [
        "## A second view: L(N, D) = E + A (N/N0)^-a + B (D/D0)^-b per arm",
        "",
        "Chinchilla's third approach, each arm alone (Huber in log space, 81 starts): how loss splits "
        "between parameters (a) and tokens (b). The multiplier here is the baseline's compute for the arm's "
        "fitted loss at the arm's largest point, reached with more tokens at the same size, over the arm's "
        "compute; a point estimate to set beside the joint fit's, not a test.",
        "",
        "| arm | E | A | a | B | b | compute multiplier at its largest size |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for arm in arms:
        f = arm.nd
        m = "1 (baseline)" if arm.name == analysis.baseline else _ratio(arm.nd_multiplier)
        lines.append(
            f"| {arm.name} | {f.E:.3f} | {f.A:.3f} | {_exponent(f.a)} | {f.B:.3f} | {_exponent(f.b)} | {m} |"
        )
    f = arms[0].nd
    bound = any(_at_bound(a.nd.a) or _at_bound(a.nd.b) for a in arms)
    return [
        *lines,
        "",
        *(
            [
                f"‡ an exponent at its bound (0 or {ALPHA_MAX:g}): the fit could not place it, and the terms it "
                "scales are not identified by these points; read that arm's split as undetermined.",
                "",
            ]
            if bound
            else []
        ),
        f"N0 {f.N0:,.0f} parameters, D0 {f.D0:.3g} tokens (the baseline's geometric means, for every arm).",
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
        p_holm = _num(t.p_holm, "{:.2g}")
        if t.significant:
            diff, p_holm = f"**{diff}**", f"**{p_holm}**"
        lines.append(f"| {arm.name} | {n} | {cell} | {diff} | {_num(t.p, '{:.2g}')} | {p_holm} |")
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
                "times its FLOPs "
                "per token: every arm of a size gets the same compute, in its own number of steps"
            )
        notes.append(_noise_note(plan, analysis))
    if plan.sweep.match:
        notes.append(
            f"match: {plan.sweep.match}: each arm's MLP width set to {_matched_to(plan)}'s budget at each size"
        )
    notes += analysis.notes
    return notes


def _matched_to(plan: Plan) -> str:
    """The arm `match` sized the others to: the file's first (make_plan, budget.py), whichever arm
    the report's baseline is (ablate --baseline)."""
    reference = plan.sweep.variants[0] if plan.ladder is not None else plan.sweep.reference
    return reference.name if reference is not None else plan.arms[0]


def _noise_note(plan: Plan, analysis: Analysis) -> str:
    shared = 1 - plan.decay_fraction if len(plan.budgets) > 1 else 0.0
    trunk = (
        f"; {shared:.0%} of a point's noise variance is shared by the points of its arm and size (a size's "
        "smaller budgets are decays branched from its longest run: they share its trunk)"
        if shared
        else ""
    )
    head = (
        f"intervals: a parametric bootstrap, {_draws()} refits of the joint fit (weighted by each point's noise, "
        "Huber's delta 1.345 of it) to losses redrawn about it"
    )
    if analysis.size_noise is None:
        return f"{head}; {analysis.noise_note}{trunk}"
    noise = analysis.size_noise
    sizes = ", ".join(f"{s.name} {noise.sd[i]:.4f}" for i, s in enumerate(plan.sizes))
    return (
        f"{head} with each point's noise: its size's seed noise (sd of log loss {sizes}; {noise.dof:g} degrees "
        "of freedom from the replicates) times its arm's dispersion, at least 1: an arm whose points stray from "
        "the joint curve more than seeds do (an unlucky run, a curve of another shape) gets intervals that wide"
        f"{trunk}; each draw also redraws each sd from its own uncertainty (the seeds' freedom, or the arm's "
        "residuals' counted by trunk). A 90% interval: on simulated ladders with the showcase's design, noise "
        "and misspecifications (unlucky trunks, noise growing at small sizes, a bending arm) it held the planted "
        "multiplier 90-95% of the time (benchmarks/ladder_calibration.py); it is not a promise that a rerun lands "
        "inside, since a rerun redraws the rates' luck too"
    )


def write_design_results(
    plan: Plan,
    analysis: Analysis,
    all_points: list[Point],
    title: str,
    trained: RunResults,
    given: Sequence[str] = (),
) -> None:
    """`trained`: what each point's run did, as the analysis read it (runs/results.py)."""
    from . import designed_plots

    output = plan.output
    write_text_atomically(output / "results.csv", csv_text(all_points, trained))
    write_text_atomically(output / "results.md", markdown(plan, analysis, title, all_points, trained, given))
    designed_plots.draw_all(plan, analysis, all_points, trained, output)
