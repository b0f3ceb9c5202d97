"""The optimiser and schedule settings, the model.* keys of a config (`model.lr`, ...), with their
checks: Optimisation, the one declaration that MinitxLM, its schedule, the train command's keys
and the resume checks read.

Optimisation is the settings every optimiser and the schedule share (SharedSettings: model.lr,
model.optimizer, ...) and, under model.optimizer_options.<name>, each registered optimiser's own
(muon.MuonSettings: model.optimizer_options.muon.lr, ...), as an attention kind's options sit
under model.attention.options.<kind>. An optimiser's settings are declared in its file and reach
the config through its entry in registry.OPTIMIZERS; minitx/options.py builds and checks them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from ...errors import UserError
from ...options import build_options, build_sections, check_options_class, fail
from .groups import Parameters
from .registry import OPTIMIZERS
from .schedules import DECAY_SHAPES, SCHEDULES, lr_at


@dataclass(frozen=True)
class SharedSettings:
    """The settings every optimiser and the schedule read.

    Args:
        lr: AdamW's peak learning rate (the schedule scales an optimiser's own, such as
            optimizer_options.muon.lr, by the same factor).
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


def args_entries(cls: type) -> str:
    """The "Args:" entries of a settings dataclass's docstring, as they stand there."""
    return cls.__doc__.split("Args:\n", 1)[1].rstrip()


def _optimizer_options_class() -> type:
    """model.optimizer_options: a section per registered optimiser that has settings, its settings
    dataclass (checked as options are: every field has a default). Built from the registry, so an
    entry there is all it takes for `--model.optimizer_options.<name>.<setting>` to parse, to be
    listed by --help and to be saved in a run's config and its checkpoints."""
    own = {name: spec.settings for name, spec in OPTIMIZERS.items() if spec.settings is not None}
    for name, settings in own.items():
        check_options_class(f"optimizer {name}", settings)
    sections = [(name, settings, field(default_factory=settings)) for name, settings in own.items()]
    made = dataclasses.make_dataclass("OptimizerOptions", sections, frozen=True)
    made.__module__ = __name__  # pickled and looked up by name, as a class written here would be
    made.__doc__ = "model.optimizer_options: each optimiser's own settings, under its name."
    return made


OptimizerOptions = _optimizer_options_class()


def optimizer_options(given: Any) -> Any:
    """The OptimizerOptions from what a config, a checkpoint or Python holds: a mapping of optimiser
    names to their settings (an optimiser left out, or a setting, takes its defaults), a
    jsonargparse Namespace or the object itself, each setting checked (minitx/options.py)."""
    where = "model.optimizer_options"

    def build(name: str, section: Any) -> Any:
        settings = OPTIMIZERS[name].settings
        if settings is None:
            fail(f"{where}.{name}", f"optimizer {name} has no settings of its own", "remove this section")
        return build_options(f"{where}.{name}", f"optimizer {name}", settings, section)

    example = "optimizer_options: {muon: {lr: 0.02}}"
    return OptimizerOptions(**build_sections(where, "optimizer", OPTIMIZERS, given, build, example))


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True)
class Optimisation(SharedSettings):
    """The optimiser and schedule settings (see the top of this file).

    Args:
    """

    optimizer_options: OptimizerOptions = field(default_factory=OptimizerOptions)

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))  # a config gives a list
        object.__setattr__(self, "optimizer_options", optimizer_options(self.optimizer_options))
        self.check()

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> Optimisation:
        """The settings among `settings` (a config's model section, a module's hparams: other keys
        are ignored); one it lacks, from an older run, takes its default."""
        return cls(**{name: settings[name] for name in cls.names() if name in settings})

    def by_key(self) -> dict[str, Any]:
        """Each setting as plain data by its key under model: lr, ..., optimizer_options.muon.lr."""
        keys = {name: _plain(getattr(self, name)) for name in self.names() if name != "optimizer_options"}
        for name, settings in dataclasses.asdict(self.optimizer_options).items():
            keys.update({f"optimizer_options.{name}.{key}": value for key, value in settings.items()})
        return keys

    def check(self) -> None:
        """Each shared setting's check (an optimiser's own are checked as they are built); errors
        name `model.<setting>` and say the fix."""

        def fail(name: str, fix: str) -> None:
            value = getattr(self, name)
            raise UserError(
                f"model.{name}: is {repr(value) if isinstance(value, str) else _plain(value)}; {fix}"
            )

        if not self.lr > 0:
            fail("lr", "use a positive learning rate such as 1e-3")
        if not 0 <= self.min_lr <= self.lr:
            fail("min_lr", f"use a value between 0 and model.lr={self.lr}")
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
        if self.schedule not in SCHEDULES:
            fail("schedule", f"use one of {', '.join(SCHEDULES)}")
        if self.decay_steps is not None and self.decay_steps < 0:
            fail("decay_steps", "use 0 or more, or leave it unset to use model.decay_fraction")
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
        names = ("lr", "min_lr", "warmup_steps", "schedule", "decay_steps", "decay_fraction", "decay_shape")
        return lr_at(step, max_steps=max_steps, **{name: getattr(self, name) for name in names})

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


# Its docstring's "Args:" (MinitxLM's docstring and --help show them): the shared settings', then
# optimizer_options, whose settings --help lists under their own keys with their own docstrings'.
_OWN = ", ".join(f"{f.name}: {f.type.__name__}" for f in fields(OptimizerOptions))
Optimisation.__doc__ += (
    args_entries(SharedSettings)
    + f"\n        optimizer_options: each optimiser's own settings, under its name ({_OWN}).\n"
)

DEFAULTS = Optimisation()
# Settings a checkpoint of an older minitx may lack, by key under model: it ran with their
# defaults. The first six are as old as the optimiser.
FIRST_SETTINGS = ("lr", "min_lr", "warmup_steps", "weight_decay", "betas", "eps")
ADDED_LATER = tuple(key for key in DEFAULTS.by_key() if key not in FIRST_SETTINGS)
