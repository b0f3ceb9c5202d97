"""Running a designed sweep (a budget, an lr_sweep or a ladder: design.py): its three phases in
order (ladder.py), the diagnostics of every finished run, then the analysis and the report.

A rerun skips every finished run (branch decays too), so a stopped sweep resumes; `--report-only`
rebuilds the tables, fits and plots from what is on disk.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from ...errors import UserError
from ...fileio import write_text_atomically
from ..analysis.designed import analyse
from ..plan.ladder import Plan, Point, make_plan
from ..report.designed import DESIGN_PLOTS, write_design_results
from .eval_runs import diagnose_run, read_diagnostics
from .launch import run_sweep
from .runner import BASE_SNAPSHOT, given_arguments, is_finished


def _unique_runs(points: Sequence[Point]) -> list:
    seen: dict = {}
    for p in points:
        seen.setdefault(p.run.directory, p.run)
    return list(seen.values())


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
) -> Plan:
    plan = make_plan(sweep, output, extra, logging)
    if dry_run:
        first, second, third = plan.all_points()
        shown = first or second
        for run in _unique_runs(shown):
            log(" ".join(shlex.quote(part) for part in run.command))
        later = (
            "the ladder at each arm's chosen learning rate, then the branches" if first else "the branches"
        )
        log(f"# then {later}; {output / BASE_SNAPSHOT} is written when the sweep runs")
        return plan
    if report_only:
        if not any(is_finished(p.run) for p in plan.all_points()[0] + plan.all_points()[1]):
            raise UserError(
                f"--report-only: {str(output)!r} holds no finished run of this sweep; run it first (without --report-only)"
            )
    else:
        output.mkdir(parents=True, exist_ok=True)
        for phase in range(3):  # each phase is planned from the finished runs of the one before
            points = plan.all_points()[phase]
            if points:
                log(f"ablate: phase {phase + 1} of 3 ({('learning-rate sweep', 'ladder', 'branches')[phase]}): "
                    f"{len(_unique_runs(points))} runs")  # fmt: skip
                run_sweep(_unique_runs(points), sweep, output, launcher, log)
        for point in sum(plan.all_points(), []):
            diagnose_run(point.run, trust_kind_modules, log)
    phases = plan.all_points()
    analysis = analyse(plan, phases, diagnostics=lambda p: read_diagnostics(p.run))
    write_design_results(plan, analysis, sum(phases, []), title, lambda p: read_diagnostics(p.run))
    given = given_arguments(_unique_runs(sum(phases, [])))
    if given:  # what the runs were given besides the sweep file: part of what the table measured
        text = (output / "results.md").read_text(encoding="utf-8").rstrip("\n")
        write_text_atomically(output / "results.md", text + "\n" + "".join(f"- {n}\n" for n in given))
    log((output / "results.md").read_text(encoding="utf-8"))
    log(f"ablate: wrote {output / 'results.md'}, results.csv, {', '.join(DESIGN_PLOTS)}")
    if not any(p.loss is not None for p in sum(phases, [])):
        raise UserError(f"every run failed; see {output / 'results.md'} and each run's train.log")
    return plan
