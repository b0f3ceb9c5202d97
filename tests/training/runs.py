"""Helpers of the training tests: tiny configs and corpora, the train command in a subprocess that
a callback may kill, and the checks that a resumed run equals an uninterrupted one."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from helpers import metrics

from minitx.ablation import format_value

REPO = Path(__file__).resolve().parents[2]
WORDS = "the quick brown fox jumps over a lazy dog while seven kings sing of old stars".split()

# The subprocess runs: 24 optimiser steps, last.ckpt every 5 steps and after each validation (8).
STEPS, SAVE_EVERY, VAL_EVERY = 24, 5, 8
SAVE_STEPS = sorted({s for s in range(1, STEPS + 1) if s % SAVE_EVERY == 0 or s % VAL_EVERY == 0})
LOSS_TOLERANCE = 1e-6


def tiny_config(corpus: dict[str, Path], root: Path, **sections: dict) -> dict:
    """A one-layer model that trains 24 steps in a second or two; `sections` update its sections."""
    config = {
        "seed_everything": 7,
        "model": {
            "n_layer": 1,
            "n_head": 2,
            "d_model": 32,
            "block_size": 32,
            "dropout": 0.1,
            "lr": 1e-2,
            "min_lr": 1e-3,
            "warmup_steps": 5,
        },
        "data": {
            "source": "files",
            "train_files": str(corpus["train"]),
            "val_files": str(corpus["val"]),
            "batch_size": 8,
            "val_batches": 2,
            "cache_dir": str(corpus["cache"]),
        },
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": STEPS,
            "val_check_interval": VAL_EVERY,
            "log_every_n_steps": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
        },
        "run": {
            "root": str(root),
            "name": "tiny",
            "sample_tokens": 0,
            "checkpoint_every_n_steps": SAVE_EVERY,
        },
    }
    for section, values in sections.items():
        config[section] = {**config[section], **values}
    return config


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


KILLER = '''
"""Callbacks that SIGKILL the training process they run in (tests/training/test_failures.py)."""
import io
import os
import signal
import time

import torch
from lightning.pytorch.callbacks import Callback


def die():
    os.kill(os.getpid(), signal.SIGKILL)


class KillAtStep(Callback):
    """SIGKILL once optimiser step `step` is done, before a checkpoint of that step is written
    (Lightning runs checkpoint callbacks after all others)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            die()


class KillDuringSave(Callback):
    """In the first checkpoint save at step `step` or later: write half of the bytes, make them
    durable, and SIGKILL, as a power cut in the middle of torch.save would."""

    def __init__(self, step: int):
        self.step = step

    def setup(self, trainer, pl_module, stage):
        save = torch.save

        def half_then_die(obj, file, *args, **kwargs):
            if trainer.global_step >= self.step and hasattr(file, "write"):
                whole = io.BytesIO()
                save(obj, whole, *args, **kwargs)
                file.write(whole.getvalue()[: len(whole.getvalue()) // 2])
                file.flush()
                os.fsync(file.fileno())
                die()
            return save(obj, file, *args, **kwargs)

        torch.save = half_then_die


class InterruptAtStep(Callback):
    """Send this process SIGINT (Ctrl-C) once optimiser step `step` is done."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


class WaitAtStep(Callback):
    """After optimiser step `step`, say so on stdout and wait until the file `go` exists."""

    def __init__(self, step: int, go: str):
        self.step, self.go = step, go

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            print("waiting", flush=True)
            while not os.path.exists(self.go):
                time.sleep(0.05)


class PoisonAtStep(Callback):
    """After optimiser step `step`, set one weight to NaN: the next loss is NaN."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            with torch.no_grad():
                next(pl_module.parameters()).view(-1)[0] = float("nan")
'''


def train_process(config: Path, *args: str, killer_dir: Path | None = None, **popen) -> subprocess.Popen:
    """`python train.py --config CONFIG ARGS` on one thread (the same in every run: same float sums)."""
    paths = [str(REPO)] + ([str(killer_dir)] if killer_dir else [])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "MINITX_CLASS_PATHS": "killer",
    }  # a config may name the test's callbacks (minitx/training/classpaths.py)
    return subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), "--config", str(config), *args],
        cwd=config.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def finish(process: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out + err


def with_callback(class_name: str, step: int, **init_args) -> str:
    return "--trainer.callbacks+=" + json.dumps(
        {"class_path": f"killer.{class_name}", "init_args": {"step": step, **init_args}}
    )


def checkpoint_step(path: Path) -> int:
    return torch.load(path, weights_only=True)["global_step"]


def assert_resumed_losses_equal(uninterrupted: Path, resumed_run: Path, from_step: int) -> float:
    """The resumed run's per-step losses (log version 1) equal the uninterrupted run's; returns
    the largest absolute difference."""
    whole_train, whole_val = metrics(uninterrupted)
    resumed_train, resumed_val = metrics(resumed_run, version=1)
    assert sorted(whole_train) == list(range(STEPS))
    assert sorted(resumed_train) == list(range(from_step, STEPS))
    differences = [abs(resumed_train[s] - whole_train[s]) for s in resumed_train]
    differences += [abs(resumed_val[s] - whole_val[s]) for s in resumed_val]
    # A validation after step g is logged at step g - 1, so those after the resumed step c are >= c.
    assert sorted(whole_val) == list(range(VAL_EVERY - 1, STEPS, VAL_EVERY))
    assert sorted(resumed_val) == [s for s in sorted(whole_val) if s >= from_step]
    largest = max(differences)
    print(
        f"resumed from step {from_step}: largest |loss difference| {largest:.3g} over {len(differences)} losses"
    )
    assert largest <= LOSS_TOLERANCE
    return largest


def one_line_error(capfd, prog: str, *fragments: str) -> str:
    """The command's stderr ends in exactly one `<prog>: error: ...` line holding every fragment,
    and nothing on stdout or stderr looks like a traceback or an uncaught exception."""
    out, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(f"{prog}: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err[-3000:]
    assert "Traceback" not in out + err, (out + err)[-3000:]
    assert not any(
        line.split(":")[0].endswith(("Error", "Exception")) for line in (out + err).splitlines()
    ), err[-3000:]
    with capfd.disabled():
        print(errors[0])
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
    return errors[0]


def files_under(directory: Path) -> dict[str, int]:
    """Every file under directory, with its modification time: what a failed start must not touch."""
    return {
        str(p.relative_to(directory)): p.stat().st_mtime_ns
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def flags(overrides: dict) -> list[str]:
    return [arg for key, value in overrides.items() for arg in (f"--{key}", format_value(value))]


class RunsCode:
    """Unpickling this calls os.system, which creates the marker file: the attack to refuse."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def corrupt(data: bytes, at: int, length: int = 64) -> bytes:
    noise = random.Random(at).randbytes(length)
    return data[:at] + noise + data[at + length :]


def write_sweep(path: Path, base: dict, variants: list[dict], **extra) -> Path:
    path.write_text(yaml.safe_dump({"base": base, "seed": 3, "variants": variants, **extra}, sort_keys=False))
    return path
