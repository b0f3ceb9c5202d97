"""Reliability: a run survives SIGKILL at any moment, bad input ends every command with one line and
exit status 2, and nothing that is loaded can run code.

The kill tests run the real train command in subprocesses. A callback module written to tmp_path
(added with --trainer.callbacks+=, so the product has no test hooks) SIGKILLs its own process
after a step drawn at random, or halfway through writing a checkpoint; the run resumed with
--ckpt_path last must log the per-step losses of an uninterrupted run with the same seed.
Dropout is on, so the resumed run must also draw the same dropout masks. Another callback makes
a loss NaN: the process must stop with status 2, naming the step, its last checkpoint intact.

Bad inputs go through the commands' entry points in-process (train_main, generate_main and
ablate_main return the exit status, as `python train.py` etc. do via sys.exit), and one of each
through a real process, where status 2 and the absence of a traceback are the process's own.
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import metrics

from minitx.ablation import format_value
from minitx.checkpoint import LAST
from minitx.cli import ablate_main, generate_main, train_main
from minitx.config import ModelConfig
from minitx.data.tokenizer import CharTokenizer
from minitx.fileio import TMP_PREFIX
from minitx.model import Transformer

REPO = Path(__file__).resolve().parents[1]
WORDS = "the quick brown fox jumps over a lazy dog while seven kings sing of old stars".split()

# The subprocess runs: 24 optimiser steps, last.ckpt every 5 steps and after each validation (8).
STEPS, SAVE_EVERY, VAL_EVERY = 24, 5, 8
SAVE_STEPS = sorted({s for s in range(1, STEPS + 1) if s % SAVE_EVERY == 0 or s % VAL_EVERY == 0})
LOSS_TOLERANCE = 1e-6


# ------------------------------------------------------------------------------------------ setup


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """A small generated text corpus (train.txt, val.txt) and a token cache, shared by the file."""
    directory = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    for name, lines in (("train.txt", 500), ("val.txt", 80)):
        text = "".join(" ".join(rng.choices(WORDS, k=rng.randint(3, 9))) + ".\n" for _ in range(lines))
        (directory / name).write_text(text)
    return {
        "train": directory / "train.txt",
        "val": directory / "val.txt",
        "cache": directory / "token-cache",
    }


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
"""Callbacks that SIGKILL the training process they run in (tests/test_reliability.py)."""
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


@pytest.fixture(scope="module")
def killer_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("killer")
    (directory / "killer.py").write_text(KILLER)
    return directory


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


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, corpus) -> Path:
    """The reference: the tiny run from start to end without a crash. Returns its run directory."""
    directory = tmp_path_factory.mktemp("uninterrupted")
    config = write_config(directory / "tiny.yaml", tiny_config(corpus, directory / "runs"))
    status, output = finish(train_process(config))
    assert status == 0, output[-3000:]
    return directory / "runs" / "tiny"


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


# ------------------------------------------------------------------------------- kill and resume


@pytest.mark.slow
def test_sigkill_at_a_random_step_then_resume_gives_the_uninterrupted_losses(
    tmp_path, corpus, killer_dir, uninterrupted, seed
):
    kill_step = random.Random(seed).randint(6, 18)
    print(f"SIGKILL after step {kill_step}")
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    run = tmp_path / "runs" / "tiny"

    status, output = finish(
        train_process(config, with_callback("KillAtStep", kill_step), killer_dir=killer_dir)
    )
    assert status == -signal.SIGKILL, output[-3000:]
    # Left behind: the newest checkpoint written before the kill, complete, and no temporary file.
    saved_before = max(s for s in SAVE_STEPS if s < kill_step)
    assert checkpoint_step(run / "checkpoints" / LAST) == saved_before
    assert not list((run / "checkpoints").glob(f"{TMP_PREFIX}*"))

    status, output = finish(train_process(config, "--ckpt_path", "last"))
    assert status == 0, output[-3000:]
    assert f"resuming from {run / 'checkpoints' / LAST}" in output
    assert checkpoint_step(run / "checkpoints" / LAST) == STEPS
    assert_resumed_losses_equal(uninterrupted, run, saved_before)


@pytest.mark.slow
def test_sigkill_while_a_checkpoint_is_written_keeps_the_previous_one_and_resumes_exactly(
    tmp_path, corpus, killer_dir, uninterrupted, seed
):
    armed_at = random.Random(seed + 1).randint(6, 18)  # the first save at or after this step is killed
    killed_save = min(s for s in SAVE_STEPS if s >= armed_at)
    saved_before = max(s for s in SAVE_STEPS if s < killed_save)
    print(f"SIGKILL halfway through writing the checkpoint of step {killed_save}")
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    checkpoints = tmp_path / "runs" / "tiny" / "checkpoints"

    status, output = finish(
        train_process(config, with_callback("KillDuringSave", armed_at), killer_dir=killer_dir)
    )
    assert status == -signal.SIGKILL, output[-3000:]
    # The half-written file is a temporary beside last.ckpt, which is still the previous
    # checkpoint, whole: it loads (weights_only) and holds the earlier step.
    partial = list(checkpoints.glob(f"{TMP_PREFIX}*"))
    assert len(partial) == 1 and partial[0].stat().st_size > 0
    assert checkpoint_step(checkpoints / LAST) == saved_before
    for path in checkpoints.glob("*.ckpt"):
        if not path.name.startswith(TMP_PREFIX):
            torch.load(path, weights_only=True)  # every file under a checkpoint's name is whole

    status, output = finish(train_process(config, "--ckpt_path", "last"))
    assert status == 0, output[-3000:]
    assert not list(checkpoints.glob(f"{TMP_PREFIX}*"))  # the stale temporary was cleaned up
    assert checkpoint_step(checkpoints / LAST) == STEPS
    assert_resumed_losses_equal(uninterrupted, checkpoints.parent, saved_before)


def test_nan_loss_stops_the_process_with_exit_2_naming_the_step_and_keeps_the_last_checkpoint(
    tmp_path, corpus, killer_dir
):
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    checkpoints = tmp_path / "runs" / "tiny" / "checkpoints"
    status, output = finish(train_process(config, with_callback("PoisonAtStep", 12), killer_dir=killer_dir))
    assert status == 2, output[-3000:]
    assert "Traceback" not in output
    last_line = output.strip().splitlines()[-1]
    assert (
        last_line.startswith("train: error: step 12: the training loss is nan")
        and "--ckpt_path last" in last_line
    )
    checkpoint = torch.load(checkpoints / LAST, weights_only=True)
    assert checkpoint["global_step"] == 10  # the last save before the NaN, untouched
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())
    assert not list(checkpoints.glob(f"{TMP_PREFIX}*"))


# ------------------------------------------------------------------------------- one-line errors


def one_line_error(capfd, prog: str, *fragments: str) -> str:
    """The command's stderr ends in exactly one `<prog>: error: ...` line holding every fragment,
    and nothing on stdout or stderr looks like a traceback or an uncaught exception."""
    out, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(f"{prog}: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err[-3000:]
    assert "Traceback" not in out + err
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


# Config mistakes: (dotted overrides, fragments the one line must hold). Each goes through train
# (as flags) and through ablate (as a variant's overrides).
BAD_CONFIGS = {
    "unknown attention kind": ({"model.attention.kind": "flash"}, ["model.attention.kind", "flash"]),
    "n_head not divisible by n_kv_head": (
        {"model.n_head": 4, "model.attention.kind": "gqa", "model.attention.n_kv_head": 3},
        ["model.attention.n_kv_head", "n_head=4 is not divisible by n_kv_head=3"],
    ),
    "d_model not divisible by n_head": (
        {"model.d_model": 30, "model.n_head": 4},
        ["model.d_model", "not divisible by n_head=4"],
    ),
    "window below 1": (
        {"model.attention.kind": "local", "model.attention.options.local.window": 0},
        ["model.attention.options.local.window", "is 0"],
    ),
    "even MTA key kernel": (
        {"model.attention.kind": "mta", "model.attention.options.mta.key_kernel": 4},
        ["model.attention.options.mta.key_kernel", "odd"],
    ),
    "MTA layer out of range": (
        {"model.attention.kind": "mta", "model.attention.options.mta.conv_layers": [3]},
        ["model.attention.options.mta.conv_layers", "layer 3 is out of range for n_layer=1"],
    ),
    "unknown key": ({"model.n_layers": 2}, ["model.n_layers", "did you mean 'model.n_layer'"]),
    "wrong type": ({"model.n_layer": "two"}, ["model.n_layer", "two"]),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_config_mistake_through_train(case, tmp_path, corpus, capfd):
    overrides, fragments = BAD_CONFIGS[case]
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    assert train_main(["--config", str(config), *flags(overrides)]) == 2
    one_line_error(capfd, "train", *fragments)
    assert not (tmp_path / "runs").exists()  # nothing written


def test_config_mistakes_inside_the_config_file_through_train(tmp_path, corpus, capfd):
    """The same mistakes written in the YAML file rather than given as flags."""
    unknown = tiny_config(corpus, tmp_path / "runs", model={"n_layers": 2})
    assert train_main(["--config", str(write_config(tmp_path / "unknown.yaml", unknown))]) == 2
    one_line_error(capfd, "train", "n_layers", "did you mean 'model.n_layer'")
    wrong_type = tiny_config(corpus, tmp_path / "runs", trainer={"max_steps": "many"})
    assert train_main(["--config", str(write_config(tmp_path / "wrong_type.yaml", wrong_type))]) == 2
    one_line_error(capfd, "train", "trainer.max_steps", "many")
    attention = tiny_config(corpus, tmp_path / "runs", model={"attention": {"kind": "gqa", "n_kv_head": 3}})
    assert train_main(["--config", str(write_config(tmp_path / "attention.yaml", attention))]) == 2
    one_line_error(capfd, "train", "model.attention.n_kv_head")
    (tmp_path / "syntax.yaml").write_text("model:\n  n_layer: [1\n")
    assert train_main(["--config", str(tmp_path / "syntax.yaml")]) == 2
    one_line_error(capfd, "train", "syntax.yaml", "line 2", "fix the YAML")
    (tmp_path / "list.yaml").write_text("- model\n- data\n")
    assert train_main(["--config", str(tmp_path / "list.yaml")]) == 2
    one_line_error(capfd, "train", "list.yaml", "not a mapping")
    assert train_main(["--config", str(tmp_path / "missing.yaml")]) == 2
    one_line_error(capfd, "train", "missing.yaml", "does not exist")
    assert not (tmp_path / "runs").exists()


def write_sweep(path: Path, base: dict, variants: list[dict], **extra) -> Path:
    path.write_text(yaml.safe_dump({"base": base, "seed": 3, "variants": variants, **extra}, sort_keys=False))
    return path


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_config_mistake_through_ablate_in_a_variant(case, tmp_path, corpus, capfd):
    overrides, fragments = BAD_CONFIGS[case]
    base = tiny_config(corpus, tmp_path / "unused")
    sweep = write_sweep(
        tmp_path / "sweep.yaml",
        base,
        [{"name": "fine", "overrides": {}}, {"name": "bad", "overrides": overrides}],
    )
    output = tmp_path / "out"
    assert ablate_main(["--config", str(sweep), "--output", str(output)]) == 2
    one_line_error(capfd, "ablate", str(sweep), "variant 'bad'", *fragments)
    assert not output.exists()  # refused before any run: not even the good variant trained


@pytest.mark.parametrize("case", ["unknown attention kind", "unknown key"])
def test_config_mistake_through_ablate_in_the_base(case, tmp_path, corpus, capfd):
    overrides, fragments = BAD_CONFIGS[case]
    base = tiny_config(corpus, tmp_path / "unused")
    for key, value in overrides.items():  # "model.attention.kind" -> base["model"]["attention"]["kind"]
        section, *path = key.split(".")
        target = base[section]
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = value
    sweep = write_sweep(tmp_path / "sweep.yaml", base, [{"name": "v", "overrides": {"model.lr": 0.01}}])
    output = tmp_path / "out"
    assert ablate_main(["--config", str(sweep), "--output", str(output)]) == 2
    # In a YAML file the unknown key is reported as "Group 'model' does not accept option 'n_layers'".
    one_line_error(
        capfd,
        "ablate",
        str(sweep),
        "base config",
        *[f.replace("model.n_layers", "n_layers") for f in fragments],
    )
    assert not output.exists()


def data_config(tmp_path: Path, corpus: dict[str, Path], **data) -> Path:
    return write_config(
        tmp_path / "tiny.yaml",
        tiny_config(corpus, tmp_path / "runs", data={"cache_dir": str(tmp_path / "cache"), **data}),
    )


def assert_nothing_half_written(tmp_path: Path) -> None:
    assert not (tmp_path / "runs").exists()
    cache = tmp_path / "cache"
    assert not cache.exists() or not list(cache.glob(f"{TMP_PREFIX}*"))


def test_missing_data_file(tmp_path, corpus, capfd):
    assert (
        train_main(
            ["--config", str(data_config(tmp_path, corpus, train_files=str(tmp_path / "nowhere" / "*.txt")))]
        )
        == 2
    )
    one_line_error(capfd, "train", "data.train_files", "no file matches", "nowhere")
    assert_nothing_half_written(tmp_path)


def test_empty_data_file(tmp_path, corpus, capfd):
    (tmp_path / "empty.txt").write_text("  \n")
    assert (
        train_main(["--config", str(data_config(tmp_path, corpus, val_files=str(tmp_path / "empty.txt")))])
        == 2
    )
    one_line_error(capfd, "train", "data.val_files", "empty.txt", "is empty")
    assert_nothing_half_written(tmp_path)


def test_unreadable_data_file(tmp_path, corpus, capfd):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1") * 50)
    assert (
        train_main(["--config", str(data_config(tmp_path, corpus, train_files=str(tmp_path / "latin1.txt")))])
        == 2
    )
    one_line_error(capfd, "train", "data.train_files", "latin1.txt", "not UTF-8", "convert it to UTF-8")
    assert_nothing_half_written(tmp_path)


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads a file whatever its permissions"
)
def test_data_file_without_read_permission(tmp_path, corpus, capfd):
    locked = tmp_path / "locked.txt"
    shutil.copy(corpus["train"], locked)
    locked.chmod(0)
    try:
        assert train_main(["--config", str(data_config(tmp_path, corpus, train_files=str(locked)))]) == 2
    finally:
        locked.chmod(0o600)
    one_line_error(capfd, "train", "data.train_files", "locked.txt", "cannot read")
    assert_nothing_half_written(tmp_path)


def test_corpus_shorter_than_a_block(tmp_path, corpus, capfd):
    (tmp_path / "short.txt").write_text("the quick brown fox.\n")  # 21 characters, block_size 32
    assert (
        train_main(["--config", str(data_config(tmp_path, corpus, train_files=str(tmp_path / "short.txt")))])
        == 2
    )
    one_line_error(capfd, "train", "data.block_size", "21 tokens", "block_size + 1 = 33")
    assert_nothing_half_written(tmp_path)


def test_empty_validation_set(tmp_path, corpus, capfd):
    (tmp_path / "text.txt").write_text(corpus["train"].read_text() + "\n" * 8)  # the tail held out is blank
    config = data_config(
        tmp_path, corpus, train_files=str(tmp_path / "text.txt"), val_files=None, val_fraction=0.0005
    )
    assert train_main(["--config", str(config)]) == 2
    one_line_error(capfd, "train", "data.val_fraction", "validation set is empty")
    assert_nothing_half_written(tmp_path)


# -- checkpoints, through generate --ckpt and train --ckpt_path


class RunsCode:
    """Unpickling this calls os.system, which creates the marker file: the attack to refuse."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def corrupt(data: bytes, at: int, length: int = 64) -> bytes:
    noise = random.Random(at).randbytes(length)
    return data[:at] + noise + data[at + length :]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, uninterrupted) -> dict[str, Path]:
    """A good training checkpoint and bad files made from it (all built once)."""
    directory = tmp_path_factory.mktemp("checkpoints")
    good = directory / "good.ckpt"
    shutil.copy(uninterrupted / "checkpoints" / LAST, good)
    data = good.read_bytes()
    paths = {"good": good}

    def put(name: str, content: bytes) -> None:
        paths[name] = directory / f"{name}.ckpt"
        paths[name].write_bytes(content)

    put("truncated", data[: len(data) * 2 // 3])
    put("corrupted header", corrupt(data, 0))
    put("corrupted pickle", corrupt(data, data.index(b"data.pkl") + 60))  # inside the pickled dict
    put("random bytes", random.Random(1).randbytes(4096))
    put("empty", b"")
    put("text file", b"model:\n  n_layer: 1\n")
    torch.save({"weights": torch.zeros(3)}, directory / "foreign.ckpt")
    paths["foreign"] = directory / "foreign.ckpt"
    paths["a directory"] = directory / "a-directory"
    paths["a directory"].mkdir()
    paths["missing"] = directory / "missing.ckpt"

    checkpoint = torch.load(good, weights_only=True)
    # Generation-only file: weights and the minitx entry, no optimiser or loop state.
    torch.save(
        {"state_dict": checkpoint["state_dict"], "minitx": checkpoint["minitx"]},
        directory / "weights_only.ckpt",
    )
    paths["weights only"] = directory / "weights_only.ckpt"
    other = {
        **checkpoint,
        "minitx": {
            **checkpoint["minitx"],
            "model_config": {**checkpoint["minitx"]["model_config"], "d_model": 64},
        },
    }
    torch.save(other, directory / "other_shape.ckpt")
    paths["other shape"] = directory / "other_shape.ckpt"
    chars = checkpoint["minitx"]["tokenizer"]["chars"]
    bigger = {
        **checkpoint,
        "minitx": {**checkpoint["minitx"], "tokenizer": {"kind": "char", "chars": chars + "XYZ"}},
    }
    torch.save(bigger, directory / "bigger_vocabulary.ckpt")
    paths["bigger vocabulary"] = directory / "bigger_vocabulary.ckpt"
    return paths


# (checkpoint, fragments of generate's line, fragments of train's line)
BAD_CHECKPOINTS = {
    "missing": (["no such file"], ["ckpt_path", "no checkpoint at"]),
    "a directory": (["is a directory"], ["ckpt_path", "is a directory"]),
    "truncated": (
        ["not a readable minitx checkpoint", "central directory"],
        ["ckpt_path", "not a readable minitx checkpoint", "central directory"],
    ),
    "corrupted header": (
        ["not a readable minitx checkpoint"],
        ["ckpt_path", "not a readable minitx checkpoint"],
    ),
    "corrupted pickle": (
        ["not a readable minitx checkpoint"],
        ["ckpt_path", "not a readable minitx checkpoint"],
    ),
    "random bytes": (["not a readable minitx checkpoint"], ["ckpt_path", "not a readable minitx checkpoint"]),
    "empty": (["the file is empty"], ["ckpt_path", "the file is empty"]),
    "text file": (["not a readable minitx checkpoint"], ["ckpt_path", "not a readable minitx checkpoint"]),
    "foreign": (["not a minitx checkpoint"], ["ckpt_path", "not a minitx checkpoint"]),
    "other shape": (
        ["weights do not match its model config", "wrong shape"],
        ["ckpt_path", "model differs", "d_model: checkpoint 64, config 32"],
    ),
    "bigger vocabulary": (
        ["tokenizer has", "tokens but the model only"],
        ["data.tokenizer", "another tokenizer or vocabulary"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_CHECKPOINTS))
def test_bad_checkpoint_through_generate(case, checkpoints, capfd):
    fragments, _ = BAD_CHECKPOINTS[case]
    path = checkpoints[case]
    assert generate_main(["--ckpt", str(path), "--prompt", "the", "--max-new-tokens", "5"]) == 2
    one_line_error(capfd, "generate", "--ckpt", str(path), *fragments)


@pytest.mark.parametrize("case", [*BAD_CHECKPOINTS, "weights only"])
def test_bad_checkpoint_through_train(case, checkpoints, tmp_path, corpus, capfd):
    fragments = BAD_CHECKPOINTS[case][1] if case in BAD_CHECKPOINTS else ["weights but no training state"]
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    assert train_main(["--config", str(config), "--ckpt_path", str(checkpoints[case])]) == 2
    one_line_error(capfd, "train", *fragments)
    assert not (tmp_path / "runs").exists()  # no run directory, config.yaml or log version was started


def test_resume_with_another_model_shape_or_tokenizer_leaves_the_run_as_it_was(
    tmp_path, corpus, uninterrupted, capfd
):
    run = tmp_path / "runs" / "tiny"
    shutil.copytree(uninterrupted, run)
    before = files_under(run)
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))

    assert train_main(["--config", str(config), "--ckpt_path", "last", "--model.d_model", "64"]) == 2
    one_line_error(capfd, "train", "ckpt_path", "model differs", "d_model: checkpoint 32, config 64")
    assert files_under(run) == before

    # The same run resumed on text with characters the checkpoint's vocabulary does not have.
    (tmp_path / "other.txt").write_text(corpus["train"].read_text().upper())
    assert (
        train_main(
            [
                "--config",
                str(config),
                "--ckpt_path",
                "last",
                "--data.train_files",
                str(tmp_path / "other.txt"),
            ]
        )
        == 2
    )
    one_line_error(capfd, "train", "data.tokenizer", "another tokenizer or vocabulary", "new: 'A'")
    assert files_under(run) == before


def test_resume_of_a_run_that_never_saved(tmp_path, corpus, capfd):
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    assert train_main(["--config", str(config), "--ckpt_path", "last"]) == 2
    one_line_error(capfd, "train", "ckpt_path", "does not exist")
    assert not (tmp_path / "runs").exists()


# -- prompts and sampling options, through generate


@pytest.fixture(scope="module")
def learned_positions_checkpoint(tmp_path_factory, corpus) -> Path:
    """A checkpoint of a model with learned positions (it cannot slide past block_size 32)."""
    tokenizer = CharTokenizer(corpus["train"].read_text())
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size, block_size=32, n_layer=1, n_head=2, d_model=16, positions="learned"
    )
    model = Transformer(config)
    path = tmp_path_factory.mktemp("learned") / "learned.ckpt"
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "minitx": {"format": 1, "model_config": config.to_dict(), "tokenizer": tokenizer.to_dict()},
        },
        path,
    )
    return path


