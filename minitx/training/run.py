"""How a run saves: its trainer's directory, checkpointing and loggers (the `run` section's
settings are runsection.py's; the run directory's layout is minitx/files/checkpoint.py's).

Saving goes through `AtomicCheckpointIO` (every save path of the Trainer: atomic writes,
weights_only=True reads) and `RunCheckpoints` decides when (the file format: minitx/files/checkpoint.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Checkpoint, ModelSummary, ProgressBar
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.model_summary.model_summary import get_human_readable_count

from ..files.atomic import copy_atomically, write_atomically
from ..files.checkpoint import BEST, LAST, load_file, remove_stale_temporaries
from .progress import progress_callback
from .runsection import RunSettings


class ParameterSummary(ModelSummary):
    """Lightning's model summary without its FLOPs column and "Total FLOPs: 0" line: Lightning
    counts FLOPs only by running an example input the module declares, which MinitxLM does not;
    the run's progress gives MFU from Transformer.flops_per_token instead."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        **_: Any,  # total_flops, and what Lightning's summary options add
    ) -> None:
        columns = [(name, values) for name, values in summary_data if name != "FLOPs"]
        widths = [max([len(name), *(len(v) for v in values)]) for name, values in columns]
        rows = [[name for name, _ in columns], *zip(*(values for _, values in columns))]
        lines = [" | ".join(f"{cell:<{w}}" for cell, w in zip(row, widths)).rstrip() for row in rows]
        rule = "-" * max(len(line) for line in lines)
        totals = [
            (get_human_readable_count(trainable_parameters), "Trainable params"),
            (get_human_readable_count(total_parameters - trainable_parameters), "Non-trainable params"),
            (get_human_readable_count(total_parameters), "Total params"),
            (f"{model_size:,.3f}", "Total estimated model params size (MB)"),
            (str(total_training_modes["train"]), "Modules in train mode"),
            (str(total_training_modes["eval"]), "Modules in eval mode"),
        ]
        text = [lines[0], rule, *lines[1:], rule, *(f"{value:<10} {what}" for value, what in totals)]
        print("\n".join(text), flush=True)


def trainer_arguments(run: RunSettings, config: dict[str, Any]) -> dict[str, Any]:
    """The trainer's arguments with the run's directory, checkpointing and loggers filled in."""
    config = dict(config)
    config["default_root_dir"] = str(run.dir)
    checkpoints = RunCheckpoints(
        run.checkpoint_dir, run.checkpoint_every_n_steps, run.keep_every_n_steps, run.keep_steps or ()
    )
    callbacks = config["callbacks"] = [*(config.get("callbacks") or []), checkpoints]
    if config.get("enable_model_summary") is not False and not any(
        isinstance(c, ModelSummary) for c in callbacks
    ):
        # Ours instead of Lightning's default (which is then off: no note that one was given).
        callbacks.append(ParameterSummary())
        config["enable_model_summary"] = False
    if config.get("enable_progress_bar") is not False and not any(
        isinstance(c, ProgressBar) for c in callbacks
    ):
        # Ours counts steps out of max_steps, and writes lines where stdout is no terminal.
        callbacks.append(progress_callback())
    plugins = config.get("plugins") or []
    config["plugins"] = (list(plugins) if isinstance(plugins, list) else [plugins]) + [AtomicCheckpointIO()]
    if config.get("logger") in (None, True):
        csv = CSVLogger(save_dir=str(run.dir), name="logs")
        loggers: list = [csv]
        if run.tensorboard:
            # Into the CSV logs' version_<k>/, not the next one after it. No graph (log_graph's
            # default) and no hp_metric placeholder: the scalars the CSV logs hold.
            loggers.append(
                TensorBoardLogger(str(run.dir), name="logs", version=csv.version, default_hp_metric=False)
            )
        if run.wandb:
            # WANDB_DIR, when set, wins: the user asked for W&B files to go there.
            wandb = dict(project=run.wandb_project, name=run.name, group=run.wandb_group)
            loggers.append(WandbLogger(save_dir=os.environ.get("WANDB_DIR", str(run.dir)), **wandb))
        config["logger"] = loggers
    return config


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint IO, with atomic writes and weights_only=True reads.

    Every save path of the Trainer (our callback, `trainer.save_checkpoint`, any ModelCheckpoint
    a user adds) goes through the strategy's CheckpointIO, so this one plugin covers them all.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options")
        write_atomically(path, lambda file: torch.save(checkpoint, file))

    def load_checkpoint(self, path: Any, map_location: Any = "cpu", **_: Any) -> dict[str, Any]:
        # weights_only is forced: a checkpoint is data, never code, whatever the caller asked for.
        return load_file(
            path, f"ckpt_path: {str(path)!r}", "give last.ckpt or best.ckpt written by train.py", map_location
        )


