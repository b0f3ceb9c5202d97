"""The runs a sweep plans: one training command per (variant, seed), with its directory and the
fingerprint of its settings (Run): a command line, the training command's contract. Nothing here
starts a run: runs/runner.py does.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...data.config import TASKS
from .budget import config_section
from .sweep import Sweep, Variant

# How a run is launched: the training command's contract (minitx/training). A command string,
# so the sweep depends on the command line, not on the command's module.
TRAIN_COMMAND = [
    sys.executable,
    "-c",
    "import sys; from minitx.cli import train_main; sys.exit(train_main())",
]
SEED_KEYS = ("seed_everything", "data.seed")  # weights and dropout; the order of training batches
SUMMARY_CALLBACK = "minitx.ablation.summary.RunSummary"
# Quiet, quick defaults for runs nobody watches; the sweep file's overrides come after and win.
RUN_DEFAULTS = {"trainer.enable_progress_bar": False, "run.sample_tokens": 0}

# Every run reads this copy of the base config, written once per sweep: an edit of the original
# file while the sweep runs cannot give later runs a different base.
BASE_SNAPSHOT = "base_config.yaml"


def format_value(value: Any) -> str:
    """A command-line value the training CLI parses back to the same thing (JSON is YAML)."""
    return value if isinstance(value, str) else json.dumps(value)


@dataclass
class Run:
    variant: Variant
    seed: int
    directory: Path  # the training run's own directory: <output>/runs/<variant>-seed<seed>
    command: list[str]
    fingerprint: str  # base config + overrides + seed: detects a changed sweep in an old output dir

    @property
    def label(self) -> str:
        plain = self.directory.name == f"{self.variant.name}-seed{self.seed}"  # a plain sweep's run
        return f"{self.variant.name} seed {self.seed}" if plain else self.directory.name


def plan_runs(
    sweep: Sweep, output: Path, seeds: int, extra: Sequence[str] = (), logging: Sequence[str] = ()
) -> list[Run]:
    """One run per (variant, seed). `extra`: training arguments for every run (part of the
    settings a finished run is checked against); `logging`: arguments that change where runs
    report (W&B), not what they compute."""
    return [
        make_run(sweep, variant, seed, output, extra, logging)
        for variant in sweep.variants
        for seed in range(sweep.seed, sweep.seed + seeds)
    ]


def make_run(
    sweep: Sweep,
    variant: Variant,
    seed: int,
    output: Path,
    extra: Sequence[str] = (),
    logging: Sequence[str] = (),
    budget: dict[str, Any] | None = None,
    name: str | None = None,
) -> Run:
    """The run of one variant and seed in <output>/runs/<name>. `budget`: overrides the sweep sets
    for this run alone (its steps under equal compute, the checkpoint a branch starts from), which
    a variant may not set itself."""
    root, name = output / "runs", name or f"{variant.name}-seed{seed}"
    overrides = {**run_overrides(sweep, variant.overrides, seed), **(budget or {})}
    command = [
        *TRAIN_COMMAND,
        *train_arguments(output / BASE_SNAPSHOT, root, name, overrides, [*extra, *logging]),
    ]
    settings = json.dumps(
        [sweep.base_text, sorted((k, format_value(v)) for k, v in overrides.items()), list(extra)]
    )
    return Run(variant, seed, root / name, command, hashlib.sha256(settings.encode()).hexdigest()[:16])


def run_overrides(sweep: Sweep, variant_overrides: dict[str, Any], seed: int) -> dict[str, Any]:
    """The dotted overrides of one run: quiet defaults, the shared ones, the variant's, the seed."""
    return {**RUN_DEFAULTS, **sweep.overrides, **variant_overrides, **{key: seed for key in SEED_KEYS}}


def train_arguments(
    base_config: Path, root: Path, name: str, overrides: dict[str, Any], extra: Sequence[str]
) -> list[str]:
    """The training command's arguments for one run (everything after TRAIN_COMMAND)."""
    arguments = ["--config", str(base_config), "--run.root", str(root), "--run.name", name]
    for key, value in overrides.items():
        arguments += [f"--{key}", format_value(value)]
    return [*arguments, "--trainer.callbacks+=" + SUMMARY_CALLBACK, *extra]


def is_synthetic(sweep: Sweep, variant: Variant, extra: Sequence[str] = ()) -> bool:
    """A synthetic task (toy, mqar, needle): no held-out text for the diagnostics to read."""
    source = config_section("data", sweep, variant, extra).get("source")
    return source is not None and str(source) in TASKS
