"""A plain sweep (variants and seeds, no design) from end to end: its runs (plan/commands.py),
trained (runs/launch.py), evaluated and diagnosed (runs/eval_runs.py), then its table
(analysis/table.py) and report (report/plain.py), or that report from a results.csv alone
(runs/plain_csv.py: --report-only --from-csv). It sits above the stages it drives;
designed_sweep.py does the same for a sweep with a budget, an lr_sweep or a ladder.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from ..errors import UserError
from .analysis.table import collect
from .plan.commands import BASE_SNAPSHOT, plan_runs
from .plan.sweep import Sweep
from .report.plain import write_report
from .request import SweepRequest
from .runs import plain_csv
from .runs.eval_runs import diagnose_runs, evaluate_runs, sweep_kind_modules
from .runs.launch import Launcher, run_sweep
from .runs.runner import LOG_FILE, Run, given_arguments, is_finished


def run_plain(sweep: Sweep, request: SweepRequest, launcher: Launcher | None = None, log=print) -> None:
    """The sweep the request asks for: its runs (only shown, with --dry-run), trained and
    evaluated unless only reporting, then its report from their rows, or from a results.csv's
    (--from-csv, with --report-only: the rows the runs would give, runs/plain_csv.py)."""
    if request.from_csv is not None:
        rows, left_out = plain_csv.read_rows(request.from_csv, sweep)
        notes, curves = [plain_csv.note(request.from_csv, rows, left_out)], False  # a CSV holds no curve
    else:
        runs = plan_runs(sweep, request.output, request.seeds or sweep.seeds, request.extra, request.logging)
        if request.dry_run:  # writes nothing
            for run in runs:
                log(shlex.join(run.command))
            log(
                f"# {request.output / BASE_SNAPSHOT} is written when the sweep runs: the base config as it is then"
            )
            return
        if request.report_only and not any(is_finished(run) for run in runs):
            raise UserError(
                f"--report-only: {str(request.output)!r} holds no finished run of this sweep; run it first "
                "(without --report-only)"
            )
        if request.trains:
            train(runs, sweep, request, launcher, log)
        rows, notes, curves = collect(runs, sweep.evaluation), given_arguments(runs), True
    request.output.mkdir(parents=True, exist_ok=True)  # only once what the report reads is known to be sound
    report = write_report(rows, request.output, notes, request.title, sweep, request.baseline, curves)
    report.log(log)
    check_finished(report.table, request.output)


def train(runs: list[Run], sweep: Sweep, request: SweepRequest, launcher: Launcher | None, log) -> None:
    """Every run trained (a finished one skipped), evaluated and diagnosed."""
    request.output.mkdir(parents=True, exist_ok=True)
    run_sweep(runs, sweep, request.output, launcher, log)
    trusted = sweep_kind_modules(sweep, request.extra)
    evaluate_runs(runs, sweep.evaluation, log, trusted)
    diagnose_runs(runs, sweep, request.extra, trusted, log)


def check_finished(table: list[dict], output: Path) -> None:
    """A sweep none of whose runs finished ends in one line (its table is written first)."""
    if all(entry["ok"] == 0 for entry in table):
        failed = next((entry for entry in table if entry["status"] != "ok"), None)
        first = f" ({failed['variant']}: {failed['status']})" if failed else ""
        # A run whose SLURM job was cancelled did not fail: rerunning resumes it.
        cancelled = any(" cancelled: " in entry["status"] for entry in table)
        raise UserError(
            f"{'no run finished' if cancelled else 'every run failed'}{first}; see the status column in "
            f"{output / 'results.md'} and each run's {LOG_FILE}"
        )
