"""The plain, materialised attention: the oracle every fast path is tested against.

It builds the whole (B, H, Tq, Tk) score matrix, so it is slow and memory-hungry on purpose: what
it computes is visible line by line, and it can hand back the attention weights for plots.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor


def allowed_mask(
    q_pos: Tensor, k_pos: Tensor, *, causal: bool = True, window: Optional[int] = None, n_global: int = 0
) -> Tensor:
    """Boolean (Tq, Tk) mask, True where query at position q_pos[i] may see key at k_pos[j].

    Positions are absolute, so the same rule serves training (0..T-1) and decoding from a cache.
    """
    q = q_pos[:, None]
    k = k_pos[None, :]
    allowed = torch.ones(q.shape[0], k.shape[1], dtype=torch.bool, device=q_pos.device)
    if causal:
        allowed &= k <= q
    if window is not None:
        in_window = q - k < window
        if n_global:
            in_window |= k < n_global
        allowed &= in_window
    return allowed


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = True,
    window: Optional[int] = None,
    n_global: int = 0,
    mask: Optional[Tensor] = None,
    return_weights: bool = False,
):
    """softmax(Q K^T / sqrt(D) + mask) V, materialised.

    q: (B, H, Tq, D); k, v: (B, G, Tk, D) with H % G == 0 (query head h reads kv head h // (H/G)).
    When Tq < Tk the queries are the last Tq positions (as when decoding after a prompt).
    mask: optional boolean, True = may attend, broadcastable to (B, H, Tq, Tk).
    Rows with nothing to attend to give zeros, not NaN.
    """
    B, H, Tq, D = q.shape
    G, Tk = k.shape[1], k.shape[2]
    if H % G:
        raise ValueError(f"query heads {H} not divisible by key/value heads {G}")
    k = k.repeat_interleave(H // G, dim=1)  # fine here: the oracle favours clarity over memory
    v = v.repeat_interleave(H // G, dim=1)

    scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)
    k_pos = torch.arange(Tk, device=q.device)
    allowed = allowed_mask(k_pos[Tk - Tq :], k_pos, causal=causal, window=window, n_global=n_global)
    if mask is not None:
        allowed = allowed & mask
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    weights = torch.nan_to_num(weights, nan=0.0)  # a fully masked row is all -inf -> NaN -> 0
    out = weights @ v
    return (out, weights) if return_weights else out
