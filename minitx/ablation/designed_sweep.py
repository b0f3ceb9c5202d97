"""A designed sweep (a budget, an lr_sweep or a ladder: plan/design.py) from end to end, as
run_designed reads: its plan (plan/ladder.py); its phases of runs in order (runs/; a fourth, the
held-out rung, where the ladder has one), then the diagnostics of every finished run
(runs/eval_runs.py); the analysis (analysis/designed.py), a third seed where a replicate pair
disagrees; the report (report/designed.py). Each step reads the sweep's results source, chosen
once: the runs on disk, a results.csv in their place, or a recorded CSV extended by new runs
(runs/results.py, runs/from_csv.py). It sits above the stages it drives; plain_sweep.py does the
same for a sweep without a design.

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
from .analysis.designed import Analysis, analyse, replicate_points
from .plan.ladder import PHASES, Plan, Point, make_plan
from .plan.sweep import Sweep
from .report.designed import write_design_results
from .request import SweepRequest
from .runs import from_csv
from .runs.eval_runs import diagnose_run, sweep_kind_modules
from .runs.from_csv import CsvResults
from .runs.launch import Launcher, run_sweep
from .runs.results import RunResults
from .runs.runner import BASE_SNAPSHOT, given_arguments, is_finished


def _unique_runs(points: Sequence[Point]) -> list:
    seen: dict = {}
    for p in points:
        seen.setdefault(p.run.directory, p.run)
    return list(seen.values())


PLAN_FILE = "plan.json"  # what the output's runs were planned by: older sweeps chose rates otherwise
PLAN_VERSION = 2  # 2: rates chosen past the sweep's edges, confirmed at the largest size, fresh ladder seeds
HELD_OUT = PHASES.index("held out")  # the held-out rung's phases: its trunks, then its branches
# Where a sweep's figures are read from (results_source): each is called with a point, as RunResults
Results = RunResults | CsvResults


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
            kind = "held-out " + {"holdout": "trunk", "holdout-branch": "branch"}.get(p.role, "seed")
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
    kinds = ", ".join(f"{n} {k}" for k, n in counts.items())
    log(f"ablate: the plan: {counted(sum(counts.values()), 'run')} ({kinds}{past})")


def check_baseline_rate(plan: Plan) -> None:
    """Every arm is compared with the baseline (the first variant): without a learning rate for it
    the ladder has nothing to answer, so the sweep stops before the ladder's first run, in one line."""
    baseline = plan.arms[0]
    refused = plan.rates(RunResults())[baseline].refused
    if not refused:
        return
    fix = "; list other lr_sweep.multipliers (or a lower base rate) and rerun"
    if "lr_sweep" in refused:  # a refusal naming lr_sweep says its own fix
        fix = ""
    raise UserError(
        f"lr_sweep: the baseline {baseline!r} has no learning rate: {refused}{fix}; the ladder was not started "
        "(every arm is compared with the baseline)"
    )


def _phase(plan: Plan, trained, phase: int) -> list[Point]:
    """The runs of one phase (PHASES): the plan's four, the held-out rung's trunks before its
    branches (a branch starts from its trunk's checkpoint)."""
    found = plan.all_points(trained)
    if phase < HELD_OUT:
        return found[phase]
    branches = phase > HELD_OUT  # the held-out rung's second phase: its branches
    return [p for p in found[HELD_OUT] if (p.role == "holdout-branch") == branches]


def run_designed(sweep: Sweep, request: SweepRequest, launcher: Launcher | None = None, log=print) -> Plan:
    """The sweep the request asks for, step by step: its plan (only shown, with --dry-run), its
    phases of runs (none with --report-only), the analysis of what its results source holds, the
    report."""
    plan = make_plan(sweep, request.output, request.extra, request.logging)
    if request.baseline is not None:  # the analysis compares every arm with the plan's first
        plan.arms = [request.baseline, *(arm for arm in plan.arms if arm != request.baseline)]
    if request.dry_run:
        show_plan(plan, log)
        return plan
    source = results_source(plan, request)
    if request.trains:
        run_phases(plan, source, launcher, log)
    # a CSV's sweep is settled as it was recorded: only runs on disk are given a third seed
    third_seeds = request.trains and source.recorded is None
    analysis, points, trained = analyse_sweep(plan, source, third_seeds, launcher, log)
    plan.output.mkdir(parents=True, exist_ok=True)  # a CSV's report may go to a new folder
    # what the runs were given besides the sweep file: part of what the table measured
    given = given_arguments(_unique_runs(points))
    write_design_results(plan, analysis, points, request.title, trained, given).log(log)
    check_finished(points, trained, plan.output)
    return plan


def show_plan(plan: Plan, log) -> None:
    """--dry-run: the first phase's commands, then what the later phases will be, in words."""
    declared = plan.phases()
    first, second, _, _ = plan.all_points(RunResults())
    for run in _unique_runs(first or second):
        log(shlex.join(run.command))
    later = []
    if first:
        later.append("runs past the sweep's edges where an arm's best is at one")
        if len(plan.sizes) > 1:
            later.append("the confirmation at the largest size")
        later.append("the ladder at each arm's rates" if plan.ladder is not None else "each arm's seeds")
    if any(index == 2 for index, _ in declared):
        later.append("the branches")
    if plan.holdout is not None:
        number = next(n for n, (index, _) in enumerate(declared, 1) if index == HELD_OUT)
        later.append(
            f"phase {number}, the held-out rung: every arm at {plan.holdout.name} at the rate extrapolated "
            "there, never fitted"
        )
    then = f"then {', then '.join(later)}; " if later else ""
    log(f"# {then}{plan.output / BASE_SNAPSHOT} is written when the sweep runs")
    log_count(plan, lambda line: log("# " + line))


