"""A designed sweep (a budget, an lr_sweep or a ladder: plan/design.py) from end to end: its plan
(plan/ladder.py), its phases of runs in order (runs/; a fourth, the held-out rung, where the
ladder has one), the diagnostics of every finished run
(runs/eval_runs.py), then its analysis (analysis/designed.py) and report (report/designed.py).
It sits above the stages it drives; plain_sweep.py does the same for a sweep without a design.

The first phase grows as its runs finish (runs past the sweep's edges, then the confirmation at
the largest size: rates.py), so each phase is run until its plan holds no run not yet tried. A
rerun skips every finished run (branch decays too), so a stopped sweep resumes; `--report-only`
rebuilds the tables, fits and plots from what is on disk.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from ..errors import UserError
from ..files.atomic import read_json, write_json_atomically
from ..wording import counted
from .analysis.designed import analyse, replicate_points
from .plan.ladder import Plan, Point, make_plan
from .report.designed import design_plots, write_design_results
from .runs import from_csv
from .runs.eval_runs import diagnose_run
from .runs.launch import run_sweep
from .runs.results import RunResults
from .runs.runner import BASE_SNAPSHOT, given_arguments, is_finished


def _unique_runs(points: Sequence[Point]) -> list:
    seen: dict = {}
    for p in points:
        seen.setdefault(p.run.directory, p.run)
    return list(seen.values())


PLAN_FILE = "plan.json"  # what the output's runs were planned by: older sweeps chose rates otherwise
PLAN_VERSION = 2  # 2: rates chosen past the sweep's edges, confirmed at the largest size, fresh ladder seeds
PHASES = ("learning rates", "ladder", "branches", "held out", "held-out branches")


def declared_phases(plan: Plan) -> list[tuple[int, str]]:
    """The phases the sweep file declares, as (index in PHASES, name), in order: the learning
    rates only with lr_sweep, the branches only with a ladder of two or more budgets, the held-out
    rung's two only with ladder.holdout. Without a ladder the second phase trains each arm's seeds
    at the budget, and is named so: a log line names no phase the file did not ask for."""
    design, ladder = plan.sweep.design, plan.ladder
    found = [(0, PHASES[0])] if design.multipliers else []
    found.append((1, PHASES[1] if ladder is not None else "each arm's seeds"))
    branched = ladder is not None and len(plan.budgets) > 1
    if branched:
        found.append((2, PHASES[2]))
    if plan.holdout is not None:
        found += [(3, PHASES[3]), *([(4, PHASES[4])] if branched else [])]
    return found


def describe(points: Sequence[Point], plan: Plan) -> str:
    """What a batch of runs is, in words: "56 runs (56 sweep)", "10 runs (2 past the sweep's edge, ...)"."""
    grids = set(plan.sweep.design.multipliers)
    kinds: dict[str, int] = {}
    for p in {p.run.directory: p for p in points}.values():
        if p.role == "sweep":
            kind = "sweep" if p.multiplier in grids else "past the sweep's edge"
        elif p.role == "confirm":
            kind = f"confirmation at {p.size}"
        elif p.role.startswith("holdout"):
            kind = {"holdout": "held-out trunk", "holdout-branch": "held-out branch"}.get(
                p.role, "held-out seed"
            )
        elif plan.ladder is None:  # without a ladder its second phase is each arm's seeds
            kind = "seeds"
        else:
            kind = p.role
        kinds[kind] = kinds.get(kind, 0) + 1
    return f"{counted(sum(kinds.values()), 'run')} ({', '.join(f'{n} {k}' for k, n in kinds.items())})"


def log_count(plan: Plan, log) -> None:
    counts = plan.run_count()
    extend = plan.sweep.design.extend * len(plan.arms) if plan.sweep.design.multipliers else 0
    past = f", and up to {extend} past the sweep's edges" if extend else ""
    log(
        f"ablate: the plan: {counted(sum(counts.values()), 'run')} ({', '.join(f'{n} {k}' for k, n in counts.items())}{past})"
    )


def check_plan_version(plan: Plan, output: Path) -> None:
    """--report-only of an output whose learning rates were chosen by an earlier minitx (the sweep's
    run doubled as a ladder point, one seed chose): refused in one line, not misread."""
    if not plan.sweep.design.multipliers:  # without lr_sweep the plan is what it was
        return
    record = read_json(output / PLAN_FILE) or {}
    if record.get("version") != PLAN_VERSION and any((output / "runs").glob("*/summary.json")):
        raise UserError(
            f"--report-only: {str(output)!r} holds runs of an earlier minitx's designed sweep, which chose learning "
            "rates from one run and reused it as a ladder point; rerun the sweep into a new --output"
        )


def check_baseline_rate(plan: Plan) -> None:
    """Every arm is compared with the baseline (the first variant): without a learning rate for it
    the ladder has nothing to answer, so the sweep stops before the ladder's first run, in one line."""
    baseline = plan.arms[0]
    refused = plan.rates(RunResults())[baseline].refused
    if not refused:
        return
    fix = (
        "" if "lr_sweep" in refused else "; list other lr_sweep.multipliers (or a lower base rate) and rerun"
    )
    raise UserError(
        f"lr_sweep: the baseline {baseline!r} has no learning rate: {refused}{fix}; the ladder was not started "
        "(every arm is compared with the baseline)"
    )


