"""What `ablate` was asked to do: every choice of its command line in one object (SweepRequest),
which command.py makes once and either kind of sweep reads. make_request checks the choices
against one another before the sweep file is read, and refuses a contradictory pair in one line.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from .runs import slurm
from .runs.csv_file import read_table

# the choices a SweepRequest holds as the command line parsed them
AS_PARSED = "only seeds parallel devices_per_run dry_run report_only force baseline".split()


@dataclass(frozen=True)
class SweepRequest:
    """The sweep to run and how: the command line's choices, checked (make_request)."""

    config: Path  # the sweep file
    output: Path  # its runs and report (default runs/ablation/<config name>)
    extra: tuple[str, ...] = ()  # training arguments after `--`, with --devices-per-run's devices
    only: str | None = None  # comma-separated variants to run
    seeds: int | None = None  # a plain sweep's seeds per variant (None: the file's)
    parallel: int = 1  # runs at once on this machine
    devices_per_run: int | None = None
    slurm_launcher: slurm.SlurmLauncher | None = None  # with --launcher slurm, if the runs train
    wandb_project: str | None = None  # None without --wandb
    dry_run: bool = False
    report_only: bool = False
    force: bool = False
    from_csv: Path | None = None  # a results.csv read in place of the runs (runs/from_csv.py)
    baseline: str | None = None  # the arm the report compares the others with (None: the file's first)

    @property
    def title(self) -> str:
        return f"Ablation: {self.config.name}"

    @property
    def trains(self) -> bool:
        """Runs may start (not --dry-run, not --report-only)."""
        return not (self.dry_run or self.report_only)

    @property
    def logging(self) -> list[str]:
        """Every run's W&B arguments: one group per sweep, named after its --output."""
        if self.wandb_project is None:
            return []
        group = self.output.resolve().name
        return ["--run.wandb", "true", "--run.wandb_project", self.wandb_project, "--run.wandb_group", group]


def make_request(args: argparse.Namespace) -> SweepRequest:
    """The parsed command line as a SweepRequest, each flag checked against the others (and,
    with --launcher slurm, submitit and SLURM's commands looked for) before the sweep is read."""
    check_csv_flags(args)
    if args.seeds is not None and args.seeds < 1:
        raise UserError(f"--seeds: must be 1 or more, got {args.seeds}")
    if args.parallel < 1:
        raise UserError(f"--parallel: must be 1 or more, got {args.parallel}")
    on_slurm = args.launcher == "slurm"
    if args.devices_per_run is not None and args.devices_per_run < (0 if on_slurm else 1):
        raise UserError(f"--devices-per-run: must be 1 or more, got {args.devices_per_run}")
    if on_slurm and args.parallel != 1:
        raise UserError(
            "--parallel: runs on this machine at once; with --launcher slurm give --slurm-array-parallelism N"
        )
    for flag, value in (
        ("--slurm-partition", args.slurm_partition),
        ("--slurm-time", args.slurm_time != slurm.SLURM_TIME or None),
        ("--slurm-cpus-per-run", args.slurm_cpus_per_run),
        ("--slurm-array-parallelism", args.slurm_array_parallelism),
        ("--slurm-option", args.slurm_option or None),
        ("--no-wait", args.no_wait or None),
    ):
        if value is not None and not on_slurm:
            raise UserError(f"{flag}: only with --launcher slurm; add --launcher slurm or leave it out")
    if args.force and args.report_only and not args.from_csv:
        raise UserError(
            "--force: replaces the sweep in --output before it runs again; --report-only reads that sweep, leave one out"
        )
    launcher = None
    if on_slurm and not (args.dry_run or args.report_only):
        slurm.import_submitit()  # both before the sweep is read, checked or its data prepared
        slurm.check_slurm_commands()
        options = slurm.SlurmOptions(
            args.slurm_partition, args.slurm_time, args.devices_per_run or 0, args.slurm_cpus_per_run,
            args.slurm_array_parallelism, slurm.parse_sbatch_options(args.slurm_option),
        )  # fmt: skip
        launcher = slurm.SlurmLauncher(options, wait=not args.no_wait)
    extra = tuple(args.train_args)
    if args.devices_per_run and args.devices_per_run > 1:
        if any(a == "--trainer.devices" or a.startswith("--trainer.devices=") for a in extra):
            raise UserError(
                "--devices-per-run: sets --trainer.devices itself; leave --trainer.devices out of the training arguments"
            )
        # Part of what each run computes (K processes, K times the batch): in its fingerprint.
        extra = (*extra, "--trainer.devices", str(args.devices_per_run))
    config = Path(args.config)
    return SweepRequest(
        config,
        Path(args.output) if args.output else Path("runs") / "ablation" / config.stem,
        extra,
        slurm_launcher=launcher,
        wandb_project=args.wandb_project if args.wandb else None,
        from_csv=Path(args.from_csv) if args.from_csv else None,
        **{name: getattr(args, name) for name in AS_PARSED},
    )


def check_csv_flags(args: argparse.Namespace) -> None:
    """--from-csv and --baseline, refused in one line where they cannot be honoured, before the
    sweep is read (the CSV is read once the sweep is known to be designed or plain)."""
    if args.baseline is not None and not args.report_only:
        raise UserError(
            "--baseline: only with --report-only (a sweep trains its baseline first: the file's first variant); "
            "add --report-only to rebuild the report against another arm"
        )
    if args.from_csv is None:
        return
    if args.output is None:
        raise UserError("--from-csv: give --output DIR, the folder the rebuilt report is written to")
    target, source = Path(args.output), Path(args.from_csv)
    if target.exists() and not target.is_dir():
        raise UserError(f"--output: {str(target)!r} is a file; give a directory (new or of this sweep)")
    if (target / "results.csv").exists() and source.exists() and (target / "results.csv").samefile(source):
        raise UserError(
            f"--output: {str(target)!r} holds {source}, the CSV being read, which the report would rewrite; "
            "give another folder"
        )
    if args.report_only and any(target.glob("runs/*/summary.json")):
        raise UserError(
            f"--output: {str(target)!r} holds a sweep's runs, whose report --report-only rebuilds from them; "
            "give another folder for the CSV's report"
        )
    if not source.is_file():
        read_table(source)  # says why: not found, or a directory
