"""Learned attention sinks (gpt-oss): one learned logit per head joins every softmax row as a
column that no value reads, so a head may attend to nothing:

    p_ij = exp(z_ij) / (exp(s_h) + sum_j exp(z_ij))

An option of every softmax kind (SoftmaxOptions.sinks). Training and prefill go through the kind's
own causal attention with the sink as one token before the sequence (`with_sink`); decoding's few
queries take the scores materialised (`sink_attention`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# The features `with_sink` adds to each head: the sink's, padded so that widths stay aligned.
SINK_WIDTH = 8


def with_sink(attend, q: Tensor, k: Tensor, v: Tensor, sinks: Tensor, scale: float) -> Tensor:
    """Attention with `sinks` (H,) through `attend`, any causal attention of (q, k, v) that takes
    the sink as one token before the sequence (and scales by `scale`).

    The sink's key [0, ..., 0, 1] meets each query [q, s_h / scale], so its score is exactly s_h,
    while every real score q.k is unchanged (the real keys get a 0 there); its value is 0, so it
    only adds exp(s_h) to each row's denominator. A query one place later sees one key more,
    exactly the sink: the first output dropped and cut back to D features, this is attention with
    sinks. The extra feature is padded to SINK_WIDTH, and the values with zeros to the same width:
    fused kernels want equal, aligned widths (on the CPU, SDPA with values narrower than the keys
    takes a path three times slower, measured at T = 1024).
    """
    B, H, T, D = q.shape
    sink_feature = (sinks / scale).to(q.dtype).view(1, H, 1, 1).expand(B, H, T, 1)
    q = F.pad(torch.cat([q, sink_feature], dim=-1), (0, SINK_WIDTH - 1, 1, 0))
    k = F.pad(k, (0, SINK_WIDTH, 1, 0))
    k[:, :, 0, D] = 1.0
    v = F.pad(v, (0, SINK_WIDTH, 1, 0))
    return attend(q, k, v)[:, :, 1:, :D]


def sink_attention(
    q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, sinks: Tensor, scale: float
) -> Tensor:
    """Attention with `sinks` of a few new queries against a cache's keys (mask: (T, keys),
    (B, 1, T, keys) or None), materialised: decoding's scores are one row per query anyway."""
    B, H, T, D = q.shape
    G = keys.shape[1]
    r = H // G  # query heads per key/value head: grouped, never copied
    scores = (q.reshape(B, G, r * T, D) @ keys.to(q.dtype).transpose(-1, -2)) * scale
    if mask is not None:  # (T, keys), or (B, 1, T, keys) with documents
        rows = mask.repeat(r, 1) if mask.dim() == 2 else mask.repeat(1, 1, r, 1)
        scores = scores.masked_fill(~rows, float("-inf"))
    sink = sinks.to(scores.dtype).view(1, G, r, 1, 1).expand(B, G, r, T, 1).reshape(B, G, r * T, 1)
    norm = torch.logsumexp(torch.cat([scores, sink], dim=-1), dim=-1, keepdim=True)
    out = torch.exp(scores - norm) @ values.to(q.dtype)
    return out.view(B, H, T, D)
