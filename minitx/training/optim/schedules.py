"""The learning-rate schedules (model.schedule), both after a linear warmup: `cosine` decays to
min_lr over the whole run; `wsd` (warmup-stable-decay) holds the peak lr and decays only over the
last steps (decay_steps, or decay_fraction of max_steps). The schedule multiplies every parameter
group's lr by the same factor, so Muon's lr follows AdamW's. A function of the step, never state:
a resumed run follows its own schedule (apply_schedule).

lr_at's keyword defaults are settings.Optimisation's (tests/training/test_recipe.py holds them equal).
"""

from __future__ import annotations

import math

import torch

SCHEDULES = ("cosine", "wsd")
DECAY_SHAPES = ("linear", "1-sqrt")


def apply_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """Set every group's lr to the schedule's value at the scheduler's step. A checkpoint holds
    the lr its run computed; a run resumed with another max_steps (or decay) must take its first
    step at the lr of its own schedule, not the one it was saved with. An unchanged resume
    computes the same value, so exact resumption is kept."""
    lrs = [base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, value in zip(scheduler.optimizer.param_groups, lrs):
        group["lr"] = value
    scheduler._last_lr = lrs


def lr_at(
    step: int,
    lr: float,
    min_lr: float,
    warmup_steps: int,
    max_steps: int,
    schedule: str = "cosine",
    decay_steps: int | None = None,
    decay_fraction: float = 0.2,
    decay_shape: str = "linear",
) -> float:
    """The learning rate of optimiser step `step`: linear warmup from lr/warmup_steps to lr over
    `warmup_steps`, then to `min_lr` at `max_steps` (and min_lr after that), by

    - "cosine": a cosine over all steps after the warmup;
    - "wsd" (warmup-stable-decay): lr until the last `decay_steps` steps (or the last
      `decay_fraction` of max_steps when decay_steps is None), then down to min_lr, in a straight
      line ("linear") or as 1 - sqrt(progress) ("1-sqrt", which drops faster at the start).

    The stages follow from max_steps as given, so a wsd run resumed with a larger max_steps stays
    at lr until its new decay starts: the schedule is a function, never state in a checkpoint.
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    if schedule == "cosine":
        progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
    decay = decay_steps if decay_steps is not None else round(decay_fraction * max_steps)
    start = max(warmup_steps, max_steps - decay)  # a decay longer than the run starts after warmup
    if step < start:
        return lr
    progress = (step - start) / max(1, max_steps - start)
    drop = progress if decay_shape == "linear" else math.sqrt(progress)
    return lr - drop * (lr - min_lr)
