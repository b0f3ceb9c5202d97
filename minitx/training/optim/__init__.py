"""The optimiser and its schedule, one file per concern and one per optimiser.

settings.py   Optimisation: the model.* settings, the shared ones (model.lr, ...) and each
              optimiser's own (model.optimizer_options.<name>.*), checks
schedules.py  warmup, then cosine or WSD (lr_at); apply_schedule on a resume
registry.py   OPTIMIZERS: per model.optimizer, its settings, how it is built, its saved state and
              its parts, its learning-rate settings; a new optimiser is its own file plus one
              entry here
groups.py     what an optimiser is built over (Parameters), weight decay on matrices only
adamw.py      AdamW
muon.py       Muon on the hidden matrices with AdamW on the rest (its settings, Newton-Schulz)
"""

from .groups import Parameters, optimizer_groups
from .muon import (
    MUON_DTYPES,
    MUON_PRECISIONS,
    BatchedMuon,
    MuonSettings,
    MuonWithAdamW,
    muon_dtype,
    muon_lr_scale,
    muon_matrix,
    newton_schulz,
    split_for_muon,
)
from .registry import OPTIMIZERS, optimizer_of_state
from .schedules import apply_schedule, lr_at
from .settings import ADDED_LATER, DEFAULTS, Optimisation, OptimizerOptions

__all__ = [
    "ADDED_LATER",
    "BatchedMuon",
    "DEFAULTS",
    "MUON_DTYPES",
    "MUON_PRECISIONS",
    "MuonSettings",
    "MuonWithAdamW",
    "OPTIMIZERS",
    "Optimisation",
    "OptimizerOptions",
    "Parameters",
    "apply_schedule",
    "lr_at",
    "muon_dtype",
    "muon_lr_scale",
    "muon_matrix",
    "newton_schulz",
    "optimizer_groups",
    "optimizer_of_state",
    "split_for_muon",
]
