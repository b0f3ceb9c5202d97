"""Ctrl-C during training: finish the optimiser step under way, save last.ckpt, exit with status 130.

Lightning turns a KeyboardInterrupt inside fit into exit status 1, like a crash, and a
KeyboardInterrupt can land in the middle of an optimiser update, where no checkpoint is
consistent. So while a run trains, SIGINT only sets a flag; at the end of the step the run writes
last.ckpt through its atomic save (a whole checkpoint of that step that resumes exactly, as after
a timed save), stops as if max_steps were reached, and `main` raises `RunInterrupted`,
which the command layer reports in one line with status 130. A second Ctrl-C stops at once.

With several processes (DDP), the processes agree at every step on whether any of them was
interrupted (one all-reduce of a flag), so they all stop at the same step.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from ..files.checkpoint import LAST


class RunInterrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C; the message says where the last checkpoint is."""


class StopOnInterrupt(Callback):
    def __init__(self) -> None:
        self.requested = False

    def _on_sigint(self, *_: Any) -> None:  # a signal handler: (signum, frame)
        if self.requested:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now
        self.requested = True

    @contextmanager
    def installed(self) -> Iterator[StopOnInterrupt]:
        """SIGINT sets the flag while the block runs (only the main thread can take signals)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        stop = self.requested
        if trainer.world_size > 1:
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if stop:
            self.requested = True
            # Saved here, where the run's timed saves happen (a checkpoint written later, at the end
            # of fit, resumes one step early); then stopped as at max_steps, without the validation
            # Lightning runs when a run stops early, whose save would replace this checkpoint.
            trainer.checkpoint_callback._save_last(trainer)
            trainer.limit_val_batches = 0
            trainer.should_stop = True

    def message(self, trainer: L.Trainer, checkpoint_dir: Path) -> str:
        last = checkpoint_dir / LAST
        if not last.is_file():
            return (
                f"at step {trainer.global_step}, before the run saved a checkpoint; start it again to train"
            )
        return f"at step {trainer.global_step}; the last checkpoint is {last}: continue with --ckpt_path last"
