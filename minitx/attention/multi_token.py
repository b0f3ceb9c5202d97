"""Multi-token attention (Golovneva, Wang, Weston, Sukhbaatar 2025).

Neighbouring queries, keys and heads shape each attention weight:

    S  = Q K^T / sqrt(D), future entries set to 0            (zero BEFORE the convolution)
    S  = conv2d(S, theta) per head over (c_q query rows looking back, c_k keys centred)
    S  = mix heads within groups of c_h                       (pre-softmax head mixing)
    A  = softmax(S with future entries at -inf)               (-inf AFTER the convolution)
    A  = mix heads within groups of c_h                       (post-softmax head mixing)
    O  = A V, then RMSNorm over D and a sigmoid gate, per head

The convolution needs the scores themselves, so no fused kernel applies. Work goes in chunks of
queries: a chunk needs its own score rows plus the c_q - 1 rows above it, against the keys up to
its last query, so memory is O(chunk * T) rather than O(T^2). Decoding is the same computation
with a chunk of one query whose c_q - 1 earlier queries come from the cache.

All learned parts start as the identity, so an untrained MTA layer without the output norm equals
plain attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..cache import CacheSpec, LayerCache
from ..config import ModelConfig
from ..functional import allowed_mask
from .base import Attention


class MultiTokenAttention(Attention):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__(config, layer)
        att = config.attention
        self.query_chunk = att.mta_query_chunk
        self.head_mix = att.mta_head_mix
        self.conv_placement = att.mta_conv_placement
        H = self.n_head
        self.has_conv = layer in att.mta_conv_layer_set(config.n_layer)
        self.c_q = att.mta_query_kernel if self.has_conv else 1
        self.c_k = att.mta_key_kernel if self.has_conv else 1
        if self.has_conv:
            theta = torch.zeros(H, 1, self.c_q, self.c_k)
            theta[:, 0, self.c_q - 1, self.c_k // 2] = 1.0  # last row = current query, centre = same key
            self.kq_conv = nn.Parameter(theta)
        if self.head_mix != "none":
            group = att.mta_head_group or H
            eye = torch.eye(group).expand(H // group, group, group)
            if self.head_mix in ("pre", "both"):
                self.mix_pre = nn.Parameter(eye.clone())
            if self.head_mix in ("post", "both"):
                self.mix_post = nn.Parameter(eye.clone())
        self.output_norm = att.mta_output_norm
        if self.output_norm:
            self.norm_weight = nn.Parameter(torch.ones(self.head_dim))  # shared by all heads
            self.gate = nn.Linear(self.head_dim, 1)
        self.init_extra()

    def init_extra(self) -> None:
        if self.output_norm:  # a zero gate starts every head at the same half-open sigmoid
            nn.init.zeros_(self.gate.weight)
            nn.init.zeros_(self.gate.bias)

    @classmethod
    def cache_spec(cls, config: ModelConfig, layer: int) -> CacheSpec:
        has_conv = layer in config.attention.mta_conv_layer_set(config.n_layer)
        n_query = config.attention.mta_query_kernel - 1 if has_conv else 0
        return CacheSpec(capacity=config.block_size, window=config.block_size, n_query=n_query)

    # -- the maths for a run of query rows ----------------------------------------------------
    def rows(self, q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, first_key: int = 0):
        """Attention for query rows q (B, H, R, D) of which the first c_q - 1 are history only.

        q_pos: (R,) absolute positions (history rows that do not exist have position -1, so they
        see nothing and act as the convolution's zero padding); k, v: (B, G, Tk, D) at k_pos.
        Keys before `first_key` are invisible to every row: past block_size the context slides,
        and the rows the convolution looks back on must see the same keys as a fresh run would.
        Returns (out, weights) for the last R - (c_q - 1) rows.
        """
        B, H, R, D = q.shape
        G, Tk = k.shape[1], k.shape[2]
        n_hist = self.c_q - 1
        # Scores per query head without copying k: fold the heads sharing a kv head into rows.
        scores = (q.reshape(B, G, (H // G) * R, D) @ k.transpose(-2, -1)).view(B, H, R, Tk) * self.scale
        allowed = allowed_mask(q_pos, k_pos) & (q_pos >= 0)[:, None] & (k_pos >= max(first_key, 0))[None, :]
        out_allowed = allowed[n_hist:]
        scores = scores.masked_fill(~allowed, 0.0)
        if self.has_conv and self.conv_placement == "pre":
            scores = self.convolve(scores).masked_fill(~out_allowed, 0.0)
        if hasattr(self, "mix_pre"):
            scores = mix_heads(scores, self.mix_pre)
        row_allowed = out_allowed if scores.shape[2] == R - n_hist else allowed
        weights = torch.softmax(scores.masked_fill(~row_allowed, float("-inf")), dim=-1)
        weights = torch.nan_to_num(weights, nan=0.0)  # history rows that do not exist
        if self.has_conv and self.conv_placement == "post":
            weights = self.convolve(weights).masked_fill(~out_allowed, 0.0)
        weights = weights[:, :, weights.shape[2] - (R - n_hist) :]
        if hasattr(self, "mix_post"):
            weights = mix_heads(weights, self.mix_post)
        dropped = F.dropout(weights, self.dropout_p, self.training)
        n_out = R - n_hist
        out = (dropped.reshape(B, G, (H // G) * n_out, Tk) @ v).view(B, H, n_out, D)
        return self.normalise(out), weights

    def convolve(self, scores: Tensor) -> Tensor:
        # The c_q - 1 history rows on top are the padding of the query axis: nothing below.
        return F.conv2d(scores, self.kq_conv, padding=(0, self.c_k // 2), groups=self.n_head)

    def normalise(self, out: Tensor) -> Tensor:
        if not self.output_norm:
            return out
        normed = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm_weight
        return normed * torch.sigmoid(self.gate(normed))

    # -- training, prefill and decoding ---------------------------------------------------------
    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        T, n_hist = q.shape[2], self.c_q - 1
        positions = torch.arange(T, device=q.device)
        q = F.pad(q, (0, 0, n_hist, 0))  # zero rows above the first query
        q_pos = torch.cat([torch.full((n_hist,), -1, device=q.device), positions])
        outs = []
        for start in range(0, T, self.query_chunk):
            end = min(start + self.query_chunk, T)
            # Rows start-n_hist .. end-1 (shifted by the padding), keys up to the chunk's last query.
            out, _ = self.rows(q[:, :, start : end + n_hist], k[:, :, :end], v[:, :, :end], q_pos[start : end + n_hist], positions[:end])
            outs.append(out)
        return torch.cat(outs, dim=2)

    def reference(self, q: Tensor, k: Tensor, v: Tensor):
        T, n_hist = q.shape[2], self.c_q - 1
        positions = torch.arange(T, device=q.device)
        q_pos = torch.cat([torch.full((n_hist,), -1, device=q.device), positions])
        return self.rows(F.pad(q, (0, 0, n_hist, 0)), k, v, q_pos, positions)

    def attend_cached(self, q: Tensor, k: Tensor, v: Tensor, cache: LayerCache) -> Tensor:
        T = q.shape[2]
        q_pos = torch.arange(cache.n_seen, cache.n_seen + T, device=q.device)
        old_k, old_v, old_pos = cache.contents()
        keys, values = torch.cat([old_k, k.to(old_k.dtype)], dim=2), torch.cat([old_v, v.to(old_v.dtype)], dim=2)
        k_pos = torch.cat([old_pos, q_pos])
        rows, rows_pos = q, q_pos
        if cache.queries is not None:
            rows, rows_pos = torch.cat([cache.queries.to(q.dtype), q], dim=2), torch.cat([cache.query_pos, q_pos])
        cache.append(k, v)
        cache.remember_queries(q)
        first_key = cache.n_seen - cache.window  # n_seen already counts the new tokens
        out, _ = self.rows(rows, keys.to(q.dtype), values.to(q.dtype), rows_pos, k_pos, first_key)
        return out

    def forward(self, x: Tensor, rope=None, cache=None) -> Tensor:
        if cache is not None and cache.n_seen == 0:
            # Prefill: the fast path as usual, and remember the queries for the next steps.
            q, k, v = self.project(x, rope)
            y = self.attend(q, k, v)
            cache.append(k, v)
            cache.remember_queries(q)
            return self.merge(y)
        return super().forward(x, rope, cache)


def mix_heads(maps: Tensor, mix: Tensor) -> Tensor:
    """A'_h = sum_h' M[h', h] A_h' within each group of heads. maps (B, H, R, T); mix (groups, c_h, c_h)."""
    B, H, R, T = maps.shape
    groups, c_h, _ = mix.shape
    mixed = torch.einsum("bgirt,gij->bgjrt", maps.view(B, groups, c_h, R, T), mix)
    return mixed.reshape(B, H, R, T)
