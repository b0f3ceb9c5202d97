"""Gated DeltaNet's decoding cache: the convolution's last conv_size - 1 inputs and the recurrent
state in float32, one per layer (fla's cache keeps the same two). Its size does not depend on the
context's length.
"""

from __future__ import annotations

import torch

from ...cache import DecodingCache
from .delta_rule import state_dtype


class GDNCache(DecodingCache):
    """One gdn layer's decoding state: the convolution's last conv_size - 1 inputs (B, conv_size - 1,
    channels) and the recurrent state h (B, value heads, dk, dv) in float32. Its size is fixed:
    decoding costs the same per token at any context length."""

    def __init__(self, batch, channels, window, heads, key_dim, value_dim, dtype, device):
        super().__init__()
        self.register_buffer(
            "conv", torch.zeros(batch, window, channels, dtype=dtype, device=device), persistent=False
        )
        shape = (batch, heads, key_dim, value_dim)
        state = torch.zeros(shape, dtype=state_dtype(dtype), device=device)
        self.register_buffer("state", state, persistent=False)

    def reset(self) -> None:
        self.conv.zero_()
        self.state.zero_()
        super().reset()

    def nbytes(self) -> int:
        return self.conv.nbytes + self.state.nbytes
