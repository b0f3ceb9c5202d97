"""Checkpoints of a training run: written atomically, loaded with weights_only=True.

A run directory looks like

    runs/<name>/
      config.yaml            the resolved configuration of the latest start (re-runnable)
      checkpoints/
        last.ckpt            the newest state: every N steps, at each validation, at the end
        best.ckpt            the state with the lowest validation loss so far
      logs/version_<k>/      CSV metrics, one version per start (a resume starts a new one)

A checkpoint is Lightning's dictionary (weights under "state_dict" with keys prefixed "model.",
optimiser, scheduler, loop counters, the datamodule's data position) plus our own plain-data entry

    checkpoint["minitx"] = {"format": 1, "model_config": {...}, "tokenizer": {...}, "train_config": {...}}

which is all that generation needs. Everything in it is tensors and plain Python values, so
`torch.load(path, weights_only=True)` reads it and nothing in a checkpoint can run code.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.trainer.states import TrainerFn

from .errors import UserError

CHECKPOINT_FORMAT = 1
TMP_PREFIX = ".tmp-"
LAST = "last.ckpt"
BEST = "best.ckpt"


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable; not every platform lets a directory be opened.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomically(path: str | os.PathLike, write: Callable[[Any], None]) -> None:
    """Call write(file) on a temporary file beside `path`, make it durable, then rename it over `path`.

    A process killed at any moment leaves either the old file or the complete new one under
    `path`, never a truncated file that looks like a checkpoint.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX, suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        if os.path.exists(tmp_name):
            os.remove(tmp_name)
        raise
    _fsync_directory(path.parent)


def copy_atomically(source: str | os.PathLike, target: str | os.PathLike) -> None:
    with open(source, "rb") as src:
        write_atomically(target, lambda dst: shutil.copyfileobj(src, dst))


# What a refusal by torch.load(weights_only=True) is about, in the forms torch 2.6+ words it. The
# rest of its message is the same for every file and advises weights_only=False or allowlisting
# the global: exactly what must not be done with a file that fails here, so it is not shown.
_WEIGHTS_ONLY_DETAIL = (
    re.compile(r"WeightsUnpickler error:\s*(.+?)(?:\.\s*Please use|\n\n|$)", re.S),
    re.compile(r"(Trying to load unsupported GLOBAL[^\n]*)"),
)


def load_error_message(where: str, path: str | os.PathLike, error: BaseException, fix: str) -> str:
    """One line saying why torch.load(path, weights_only=True) failed: `<where>: <reason>; <fix>`."""
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        return f"{where}: the file is empty; {fix}"
    text = str(error)
    details = [match.group(1) for pattern in _WEIGHTS_ONLY_DETAIL for match in [pattern.search(text)] if match]
    # torch's zip reader appends a paragraph on what corruption is: the one line keeps the fact.
    text = text.split(" This is an internal miniz error")[0]
    reason = " ".join((details[0] if details else text).split()) or type(error).__name__
    reason = reason if len(reason) <= 200 else reason[:197] + "..."
    if isinstance(error, pickle.UnpicklingError) and "GLOBAL" in reason:
        return (
            f"{where}: refused: it holds Python objects, not only tensors and plain data ({reason}), and loading "
            f"such a file can run code; {fix}"
        )
    return f"{where}: not a readable minitx checkpoint ({type(error).__name__}: {reason}); {fix}"


