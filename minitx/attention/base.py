"""What every attention kind shares: projections, RoPE, the cached decode path, attention maps.

A kind is a subclass that fills in two methods:
- `attend(q, k, v)`: the fast path for a whole sequence (training, and prefill of an empty cache);
- `reference(q, k, v)`: the same maths materialised, returning (out, weights): the oracle in
  tests and the source of attention maps.
It may also override `cache_spec` (how many cache slots it needs) and `attend_cached`.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..cache import CacheSpec, LayerCache
from ..config import ModelConfig
from ..functional import allowed_mask


def apply_rope(x: Tensor, rope: Optional[tuple[Tensor, Tensor]]) -> Tensor:
    """Rotate each pair (x[..., i], x[..., i + D/2]) of x (B, heads, T, D) by position * freq_i:

        [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin] = x * [cos, cos] + [x2, x1] * [-sin, sin]

    where [x2, x1] is x rolled by D/2. Three ops, which matters when decoding one token at a time.
    """
    if rope is None:
        return x
    cos, sin = rope  # (T, D) each, from RotaryEmbedding
    x32 = x.float()  # rotate in float32 under bf16 autocast too
    return torch.addcmul(x32 * cos, x32.roll(x.shape[-1] // 2, dims=-1), sin).type_as(x)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head_at(layer)
        self.head_dim = config.head_dim
        self.block_size = config.block_size
        self.dropout = config.dropout
        inner, kv_inner = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        # q has n_head heads; k and v have n_kv_head heads each, which is the whole saving of
        # MQA/GQA. One matmul makes all three.
        self.qkv_proj = nn.Linear(config.d_model, inner + 2 * kv_inner, bias=config.bias)
        self.out_proj = nn.Linear(inner, config.d_model, bias=config.bias)

    # -- to be filled in by each kind -------------------------------------------------------
    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        raise NotImplementedError

    def reference(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    @classmethod
    def cache_spec(cls, config: ModelConfig, layer: int) -> CacheSpec:
        # Full attention: a ring of block_size slots; past it the context slides.
        return CacheSpec(capacity=config.block_size, window=config.block_size)

    def init_extra(self) -> None:
        """Initialise parameters the model's generic init must not touch (none here)."""

    def mean_keys(self, T: int) -> float:
        """Keys a query attends to, on average over a causal sequence of T (for FLOP counts)."""
        return (T + 1) / 2

    # -- shared machinery -------------------------------------------------------------------
    def project(self, x: Tensor, rope) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, n_head, T, D), k and v (B, n_kv_head, T, D) of x (B, T, d_model), RoPE applied."""
        B, T, _ = x.shape
        H, G = self.n_head, self.n_kv_head
        qkv = self.qkv_proj(x).view(B, T, H + 2 * G, self.head_dim).transpose(1, 2)
        q, k = apply_rope(qkv[:, : H + G], rope).split([H, G], dim=1)  # q and k turn by the same angles
        return q, k, qkv[:, H + G :]

    def merge(self, y: Tensor) -> Tensor:
        B, H, T, D = y.shape
        return self.out_proj(y.transpose(1, 2).reshape(B, T, H * D))

    def forward(self, x: Tensor, rope=None, cache: Optional[LayerCache] = None) -> Tensor:
        q, k, v = self.project(x, rope)
        if cache is None:
            y = self.attend(q, k, v)
        elif cache.n_seen == 0:
            # A prompt into an empty cache: the fast path, then keep what the cache has room for.
            y = self.attend(q, k, v)
            cache.append(k, v)
        else:
            y = self.attend_cached(q, k, v, cache)
        return self.merge(y)

    def attend_cached(self, q: Tensor, k: Tensor, v: Tensor, cache: LayerCache) -> Tensor:
        """New tokens against the cache: mask from absolute positions, keys in any slot order."""
        T = q.shape[2]
        if T == 1 and cache.capacity - cache.n_sink <= cache.window:
            # One new token: the slot it overwrites is a window behind it, so after the append every
            # filled slot (the sinks and a ring of at most a window) is visible: no mask is needed.
            cache.append(k, v)
            filled = min(cache.n_seen, cache.capacity)
            keys, values = cache.k[:, :, :filled], cache.v[:, :, :filled]
            return F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), enable_gqa=True)
        q_pos = torch.arange(cache.n_seen, cache.n_seen + T, device=q.device)
        if T == 1:
            cache.append(k, v)
            keys, values, k_pos = cache.k, cache.v, cache.pos
        else:
            # Several new tokens: earlier ones may still need what the ring would overwrite.
            keys, values = torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2)
            k_pos = torch.cat([cache.pos, q_pos])
            cache.append(k, v)
        allowed = allowed_mask(q_pos, k_pos, window=cache.window, n_global=cache.n_sink) & (k_pos >= 0)
        return F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=allowed, enable_gqa=True)

    def attention_weights(self, x: Tensor, rope=None) -> Tensor:
        """(B, H, T, T) attention weights of this layer for input x, from the reference path."""
        q, k, v = self.project(x, rope)
        return self.reference(q, k, v)[1]

    def new_cache(self, config: ModelConfig, batch: int, max_len: Optional[int], dtype, device) -> LayerCache:
        spec = self.cache_spec(config, self.layer)
        return spec.build(batch, self.n_kv_head, self.n_head, self.head_dim, max_len, dtype, device)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def dropout_p(self) -> float:
        return self.dropout if self.training else 0.0
