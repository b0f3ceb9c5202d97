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

from .adamw import build_adamw
from .groups import NO_DECAY_NAMES, Parameters, decays, optimizer_groups
from .muon import (
    MUON_DTYPES,
    MUON_PRECISIONS,
    BatchedMuon,
    MuonSettings,
    MuonWithAdamW,
    build_muon,
    muon_dtype,
    muon_lr_scale,
    muon_matrix,
    newton_schulz,
    orthogonalise,
    split_for_muon,
)
from .registry import OPTIMIZERS, OptimiserSpec, optimizer_of_state
from .schedules import DECAY_SHAPES, SCHEDULES, apply_schedule, lr_at
from .settings import ADDED_LATER, DEFAULTS, Optimisation, OptimizerOptions

__all__ = [
    "ADDED_LATER",
    "BatchedMuon",
    "DECAY_SHAPES",
    "DEFAULTS",
    "MUON_DTYPES",
    "MUON_PRECISIONS",
    "MuonSettings",
    "MuonWithAdamW",
    "NO_DECAY_NAMES",
    "OPTIMIZERS",
    "Optimisation",
    "OptimizerOptions",
    "OptimiserSpec",
    "Parameters",
    "SCHEDULES",
    "apply_schedule",
    "build_adamw",
    "build_muon",
    "decays",
    "lr_at",
    "muon_dtype",
    "muon_lr_scale",
    "muon_matrix",
    "newton_schulz",
    "optimizer_groups",
    "optimizer_of_state",
    "orthogonalise",
    "split_for_muon",
]
