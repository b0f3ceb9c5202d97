"""How a training run saves: Lightning's checkpoint IO made atomic, and the callback that keeps
last.ckpt and best.ckpt (the files themselves: minitx/checkpoint.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.trainer.states import TrainerFn

from .checkpoint import BEST, LAST, TMP_PREFIX, copy_atomically, load_file, remove_stale_temporaries, write_atomically


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
        return load_file(path, f"ckpt_path: {str(path)!r}", "give last.ckpt or best.ckpt written by train.py", map_location)


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
