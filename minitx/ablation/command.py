"""The ablate command: parse the command line, check the sweep, then hand it to its orchestrator:
plain_sweep.py, or designed_sweep.py for a sweep with a budget, an lr_sweep or a ladder."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

from ..arguments import ArgumentParser, missing_file_advice
from ..errors import UserError
from ..kinds import import_kind_modules
from .designed_sweep import run_designed
from .output import SweepIdentity, check_output, recorded, sweep_identity
from .plain_sweep import run_plain
from .plan.budget import match_budgets
from .plan.ladder import check_design_keys
from .plan.sweep import Sweep, load_sweep
from .request import SweepRequest, make_request
from .runs import from_csv
from .runs.eval_runs import sweep_kind_modules
from .runs.launch import local_launcher
from .runs.runner import check_variants
from .runs.slurm import SLURM_TIME, SweepSubmitted


class AblateParser(ArgumentParser):
    def advice(self, given: Sequence[str], declared: Sequence[str]) -> str:
        """A training key among ablate's flags (`--trainer.max_steps 50`): its place is after `--`."""
        if "." in given[0].partition("=")[0]:
            return f"; training settings go after `--`: python ablate.py --config FILE -- {' '.join(given)}"
        return super().advice(given, declared)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = AblateParser(
        prog="ablate.py",
        description="Train each attention variant of a sweep file on the same data and budget; write a table and plots.",
    )
    parser.add_argument("--config", required=True, help="sweep YAML: base training config + variants")
    parser.add_argument("--output", help="output directory (default runs/ablation/<config name>)")
    parser.add_argument("--seeds", type=int, help="seeds per variant (default: the file's 'seeds')")
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="training processes at once (default 1); with GPUs, at most one run per --devices-per-run GPUs",
    )
    parser.add_argument(
        "--devices-per-run",
        type=int,
        metavar="K",
        help="GPUs each run is given (default 1 where there are GPUs; with --launcher slurm, "
        "the GPUs each job asks for, default none); K > 1 also sets --trainer.devices K",
    )
    parser.add_argument(
        "--launcher",
        choices=("local", "slurm"),
        default="local",
        help="where the runs go: this machine (default) or a SLURM cluster, one job of an array per run",
    )
    slurm = parser.add_argument_group("SLURM (with --launcher slurm; docs/scale.md)")
    slurm.add_argument("--slurm-partition", help="partition of every job (default the cluster's)")
    slurm.add_argument(
        "--slurm-time",
        type=int,
        default=SLURM_TIME,
        metavar="MINUTES",
        help=f"time limit of each job (default {SLURM_TIME})",
    )
    slurm.add_argument("--slurm-cpus-per-run", type=int, metavar="N", help="CPUs of each job")
    slurm.add_argument(
        "--slurm-array-parallelism",
        type=int,
        metavar="N",
        help="jobs of the array running at once",
    )
    slurm.add_argument(
        "--slurm-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a further sbatch option for every job, e.g. account=myproject (repeatable)",
    )
    slurm.add_argument(
        "--no-wait",
        action="store_true",
        help="submit and return; run the same command again for the next phase, or with --report-only at the end",
    )
    parser.add_argument("--only", help="comma-separated variant names to run (default all)")
    parser.add_argument(
        "--wandb", action="store_true", help="log every run to Weights & Biases, one group per sweep"
    )
    parser.add_argument("--wandb-project", default="minitx-ablation", help="W&B project (with --wandb)")
    parser.add_argument("--dry-run", action="store_true", help="print the training commands and stop")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild the table and plots from finished runs (no training, no new evaluations)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace the sweep --output holds: remove its results, plots, plan and runs first "
        "(without it, another sweep there is refused and the same sweep resumes)",
    )
    parser.add_argument(
        "--from-csv",
        metavar="FILE",
        help="with --report-only: rebuild a sweep's report into --output from its results.csv, no runs needed",
    )
    parser.add_argument(
        "--baseline",
        metavar="NAME",
        help="with --report-only: the variant (arm) the report compares the others with (default the first)",
    )
    parser.add_argument("train_args", nargs="*", help="extra training arguments for every run, after --")
    return parser.parse_args(argv)