BAD_GENERATE_OPTIONS = {
    "unknown prompt characters": (
        ["--prompt", "the Quick~fox"],
        ["--prompt", "characters the tokenizer does not know", "'Q', '~'"],
    ),
    "max_new_tokens below 0": (["--max-new-tokens", "-1"], ["--max-new-tokens", "is -1", "use 0 or more"]),
    "temperature below 0": (["--temperature", "-0.5"], ["--temperature", "is -0.5"]),
    "top_p of 0": (["--top-p", "0"], ["--top-p", "is 0.0", "(0, 1]"]),
    "top_p above 1": (["--top-p", "1.5"], ["--top-p", "is 1.5", "(0, 1]"]),
    "top_k below 1": (["--top-k", "0"], ["--top-k", "is 0", "1 or more"]),
}


@pytest.mark.parametrize("case", list(BAD_GENERATE_OPTIONS))
def test_bad_prompt_or_sampling_option_through_generate(case, checkpoints, capfd):
    options, fragments = BAD_GENERATE_OPTIONS[case]
    assert generate_main(["--ckpt", str(checkpoints["good"]), "--prompt", "the", *options]) == 2
    one_line_error(capfd, "generate", *fragments)


def test_prompt_longer_than_the_context_of_a_model_that_cannot_slide(learned_positions_checkpoint, capfd):
    prompt = "the lazy dog " * 3  # 39 characters, block_size 32
    assert (
        generate_main(
            ["--ckpt", str(learned_positions_checkpoint), "--prompt", prompt, "--max-new-tokens", "3"]
        )
        == 2
    )
    one_line_error(capfd, "generate", "prompt has 39 tokens", "block_size=32", "shorten the prompt")