def results_source(plan: Plan, request: SweepRequest) -> Results:
    """Where the sweep's figures are read from, chosen once: its runs on disk; a results.csv in
    their place (--from-csv with --report-only: none need be on disk); or a recorded sweep's CSV
    and the held-out rung it lacks, trained now (--from-csv alone: ladder.holdout added since)."""
    if request.from_csv is None:
        if request.report_only:
            check_reportable(plan)
        return RunResults()
    return from_csv.read_results(request.from_csv, plan, extend=not request.report_only)


def check_reportable(plan: Plan) -> None:
    """--report-only of the runs on disk: refused in one line where none of them finished, or an
    earlier minitx chose their learning rates (the sweep's run doubled as a ladder point, one seed
    chose), not misread."""
    output = plan.output
    if plan.sweep.design.multipliers:  # without lr_sweep the plan is what it was
        record = read_json(output / PLAN_FILE) or {}
        if record.get("version") != PLAN_VERSION and any((output / "runs").glob("*/summary.json")):
            raise UserError(
                f"--report-only: {str(output)!r} holds runs of an earlier minitx's designed sweep, which chose learning "
                "rates from one run and reused it as a ladder point; rerun the sweep into a new --output"
            )
    first, second, _, _ = plan.all_points(RunResults())
    if not any(is_finished(p.run) for p in first + second):
        raise UserError(
            f"--report-only: {str(plan.output)!r} holds no finished run of this sweep; run it first (without --report-only)"
        )


def run_phases(plan: Plan, source: Results, launcher: Launcher | None, log) -> None:
    """Each declared phase in order, each planned from the runs before it; then the diagnostics
    of every run. A run the source holds (a recorded CSV's) is not trained again."""
    plan.output.mkdir(parents=True, exist_ok=True)
    write_json_atomically(plan.output / PLAN_FILE, {"version": PLAN_VERSION})
    log_count(plan, log)
    declared = plan.phases()
    numbered = list(enumerate(declared, 1))
    if source.recorded is not None:
        # extending a CSV's sweep trains its held-out rung only: the ladder ran at the CSV's rates
        # (a rule changed since would plan other learning-rate runs, which choose nothing here)
        log(
            f"ablate: the runs {source.recorded.path} holds are read from it; the held-out rung it lacks is trained"
        )
        numbered = [(number, phase) for number, phase in numbered if phase[0] >= HELD_OUT]
    tried: set[Path] = set()  # each run once per invocation: a failed run is a row, not retried here
    for number, (phase, name) in numbered:
        while True:  # the learning rates grow run by run: past an edge, then the confirmation
            snapshot = source.now()
            points = [
                p
                for p in _phase(plan, snapshot, phase)
                if p.run.directory not in tried and not source.holds(p)
            ]
            if not points:
                break
            train(plan, points, f"phase {number} of {len(declared)} ({name})", launcher, log)
            tried |= {p.run.directory for p in points}
        if phase == 0:
            check_baseline_rate(plan)
    trusted = sweep_kind_modules(plan.sweep, plan.extra)  # the user's own kinds the configs name
    for point in sum(plan.all_points(source.now()), []):
        if not source.holds(point):
            diagnose_run(point.run, trusted, log)


def train(plan: Plan, points: list[Point], phase: str, launcher: Launcher | None, log) -> None:
    log(f"ablate: {phase}: {describe(points, plan)}")
    run_sweep(_unique_runs(points), plan.sweep, plan.output, launcher, log)


def analyse_sweep(
    plan: Plan, source: Results, third_seeds: bool, launcher: Launcher | None, log
) -> tuple[Analysis, list[Point], RunResults]:
    """The analysis of what the source holds, with the lines it gives rise to: the runs that were
    unstable, the arms refused. With `third_seeds`, a replicate pair far apart is first settled by
    a third seed of that point (the median of three), trained here. Returns the analysis, every
    point it read and what their runs did."""
    trained = source.now()
    phases = plan.all_points(trained)
    source.check(sum(phases, []))
    for p in phases[0] + phases[1]:
        if p.role in ("confirm", "ladder", "seed") and trained(p).trouble:
            log(
                f"ablate: unstable {p.run.directory.name} (x{p.multiplier:g} at {p.size}): {trained(p).trouble}"
            )
    for rate in plan.rates(trained).values():
        if rate.refused:
            log(f"ablate: refused {rate.arm}: {rate.refused}")
    analysis = analyse(plan, phases, trained)
    replicates = replicate_points(plan, analysis)
    todo = [p for p in replicates if not is_finished(p.run)]
    if todo and third_seeds:
        phase = f"phase {len(plan.phases()) + 1} (a third seed where two disagree)"
        train(plan, todo, phase, launcher, log)
        trusted = sweep_kind_modules(plan.sweep, plan.extra)
        for point in todo:
            diagnose_run(point.run, trusted, log)
        trained = source.now()
        phases = plan.all_points(trained)
    if replicates:
        analysis = analyse(plan, phases, trained, replicates)
        phases = (phases[0], phases[1], [*phases[2], *replicates], phases[3])
    points = sum(phases, [])
    analysis.notes.extend(source.notes(plan, points))
    return analysis, points, trained


def check_finished(points: Sequence[Point], trained: RunResults, output: Path) -> None:
    """A sweep none of whose runs finished ends in one line (its report is written first)."""
    if any(trained(p).loss is not None for p in points):
        return
    # a run whose SLURM job was cancelled did not fail: rerunning resumes it from last.ckpt
    cancelled = any(trained(p).record.get("status") == "cancelled" for p in points)
    what = (
        "no run finished (some were cancelled: run the same command again to resume them)"
        if cancelled
        else "every run failed"
    )
    raise UserError(f"{what}; see {output / 'results.md'} and each run's train.log")