def select(sweep: Sweep, only: str | None) -> None:
    """Keep the variants --only names (the reference stays the file's first variant)."""
    if not only:
        return
    wanted = [name.strip() for name in only.split(",") if name.strip()]
    if not wanted:
        raise UserError(
            f"--only: {only!r} names no variant; give names such as {', '.join(v.name for v in sweep.variants[:2])}"
        )
    missing = sorted(set(wanted) - {v.name for v in sweep.variants})
    if missing:
        raise UserError(
            f"--only: unknown variant(s) {', '.join(missing)}; the file has {', '.join(v.name for v in sweep.variants)}"
        )
    sweep.variants = [v for v in sweep.variants if v.name in wanted]


def check_readable(config_path: Path) -> None:
    if config_path.is_dir():
        raise UserError(
            f"--config: {str(config_path)!r} is a directory; give a sweep YAML file such as configs/ablation.yaml"
        )
    try:
        config_path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"--config: {str(config_path)!r} is not UTF-8 text; give a sweep YAML file") from None
    except FileNotFoundError:
        advice = missing_file_advice(config_path)
        if advice:  # `configs/ablation` for configs/ablation.yaml; load_sweep says the rest
            raise UserError(f"--config: file {config_path} not found{advice}") from None


def prepare(request: SweepRequest) -> tuple[Sweep, SweepIdentity]:
    """The sweep as it will run: read, filtered, resized (`match`), and checked unless only
    reporting; and whose it is (output.py)."""
    check_readable(request.config)
    sweep = load_sweep(request.config)
    # Whose the output is: the file's every variant, before --only picks some (output.py).
    identity = sweep_identity(sweep, request.config, request.extra)
    select(sweep, request.only)
    # Kinds of the user's own that the sweep's configs name: writing them there is consent to
    # their code, here (budgets, checks) and in the evaluation of the runs (eval_runs.py).
    try:
        import_kind_modules(sweep_kind_modules(sweep, request.extra))
    except UserError as error:
        raise UserError(f"{request.config}: model.{error}") from None
    if sweep.match and not sweep.design.ladder:  # a ladder matches each size (ladder.make_plan)
        try:
            match_budgets(sweep, sweep.match, request.extra, log=print)
        except UserError as error:
            raise UserError(f"{request.config}: {error}") from None
    if sweep.design.active:  # what the design sets, refused before the slower checks of every variant
        check_design_keys(sweep, request.extra)
    if not request.report_only:
        check_variants(sweep, request.config, request.extra)
    return sweep, identity


def main(argv: Sequence[str] | None = None) -> None:
    request = make_request(parse_args(argv))
    sweep, identity = prepare(request)
    from_csv.check_against_sweep(
        request.from_csv, request.baseline, sweep, request.config, request.report_only
    )
    try:
        run_and_report(request, sweep, identity)
    except SweepSubmitted as submitted:
        print(
            f"ablate: {submitted}; run the same command again once they end (it waits for them, then goes on "
            "to the next phase), or add --report-only for the table of what has finished"
        )


def run_and_report(request: SweepRequest, sweep: Sweep, identity: SweepIdentity) -> None:
    output = request.output
    if output.exists() and not output.is_dir():
        raise UserError(f"--output: {str(output)!r} is a file; give a directory (new or of this sweep)")
    launcher = None
    if request.trains:  # SLURM's, or this machine (each run on its own GPUs where there are some)
        launcher = request.slurm_launcher or local_launcher(request.parallel, request.devices_per_run)
    # After every refusal of the command line: --force removes the sweep there only when this one runs.
    check_output(output, identity, sweep, request.extra, force=request.force, dry_run=request.dry_run)
    # The output's sweep.json says whose it is from the moment this sweep runs there (output.py).
    with recorded(output, identity) if request.trains else nullcontext():
        if sweep.design.active:  # a budget, a learning-rate sweep or a ladder
            run_designed(sweep, request, launcher)
        else:
            run_plain(sweep, request, launcher)
