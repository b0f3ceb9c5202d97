"""minitx against nanoGPT's CPU recipe: the same model, data, optimiser and schedule, trained by
`python train.py --config configs/nanogpt_cpu.yaml` and by a plain PyTorch loop
(benchmarks/nanogpt_reference.py), one after the other, alternating which goes first, each in a
fresh process, `--rounds` times (median of 3 by default).

    python benchmarks/nanogpt_recipe.py                    # 1000 iterations, 3 rounds (about 6 minutes alone)
    python benchmarks/nanogpt_recipe.py --iters 100 --rounds 1

Reported for each side: ms a step (the mean over every training step after the first --skip, the
time of evaluation taken out, the checkpoint writes and everything else a step pays left in; the
median, min and max over the rounds), the process's wall time from start to exit (imports, data,
evaluation, checkpoints and minitx's closing sample included) and the final validation loss; then
minitx / reference for both. The losses' digest (sha1 of the per-step training losses as float64)
is the same in every round when training is deterministic: a change that claims to move no number
keeps it.

minitx's step times come from StepClock, a callback given on the command line
(`--trainer.callbacks+=benchmarks.nanogpt_recipe.StepClock`, allowed by MINITX_CLASS_PATHS), which
records the end of every step and each validation's span, as the reference records its own.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "nanogpt_cpu.yaml"
CLOCK_FILE = "NANOGPT_RECIPE_CLOCK"  # the environment variable naming StepClock's JSON file


class StepClock(L.Callback):
    """Writes to the file $NANOGPT_RECIPE_CLOCK, at the end of fit: the wall and process CPU time
    at the end of every training step and the span of every validation (seconds since the first
    step began), each step's training loss, the last val_loss, and when the first step began
    (time.time()) with the process's CPU time until then."""

    def __init__(self) -> None:
        self.path = os.environ.get(CLOCK_FILE)
        self.ends: list[float] = []
        self.cpu: list[float] = []
        self.evals: list[dict[str, float]] = []
        self.losses: list[Any] = []
        self.start: tuple[float, float] | None = None
        self.first_step = 0.0
        self._val_start = (0.0, 0.0)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.start is None:
            self.start, self.first_step = (time.perf_counter(), time.process_time()), time.time()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.ends.append(time.perf_counter() - self.start[0])
        self.cpu.append(time.process_time() - self.start[1])
        self.losses.append(outputs["loss"].detach())  # read at the end: no sync here

    def on_validation_start(self, trainer, pl_module) -> None:
        self._val_start = (time.perf_counter(), time.process_time())

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or self.start is None:
            return
        self.evals.append(
            {
                "step": trainer.global_step,
                "start": self._val_start[0] - self.start[0],
                "seconds": time.perf_counter() - self._val_start[0],
                "cpu_seconds": time.process_time() - self._val_start[1],
                "val": float(trainer.callback_metrics["val_loss"]),
            }
        )

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.path:
            losses = [float(loss) for loss in self.losses]
            record = {"step_ends": self.ends, "step_cpu": self.cpu, "evals": self.evals, "losses": losses}
            record["val_loss"] = self.evals[-1]["val"] if self.evals else None
            record["first_step"], record["first_step_cpu"] = self.first_step, self.start[1]
            Path(self.path).write_text(json.dumps(record))


def write_tokens(directory: Path) -> tuple[int, str]:
    """train.bin and val.bin (uint16) of minitx's prepared Shakespeare, for the reference; the
    vocabulary's size and the data's summary line."""
    from minitx.data.datamodule import TextDataModule

    data = TextDataModule(source="shakespeare", tokenizer="char", block_size=64, batch_size=12)
    data.setup("fit")
    for name, tokens in (("train", data.train_tokens), ("val", data.val_tokens)):
        np.asarray(tokens).astype(np.uint16).tofile(directory / f"{name}.bin")
    return data.vocab_size, data.summary()


def step_times(record: dict, skip: int) -> dict[str, float]:
    """ms a step after the first `skip` steps, evaluation taken out: "mean" (wall), "cpu" (the
    process's CPU time: what a loaded machine distorts least), "median" (wall, of the steps
    without an evaluation: the steady step, without one-off costs)."""
    ends, cpu = record["step_ends"], record["step_cpu"]
    if len(ends) <= skip + 1:
        raise SystemExit(f"nanogpt_recipe: --iters must exceed --skip + 1 ({skip + 1})")
    first, last, steps = ends[skip], ends[-1], len(ends) - 1 - skip
    inside = [e for e in record["evals"] if first < e["start"] < last]
    spans = [
        (a, b) for a, b in zip(ends[skip:], ends[skip + 1 :]) if not any(a < e["start"] < b for e in inside)
    ]
    return {
        "mean": 1000 * (last - first - sum(e["seconds"] for e in inside)) / steps,
        "cpu": 1000 * (cpu[-1] - cpu[skip] - sum(e["cpu_seconds"] for e in inside)) / steps,
        "median": 1000 * statistics.median(b - a for a, b in spans),
    }


