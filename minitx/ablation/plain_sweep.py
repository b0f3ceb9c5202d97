"""A plain sweep (variants and seeds, no design) from end to end: its runs (plan/commands.py),
trained (runs/launch.py), evaluated and diagnosed (runs/eval_runs.py), then its table
(analysis/table.py) and report (report/plain.py), or that report from a results.csv alone
(runs/plain_csv.py: --report-only --from-csv). It sits above the stages it drives;
designed_sweep.py does the same for a sweep with a budget, an lr_sweep or a ladder.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from ..errors import UserError
from .plan.commands import BASE_SNAPSHOT, plan_runs
from .plan.sweep import Sweep
from .report.plain import plot_names, write_report, write_results
from .runs import plain_csv
from .runs.eval_runs import diagnose_runs, evaluate_runs
from .runs.launch import run_sweep
from .runs.runner import LOG_FILE, given_arguments, is_finished


def run_plain(
    sweep: Sweep,
    output: Path,
    title: str,
    launcher=1,
    seeds: int = 1,
    extra: Sequence[str] = (),
    logging: Sequence[str] = (),
    report_only: bool = False,
    dry_run: bool = False,
    trust_kind_modules: Sequence[str] = (),
    log=print,
    results_csv: Path | None = None,
    baseline: str | None = None,
) -> None:
    """`results_csv`: a results.csv read in place of the runs (runs/plain_csv.py), with
    report_only; `baseline`: the variant the report compares the others with (default the file's
    first)."""
    if results_csv is not None:
        report_from_csv(sweep, output, title, results_csv, baseline, log)
        return
    runs = plan_runs(sweep, output, seeds, extra, logging)
    if dry_run:  # writes nothing
        for run in runs:
            log(" ".join(shlex.quote(part) for part in run.command))
        log(f"# {output / BASE_SNAPSHOT} is written when the sweep runs: the base config as it is then")
        return
    if report_only and not any(is_finished(run) for run in runs):
        raise UserError(
            f"--report-only: {str(output)!r} holds no finished run of this sweep; run it first (without --report-only)"
        )
    output.mkdir(parents=True, exist_ok=True)  # only once the sweep is known to be sound
    if not report_only:
        run_sweep(runs, sweep, output, launcher, log)
        evaluate_runs(runs, sweep.evaluation, log, trust_kind_modules=trust_kind_modules)
        diagnose_runs(runs, sweep, extra, trust_kind_modules, log)
    table = write_results(
        runs, output, notes=given_arguments(runs), title=title, sweep=sweep, reference=baseline
    )
    log((output / "results.md").read_text(encoding="utf-8"))
    log(f"ablate: wrote {output / 'results.md'}, results.csv, {', '.join(plot_names(sweep))}")
    check_finished(table, output)


def report_from_csv(
    sweep: Sweep, output: Path, title: str, path: Path, baseline: str | None, log=print
) -> None:
    """The report rebuilt from a results.csv alone (`--report-only --from-csv`), no run needed:
    the CSV's rows are the rows the runs would give (runs/plain_csv.py)."""
    rows, left_out = plain_csv.read_rows(path, sweep)
    output.mkdir(parents=True, exist_ok=True)  # only once the CSV is known to fit
    note = plain_csv.note(path, rows, left_out)
    table = write_report(
        rows, output, notes=[note], title=title, sweep=sweep, reference=baseline, curves=False
    )
    log((output / "results.md").read_text(encoding="utf-8"))
    log(f"ablate: wrote {output / 'results.md'}, results.csv, {', '.join(plot_names(sweep, curves=False))}")
    check_finished(table, output)


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