class RunCheckpoints(Checkpoint):
    """Keeps `last.ckpt` and `best.ckpt` (lowest val_loss) in `dirpath`.

    last.ckpt is written every `every_n_steps` optimiser steps (0: never on a timer), after every
    validation and when training ends; best.ckpt is a copy of last.ckpt made when a validation
    beats the best val_loss so far. The last step is always validated inside fit, so every run
    ends with both files and best.ckpt judged against the final weights too. With `keep_every_n_steps`, the timed checkpoints are also
    kept as step-<N>.ckpt, and so is the checkpoint at each of `keep_steps`. Saves happen only at optimiser-step boundaries, which is what makes a
    resumed run draw exactly the batches and dropout masks of an uninterrupted one.

    A `Checkpoint` subclass, so the Trainer adds no ModelCheckpoint of its own.
    """

    def __init__(
        self,
        dirpath: str | os.PathLike,
        every_n_steps: int = 0,
        keep_every_n_steps: bool = False,
        keep_steps: Sequence[int] = (),
    ):
        super().__init__()
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps
        self.keep_every_n_steps = keep_every_n_steps
        self.keep_steps = set(keep_steps)
        self.last_path, self.best_path = self.dirpath / LAST, self.dirpath / BEST
        self.best_score: float | None = None
        self.best_step: int | None = None
        self._last_saved_step = -1

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

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if trainer.max_steps is not None and 0 < trainer.max_steps <= step:
            # Stopping here makes Lightning validate inside fit at the last step (as it does for
            # an early stop): on_validation_end then judges the final weights for best.ckpt, so a
            # run shorter than val_check_interval still ends with both files and a final
            # validation that beats the earlier ones updates best.ckpt.
            trainer.should_stop = True
        timed = self.every_n_steps > 0 and step % self.every_n_steps == 0
        kept = step in self.keep_steps
        if kept or (timed and step != self._last_saved_step):
            self._save_last(trainer)
            if kept or self.keep_every_n_steps:
                self._copy(trainer, self.last_path, self.step_path(step))

    def step_path(self, step: int) -> Path:
        return self.dirpath / f"step-{step:07d}.ckpt"

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        score = trainer.callback_metrics.get("val_loss")
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

    def validated_after_fit(self, trainer: L.Trainer, score: float) -> None:
        """A validation run after fit (trainer.validate) of the weights last.ckpt holds: best.ckpt
        becomes that file when the score beats the best so far, or when there is no best.ckpt yet,
        so that every run ends with both files."""
        if self.best_score is None or score < self.best_score or not self.best_path.is_file():
            self.best_score, self.best_step = score, trainer.global_step
            if self.last_path.is_file():
                self._copy(trainer, self.last_path, self.best_path)

    def _copy(self, trainer: L.Trainer, source: Path, target: Path) -> None:
        if trainer.is_global_zero:
            copy_atomically(source, target)
        trainer.strategy.barrier("RunCheckpoints.copy")

    def state_dict(self) -> dict[str, Any]:
        return {"best_score": self.best_score, "best_step": self.best_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best_score = state_dict.get("best_score")
        self.best_step = state_dict.get("best_step")
