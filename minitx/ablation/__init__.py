"""Ablation sweeps: which attention, at what cost?

    python ablate.py --config configs/ablation.yaml --output runs/ablation [--seeds 3] [--parallel 2]

A sweep is one training config (the base) plus named variants, each a few dotted overrides of it.
Every (variant, seed) pair is one run of the ordinary training command, in a subprocess with its
own directory. The runs share data, tokenizer, seeds and token budget: a variant may not override
those unless it says `allow_budget_change: true`, and the table then says what it changed. Before
any run starts, every variant's config is checked as the training command will check it.

    sweep.py      the sweep file: parsing and checks; design.py its budget, lr_sweep, ladder, seeds_at
    ladder.py     the plan of a designed sweep: learning-rate sweep, ladder, branched decays, seeds
    rates.py      each arm's learning rate: past the sweep's edges, a fit in log lr, confirmed at the
                  largest size; diverged and spiked runs
    designed.py   running a designed sweep's phases, diagnostics, then its analysis and report
    fit.py        one L(C) for all arms with a compute multiplier each, seed-noise bootstrap, L(N, D)
    significance.py  Welch's t-test against the baseline, Holm's correction
    analysis.py   a designed sweep's numbers; design_report.py, design_plots.py its report
    budget.py     parameters and FLOPs per token; `match: params|flops` resizes the MLP to equal budgets
    runner.py     planning the runs, the training subprocesses, skipping finished ones
    launch.py     where runs go: this machine, N at a time, each on GPUs of its own where there are GPUs
    slurm.py      a SLURM cluster through submitit: one job of an array per run, requeued from last.ckpt
    summary.py    RunSummary, the callback that writes each run's summary.json
    eval_runs.py  evaluating each finished run's best checkpoint (cached per run)
    table.py      rows per run, mean and spread per variant, each run's cached diagnostics
    report.py     results.csv, results.md (Welch tests against the reference, diagnostics);
                  plots.py: loss_curves, cost_quality, loss_vs_context, a bar chart per diagnostic
    command.py    the ablate command line

Output: runs/<variant>-seed<k>/ (the run's own logs and checkpoints, run.json, summary.json,
evaluation.json, diagnostics.json, train.log), results.csv, results.md and the plots.
"""

from .analysis.table import COLUMNS, aggregate, collect, mean_curve, mean_std
from .command import main, parse_args
from .plan.budget import match_budgets, model_budget
from .plan.sweep import EvalSettings, Sweep, Variant, load_sweep
from .report.designed import DESIGN_PLOTS
from .report.plain import CSV_FIELDS, PLOTS, format_cell, markdown_table, write_csv, write_results
from .runs.launch import run_sweep
from .runs.runner import (
    BASE_SNAPSHOT,
    LOG_FILE,
    RUN_FILE,
    SUMMARY_FILE,
    Run,
    check_variants,
    execute,
    format_value,
    plan_runs,
)

__all__ = [
    "BASE_SNAPSHOT",
    "COLUMNS",
    "CSV_FIELDS",
    "DESIGN_PLOTS",
    "EvalSettings",
    "LOG_FILE",
    "PLOTS",
    "RUN_FILE",
    "Run",
    "RunSummary",
    "SUMMARY_FILE",
    "Sweep",
    "Variant",
    "aggregate",
    "check_variants",
    "collect",
    "execute",
    "format_cell",
    "format_value",
    "load_sweep",
    "main",
    "markdown_table",
    "match_budgets",
    "mean_curve",
    "mean_std",
    "model_budget",
    "parse_args",
    "plan_runs",
    "run_sweep",
    "write_csv",
    "write_results",
]


def __getattr__(name: str):
    # RunSummary is a Lightning callback: imported when asked for, so that `ablate --help` and a
    # sweep's one-line errors do not import Lightning (seconds at every start).
    if name == "RunSummary":
        from .summary import RunSummary

        return RunSummary
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
