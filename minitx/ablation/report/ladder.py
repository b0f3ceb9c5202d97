"""The ladder's part of a designed sweep's results.md: the verdicts, the joint fit's multipliers with
each size left out, the held-out rung, the seed noise by size, the steps equal compute bought, and
L(N, D). report/designed.py puts them in order."""

from __future__ import annotations

import math

from ...wording import counted
from ..analysis import fit
from ..analysis.curves import ALPHA_MAX, FLAT
from ..analysis.designed import Analysis, share
from ..analysis.significance import LEVEL
from ..analysis.verdicts import Verdict, verdict
from ..plan.ladder import Plan
from ..runs.results import RunResults
from .cells import budget_text, interval_text, num, ratio, row


def verdicts(plan: Plan, analysis: Analysis) -> dict[str, Verdict]:
    """Each arm but the baseline's verdict (analysis/verdicts.py)."""
    size, budget = analysis.rung
    compute = plan.compute.get((size, budget)) if plan.ladder is not None else None
    base, found = analysis.arms[0].curve, {}
    for arm in analysis.arms:
        if arm.name == analysis.baseline:
            continue
        gap = None
        if analysis.joint is not None and compute and arm.curve is not None and base is not None:
            gap = float(arm.curve.fit.loss(compute) - base.fit.loss(compute))
        found[arm.name] = verdict(arm, size, gap, [s.name for s in plan.sizes])
    return found


def verdict_section(plan: Plan, analysis: Analysis) -> list[str]:
    found = verdicts(plan, analysis)
    if not found:
        return []
    size, budget = analysis.rung
    where = f"{size}, {budget_text(plan, budget)}" if plan.ladder else "the sweep's budget"
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
        "| arm | verdict | compute multiplier [90%] | without each size | smallest it could see | seeds test "
        "| why they differ |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in analysis.arms:
        if arm.name not in found:
            continue
        v = found[arm.name]
        c = arm.answer.comparison if arm.answer else None
        multiplier = "–" if c is None else interval_text(c.multiplier, c.low, c.high)
        values = arm.answer.without.values() if arm.answer else ()
        without = f"{ratio(min(values))}–{ratio(max(values))}" if values else "–"
        test = arm.test
        seeds = "–" if test is None else f"{test.difference:+.4f}, p (Holm) {num(test.p_holm, '{:.2g}')}"
        if v.seeds:
            seeds += f": {v.seeds}"
        seen = v.reach or "–"
        if v.reach and v.ladder == "no difference found" and c is not None:
            seen = f"no difference beyond x{c.low:.3g}–x{c.high:.3g} in compute; could see {v.reach}"
        lines.append(f"| {arm.name} | **{v.word}** | {multiplier} | {without} | {seen} | {seeds} | {v.why} |")
    lines += [
        "",
        "Smallest it could see: the multiplier the ladder would tell from 1 four times in five at this noise (its "
        "minimum detectable effect: the interval's width read as 2 x 1.645 sds, 1.645 + 0.842 sds from 1); "
        "a **no difference found** whose reach is wide means too noisy to say, not equal. A ladder whose arm "
        "covers fewer than 3 sizes, or whose interval is unbounded, cannot decide: the seeds test decides, named.",
    ]
    return [*lines, ""]


def transfer_lines(plan: Plan, analysis: Analysis, size: str) -> list[str]:
    """Decision accuracy at a held-out size (analysis.designed.Transfer), in words."""
    found = next((t for t in analysis.transfer if t.size == size), None)
    if found is None:
        return []
    by_count: dict[int, list[str]] = {}
    for arm, n in found.seeds.items():
        by_count.setdefault(n, []).append(arm)
    if len(by_count) == 1:
        n = next(iter(by_count))
        averaged = f" ({counted(n, 'run')} an arm{', averaged first' if n > 1 else ''})"
    else:
        parts = [
            f"{counted(n, 'run')} for {', '.join(arms)}" for n, arms in sorted(by_count.items(), reverse=True)
        ]
        averaged = f" (each arm's runs there averaged first: {'; '.join(parts)})"
    lines = [
        f"Decision accuracy at {size}, {budget_text(plan, plan.budgets[-1])}{averaged}: the share of arm pairs "
        f"ordered as measured there (DataDecide's; (Kendall tau + 1) / 2, a tie a half):",
        "",
        f"- the fitted curves ({found.source}), each arm's predicted loss: **{found.curves.text()}**",
        f"- ranking at {found.rung} alone, {budget_text(plan, plan.budgets[-1])}: **{found.one_rung.text()}**",
    ]
    if found.verdicts is not None:
        lines.append(
            f"- the verdicts, read as the sign of each arm's difference from {analysis.baseline} there: "
            f'**{found.verdicts.text()}** (a "no difference" agrees when the difference lies within '
            f"1.96 sds of that rung's noise, sd of log loss {found.noise:.4f} from {found.noise_from})"
        )
    else:
        lines.append(f"- the verdicts saw {size} (it is a ladder size): not scored here")
    return [*lines, ""]


