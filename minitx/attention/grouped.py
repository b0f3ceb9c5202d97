"""MHA, MQA and GQA: one module. They differ only in n_kv_head (n_head, 1, or in between).

SDPA takes k and v with n_kv_head heads directly (enable_gqa), so no head is ever copied.
"""

from __future__ import annotations

from functools import partial

import torch.nn.functional as F
from torch import Tensor

from .. import functional
from ..documents import Documents, flex_documents, masked_attention
from ..kinds import KindSpec
from .sinks import with_sink
from .softmax import Attention, SoftmaxOptions


class GroupedQueryAttention(Attention):
    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.sinks is not None:
            return with_sink(self.causal, q, k, v, self.sinks, self.scale)
        return self.causal(q, k, v)

    def causal(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        """Causal attention, or attention under a boolean `mask` (True: may see) that says more."""
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout_p,
            is_causal=mask is None,
            scale=self.scale,
            enable_gqa=True,
        )

    def attend_documents(self, q: Tensor, k: Tensor, v: Tensor, docs: Documents) -> Tensor:
        # A sink enters as one token before the sequence (with_sink), in view of every document.
        leading = 0 if self.sinks is None else 1
        if self.use_flex(q):  # block-sparse: blocks wholly in another document are skipped
            attend = partial(flex_documents, docs=docs, window=None, leading=leading, scale=self.scale)
        else:  # SDPA under the mask, in blocks of queries
            attend = partial(masked_attention, self.causal, docs=docs, leading=leading)
        return attend(q, k, v) if self.sinks is None else with_sink(attend, q, k, v, self.sinks, self.scale)

    def use_flex(self, q: Tensor) -> bool:
        """Documents through compiled flex attention: on CUDA, without dropout (flex has none)."""
        return q.is_cuda and self.dropout_p == 0.0

    def reference(self, q: Tensor, k: Tensor, v: Tensor):
        return functional.attention(q, k, v, causal=True, sinks=self.sinks, return_weights=True)


# Their options (qk_norm, sinks, gate) are those every softmax kind shares.
FIXED_KV_HEADS = dict(options=SoftmaxOptions, reads_n_kv_head=False)
MHA = KindSpec("mha", GroupedQueryAttention, kv_heads=lambda attention, n_head: n_head, **FIXED_KV_HEADS)
MQA = KindSpec("mqa", GroupedQueryAttention, kv_heads=lambda attention, n_head: 1, **FIXED_KV_HEADS)
GQA = KindSpec("gqa", GroupedQueryAttention, options=SoftmaxOptions)  # 1 < n_kv_head < n_head
