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
from torch.utils.checkpoint import checkpoint

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
        n_out = R - n_hist
        # Scores per query head without copying k: fold the heads sharing a kv head into rows.
        # The scale goes on q, which has D numbers per row where the scores have Tk.
        scores = ((q * self.scale).reshape(B, G, (H // G) * R, D) @ k.transpose(-2, -1)).view(B, H, R, Tk)
        hidden = ~(allowed_mask(q_pos, k_pos) & (q_pos >= 0)[:, None] & (k_pos >= max(first_key, 0))[None, :])
        out_hidden = hidden[n_hist:]
        scores = scores.masked_fill(hidden, 0.0)
        if self.has_conv and self.conv_placement == "pre":
            # What the convolution spreads into hidden entries needs no zeroing: head mixing works
            # entry by entry, and the softmax below sets every hidden entry to -inf.
            scores = self.convolve(scores)
        if hasattr(self, "mix_pre"):
            scores = mix_heads(scores, self.mix_pre)
        softmax_rows = n_hist if scores.shape[2] == R else 0  # post conv: history rows too
        weights = torch.softmax(scores.masked_fill(hidden[n_hist - softmax_rows :], float("-inf")), dim=-1)
        if softmax_rows or first_key > 0:
            # Only history padding rows (position -1) and rows whose keys all slid out of the
            # context see nothing; their softmax is NaN. Other rows always see their own key.
            weights = torch.nan_to_num(weights, nan=0.0)
        if self.has_conv and self.conv_placement == "post":
            weights = self.convolve(weights).masked_fill(out_hidden, 0.0)
        if hasattr(self, "mix_post"):
            weights = mix_heads(weights, self.mix_post)
        dropped = F.dropout(weights, self.dropout_p, self.training)
        out = (dropped.reshape(B, G, (H // G) * n_out, Tk) @ v).view(B, H, n_out, D)
        return self.normalise(out), weights

    def convolve(self, scores: Tensor) -> Tensor:
        # The c_q - 1 history rows on top are the padding of the query axis: nothing below.
        if scores.is_cuda:  # cuDNN as it comes: KeyQueryConv's choices were measured on CPU only
            return F.conv2d(scores, self.kq_conv, padding=(0, self.c_k // 2), groups=self.n_head)
        return KeyQueryConv.apply(scores, self.kq_conv)

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
        # Training would keep every chunk's (rows x keys) maps for the backward pass, O(T^2) again;
        # recomputing a chunk's maps in the backward keeps only its inputs and output (measured at
        # T=4096: 6x less peak memory, 15-20% more time). mta_query_chunk >= T skips it.
        recompute = torch.is_grad_enabled() and T > self.query_chunk
        outs = []
        for start in range(0, T, self.query_chunk):
            end = min(start + self.query_chunk, T)
            # Rows start-n_hist .. end-1 (shifted by the padding), keys up to the chunk's last query.
            chunk = (q[:, :, start : end + n_hist], k[:, :, :end], v[:, :, :end], q_pos[start : end + n_hist], positions[:end])
            out, _ = checkpoint(self.rows, *chunk, use_reentrant=False) if recompute else self.rows(*chunk)
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
        rows, rows_pos = q, q_pos
        if cache.queries is not None:
            rows, rows_pos = torch.cat([cache.queries.to(q.dtype), q], dim=2), torch.cat([cache.query_pos, q_pos])
        # Append first, then read the cache: a token the new ones overwrite lies before first_key
        # below, so no row could see it anyway, and there is no copy of the whole cache to concatenate.
        cache.append(k, v)
        cache.remember_queries(q)
        keys, values, k_pos = cache.contents(ordered=self.c_k > 1)  # only a key-axis convolution needs order
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


class KeyQueryConv(torch.autograd.Function):
    """conv2d(scores, kernel, groups=H), keys padded by (c_k - 1) / 2: oneDNN's fast paths on CPU.

    Measured on CPU (1-4 x 4 heads x 261 rows x 256-4096 keys), forward and backward together run
    2.5-3.6x faster than plain F.conv2d, because:
    - oneDNN convolves these per-head (depthwise) maps up to 3-4x faster in channels-last layout,
      copies included;
    - its kernel gradient is 5-10x slower than the forward, but that gradient (the correlation of
      the padded input with the output's gradient) is itself a forward convolution, with the
      output's gradient as a large kernel, one group per (batch, head) and a (c_q, c_k) result.
    """

    @staticmethod
    def forward(ctx, scores: Tensor, kernel: Tensor) -> Tensor:
        ctx.save_for_backward(scores, kernel)
        H, pad = kernel.shape[0], kernel.shape[-1] // 2
        out = F.conv2d(scores.contiguous(memory_format=torch.channels_last), kernel, padding=(0, pad), groups=H)
        return out.contiguous()

    @staticmethod
    def backward(ctx, grad: Tensor):
        scores, kernel = ctx.saved_tensors
        kernel = kernel.to(grad.dtype)  # under autocast the forward ran in a lower precision
        H, pad = kernel.shape[0], kernel.shape[-1] // 2
        grad_scores = grad_kernel = None
        if ctx.needs_input_grad[0]:
            grad_last = grad.contiguous(memory_format=torch.channels_last)
            grad_scores = F.conv_transpose2d(grad_last, kernel, padding=(0, pad), groups=H).contiguous()
        if ctx.needs_input_grad[1]:
            B, _, R, T = scores.shape
            padded = F.pad(scores.to(grad.dtype), (pad, pad)).reshape(1, B * H, R, T + 2 * pad)
            per_map = F.conv2d(padded, grad.reshape(B * H, 1, *grad.shape[2:]), groups=B * H)
            grad_kernel = per_map.view(B, H, *kernel.shape[2:]).sum(0).view_as(kernel)
        return grad_scores, grad_kernel


def mix_heads(maps: Tensor, mix: Tensor) -> Tensor:
    """A'_h = sum_h' M[h', h] A_h' within each group of heads. maps (B, H, R, T); mix (groups, c_h, c_h)."""
    B, H, R, T = maps.shape
    groups, c_h, _ = mix.shape
    # One matmul per group on the maps as they lie in memory: einsum would permute them first.
    mixed = mix.transpose(-1, -2) @ maps.reshape(B, groups, c_h, R * T)
    return mixed.view(B, H, R, T)