def _prediction_header(plan: Plan, first: list[str]) -> list[str]:
    """A table of predictions: the first columns, then each budget's measured and predicted."""
    budgets = [f"@ {budget_text(plan, b)}: measured, predicted [90%]" for b in plan.budgets]
    return [row(*first, *budgets), "|" + "---|" * (len(first) + len(budgets))]


def _coverage(plan: Plan, by_budget: list[list]) -> str:
    """Per budget, how many of its predictions (robust.Prediction) their interval holds."""
    return "; ".join(
        f"{budget_text(plan, b)} {sum(q.covered for q in here)} of {len(here)}"
        for b, here in zip(plan.budgets, by_budget)
    )


def _prediction_cell(q) -> str:
    """One prediction (robust.Prediction) beside what was measured; ✗ outside its interval."""
    measured = "not run" if math.isnan(q.measured) else f"{q.measured:.4f}"
    mark = "" if math.isnan(q.measured) or q.covered else " ✗"
    return f"{measured}, {q.predicted:.4f} [{q.low:.4f}, {q.high:.4f}]{mark}"


def holdout_section(plan: Plan, analysis: Analysis) -> list[str]:
    """The held-out rung (ladder.holdout): measured beside predicted, coverage per budget, and
    the three predictors' decision accuracy."""
    held = plan.holdout
    if held is None:
        return []
    rows = [(p, q) for a in analysis.arms for p, q in a.holdout]
    lines = [
        f"## Held out: {held.name}, never fitted, predicted from {', '.join(s.name for s in plan.sizes)}",
        "",
    ]
    if not rows:
        return [
            *lines,
            f"No prediction: the runs at {held.name} have not finished, or there is no joint fit.",
            "",
        ]
    params = plan.shapes[plan.arms[0], held.name].params
    largest = plan.shapes[plan.arms[0], plan.sizes[-1].name].params
    lines += [
        f"Every arm at {held.name} ({params:,} non-embedding parameters, {params / largest:.2g}x "
        f"{plan.sizes[-1].name}'s), at the rate the rule extrapolates there, each budget predicted by the "
        "whole fit before its run was read, with a 90% predictive interval (the refits' curves plus a new "
        f"point's noise, as at {plan.sizes[-1].name}).",
        "",
        *_prediction_header(plan, ["arm", "rate"]),
    ]
    for arm in analysis.arms:
        if not arm.holdout:
            continue
        cells = {p.budget: _prediction_cell(q) for p, q in arm.holdout}
        rate = f"x{arm.holdout[0][0].multiplier:g}"
        lines.append(row(arm.name, rate, *(cells.get(b, "–") for b in plan.budgets)))
    measured = [(p, q) for p, q in rows if not math.isnan(q.measured)]
    coverage = _coverage(plan, [[q for p, q in measured if p.budget == b] for b in plan.budgets])
    lines += [
        "",
        f"✗: outside its interval. Coverage: **{sum(q.covered for _, q in measured)} of {len(measured)}** "
        f"({coverage}).",
        "",
    ]
    found = next((t for t in analysis.transfer if t.size == held.name), None)
    if found is not None:
        extra = {a: n for a, n in found.seeds.items() if n > 1}
        if extra:
            lines += [
                f"Seeds at {held.name}, {budget_text(plan, plan.budgets[-1])}: "
                + ", ".join(f"{a} {n}" for a, n in extra.items())
                + f" runs; the sd of one run's log loss there {found.noise:.4f} ({found.noise_from}).",
                "",
            ]
    return [*lines, *transfer_lines(plan, analysis, held.name)]


def held_out_section(plan: Plan, analysis: Analysis) -> list[str]:
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
        *_prediction_header(plan, ["arm"]),
    ]
    for arm in analysis.arms:
        if not arm.held_out:
            continue
        lines.append(
            row(arm.name, *(_prediction_cell(p) for p in sorted(arm.held_out, key=lambda p: p.compute)))
        )
    computes = [plan.compute.get((analysis.held_out_size, b)) for b in plan.budgets]
    by_budget = [[p for p in predictions if c and math.isclose(p.compute, c, rel_tol=0.2)] for c in computes]
    lines += [
        "",
        f"✗: the measured loss lies outside its predictive interval. By budget: {_coverage(plan, by_budget)}.",
        "",
    ]
    return [*lines, *transfer_lines(plan, analysis, analysis.held_out_size)]


