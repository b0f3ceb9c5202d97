"""Moved to minitx.generation: the decode loop to generation/loop.py, the sampling filters to
generation/sampling.py; this old path re-exports both, for code written before."""

from .generation.loop import (
    COMPILED_DECODING,
    CachedSteps,
    CroppedSteps,
    check_prompt_fits,
    compiled_decoding,
    generate,
)
from .generation.sampling import check_options, pick_next, top_k_filter, top_p_filter

__all__ = [
    "COMPILED_DECODING",
    "CachedSteps",
    "CroppedSteps",
    "check_options",
    "check_prompt_fits",
    "compiled_decoding",
    "generate",
    "pick_next",
    "top_k_filter",
    "top_p_filter",
]
