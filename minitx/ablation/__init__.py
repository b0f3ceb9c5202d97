"""Ablation sweeps: which attention, at what cost?

    python ablate.py --config configs/ablation.yaml --output runs/ablation [--seeds 3] [--parallel 2]

A sweep is one training config (the base) plus named variants, each a few dotted overrides of it.
Every (variant, seed) pair is one run of the ordinary training command, in a subprocess with its
own directory. The runs share data, tokenizer, seeds and token budget: a variant may not override
those unless it says `allow_budget_change: true`, and the table then says what it changed. Before
any run starts, every variant's config is checked as the training command will check it.

A plain sweep is its variants and seeds; a designed one adds a budget, an lr_sweep or a ladder
(each arm at its own learning rate, scaling fits). Both go through four stages, a folder each,
in order: plan -> runs -> analysis -> report. A stage imports only the stages before it; the
modules at the top drive them, and where the two kinds of sweep differ a stage has a module each.

    command.py          the ablate command line: checks the sweep, hands it to its orchestrator
    request.py          what the command line asks (SweepRequest), its flags checked against
                        one another; both kinds of sweep read it
    plain_sweep.py      a plain sweep from end to end: runs, evaluations, the table, the report
    designed_sweep.py   a designed sweep from end to end: its plan, its phases of runs (a fourth,
                        a third seed where two disagree) read from its results source (the runs,
                        a results.csv, or both), diagnostics, the analysis, the report
    output.py           whose an --output is (its sweep.json): another sweep refused, --force
    summary.py          RunSummary, the callback that writes each run's summary.json
    plan/               what to run, from the sweep file; reads no run
      sweep.py          the sweep file: parsing and checks
      design.py         its design keys: budget, lr_sweep, ladder, seeds_at
      commands.py       each run's training command, directory and fingerprint (Run); the data
                        it trains on
      budget.py         parameters and FLOPs per token at the vocabulary the runs train with;
                        `match: params|flops` resizes the MLP to equal budgets
      ladder.py         a designed sweep's plan (Point, Plan): learning-rate sweep, ladder,
                        branched decays, seeds
      rates.py          each arm's learning rate: past the sweep's edges, a fit in log lr,
                        confirmed at the largest size; diverged and spiked runs
    runs/               running the plan, and reading back what the runs left
      runner.py         the training subprocesses, skipping finished runs
      launch.py         where runs go: this machine, N at a time, each on GPUs of its own where
                        there are GPUs
      slurm.py          a SLURM cluster through submitit: one job of an array per run, requeued
                        from last.ckpt
      eval_runs.py      evaluating each finished run's best checkpoint, diagnostics of its last
                        (cached per run)
      results.py        what each point of a designed sweep's plan trained (PointResult), read once
      from_csv.py       the same read from a results.csv alone (--report-only --from-csv), or
                        with the plan's other runs trained (--from-csv: a held-out rung added)
      plain_csv.py      a plain sweep's rows read from its results.csv (--report-only --from-csv)
      csv_file.py       a results.csv as text rows, for either reader
    analysis/           the numbers, from what the runs left; starts nothing
      table.py          a plain sweep's rows per run, mean and spread per variant
      designed.py       a designed sweep's chosen rates, fits, multipliers, tests, diagnostics
      fit.py            the fits under one name: solver.py (many small Huber fits at once),
                        curves.py (L(C) and the joint model with a compute multiplier per arm),
                        uncertainty.py (seed noise per size, the bootstrap, intervals),
                        robust.py (noise raised to each arm's lack of fit, each size left out,
                        a held-out rung), chinchilla.py (L(N, D))
      verdicts.py       one verdict per arm: the ladder's, the seeds test's, why they differ
      decisions.py      decision accuracy: does the small scale's order hold at a held-out size?
      simulation.py     ladders whose truth is known, off the method's assumptions: its calibration;
                        a whole sweep's runs drawn from a known truth (simulated_runs)
      significance.py   Welch's t-test against the baseline, Holm's correction
      equal_arms.py     arms equal to 4 decimals on every shared run: is the kind really used?
      wall_time.py      what a sweep cost in time, from its runs' records
    report/             what a sweep writes
      plain.py          a plain sweep's results.csv and results.md (Welch tests against the
                        reference, diagnostics); plain_plots.py its plots
      designed.py       a designed sweep's results.csv and results.md; ladder.py its ladder's
                        sections (verdicts, each size left out, the held-out rung, noise by size),
                        cells.py how numbers are written; designed_plots.py its plots
                        (why a diagnostic is "–": minitx/evaluation/missing.py)
      written.py        a report as written (its text, its plots): what the command logs of it

Output, under --output: a directory per run (runs/<variant>-seed<k>, with the run's own logs and
checkpoints, run.json, summary.json, evaluation.json, diagnostics.json, train.log), results.csv,
results.md, the plots and sweep.json (whose the directory is: output.py).
"""

from .analysis.table import COLUMNS, aggregate, collect, mean_curve, mean_std
from .command import main, parse_args
from .plan.budget import match_budgets, model_budget
from .plan.commands import BASE_SNAPSHOT, Run, format_value, plan_runs
from .plan.sweep import EvalSettings, Sweep, Variant, load_sweep
from .report.designed import DESIGN_PLOTS
from .report.plain import CSV_FIELDS, PLOTS, format_cell, markdown_table, write_csv, write_results
from .runs.launch import run_sweep
from .runs.runner import LOG_FILE, RUN_FILE, SUMMARY_FILE, check_variants, execute

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
