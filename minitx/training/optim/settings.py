"""The optimiser and schedule settings, the model.* keys of a config (`model.lr`, ...), with their
checks: Optimisation, the one declaration that MinitxLM, its schedule, the train command's keys
and the resume checks read.

Optimisation is made of the settings every optimiser and the schedule share (SharedSettings) and
each registered optimiser's own (muon.MuonSettings, ...; registry.OPTIMISER_SETTINGS), so an
optimiser's settings are declared in its file and reach the config through its registration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from ...errors import UserError
from .groups import Parameters
from .registry import OPTIMISER_SETTINGS, OPTIMIZERS
from .schedules import DECAY_SHAPES, SCHEDULES, lr_at


@dataclass(frozen=True)
class SharedSettings:
    """The settings every optimiser and the schedule read.

    Args:
        lr: AdamW's peak learning rate (the schedule scales Muon's muon_lr by the same factor).
        min_lr: final learning rate of the schedule.
        warmup_steps: optimiser steps of linear warmup.
        weight_decay: AdamW decay on matrices only (see minitx.training.optim.decays).
        betas: AdamW's betas.
        eps: AdamW's eps.
        optimizer: "adamw" for every parameter, or "muon": torch.optim.Muon on the hidden matrices
            (minitx.training.optim.muon_matrix) and AdamW on the rest.
        schedule: after the warmup, "cosine" down to min_lr over the run, or "wsd": lr held,
            then down to min_lr over the last decay_steps (or decay_fraction of max_steps).
        decay_steps: wsd's decay in steps; when unset, decay_fraction * max_steps.
        decay_fraction: wsd's decay as a fraction of max_steps (0 holds lr to the end).
        decay_shape: wsd's decay, "linear" or "1-sqrt" (lr - (lr - min_lr) * sqrt(progress)).
    """

    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    # The settings below came later. A checkpoint or config without them ran with these values,
    # so they are also what an older run resumes with (ADDED_LATER): change them only with a
    # mapping for older runs.
    optimizer: str = "adamw"
    schedule: str = "cosine"
    decay_steps: int | None = None
    decay_fraction: float = 0.2
    decay_shape: str = "linear"


def _args(cls: type) -> str:
    """The "Args:" entries of a settings dataclass's docstring, as they stand there."""
    return cls.__doc__.split("Args:\n", 1)[1].rstrip()


@dataclass(frozen=True)
class Optimisation(*OPTIMISER_SETTINGS, SharedSettings):
    """The optimiser and schedule settings (see the top of this file).

    Args:
    """

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))  # a config gives a list
        self.check()

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> Optimisation:
        """The settings among `settings` (a config's model section, a module's hparams: other keys
        are ignored); one it lacks, from an older run, takes its default."""
        return cls(**{name: settings[name] for name in cls.names() if name in settings})

    def check(self, prefix: str = "model") -> None:
        """Each setting's check; errors name `<prefix>.<setting>` and say the fix."""

        def fail(name: str, fix: str) -> None:
            value = getattr(self, name)
            shown = (
                repr(value) if isinstance(value, str) else list(value) if isinstance(value, tuple) else value
            )
            raise UserError(f"{prefix}.{name}: is {shown}; {fix}")

        if not self.lr > 0:
            fail("lr", "use a positive learning rate such as 1e-3")
        if not 0 <= self.min_lr <= self.lr:
            fail("min_lr", f"use a value between 0 and {prefix}.lr={self.lr}")
        if self.warmup_steps < 0:
            fail("warmup_steps", "use 0 or more")
        if self.weight_decay < 0:
            fail("weight_decay", "use 0 or more")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            fail("betas", "use two numbers in [0, 1), e.g. [0.9, 0.95]")
        if not (self.eps > 0 and math.isfinite(self.eps)):
            fail("eps", "use a small positive number such as 1e-8")
        if self.optimizer not in OPTIMIZERS:
            fail("optimizer", f"use one of {', '.join(sorted(OPTIMIZERS))}")
        for part in OPTIMISER_SETTINGS:
            part.check_part(self, fail)
        if self.schedule not in SCHEDULES:
            fail("schedule", f"use one of {', '.join(SCHEDULES)}")
        if self.decay_steps is not None and self.decay_steps < 0:
            fail("decay_steps", f"use 0 or more, or leave it unset to use {prefix}.decay_fraction")
        if not 0 <= self.decay_fraction <= 1:
            fail("decay_fraction", "use a fraction of max_steps in [0, 1], e.g. 0.2")
        if self.decay_shape not in DECAY_SHAPES:
            fail("decay_shape", f"use one of {', '.join(DECAY_SHAPES)}")

    def all_warmup(self, max_steps: int | None) -> str:
        """Why a run of `max_steps` is all warmup (the warmup as long as the run or longer: its
        rate never reaches the peak, or only at the last step, and never decays), in one line;
        "" where it is not, or where max_steps is unset. A sweep refuses such a run, as a designed
        sweep's budget does (its arms would be compared in their warmups); `train` warns and
        trains, since a few steps to see that training starts are a run of their own."""
        if not max_steps or max_steps < 1 or self.warmup_steps < max_steps:
            return ""
        reached = self.lr_at(max_steps - 1, max_steps) / self.lr
        return (
            f"model.warmup_steps {self.warmup_steps} is not less than trainer.max_steps {max_steps}: the run is all "
            f"warmup, its learning rate ending at {reached:.0%} of the peak model.lr, never decayed; lower "
            "model.warmup_steps or raise trainer.max_steps"
        )

    def lr_at(self, step: int, max_steps: int) -> float:
        """The peak lr's value at optimiser step `step` of a run of `max_steps` (see schedules.lr_at)."""
        return lr_at(
            step,
            self.lr,
            self.min_lr,
            self.warmup_steps,
            max_steps,
            schedule=self.schedule,
            decay_steps=self.decay_steps,
            decay_fraction=self.decay_fraction,
            decay_shape=self.decay_shape,
        )

    def configure(self, params: Parameters, max_steps: int) -> dict:
        """The optimiser over `params` and a LambdaLR stepped every optimiser step, as
        configure_optimizers returns them. Every group's lr is its initial lr times
        lr_at(step) / lr, so AdamW's and Muon's groups move by the same factor."""
        optimizer = OPTIMIZERS[self.optimizer].build(self, params)

        def factor(step: int) -> float:  # a plain function: LambdaLR saves no state of it
            return self.lr_at(step, max_steps) / self.lr

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
        }


# Its docstring's "Args:" (MinitxLM's docstring and --help show them): the shared settings' and
# each optimiser's, in the order of the fields.
Optimisation.__doc__ += "\n".join(_args(part) for part in (SharedSettings, *OPTIMISER_SETTINGS)) + "\n"

DEFAULTS = Optimisation()
# Settings a checkpoint of an older minitx may lack: it ran with their defaults. The first six
# are as old as the optimiser.
FIRST_SETTINGS = ("lr", "min_lr", "warmup_steps", "weight_decay", "betas", "eps")
ADDED_LATER = tuple(name for name in Optimisation.names() if name not in FIRST_SETTINGS)