def noise_section(plan: Plan, analysis: Analysis) -> list[str]:
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
            row(size.name, "interpolated" if freedom is None else f"{freedom:g}", f"{noise.sd[i]:.4f}")
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


def ladder_section(plan: Plan, analysis: Analysis, trained: RunResults) -> list[str]:
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
        f"more compute than it spends). Its 90% interval comes from {fit.BOOTSTRAP} refits to losses redrawn "
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
            multiplier = "–" if c is None else interval_text(c.multiplier, c.low, c.high)
            if answer is not None and answer.dagger:
                multiplier += " †"
            elif answer is not None and answer.verdict == "fragile":
                multiplier += f" *fragile: {plan.sizes[answer.fragile_size].name}*"
            if answer is not None and answer.without:
                without = ", ".join(ratio(answer.without.get(i, math.nan)) for i in range(len(plan.sizes)))
            params = "–" if arm.params is None else interval_text(*share(arm.params))
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

    def loss_cell(arm, p) -> str:
        if p.run.directory in arm.settled:  # what the fit used: the median of three seeds
            return f"{arm.settled[p.run.directory]:.4f} ᵐ"
        return f"{trained(p).loss:.4f}" + (" ᵇ" if p.role == "branch" else "")

    rows = [row("size", *(a.name for a in analysis.arms)), "|---|" + "---:|" * len(analysis.arms)]
    for size in plan.sizes:
        rows.append(row(f"{size.name} params", *(f"{plan.shapes[a, size.name].params:,}" for a in plan.arms)))
        for budget in plan.budgets:
            cells = _point_cells(analysis, size.name, budget, loss_cell)
            rows.append(row(f"{size.name} @ {budget_text(plan, budget)}", *cells))
    settled = "; ᵐ: the median of three seeds, where the ladder's run and its replicate disagreed (below)"
    settled = settled if any(arm.settled for arm in analysis.arms) else ""
    return [
        *lines,
        f"Final val loss per point (ᵇ: a decay branched from the size's longest run{settled}):",
        "",
        *rows,
        "",
        *_steps_table(plan, analysis, trained),
        *_nd_section(analysis),
    ]


def _point_cells(analysis: Analysis, size: str, budget, cell) -> list[str]:
    """Each arm's cell at (size, budget) of the ladder: cell(arm, point), "–" where it has no point."""
    return [("–" if (p := arm.point(size, budget)) is None else cell(arm, p)) for arm in analysis.arms]


def _steps_table(plan: Plan, analysis: Analysis, trained: RunResults) -> list[str]:
    """What equal compute bought each arm: the steps and tokens of each point (as trained)."""

    def steps_cell(arm, p) -> str:
        steps = trained(p).trained_steps
        return f"{steps:,} · {_count(steps * plan.tokens_per_step)}"

    rows = [
        f"Steps and tokens at equal compute (tokens = steps x {plan.tokens_per_step:,}; an arm whose "
        "token costs more FLOPs trains fewer steps):",
        "",
        row("size @ budget", "FLOPs", *(a.name for a in analysis.arms)),
        "|---|---:|" + "---:|" * len(analysis.arms),
    ]
    for size in plan.sizes:
        for budget in plan.budgets:
            cells = _point_cells(analysis, size.name, budget, steps_cell)
            compute = plan.compute.get((size.name, budget))
            flops = "–" if compute is None else f"{compute:.3g}"
            rows.append(row(f"{size.name} @ {budget_text(plan, budget)}", flops, *cells))
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
        m = "1 (baseline)" if arm.name == analysis.baseline else ratio(arm.nd_multiplier)
        lines.append(
            f"| {arm.name} | {f.E:.3f} | {f.A:.3f} | {_exponent(f.a)} | {f.B:.3f} | {_exponent(f.b)} | {m} |"
        )
    lines.append("")
    if any(_at_bound(a.nd.a) or _at_bound(a.nd.b) for a in arms):
        lines += [
            f"‡ an exponent at its bound (0 or {ALPHA_MAX:g}): the fit could not place it, and the terms it "
            "scales are not identified by these points; read that arm's split as undetermined.",
            "",
        ]
    f = arms[0].nd
    return [
        *lines,
        f"N0 {f.N0:,.0f} parameters, D0 {f.D0:.3g} tokens (the baseline's geometric means, for every arm).",
        "",
    ]


def noise_note(plan: Plan, analysis: Analysis) -> str:
    shared = 1 - plan.decay_fraction if len(plan.budgets) > 1 else 0.0
    trunk = (
        f"; {shared:.0%} of a point's noise variance is shared by the points of its arm and size (a size's "
        "smaller budgets are decays branched from its longest run: they share its trunk)"
        if shared
        else ""
    )
    head = (
        f"intervals: a parametric bootstrap, {fit.BOOTSTRAP} refits of the joint fit (weighted by each point's noise, "
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
