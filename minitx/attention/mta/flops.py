"""What an MTA layer computes in training, counted: `per_token` (MultiTokenAttention.flops_per_token)
by the convention of minitx/flops.py, and `executed`, what a code path runs on a device.

Apart from layer.py so that the module stays readable; `executed` follows `attend` step by step,
chunk by chunk, so a change there should come here too (tests/model/test_flops.py holds it to
FlopCounterMode, and `per_token` to a count of the pairs one by one).
"""

from __future__ import annotations

import torch

from ...flops import causal_pairs
from . import native
from . import triton_launch as mta_triton
from .options import FACTORISED_FROM
from .torch_math import band_width


def per_token(layer, T: int) -> float:
    """Training FLOPs (3 x forward) per token of T of this MTA layer, besides the 6 per weight of
    its projections that Transformer.flops_per_token counts; 2 FLOPs per multiply-add. For each
    head and each (query, key) pair of the causal triangle, what the released order computes:
    - the score, head_dim wide;
    - each key-query convolution (pre- and post-softmax), c_q x c_k per entry of its output (the
      entries of hidden pairs are set aside after it: no part of the method's result);
    - each head mix, one per head of its group (all n_head before the softmax, as released);
    - the weight times the value, head_dim wide.
    After the heads: the output gate, a Linear(head_dim, 1) applied to every head, n_head times
    per token where Transformer.flops_per_token counts its weight once.
    Whatever path computes it (chunks with their history rows, the factorised product, Triton's
    kernels, the C loops), on whatever device: what those execute is `executed`'s."""
    H, D, kernel = layer.n_head, layer.head_dim, layer.c_q * layer.c_k
    per_pair = 2 * D  # the score and the value
    per_pair += kernel * ((layer.kq_conv is not None) + (layer.kq_conv_post is not None))
    per_pair += sum(mix.shape[-1] for mix in (layer.mix_pre, layer.mix_post) if mix is not None)
    forward = 2 * H * causal_pairs(T) * per_pair
    if layer.norm is not None:
        forward += 2 * (H - 1) * D * T  # the gate on every head, beyond the once its weight counts
    return 3 * forward / T


def executed(layer, T: int, device: torch.device | str = "cpu") -> float:
    """What `attend` executes in training per token of T on `device`, besides the 6 per weight of
    its projections; 3 x the forward, 2 FLOPs per multiply-add.

    Per chunk of `query_chunk` queries, whose rows are the chunk's own plus the history rows above
    it (the convolutions' look-back), against the keys up to its last query:
    - the scores, n_head x rows x keys x head_dim (grouped key/value heads save nothing);
    - each key-query convolution (pre- and post-softmax), c_q x c_k per entry of its output rows:
      the whole (rows x keys) map, as torch's convolution computes it (the C loops of conv.c skip
      the hidden entries, about half the map: the figure is torch's);
    - each head mix, c_h per entry (all n_head before the softmax, as released);
    - the weights times the values.
    The factorised form (backend factorised, Triton's kernels, or `auto` past FACTORISED_FROM
    tokens without the C loops) scores the far keys as one product c_q * head_dim wide in place of
    the first two, plus the convolved keys and the exact band near the diagonal (torch_math.py).
    After the heads: the output gate, a Linear(head_dim, 1) applied to every head, n_head times
    per token where its weight is counted once.

    Not counted: elementwise work (softmax, masks, the RMSNorm) as nowhere in the model, and the
    backward's recomputation of each chunk's maps (ChunkedRows, past query_chunk tokens), a trade
    of time for memory like activation checkpointing, which no count includes.
    """
    cuda = torch.device(device).type == "cuda"
    H, D, c_q, c_k = layer.n_head, layer.head_dim, layer.c_q, layer.c_k
    pre, post = layer.kq_conv is not None, layer.kq_conv_post is not None
    fused = layer.backend == "triton" or (
        layer.backend == "auto" and cuda and mta_triton.available() and not layer.dropout
    )
    factorised = pre and (
        fused
        or layer.backend == "factorised"
        or (layer.backend == "auto" and T > FACTORISED_FROM and (cuda or not native.loaded()))
    )
    n_pad = layer.n_hist - (c_q - 1) if factorised else layer.n_hist
    chunk = T if fused else layer.query_chunk  # Triton's kernels tile the whole sequence at once
    forward = 0
    for start in range(0, T, chunk):
        keys = min(start + chunk, T)
        rows = keys - start + n_pad
        if factorised:  # Qcat . K'cat: the pre-softmax convolution folded into the scores
            forward += 2 * H * rows * keys * c_q * D
        else:
            forward += 2 * H * rows * keys * D
            if pre:
                rows -= c_q - 1
                forward += 2 * H * rows * keys * c_q * c_k
        if layer.mix_pre is not None:
            forward += 2 * H * layer.mix_pre.shape[-1] * rows * keys
        if post:
            rows -= c_q - 1
            forward += 2 * H * rows * keys * c_q * c_k
        if layer.mix_post is not None:
            forward += 2 * H * layer.mix_post.shape[-1] * rows * keys
        forward += 2 * H * rows * keys * D  # @ V
    if factorised:
        off = band_width(c_q, c_k)
        lags = off + c_k // 2
        forward += 2 * H * T * c_q * c_k * D  # convolved_keys: each head's c_q kernel rows over the keys
        forward += 2 * H * T * lags * D + 2 * H * T * lags * c_q * off  # band_scores
    if layer.norm is not None:
        forward += 2 * (H - 1) * D * T  # the gate on every head, beyond the once its weight counts
    return 3 * forward / T
