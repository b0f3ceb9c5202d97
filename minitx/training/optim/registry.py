"""The optimisers, by the value of model.optimizer: one entry each, all an optimiser declares.

Adding an optimiser is a file of its own (its settings dataclass, if it has settings, and its
build function, as muon.py) and one entry in OPTIMIZERS. Its settings are options as an attention
kind's are (minitx/options.py): `model.optimizer_options.<name>.<setting>`, beside the settings
every optimiser shares (`model.lr`, ...). The settings (settings.Optimisation), the train
command's keys and --help, the resume checks, FSDP2's placement of its saved state
(training/sharding.py) and a designed sweep's learning rates (ablation/plan/sweep.py, ladder.py)
all read the entry; none names an optimiser.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .adamw import build_adamw
from .groups import Parameters
from .muon import MuonSettings, build_muon, is_muon_state, muon_state_parts


@dataclass(frozen=True)
class OptimiserSpec:
    """One value of model.optimizer.

    build: the optimiser over the parameters, from the settings (an Optimisation).
    saved: whether an optimiser's state_dict() is this one's: a run resumes with the optimiser
        whose state its checkpoint holds, whatever the config says.
    lr_options: its own settings that are learning rates (model.optimizer_options.<name>.<setting>),
        besides the shared model.lr and model.min_lr (lr_keys). A designed sweep sets each for
        every run, and its rule for an arm is theirs together: each is the base config's value
        times the arm's lr_sweep multiplier, along the whole ladder.
    state_parts: for an optimiser made of several torch optimisers, its parts by the key its
        state_dict() holds each one's state under (FSDP2 places each part's per-parameter state
        as that part's parameters); None for a single torch optimiser.
    settings: the frozen dataclass of its own settings, model.optimizer_options.<name>.<setting>
        (None when it has none): a default for every field, its annotations and __post_init__
        (raising minitx.options.OptionError) its checks, as an attention kind's options.
    """

    build: Callable[[Any, Parameters], torch.optim.Optimizer]
    saved: Callable[[Mapping], bool]
    lr_options: tuple[str, ...] = ()
    state_parts: Callable[[Any], dict[str, torch.optim.Optimizer]] | None = None
    settings: type | None = None


# AdamW is recognised last: a state no other optimiser claims is AdamW's, as every older checkpoint's.
OPTIMIZERS: dict[str, OptimiserSpec] = {
    "muon": OptimiserSpec(
        build_muon, is_muon_state, lr_options=("lr",), state_parts=muon_state_parts, settings=MuonSettings
    ),
    "adamw": OptimiserSpec(build_adamw, lambda state: True),
}
FALLBACK = "adamw"  # the optimiser of a checkpoint that holds no optimiser state (an older minitx's)


def optimizer_of_state(state: Mapping | None) -> str:
    """The model.optimizer whose state_dict() `state` is (the first that claims it)."""
    if not isinstance(state, Mapping):
        return FALLBACK
    return next((name for name, spec in OPTIMIZERS.items() if spec.saved(state)), FALLBACK)


def state_parts(optimizer: torch.optim.Optimizer, state: Mapping) -> dict[str, torch.optim.Optimizer] | None:
    """The parts of `optimizer` by their keys in its saved `state`, or None for a single torch optimiser."""
    spec = OPTIMIZERS[optimizer_of_state(state)]
    return spec.state_parts(optimizer) if spec.state_parts is not None else None


SHARED_LR_KEYS = ("lr", "min_lr")  # the learning rates every optimiser reads (settings.SharedSettings)


def lr_keys(optimizer: str) -> tuple[str, ...]:
    """The learning-rate settings of model.optimizer `optimizer`, as keys under model: the shared
    lr and min_lr, then its own (optimizer_options.muon.lr); only the shared ones for a name that
    is none of ours (the train command refuses it in one line)."""
    spec = OPTIMIZERS.get(optimizer)
    own = spec.lr_options if spec is not None else ()
    return (*SHARED_LR_KEYS, *(f"optimizer_options.{optimizer}.{name}" for name in own))


def all_lr_keys() -> tuple[str, ...]:
    """Every optimiser's learning-rate settings, each once, in the registry's order."""
    return tuple(dict.fromkeys(key for name in OPTIMIZERS for key in lr_keys(name)))
