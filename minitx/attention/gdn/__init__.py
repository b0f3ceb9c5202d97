"""Gated DeltaNet / DeltaNet, split as flash-linear-attention splits it:

delta_rule.py  the op on heads (fla's ops/): the delta rule (one step), its loop (the tests'
               oracle), the chunked WY/UT form, fla's kernel in its place on CUDA
conv.py        the short causal depthwise convolution over q, k and v
cache.py       GDNCache: the convolution's last inputs and the recurrent state, for decoding
layer.py       GDNOptions, GatedDeltaNet (projections, gates, decay, its FLOPs), the kind's KindSpec
"""

from .cache import GDNCache
from .conv import FEW_TOKENS
from .delta_rule import (
    chunk_gated_delta,
    fla_chunk,
    fla_installed,
    fla_kernel,
    l2_normalise,
    recurrent_gated_delta,
    step_gated_delta,
)
from .layer import GDN, GatedDeltaNet, GDNOptions

__all__ = [
    "FEW_TOKENS",
    "GDN",
    "GDNCache",
    "GDNOptions",
    "GatedDeltaNet",
    "chunk_gated_delta",
    "fla_chunk",
    "fla_installed",
    "fla_kernel",
    "l2_normalise",
    "recurrent_gated_delta",
    "step_gated_delta",
]
