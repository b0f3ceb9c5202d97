"""Training progress on stdout: a bar in steps on a terminal, plain lines everywhere else.

Lightning's bar counts batches of an epoch, which a run bounded in steps never finishes (it reads
"Epoch 0/-2 ... v_num"), and under nohup, Slurm or CI a bar's carriage returns make no lines at
all. Both callbacks count optimiser steps out of trainer.max_steps:

    train:  12%|██▍       | 600/5000 [01:02<07:38, train_loss=2.10, tokens_per_sec=1.2e+04, val_loss=2.25]
    minitx: step 600/5000 (12%), loss 2.1034, 12,345 tokens/s, elapsed 1m02s, ETA 7m38s

`progress_callback` picks one for where stdout goes; trainer.enable_progress_bar false turns
both off, as it turns off Lightning's bar.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar

# Off a terminal: a line at every log_every_n_steps-th step, but not more often than this, so a
# fast run's log stays readable; the last step always gets its line.
MIN_SECONDS_BETWEEN_LINES = 10.0


def duration(seconds: float) -> str:
    """1h02m, 3m05s, 42s: the width of a log column, no fractions."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _metric(trainer: L.Trainer, name: str) -> float | None:
    value = trainer.callback_metrics.get(name, trainer.progress_bar_metrics.get(name))
    return None if value is None else float(value)


class StepProgressLines(ProgressBar):
    """A plain line every `every_n_steps` optimiser steps (default: trainer.log_every_n_steps),
    at most one per MIN_SECONDS_BETWEEN_LINES, and at the last step: step/max, train loss,
    tokens/s, time elapsed and the time left at the pace of this process's steps so far."""

    def __init__(self, every_n_steps: int | None = None, stream: Any = None):
        super().__init__()
        self.every_n_steps = every_n_steps
        self.stream = stream
        self._enabled = True
        self._started = 0.0
        self._first_step = 0
        self._last_line = 0.0
        self._printed_step: int | None = None

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started = self._last_line = time.monotonic()
        self._first_step = trainer.global_step  # a resumed run: its pace is that of its own steps

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._enabled or not trainer.is_global_zero:
            return
        step, total = trainer.global_step, trainer.max_steps
        every = max(1, self.every_n_steps or trainer.log_every_n_steps or 1)
        now = time.monotonic()
        last = step >= total
        if not last and (step % every or now - self._last_line < MIN_SECONDS_BETWEEN_LINES):
            return
        if step == self._printed_step:
            return  # micro-batches of one step under gradient accumulation
        self._printed_step = step
        self._last_line = now
        self.line(trainer, step, total, now - self._started)

    def line(self, trainer: L.Trainer, step: int, total: int, elapsed: float) -> None:
        parts = [f"step {step}/{total} ({100 * step // max(total, 1)}%)"]
        loss = _metric(trainer, "train_loss")
        if loss is not None:
            parts.append(f"loss {loss:.4f}")
        speed = _metric(trainer, "tokens_per_sec")
        if speed is not None:
            parts.append(f"{speed:,.0f} tokens/s")
        parts.append(f"elapsed {duration(elapsed)}")
        done = step - self._first_step
        if done > 0 and step < total:
            parts.append(f"ETA {duration(elapsed / done * (total - step))}")
        stream = self.stream or sys.stdout
        stream.write("minitx: " + ", ".join(parts) + "\n")
        stream.flush()


class StepProgressBar(TQDMProgressBar):
    """Lightning's bar, counting optimiser steps out of max_steps (tqdm adds elapsed and ETA);
    its postfix shows the train loss, tokens/s and the latest val loss, without v_num."""

    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        bar = self.train_progress_bar
        bar.reset(total=trainer.max_steps)
        # A resumed run starts part way: tqdm's rate and ETA then cover this process's steps only.
        bar.initial = bar.n = trainer.global_step
        bar.set_description("train")
        bar.refresh()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        bar = self.train_progress_bar
        if bar is not None and not bar.disable and step != bar.n and self._should_update(step, bar.total):
            bar.n = step
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
            bar.refresh()

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items


def progress_callback(stream: Any = None) -> ProgressBar:
    """The bar when stdout is a terminal, plain lines otherwise (a log file, a pipe, CI)."""
    stream = stream or sys.stdout
    isatty = getattr(stream, "isatty", None)
    return StepProgressBar() if isatty is not None and isatty() else StepProgressLines()
