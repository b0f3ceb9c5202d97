"""Training progress on stdout: a bar in steps on a terminal, plain lines everywhere else.

Lightning's bar counts batches of an epoch, which a run bounded in steps never finishes (it reads
"Epoch 0/-2 ... v_num"), and under nohup, Slurm or CI a bar's carriage returns make no lines at
all. Both callbacks count optimiser steps out of trainer.max_steps:

    train:  12%|██▍       | 600/5000 [01:02<07:38, train_loss=2.10, tokens_per_sec=1.2e+04, val_loss=2.25]
    minitx: step 600/5000 (12%), loss 2.1034, 12,345 tokens/s, elapsed 1m02s, ETA 7m38s
    minitx: step 750/5000 (15%), val loss 2.2512 (perplexity 9.50)

Each validation of the fit gets its line, in both (above the bar on a terminal). The lines' ETA
is the time left at the pace of the recent steps (`RecentPace`), not of all steps since the start:
on a machine whose load changes, the mean of the whole run is slow to see it.

`progress_callback` picks one for where stdout goes; trainer.enable_progress_bar false turns
both off, as it turns off Lightning's bar.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar

from ..wording import duration

# Off a terminal: a line at every log_every_n_steps-th step, but not more often than this, so a
# fast run's log stays readable; the last step always gets its line.
MIN_SECONDS_BETWEEN_LINES = 10.0


def _metric(trainer: L.Trainer, name: str) -> float | None:
    value = trainer.callback_metrics.get(name, trainer.progress_bar_metrics.get(name))
    return None if value is None else float(value)


def validation_line(trainer: L.Trainer) -> str | None:
    """`step 750/5000 (15%), val loss 2.2512 (perplexity 9.50)`, with a task's accuracy, for the
    validation that just ended inside fit; None for the sanity check, a validation outside fit
    (the command prints the final one itself) and one with no loss."""
    if trainer.sanity_checking or trainer.state.fn != "fit":
        return None
    loss = _metric(trainer, "val_loss")
    if loss is None:
        return None
    step, total = trainer.global_step, trainer.max_steps
    parts = [f"step {step}/{total} ({100 * step // max(total, 1)}%)", f"val loss {loss:.4f}"]
    parts[-1] += f" (perplexity {math.exp(loss):.2f})" if loss < 50 else ""
    if (accuracy := _metric(trainer, "val_accuracy")) is not None:
        parts.append(f"val accuracy {accuracy:.4f}")
    return ", ".join(parts)


def validation_every(trainer: L.Trainer) -> int | None:
    """The optimiser steps between validations, where val_check_interval counts batches (an int,
    as train.py's configs give it); None where it is a fraction of an epoch or validation is off."""
    interval = getattr(trainer, "val_check_interval", None)
    if not isinstance(interval, int) or isinstance(interval, bool) or not trainer.limit_val_batches:
        return None
    return max(1, interval // max(1, int(trainer.accumulate_grad_batches or 1)))


# How quickly the ETA follows a change of pace: a step's time counts half as much 10 steps later.
# Lines come every log_every_n_steps (10 by default), so four lines after a machine slows down the
# ETA has taken 94% of the new pace, while one step twice as slow as the rest moves it by 7%.
HALF_LIFE_STEPS = 10


class RecentPace:
    """Seconds per optimiser step, averaged with weights that halve every HALF_LIFE_STEPS steps,
    and the time of a validation, kept apart: a validation stops the steps for as long as it takes
    every val_check_interval, and counted in the steps' pace it would make the ETA jump after each.

    The first step after the start (or a resume) is left out: it holds the compile, the first
    batches' loading and the allocator's warm-up, which no later step repeats.
    """

    def __init__(self, half_life_steps: float = HALF_LIFE_STEPS):
        self.decay = 0.5 ** (1.0 / half_life_steps)
        self.seconds_per_step: float | None = None
        self.validation_seconds: float | None = None  # of the latest validation
        self.steps_between_validations: int | None = None
        self._step: int | None = None  # the step at the latest mark, and its time
        self._time = 0.0
        self._validation_start: float | None = None
        self._validated_at: int | None = None
        self._first = 0  # the step this process started from

    def start(self, step: int, now: float) -> None:
        self._step, self._time = None, now  # None: the next step is the first, not counted
        self._first = step

    def step(self, step: int, now: float) -> None:
        if self._step is None:  # the first step of this process
            if step > self._first:
                self._step, self._time = step, now
            return
        done = step - self._step
        if done <= 0:
            return  # micro-batches of one step under gradient accumulation
        per_step, keep, pace = (now - self._time) / done, self.decay**done, self.seconds_per_step
        self.seconds_per_step = per_step if pace is None else keep * pace + (1 - keep) * per_step
        self._step, self._time = step, now

    def validation_started(self, now: float) -> None:
        self._validation_start = now

    def validation_ended(self, step: int, now: float) -> None:
        if self._validation_start is None:
            return
        self.validation_seconds = now - self._validation_start
        self._validation_start = None
        if self._validated_at is not None and step > self._validated_at:
            self.steps_between_validations = step - self._validated_at
        self._validated_at = step
        self._time += self.validation_seconds  # the steps' clock stops while validating

    def seconds_left(self, step: int, total: int, every: int | None = None) -> float | None:
        """The time to step `total` from `step` at the recent pace, the validations still to come
        (one each `every` steps, or as often as they came so far) included; None until a step has
        been timed."""
        if self.seconds_per_step is None or step >= total:
            return None
        left = (total - step) * self.seconds_per_step
        every = every or self.steps_between_validations
        if self.validation_seconds is not None and every:  # the validations ahead, the last step's included
            left += (total // every - step // every) * self.validation_seconds
        return left


class StepProgressLines(ProgressBar):
    """A plain line every `every_n_steps` optimiser steps (default: trainer.log_every_n_steps),
    at most one per MIN_SECONDS_BETWEEN_LINES, and at the last step: step/max, train loss,
    tokens/s, time elapsed and the time left at the pace of this process's steps so far."""

    def __init__(
        self,
        every_n_steps: int | None = None,
        stream: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__()
        self.every_n_steps = every_n_steps
        self.stream = stream
        self.clock = clock
        self.pace = RecentPace()
        self._enabled = True
        self._started = 0.0
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
        self._started = self._last_line = self.clock()
        self.pace.start(trainer.global_step, self._started)  # a resumed run: the pace of its own steps

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.pace.validation_started(self.clock())

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self.pace.validation_ended(trainer.global_step, self.clock())
        line = validation_line(trainer) if self._enabled and trainer.is_global_zero else None
        if line is not None:
            self.write(line)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._enabled or not trainer.is_global_zero:
            return
        step, total = trainer.global_step, trainer.max_steps
        every = max(1, self.every_n_steps or trainer.log_every_n_steps or 1)
        now = self.clock()
        self.pace.step(step, now)
        if step < total and (step % every or now - self._last_line < MIN_SECONDS_BETWEEN_LINES):
            return
        if step == self._printed_step:
            return  # micro-batches of one step under gradient accumulation
        self._printed_step, self._last_line = step, now
        self.line(trainer, step, total, now - self._started)

    def line(self, trainer: L.Trainer, step: int, total: int, elapsed: float) -> None:
        loss, speed = _metric(trainer, "train_loss"), _metric(trainer, "tokens_per_sec")
        left = self.pace.seconds_left(step, total, validation_every(trainer))
        parts = [
            f"step {step}/{total} ({100 * step // max(total, 1)}%)",
            None if loss is None else f"loss {loss:.4f}",
            None if speed is None else f"{speed:,.0f} tokens/s",
            f"elapsed {duration(elapsed, compact=True)}",
            None if left is None else f"ETA {duration(left, compact=True)}",
        ]
        self.write(", ".join(part for part in parts if part))

    def write(self, line: str) -> None:
        stream = self.stream or sys.stdout
        stream.write("minitx: " + line + "\n")
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

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        line = validation_line(trainer) if trainer.is_global_zero else None
        bar = self._train_progress_bar
        if line is not None and bar is not None and not bar.disable:
            bar.write("minitx: " + line)  # above the bar, which stays where it is

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items


def progress_callback(stream: Any = None) -> ProgressBar:
    """The bar when stdout is a terminal, plain lines otherwise (a log file, a pipe, CI)."""
    stream = stream or sys.stdout
    isatty = getattr(stream, "isatty", None)
    return StepProgressBar() if isatty is not None and isatty() else StepProgressLines()
