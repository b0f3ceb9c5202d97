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
from .output import check_output, recorded, sweep_identity
from .plain_sweep import run_plain
from .plan.budget import match_budgets
from .plan.ladder import check_design_keys
from .plan.sweep import Sweep, load_sweep
from .runs import from_csv
from .runs.eval_runs import sweep_kind_modules
from .runs.launch import Launcher, local_launcher
from .runs.runner import check_variants
from .runs.slurm import (
    SlurmLauncher,
    SlurmOptions,
    SweepSubmitted,
    check_slurm_commands,
    import_submitit,
    parse_sbatch_options,
)


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
    parser.add_argument(
        "--output", default=None, help="output directory (default runs/ablation/<config name>)"
    )
    parser.add_argument(
        "--seeds", type=int, default=None, help="seeds per variant (default: the file's 'seeds')"
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="training processes at once (default 1); with GPUs, at most one run per --devices-per-run GPUs",
    )
    parser.add_argument(
        "--devices-per-run",
        type=int,
        default=None,
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
    slurm.add_argument(
        "--slurm-partition", default=None, help="partition of every job (default the cluster's)"
    )
    slurm.add_argument(
        "--slurm-time", type=int, default=60, metavar="MINUTES", help="time limit of each job (default 60)"
    )
    slurm.add_argument("--slurm-cpus-per-run", type=int, default=None, metavar="N", help="CPUs of each job")
    slurm.add_argument(
        "--slurm-array-parallelism",
        type=int,
        default=None,
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
    parser.add_argument("--only", default=None, help="comma-separated variant names to run (default all)")
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
        default=None,
        metavar="FILE",
        help="with --report-only: rebuild a sweep's report into --output from its results.csv, no runs needed",
    )
    parser.add_argument(
        "--baseline",
        default=None,
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


def prepare(args: argparse.Namespace) -> tuple[Sweep, Path]:
    """The sweep as it will run: read, filtered, resized (`match`), and checked unless only reporting."""
    if args.seeds is not None and args.seeds < 1:
        raise UserError(f"--seeds: must be 1 or more, got {args.seeds}")
    if args.parallel < 1:
        raise UserError(f"--parallel: must be 1 or more, got {args.parallel}")
    if args.devices_per_run is not None and args.devices_per_run < (0 if args.launcher == "slurm" else 1):
        raise UserError(f"--devices-per-run: must be 1 or more, got {args.devices_per_run}")
    if args.launcher == "slurm" and args.parallel != 1:
        raise UserError(
            "--parallel: runs on this machine at once; with --launcher slurm give --slurm-array-parallelism N"
        )
    if args.launcher != "slurm":
        given = [
            flag
            for flag, value in (
                ("--slurm-partition", args.slurm_partition),
                ("--slurm-time", args.slurm_time != 60 or None),
                ("--slurm-cpus-per-run", args.slurm_cpus_per_run),
                ("--slurm-array-parallelism", args.slurm_array_parallelism),
                ("--slurm-option", args.slurm_option or None),
                ("--no-wait", args.no_wait or None),
            )
            if value is not None
        ]
        if given:
            raise UserError(f"{given[0]}: only with --launcher slurm; add --launcher slurm or leave it out")
    if args.force and args.report_only and not args.from_csv:
        raise UserError(
            "--force: replaces the sweep in --output before it runs again; --report-only reads that sweep, leave one out"
        )
    if args.launcher == "slurm" and not (args.dry_run or args.report_only):
        import_submitit()  # both before the sweep is read, checked or its data prepared
        check_slurm_commands()
    if args.devices_per_run and args.devices_per_run > 1:
        given = [a for a in args.train_args if a == "--trainer.devices" or a.startswith("--trainer.devices=")]
        if given:
            raise UserError(
                "--devices-per-run: sets --trainer.devices itself; leave --trainer.devices out of the training arguments"
            )
        # Part of what each run computes (K processes, K times the batch): in its fingerprint.
        args.train_args = [*args.train_args, "--trainer.devices", str(args.devices_per_run)]
    config_path = Path(args.config)
    check_readable(config_path)
    sweep = load_sweep(config_path)
    # Whose the output is: the file's every variant, before --only picks some (output.py).
    args.identity = sweep_identity(sweep, config_path, args.train_args)
    select(sweep, args.only)
    # Kinds of the user's own that the sweep's configs name: writing them there is consent to
    # their code, here (budgets, checks) and in the evaluation of the runs (eval_runs.py).
    try:
        import_kind_modules(sweep_kind_modules(sweep, args.train_args))
    except UserError as error:
        raise UserError(f"{config_path}: model.{error}") from None
    if sweep.match and not sweep.design.ladder:  # a ladder matches each size (ladder.make_plan)
        try:
            match_budgets(sweep, sweep.match, args.train_args, log=print)
        except UserError as error:
            raise UserError(f"{config_path}: {error}") from None
    if sweep.design.active:  # what the design sets, refused before the slower checks of every variant
        check_design_keys(sweep, args.train_args)
    if not args.report_only:
        check_variants(sweep, config_path, args.train_args)
    return sweep, config_path


def make_launcher(args: argparse.Namespace, log=print) -> Launcher:
    """Where the runs go: this machine (each run on its own GPUs where there are some) or SLURM."""
    if args.launcher == "slurm":
        options = SlurmOptions(
            partition=args.slurm_partition,
            time_min=args.slurm_time,
            gpus_per_run=args.devices_per_run or 0,
            cpus_per_run=args.slurm_cpus_per_run,
            array_parallelism=args.slurm_array_parallelism,
            sbatch=parse_sbatch_options(args.slurm_option),
        )
        return SlurmLauncher(options, wait=not args.no_wait)
    return local_launcher(args.parallel, args.devices_per_run, log=log)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    from_csv.check_flags(args.from_csv, args.baseline, args.report_only, args.output)
    sweep, config_path = prepare(args)
    from_csv.check_against_sweep(
        args.from_csv, args.baseline, args.output, sweep, config_path, args.report_only
    )
    try:
        run_and_report(args, sweep, config_path)
    except SweepSubmitted as submitted:
        print(
            f"ablate: {submitted}; run the same command again once they end (it waits for them, then goes on "
            "to the next phase), or add --report-only for the table of what has finished"
        )


def run_and_report(args: argparse.Namespace, sweep: Sweep, config_path: Path) -> None:
    output = Path(args.output) if args.output else Path("runs") / "ablation" / config_path.stem
    if output.exists() and not output.is_dir():
        raise UserError(f"--output: {str(output)!r} is a file; give a directory (new or of this sweep)")
    logging = wandb_arguments(args.wandb_project, group=output.resolve().name) if args.wandb else []
    launcher = None if args.report_only or args.dry_run else make_launcher(args)
    # After every refusal of the command line: --force removes the sweep there only when this one runs.
    check_output(output, args.identity, sweep, args.train_args, force=args.force, dry_run=args.dry_run)
    title = f"Ablation: {config_path.name}"
    given = dict(  # what the command line gives either kind of sweep
        extra=args.train_args,
        logging=logging,
        report_only=args.report_only,
        dry_run=args.dry_run,
        trust_kind_modules=sweep_kind_modules(sweep, args.train_args),
    )
    # The output's sweep.json says whose it is from the moment this sweep runs there (output.py).
    with nullcontext() if args.report_only or args.dry_run else recorded(output, args.identity):
        if sweep.design.active:  # a budget, a learning-rate sweep or a ladder
            csv_path = Path(args.from_csv) if args.from_csv else None
            run_designed(
                sweep, output, title, launcher, **given, results_csv=csv_path, baseline=args.baseline
            )
        else:
            csv_path = Path(args.from_csv) if args.from_csv else None
            seeds = args.seeds or sweep.seeds
            run_plain(
                sweep,
                output,
                title,
                launcher,
                seeds=seeds,
                **given,
                results_csv=csv_path,
                baseline=args.baseline,
            )


def wandb_arguments(project: str, group: str) -> list[str]:
    return ["--run.wandb", "true", "--run.wandb_project", project, "--run.wandb_group", group]