# ------------------------------------------------------------------------------- loading runs no code


def malicious_files(directory: Path, marker: Path) -> dict[str, Path]:
    """Files whose unrestricted unpickling runs os.system: a well-formed minitx checkpoint with a
    payload inside, in torch's zip format and in its legacy format, and bare pickles of the
    protocol torch writes (2) and of a newer one (4)."""
    checkpoint = {
        "state_dict": {"model.x": torch.zeros(2)},
        "minitx": {"format": 1},
        "global_step": 3,
        "payload": RunsCode(marker),
    }
    paths = {"zip": directory / "zip.ckpt", "legacy": directory / "legacy.ckpt"}
    torch.save(checkpoint, paths["zip"])
    torch.save(checkpoint, paths["legacy"], _use_new_zipfile_serialization=False)
    for protocol in (2, 4):
        paths[f"pickle{protocol}"] = directory / f"pickle{protocol}.ckpt"
        paths[f"pickle{protocol}"].write_bytes(
            pickle.dumps({"minitx": {"format": 1}, "payload": RunsCode(marker)}, protocol=protocol)
        )
    return paths


def test_the_malicious_files_would_run_code_if_loaded_unsafely(tmp_path):
    """The attack is real: unrestricted unpickling of these files runs the command."""
    for name, path in malicious_files(tmp_path, tmp_path / "ran").items():
        (tmp_path / "ran").unlink(missing_ok=True)
        pickle.loads(path.read_bytes()) if name.startswith("pickle") else torch.load(path, weights_only=False)
        assert (tmp_path / "ran").exists(), name


