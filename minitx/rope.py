"""Rotary position embeddings (RoPE): the tables and the rotation, shared by the model and every kind.

The model turns each head's queries and keys by its table of head_dim features; MLA turns a rotary
part of its own, d_r features wide (decoupled RoPE). Both read this module, which imports nothing
of minitx's, so no kind needs the model's module to rotate.

Within `shared_tables()`, as while a Transformer builds its layers, `rotary_table` hands out one table
per width and length: the layers of a model that rotate the same width share it, rather than
holding n_layer equal copies. The tables are buffers (moved and cast with the model) and never
persistent: no checkpoint holds them, of this version or an earlier one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor, nn

BASE = 10000.0  # minitx's RoPE base, that of Llama and transformers' default RoPE


class RotaryEmbedding(nn.Module):
    """Rotation tables for RoPE: the pair (x[i], x[i + D/2]) turns by position * base^(-2i/D).

    Stored at full width, cos = [cos, cos] and sin = [-sin, sin], shaped (T, D), so that a rotation
    is three ops (see `apply_rope`).
    The table grows past block_size when decoding slides on.
    """

    def __init__(self, head_dim: int, block_size: int, base: float = BASE):
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._build(block_size)

    def _build(self, length: int) -> None:
        # Outside inference mode even when decoding grows the table: a table made of inference
        # tensors could not be used for training afterwards.
        with torch.inference_mode(False):
            positions = torch.arange(length, dtype=torch.float32, device=self.inv_freq.device)
            angles = torch.outer(positions, self.inv_freq)
            cos, sin = angles.cos(), angles.sin()
            self.register_buffer("cos", torch.cat([cos, cos], dim=-1), persistent=False)
            self.register_buffer("sin", torch.cat([-sin, sin], dim=-1), persistent=False)

    def forward(self, start: int, length: int) -> tuple[Tensor, Tensor]:
        if start + length > self.cos.shape[0]:  # decoding past block_size: double the table
            self._build(max(2 * self.cos.shape[0], start + length))
        return self.cos[start : start + length], self.sin[start : start + length]


def apply_rope(x: Tensor, rope: tuple[Tensor, Tensor] | None) -> Tensor:
    """Rotate each pair (x[..., i], x[..., i + D/2]) of x (B, heads, T, D) by position * freq_i:

        [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin] = x * [cos, cos] + [x2, x1] * [-sin, sin]

    where [x2, x1] is x rolled by D/2. Three ops, which matters when decoding one token at a time.
    """
    if rope is None:
        return x
    cos, sin = rope  # (T, D) each, from RotaryEmbedding
    wide = x.to(torch.promote_types(x.dtype, torch.float32))  # float32 under bf16 autocast; float64 stays
    return torch.addcmul(wide * cos, wide.roll(x.shape[-1] // 2, dims=-1), sin).type_as(x)


# The tables made so far in the innermost `shared_tables()`, by (width, length, base); None outside.
_shared: ContextVar[dict[tuple[int, int, float], RotaryEmbedding] | None] = ContextVar(
    "minitx_rope_tables", default=None
)


@contextmanager
def shared_tables() -> Iterator[None]:
    """Within: `rotary_table` gives the same module for the same width, length and base. A scope, not a
    cache for the process: two models never share a table, since moving one model to a device
    or a dtype moves its buffers."""
    token = _shared.set({})
    try:
        yield
    finally:
        _shared.reset(token)


def rotary_table(head_dim: int, block_size: int, base: float = BASE) -> RotaryEmbedding:
    """The rotation table of `head_dim` features for `block_size` positions: the one already made
    in this `shared_tables()` scope if any (equal tables, built by the same ops), else a new one."""
    tables = _shared.get()
    if tables is None:
        return RotaryEmbedding(head_dim, block_size, base)
    key = (head_dim, block_size, base)
    if key not in tables:
        tables[key] = RotaryEmbedding(head_dim, block_size, base)
    return tables[key]