def _phase(plan: Plan, trained, phase: int) -> list[Point]:
    """The runs of one phase (PHASES): the plan's four, the held-out rung's trunks before its
    branches (a branch starts from its trunk's checkpoint)."""
    found = plan.all_points(trained)
    if phase < 3:
        return found[phase]
    return [p for p in found[3] if plan.holdout_stage(p) == phase - 3]


def report_instability(points: Sequence[Point], trained: RunResults, log) -> None:
    for p in points:
        if p.role in ("confirm", "ladder", "seed") and trained(p).trouble:
            log(
                f"ablate: unstable {p.run.directory.name} (x{p.multiplier:g} at {p.size}): {trained(p).trouble}"
            )


def run_designed(
    sweep,
    output: Path,
    title: str,
    launcher=1,
    extra: Sequence[str] = (),
    logging: Sequence[str] = (),
    report_only: bool = False,
    dry_run: bool = False,
    trust_kind_modules: Sequence[str] = (),
    log=print,
    results_csv: Path | None = None,
    baseline: str | None = None,
) -> Plan:
    """`results_csv`: a results.csv read in place of the runs (runs/from_csv.py), with report_only;
    `baseline`: the arm the report compares the others with (default the file's first)."""
    plan = make_plan(sweep, output, extra, logging)
    phases_declared = declared_phases(plan)
    count = len(phases_declared)
    if baseline is not None:
        from_csv.put_baseline_first(plan, baseline)
    # Each RunResults() below is what the runs on disk hold at that moment: the plan grows from
    # the runs as they finish, and the analysis reads them once they all have.
    if dry_run:
        first, second, _, _ = plan.all_points(RunResults())
        shown = first or second
        for run in _unique_runs(shown):
            log(" ".join(shlex.quote(part) for part in run.command))
        later = []
        if first:
            later.append("runs past the sweep's edges where an arm's best is at one")
            if len(plan.sizes) > 1:
                later.append("the confirmation at the largest size")
            later.append("the ladder at each arm's rates" if plan.ladder is not None else "each arm's seeds")
        if any(index == 2 for index, _ in phases_declared):
            later.append("the branches")
        if plan.holdout is not None:
            number = next(n for n, (index, _) in enumerate(phases_declared, 1) if index == 3)
            later.append(
                f"phase {number}, the held-out rung: every arm at {plan.holdout.name} at the rate extrapolated "
                "there, never fitted"
            )
        if later:
            log(f"# then {', then '.join(later)}; {output / BASE_SNAPSHOT} is written when the sweep runs")
        else:
            log(f"# {output / BASE_SNAPSHOT} is written when the sweep runs")
        log_count(plan, lambda line: log("# " + line))
        return plan
    # A results.csv stands for the runs (--from-csv): none needs to be on disk; without
    # --report-only the held-out rung it lacks is trained (ladder.holdout added since)
    recorded = from_csv.read_results(results_csv, plan) if results_csv is not None else None
    extended = from_csv.ExtendedResults(recorded) if recorded is not None and not report_only else None

    def now():
        """What the runs hold at this moment: the runs on disk (and the CSV's, where extended)."""
        return extended.now() if extended is not None else RunResults()

    if report_only and recorded is None:
        check_plan_version(plan, output)
        first, second, _, _ = plan.all_points(RunResults())
        if not any(is_finished(p.run) for p in first + second):
            raise UserError(
                f"--report-only: {str(output)!r} holds no finished run of this sweep; run it first (without --report-only)"
            )
    elif not report_only:
        output.mkdir(parents=True, exist_ok=True)
        write_json_atomically(output / PLAN_FILE, {"version": PLAN_VERSION})
        log_count(plan, log)
        if extended is not None:
            log(
                f"ablate: the runs {results_csv} holds are read from it; the held-out rung it lacks is trained"
            )
        tried: set[Path] = set()  # each run once per invocation: a failed run is a row, not retried here
        # extending a CSV's sweep trains its held-out rung only: the ladder ran at the CSV's rates
        # (a rule changed since would plan other learning-rate runs, which choose nothing here)
        for number, (phase, name) in enumerate(phases_declared, 1):  # each planned from the runs before it
            if extended is not None and phase < 3:
                continue
            while True:  # the learning rates grow run by run: past an edge, then the confirmation
                snapshot = now()
                points = [
                    p
                    for p in _phase(plan, snapshot, phase)
                    if p.run.directory not in tried and not (extended is not None and extended.holds(p))
                ]
                if not points:
                    break
                log(f"ablate: phase {number} of {count} ({name}): {describe(points, plan)}")
                run_sweep(_unique_runs(points), sweep, output, launcher, log)
                tried |= {p.run.directory for p in points}
            if phase == 0:
                check_baseline_rate(plan)
        for point in sum(plan.all_points(now()), []):
            if extended is None or not extended.holds(point):
                diagnose_run(point.run, trust_kind_modules, log)
    trained = now() if extended is not None else recorded if recorded is not None else RunResults()
    phases = plan.all_points(trained)
    if recorded is not None:
        from_csv.check_planned(recorded, sum(phases, []))
    report_instability(phases[0] + phases[1], trained, log)
    for rate in plan.rates(trained).values():
        if rate.refused:
            log(f"ablate: refused {rate.arm}: {rate.refused}")
    analysis = analyse(plan, phases, trained)
    # a replicate pair far apart: a third seed of that point settles it (the median of three)
    replicates = replicate_points(plan, analysis)
    todo = [p for p in replicates if not is_finished(p.run)]
    if todo and not report_only and recorded is None:
        log(f"ablate: phase {count + 1} (a third seed where two disagree): {describe(todo, plan)}")
        run_sweep(_unique_runs(todo), sweep, output, launcher, log)
        for point in todo:
            diagnose_run(point.run, trust_kind_modules, log)
        trained = RunResults()
        phases = plan.all_points(trained)
    if replicates:
        analysis = analyse(plan, phases, trained, replicates)
        phases = (phases[0], phases[1], [*phases[2], *replicates], phases[3])
    if recorded is not None:
        analysis.notes.extend(from_csv.notes(recorded, plan, sum(phases, [])))
        output.mkdir(parents=True, exist_ok=True)
    # what the runs were given besides the sweep file: part of what the table measured
    given = given_arguments(_unique_runs(sum(phases, [])))
    write_design_results(plan, analysis, sum(phases, []), title, trained, given)
    log((output / "results.md").read_text(encoding="utf-8"))
    log(f"ablate: wrote {output / 'results.md'}, results.csv, {', '.join(design_plots(plan))}")
    if not any(trained(p).loss is not None for p in sum(phases, [])):
        # a run whose SLURM job was cancelled did not fail: rerunning resumes it from last.ckpt
        cancelled = any(trained(p).record.get("status") == "cancelled" for p in sum(phases, []))
        what = (
            "no run finished (some were cancelled: run the same command again to resume them)"
            if cancelled
            else "every run failed"
        )
        raise UserError(f"{what}; see {output / 'results.md'} and each run's train.log")
    return plan