def safe_torch_load(path: str | os.PathLike, map_location: Any = "cpu") -> Any:
    """torch.load(path, weights_only=True): tensors and plain data only, never code."""
    with warnings.catch_warnings():
        # A foreign pickle makes torch warn about its protocol before refusing it: the refusal
        # is the message, the warning would only add lines to it.
        warnings.filterwarnings("ignore", message=r".*pickle protocol")
        return torch.load(path, map_location=map_location, weights_only=True)


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict:
    """torch.load with weights_only=True, and a one-line UserError for a missing or broken file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"ckpt_path: no checkpoint at {str(path)!r}; check the path")
    try:
        return safe_torch_load(path, map_location=map_location)
    except Exception as err:  # truncated zip, foreign pickle, ...: all mean "not a checkpoint we wrote"
        raise UserError(load_error_message(f"ckpt_path: {str(path)!r}", path, err, "give last.ckpt or best.ckpt written by train.py")) from None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint IO, with atomic writes and weights_only=True reads.

    Every save path of the Trainer (our callback, `trainer.save_checkpoint`, any ModelCheckpoint
    a user adds) goes through the strategy's CheckpointIO, so this one plugin covers them all.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options")
        write_atomically(path, lambda file: torch.save(checkpoint, file))

    def load_checkpoint(self, path: Any, map_location: Any = lambda storage, loc: storage, weights_only: Optional[bool] = None) -> dict[str, Any]:
        # weights_only is forced: a checkpoint is data, never code, whatever the caller asked for.
        return load_checkpoint(path, map_location=map_location)


def remove_stale_temporaries(directory: Path) -> None:
    """Delete temporary files left by a process killed while writing a checkpoint."""
    for tmp in directory.glob(f"{TMP_PREFIX}*"):
        try:
            tmp.unlink()
        except OSError:
            pass


class RunCheckpoints(Checkpoint):
    """Keeps `last.ckpt` and `best.ckpt` (lowest val_loss) in `dirpath`.

    last.ckpt is written every `every_n_steps` optimiser steps (0: never on a timer), after every
    validation and when training ends; best.ckpt is a copy of last.ckpt made when a validation
    beats the best val_loss so far. With `keep_every_n_steps`, the timed checkpoints are also
    kept as step-<N>.ckpt. Saves happen only at optimiser-step boundaries, which is what makes a
    resumed run draw exactly the batches and dropout masks of an uninterrupted one.

    A `Checkpoint` subclass, so the Trainer adds no ModelCheckpoint of its own.
    """

    def __init__(self, dirpath: str | os.PathLike, every_n_steps: int = 0, keep_every_n_steps: bool = False, monitor: str = "val_loss"):
        super().__init__()
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps
        self.keep_every_n_steps = keep_every_n_steps
        self.monitor = monitor
        self.best_score: Optional[float] = None
        self.best_step: Optional[int] = None
        self._last_saved_step = -1

    @property
    def last_path(self) -> Path:
        return self.dirpath / LAST

    @property
    def best_path(self) -> Path:
        return self.dirpath / BEST

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.is_global_zero:
            self.dirpath.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(self.dirpath)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_saved_step = trainer.global_step  # a resumed run does not rewrite what it loaded

    def _save_last(self, trainer: L.Trainer, force: bool = False) -> None:
        if self._last_saved_step == trainer.global_step and not force:
            return
        # Every rank calls save_checkpoint: strategies may gather state; only rank 0 writes.
        trainer.save_checkpoint(self.last_path, weights_only=False)
        self._last_saved_step = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if self.every_n_steps < 1 or step % self.every_n_steps or step == self._last_saved_step:
            return
        self._save_last(trainer)
        if self.keep_every_n_steps:
            self._copy(trainer, self.last_path, self.dirpath / f"step-{step:07d}.ckpt")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        score = trainer.callback_metrics.get(self.monitor)
        improved = score is not None and (self.best_score is None or float(score) < self.best_score)
        if improved:
            # Recorded before saving, so that best.ckpt itself knows it is the best.
            self.best_score, self.best_step = float(score), trainer.global_step
        # Written even if a timed save happened at this step: the state after validation (best
        # score, loop counters) is the one a resumed run must start from.
        self._save_last(trainer, force=True)
        if improved:
            self._copy(trainer, self.last_path, self.best_path)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save_last(trainer)

    def _copy(self, trainer: L.Trainer, source: Path, target: Path) -> None:
        if trainer.is_global_zero:
            copy_atomically(source, target)
        trainer.strategy.barrier("RunCheckpoints.copy")

    def state_dict(self) -> dict[str, Any]:
        return {"best_score": self.best_score, "best_step": self.best_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best_score = state_dict.get("best_score")
        self.best_step = state_dict.get("best_step")
