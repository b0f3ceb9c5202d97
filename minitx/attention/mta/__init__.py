"""Multi-token attention (Golovneva et al. 2025): the layer and everything that makes it fast.

options.py       MTAOptions: the kind's options and their checks
layer.py         the layer: parameters, placement, backend choice, training and prefill
decoding.py      its decoding through the cache (CachedDecoding, mixed into the layer)
cache.py         MTACache: keys, values and the latest queries, for decoding
torch_math.py    the arithmetic on torch: convolution, head mixing, the factorised form
conv.c native.py the same as C loops on CPU, compiled on first use and called by ctypes
ops.py           the C loops as torch operators (torch.ops.minitx.*), for torch.compile
triton_*.py      tiled Triton kernels (forward, backward) and their launch and operator
"""

from .layer import MTA, MTACache, MultiTokenAttention
from .options import MTAOptions

__all__ = ["MTA", "MTACache", "MTAOptions", "MultiTokenAttention"]
