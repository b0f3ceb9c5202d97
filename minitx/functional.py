"""The plain, materialised attention: the oracle every fast path is tested against.

It builds the whole (B, H, Tq, Tk) score matrix, so it is slow and memory-hungry on purpose: what
it computes is visible line by line, and it can hand back the attention weights for plots.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def allowed_mask(
    q_pos: Tensor, k_pos: Tensor, *, causal: bool = True, window: int | None = None, n_global: int = 0
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
    window: int | None = None,
    n_global: int = 0,
    mask: Tensor | None = None,
    sinks: Tensor | None = None,
    return_weights: bool = False,
):
    """softmax(Q K^T / sqrt(D) + mask) V, materialised.

    q: (B, H, Tq, D); k, v: (B, G, Tk, D) with H % G == 0 (query head h reads kv head h // (H/G)).
    When Tq < Tk the queries are the last Tq positions (as when decoding after a prompt).
    mask: optional boolean, True = may attend, broadcastable to (B, H, Tq, Tk).
    sinks: optional (H,) logits, one extra column per row that no value reads (gpt-oss): the
    weights of a row then sum to less than one.
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
    q_pos = torch.arange(Tk - Tq, Tk, device=q.device)  # the last Tq positions (negative if Tq > Tk)
    allowed = allowed_mask(q_pos, k_pos, causal=causal, window=window, n_global=n_global)
    if mask is not None:
        allowed = allowed & mask
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        sink_column = sinks.to(scores.dtype).view(1, H, 1, 1).expand(B, H, Tq, 1)
        weights = torch.softmax(torch.cat([scores, sink_column], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    weights = torch.nan_to_num(weights, nan=0.0)  # a fully masked row is all -inf -> NaN -> 0
    out = weights @ v
    return (out, weights) if return_weights else out


def multihead_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    num_heads: int,
    *,
    num_kv_heads: int | None = None,
    mask: Tensor | None = None,
    causal: bool = True,
    return_weights: bool = False,
):
    """Multi-head attention on (batch, length, features) tensors, as it is usually taught:
    split the features into heads, attend in each head (`attention`), merge the heads back.

    q: (B, Tq, num_heads * D); k, v: (B, Tk, num_kv_heads * D), num_kv_heads defaulting to
    num_heads (fewer kv heads: query head h reads kv head h // (num_heads / num_kv_heads)).
    Tq may differ from Tk (cross-attention). With causal=True the queries are the last Tq of the Tk
    positions, as when decoding after a prompt, so causal needs Tq <= Tk; cross-attention between
    two unrelated sequences wants causal=False. mask: boolean, True = may attend, broadcastable to
    (B, num_heads, Tq, Tk). Returns (B, Tq, num_heads * D), and the weights (B, num_heads, Tq, Tk)
    with return_weights. The projections before and after are the caller's (see docs/attention.md).
    """
    B, Tq, width = q.shape
    Tk = k.shape[1]
    num_kv_heads = num_kv_heads or num_heads
    if width % num_heads:
        raise ValueError(f"query width {width} not divisible by num_heads={num_heads}")
    D = width // num_heads
    if k.shape[-1] != num_kv_heads * D or v.shape[-1] != num_kv_heads * D:
        raise ValueError(
            f"k and v need {num_kv_heads} heads of {D} features, got widths {k.shape[-1]} and {v.shape[-1]}"
        )
    if causal and Tq > Tk:
        raise ValueError(
            f"causal attention with {Tq} queries but {Tk} keys; give causal=False for cross-attention"
        )

    def split(x: Tensor, heads: int) -> Tensor:  # (B, T, heads * D) -> (B, heads, T, D)
        return x.view(B, x.shape[1], heads, D).transpose(1, 2)

    out, weights = attention(
        split(q, num_heads),
        split(k, num_kv_heads),
        split(v, num_kv_heads),
        causal=causal,
        mask=mask,
        return_weights=True,
    )
    out = out.transpose(1, 2).reshape(B, Tq, num_heads * D)  # merge: heads side by side again
    return (out, weights) if return_weights else out