def digest(losses: list[float]) -> str:
    return hashlib.sha1(np.asarray(losses, dtype=np.float64).tobytes()).hexdigest()[:12]


def run(side: str, iters: int, vocab: int, work: Path, index: int) -> dict:
    """One training run in a fresh process: its record, wall seconds and output."""
    out = work / f"{side}-{index}.json"
    env = dict(os.environ)
    if side == "minitx":
        command = [
            str(REPO / "train.py"),
            "--config",
            str(CONFIG),
            "--trainer.max_steps",
            str(iters),
            "--run.root",
            str(work / "runs"),
            "--run.name",
            f"minitx-{index}",
            "--trainer.callbacks+=benchmarks.nanogpt_recipe.StepClock",
        ]
        env.update({CLOCK_FILE: str(out), "MINITX_CLASS_PATHS": "benchmarks.nanogpt_recipe"})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    else:
        checkpoints = work / f"reference-{index}"
        checkpoints.mkdir()
        command = [
            str(REPO / "benchmarks" / "nanogpt_reference.py"),
            "--data",
            str(work),
            "--vocab",
            str(vocab),
            "--iters",
            str(iters),
            "--out",
            str(out),
            "--checkpoint-dir",
            str(checkpoints),
        ]
    log = work / f"{side}-{index}.log"
    with open(log, "w") as stdout:
        launched, start = time.time(), time.perf_counter()
        result = subprocess.run(
            [sys.executable, *command], stdout=stdout, stderr=subprocess.STDOUT, env=env, cwd=work
        )
        wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"nanogpt_recipe: the {side} run failed:\n{log.read_text()[-3000:]}")
    record = json.loads(out.read_text())
    record["wall"] = wall
    record["startup"] = record["first_step"] - launched  # from the launch to the first step
    return record


def summary(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--iters", type=int, default=1000, help="training iterations of every run (default 1000)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side, alternating (default 3)")
    parser.add_argument("--skip", type=int, default=10, help="first steps of a run left out of ms a step")
    args = parser.parse_args()

    import torch

    print(
        f"torch {torch.__version__}, lightning {L.__version__}, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} CPUs, {args.iters} iterations, {args.rounds} rounds, load average "
        + " ".join(f"{load:.1f}" for load in os.getloadavg())
    )
    results: dict[str, list[dict]] = {"minitx": [], "reference": []}
    with tempfile.TemporaryDirectory(prefix="nanogpt-recipe-") as scratch:
        work = Path(scratch)
        vocab, data = write_tokens(work)
        print(f"data: {data}")
        for index in range(args.rounds):
            order = ("minitx", "reference") if index % 2 == 0 else ("reference", "minitx")
            for side in order:
                record = run(side, args.iters, vocab, work, index)
                record["times"] = step_times(record, args.skip)
                results[side].append(record)
                times = record["times"]
                print(
                    f"round {index + 1} {side:9}: {times['mean']:6.1f} ms a step ({times['median']:.1f} median, "
                    f"{times['cpu']:.1f} CPU), {record['wall']:6.1f} s wall ({record['startup']:.1f} to the first step), "
                    f"val loss {record['val_loss']:.4f}, "
                    f"losses {digest(record['losses'])}",
                    flush=True,
                )
    print()
    print(
        "| | ms a step (median of runs) | min | max | median step | CPU ms a step | wall s (median) | min | max "
        "| s to the first step | CPU s before it | final val loss | losses sha1 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    medians = {}
    for side, records in results.items():
        steps = summary([r["times"]["mean"] for r in records])
        typical = statistics.median(r["times"]["median"] for r in records)
        cpu = statistics.median(r["times"]["cpu"] for r in records)
        walls = summary([r["wall"] for r in records])
        startup = statistics.median(r["startup"] for r in records)
        startup_cpu = statistics.median(r["first_step_cpu"] for r in records)
        losses = {digest(r["losses"]) for r in records}
        vals = sorted({f"{r['val_loss']:.4f}" for r in records})
        medians[side] = (steps[0], walls[0], typical, cpu)
        print(
            f"| {side} | {steps[0]:.1f} | {steps[1]:.1f} | {steps[2]:.1f} | {typical:.1f} | {cpu:.1f} | {walls[0]:.1f} "
            f"| {walls[1]:.1f} | {walls[2]:.1f} | {startup:.1f} | {startup_cpu:.1f} | {', '.join(vals)} | {', '.join(sorted(losses))} |"
        )
    mine, theirs = medians["minitx"], medians["reference"]
    print(
        f"\nminitx / reference: {mine[0] / theirs[0]:.3f} in ms a step, {mine[1] / theirs[1]:.3f} in wall "
        f"({mine[2] / theirs[2]:.3f} in the median step, {mine[3] / theirs[3]:.3f} in CPU time a step)"
    )


if __name__ == "__main__":
    main()
