"""Where a sweep's runs go: a launcher takes the runs that are not finished and runs each one.

    LocalLauncher   this machine, N training processes at a time; on a machine with GPUs each run
                    is given its own K of them (CUDA_VISIBLE_DEVICES), never two runs the same GPU
    SlurmLauncher   a SLURM cluster through submitit, one job of an array per run (slurm.py)

run_sweep (below) skips finished runs and prepares the data, then hands the rest to its
launcher; a designed sweep's phases (designed_sweep.py) each call run_sweep, so every launcher
serves every phase.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from ...errors import UserError
from ...files.atomic import write_text_atomically
from ...wording import counted
from ..plan.sweep import Sweep
from .runner import BASE_SNAPSHOT, Run, check_same_settings, execute, is_finished, prepare_data, whole_lines


class Launcher(Protocol):
    def launch(self, runs: list[Run], output: Path, log: Any) -> None:
        """Run each of `runs` (none finished) to its end, or submit it; every run's outcome is its
        run.json, which the table reads."""


def visible_gpus() -> list[str]:
    """The GPUs this process may hand out, as CUDA_VISIBLE_DEVICES names them (indices or UUIDs;
    a run given a subset sees it renumbered from cuda:0); none on a machine without CUDA."""
    if not torch.cuda.is_available():
        return []
    count = torch.cuda.device_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(index) for index in range(count)]
    return [name.strip() for name in listed.split(",") if name.strip()][:count]


def device_groups(gpus: Sequence[str], per_run: int) -> list[list[str]]:
    """The GPUs cut into runs' shares of `per_run` each, in order; a remainder goes unused."""
    return [list(gpus[i : i + per_run]) for i in range(0, len(gpus) - per_run + 1, per_run)]


@dataclass
class LocalLauncher:
    """`parallel` training processes at a time on this machine. With `gpus` (visible_gpus), each
    run gets `per_run` of them for its whole life and gives them back when it ends; `parallel` is
    then at most the number of such shares (local_launcher says so when it cuts it)."""

    parallel: int = 1
    gpus: list[str] = field(default_factory=list)
    per_run: int = 1

    def launch(self, runs: list[Run], output: Path, log: Any) -> None:
        groups = device_groups(self.gpus, self.per_run) if self.gpus else []
        parallel = min(self.parallel, len(groups)) if groups else self.parallel
        # Runs on the CPU share its cores; a run on its own GPU keeps the usual threads.
        threads = max(1, (os.cpu_count() or 1) // parallel) if parallel > 1 else None
        free: queue.Queue[list[str] | None] = queue.Queue()
        for group in groups[:parallel] or [None] * parallel:
            free.put(group)

        def run_one(run: Run, write: Any) -> dict:
            gpus = free.get()  # a share is always free: no more workers than shares
            try:
                return execute(run, threads, write, parallel, gpus)
            finally:
                free.put(gpus)

        if parallel == 1:
            for run in runs:
                run_one(run, log)
            return
        write = whole_lines(log)
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            list(pool.map(lambda run: run_one(run, write), runs))


def local_launcher(
    parallel: int, devices_per_run: int | None, gpus: Sequence[str] | None = None, log: Any = print
) -> LocalLauncher:
    """The launcher of `ablate --parallel N [--devices-per-run K]` on this machine. `gpus`: the
    GPUs to hand out (default visible_gpus(); tests give a list of their own). Without GPUs, N
    processes as before, and --devices-per-run is refused. With them, N is cut to the number of
    K-GPU shares, in one line, rather than refused: the sweep still runs, as fast as the GPUs allow."""
    gpus = visible_gpus() if gpus is None else list(gpus)
    if not gpus:
        if devices_per_run is not None:
            raise UserError(
                f"--devices-per-run: no GPU is visible here (torch.cuda.is_available() is false), so there is none "
                f"to give {devices_per_run} of to each run; leave the option out to run on the CPU"
            )
        return LocalLauncher(parallel)
    per_run = devices_per_run or 1
    if per_run > len(gpus):
        raise UserError(
            f"--devices-per-run: {per_run} GPUs per run, but this machine shows {len(gpus)} "
            f"(CUDA_VISIBLE_DEVICES={','.join(gpus)}); give --devices-per-run {len(gpus)} or fewer"
        )
    shares = len(gpus) // per_run
    if parallel > shares:
        log(
            f"ablate: --parallel {parallel} cut to {shares}: {counted(len(gpus), 'GPU')} give {counted(shares, 'run')} "
            f"of {counted(per_run, 'GPU')} at a time"
        )
        parallel = shares
    return LocalLauncher(parallel, gpus, per_run)


def run_sweep(runs: list[Run], sweep: Sweep, output: Path, launcher: Launcher, log: Any = print) -> None:
    """Run every unfinished run where `launcher` sends it; finished ones are skipped (after
    checking their settings)."""
    todo = []
    for run in runs:
        if is_finished(run):
            check_same_settings(run)
            log(f"ablate: skip   {run.label} (finished)")
        else:
            todo.append(run)
    if not todo:
        return
    write_text_atomically(output / BASE_SNAPSHOT, sweep.base_text)
    prepare_data(todo, log)
    launcher.launch(todo, output, log)
