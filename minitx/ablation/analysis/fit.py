"""The ladder's fits, by concern, under the one name the analysis and the tests use:

solver.py       huber_fit: many small robust least-squares fits at once
curves.py       L(C) per arm and the joint model with a compute multiplier per arm
uncertainty.py  the noise of each point, the bootstrap, intervals
robust.py       answers that survive a ladder that is not a perfect curve: noise raised to
                each arm's lack of fit, leave-one-size-out refits, a held-out rung, verdicts
chinchilla.py   L(N, D), the second view
"""

from __future__ import annotations

from .chinchilla import NDFit, fit_nd
from .curves import (
    ALPHA_MAX,
    FLAT,
    LOG_M_MAX,
    MIN_POINTS,
    Fit,
    JointFit,
    fit_curve,
    fit_joint,
    fit_joint_many,
)
from .solver import HUBER_DELTA, huber, huber_fit, one_blas_thread
from .uncertainty import (
    BOOTSTRAP,
    INTERVAL,
    Comparison,
    Curve,
    JointBootstrap,
    Noise,
    SeedNoise,
    bootstrap_joint_many,
    interval,
    seed_noise,
)

__all__ = [
    "ALPHA_MAX", "BOOTSTRAP", "FLAT", "HUBER_DELTA", "INTERVAL", "LOG_M_MAX", "MIN_POINTS", "Comparison",
    "Curve", "Fit", "JointBootstrap", "JointFit", "NDFit", "Noise", "SeedNoise", "bootstrap_joint_many",
    "fit_curve", "fit_joint", "fit_joint_many", "fit_nd", "huber", "huber_fit", "interval", "one_blas_thread",
    "seed_noise",
]  # fmt: skip