# What the line says: the refused import where the unpickler gets that far; with protocol 4 it
# stops earlier, at an instruction it does not take (FRAME), and the file is merely unreadable.
MALICIOUS = {
    "zip": ["refused", "posix.system", "can run code"],
    "legacy": ["refused", "posix.system", "can run code"],
    "pickle2": ["refused", "posix.system", "can run code"],
    "pickle4": ["not a readable minitx checkpoint", "UnpicklingError"],
}


@pytest.mark.parametrize("kind", list(MALICIOUS))
def test_a_checkpoint_crafted_to_run_code_is_refused_by_generate_and_train(kind, tmp_path, corpus, capfd):
    marker = tmp_path / "code-ran"
    path = malicious_files(tmp_path, marker)[kind]
    assert generate_main(["--ckpt", str(path)]) == 2
    assert not marker.exists()
    one_line_error(capfd, "generate", "--ckpt", *MALICIOUS[kind])
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    assert train_main(["--config", str(config), "--ckpt_path", str(path)]) == 2
    assert not marker.exists()
    one_line_error(capfd, "train", "ckpt_path", *MALICIOUS[kind])
    assert not (tmp_path / "runs").exists()


def test_yaml_with_a_python_tag_is_refused_by_train_and_ablate(tmp_path, corpus, capfd):
    marker = tmp_path / "code-ran"
    tagged = f"!!python/object/apply:os.system ['touch {marker}']"
    config = tmp_path / "tagged.yaml"
    config.write_text(yaml.safe_dump(tiny_config(corpus, tmp_path / "runs")) + f"extra: {tagged}\n")
    assert train_main(["--config", str(config)]) == 2
    one_line_error(capfd, "train", "tagged.yaml", "python/object/apply:os.system", "remove the tag")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"base: tagged.yaml\nvariants:\n  - name: a\n    overrides: {{model.lr: {tagged}}}\n")
    assert ablate_main(["--config", str(sweep), "--output", str(tmp_path / "out")]) == 2
    one_line_error(capfd, "ablate", "sweep.yaml", "not valid YAML")
    assert not marker.exists()
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def test_the_source_loads_only_safely():
    """Every torch.load passes weights_only=True; YAML is read only with safe_load; no pickle,
    eval or exec anywhere in the package."""
    problems = []
    for path in sorted((REPO / "minitx").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            owner = (
                func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            )
            where = f"{path.relative_to(REPO)}:{node.lineno}"
            if owner == "torch" and name == "load":
                safe = any(
                    k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                    for k in node.keywords
                )
                if not safe:
                    problems.append(f"{where}: torch.load without weights_only=True")
            if owner == "yaml" and name in (
                "load",
                "load_all",
                "unsafe_load",
                "full_load",
                "unsafe_load_all",
                "full_load_all",
            ):
                problems.append(f"{where}: yaml.{name}")
            if owner in ("pickle", "dill", "marshal") and name.startswith("load"):
                problems.append(f"{where}: {owner}.{name}")
            if isinstance(func, ast.Name) and name in ("eval", "exec"):
                problems.append(f"{where}: {name}()")
    assert not problems, problems


# ------------------------------------------------------------------------------- real processes


def test_real_processes_exit_2_with_one_line(tmp_path, corpus):
    """Status 2 and one line from the processes themselves, for each command."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    malicious = malicious_files(tmp_path, tmp_path / "code-ran")["zip"]
    sweep = write_sweep(
        tmp_path / "sweep.yaml",
        tiny_config(corpus, tmp_path / "unused"),
        [{"name": "bad", "overrides": {"model.attention.kind": "gqa", "model.attention.n_kv_head": 3}}],
    )
    commands = {  # command: (arguments, a fragment of its one line)
        "train": (
            [str(REPO / "train.py"), "--config", str(config), "--model.attention.kind", "flash"],
            "model.attention.kind",
        ),
        "generate": ([str(REPO / "generate.py"), "--ckpt", str(malicious)], "refused"),
        "ablate": (
            [str(REPO / "ablate.py"), "--config", str(sweep), "--output", str(tmp_path / "out")],
            "model.attention.n_kv_head",
        ),
    }
    processes = {
        name: subprocess.Popen(
            [sys.executable, *arguments],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (arguments, _) in commands.items()
    }
    for name, process in processes.items():
        out, err = process.communicate(timeout=240)
        lines = [line for line in err.splitlines() if line.strip()]
        assert process.returncode == 2, (name, err[-3000:])
        assert "Traceback" not in out + err, (name, err[-3000:])
        assert lines[-1].startswith(f"{name}: error: ") and commands[name][1] in lines[-1], (name, lines[-1])
        assert sum(line.startswith(f"{name}: error: ") for line in lines) == 1, (name, err[-3000:])
    assert (
        not (tmp_path / "runs").exists()
        and not (tmp_path / "out").exists()
        and not (tmp_path / "code-ran").exists()
    )
