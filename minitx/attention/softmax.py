"""Softmax attention over one fused q/k/v projection: what mha, mqa, gqa, local, mta, diff and a
kind of one's own (examples/custom_attention.py) share.

    x -> project: q, k, v (RoPE applied) -> attend: softmax(q k^T / sqrt(D)) v -> merge -> out

`Attention.forward` reads in that order. A softmax kind is a subclass that fills in two methods:
- `attend(q, k, v)`: the fast path for a whole sequence (training, and prefill of an empty cache);
- `reference(q, k, v)`: the same maths materialised, returning (out, weights): the oracle in
  tests and the source of attention maps.
It may also override `cache_layout` (how many cache slots it needs), `cache_type` (a KVCache
subclass, when it keeps more than keys and values), `on_prefill` and `attend_cached`; and, for the
diagnostics, `softmax_maps` (a kind with more than one map per head) and `visible_keys` (a kind
whose queries see fewer keys than the causal ones). QK-norm, learned sinks and the output gate
(SoftmaxOptions) are options of every kind whose options derive from SoftmaxOptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..cache import KVCache
from ..config import NORM_EPS, ModelConfig
from ..documents import Documents, stack_pieces, token_rows
from ..flops import causal_pairs
from ..rope import apply_rope
from .kind_layer import KindLayer, norm_float32
from .sinks import SINK_WIDTH, sink_attention


@dataclass
class SoftmaxOptions:
    """Options of every softmax kind (attention.options.<kind>.*; LocalOptions adds its window)."""

    # RMSNorm over each head's queries and keys (learned weight of head_dim, eps NORM_EPS = 1e-6) before RoPE,
    # as Qwen3, OLMo2 and Gemma 3: logits stay bounded however large the projections grow.
    qk_norm: bool = False
    # One learned logit per head joins every softmax row as a column no value reads (gpt-oss):
    # a head may attend to nothing (minitx/attention/sinks.py).
    sinks: bool = False
    # The output times sigmoid(W_g x) before the output projection ("Gated Attention for LLMs",
    # Qwen3-Next): one gate per channel (elementwise) or one per head.
    gate: Literal["none", "elementwise", "head"] = "none"


class Attention(KindLayer):
    """Softmax attention over one fused q/k/v projection (see the module's docstring)."""

    cache_type = KVCache

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__(config, layer)
        self.n_kv_head = config.n_kv_head_at(layer)
        self.head_dim = config.head_dim
        inner, kv_inner = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        # q has n_head heads; k and v have n_kv_head heads each, which is the whole saving of
        # MQA/GQA. One matmul makes all three.
        self.qkv_proj = nn.Linear(config.d_model, inner + 2 * kv_inner, bias=config.bias)
        self.out_proj = nn.Linear(inner, config.d_model, bias=config.bias)
        options = config.options_at(layer)
        shared = options if isinstance(options, SoftmaxOptions) else SoftmaxOptions()
        norm = lambda: nn.RMSNorm(self.head_dim, eps=NORM_EPS) if shared.qk_norm else None  # noqa: E731
        self.q_norm, self.k_norm = norm(), norm()
        # Zero: each row starts with an extra exp(0) in its denominator, as a null token would.
        self.sinks = nn.Parameter(torch.zeros(self.n_head)) if shared.sinks else None
        gates = {"none": 0, "elementwise": inner, "head": self.n_head}[shared.gate]
        self.gate_proj = nn.Linear(config.d_model, gates, bias=config.bias) if gates else None

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def forward(
        self, x: Tensor, rope=None, cache: KVCache | None = None, docs: Documents | None = None
    ) -> Tensor:
        q, k, v = self.project(x, rope)
        if cache is None or cache.n_seen == 0:
            y = self.attend(q, k, v) if docs is None else self.attend_documents(q, k, v, docs)
            if cache is not None:  # a prompt into an empty cache: keep what the cache has room for
                cache.append(k, v)
                self.on_prefill(q, cache)
        else:  # the cache knows the new queries' documents (set_documents)
            y = self.attend_cached(q, k, v, cache)
        return self.merge(y, x)

    def project(self, x: Tensor, rope) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, n_head, T, D), k and v (B, n_kv_head, T, D) of x (B, T, d_model), RoPE applied."""
        B, T, _ = x.shape
        H, G = self.n_head, self.n_kv_head
        qkv = self.qkv_proj(x).view(B, T, H + 2 * G, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k, v = qkv.split([H, G, G], dim=1)
            q, k = norm_float32(self.q_norm, q), norm_float32(self.k_norm, k)
            return apply_rope(q, rope), apply_rope(k, rope), v
        # q and k turn by the same angles. One split rather than two slices: the backward joins
        # the two gradients with one cat, where each slice's filled a zero qkv-sized tensor.
        qk, v = qkv.split([H + G, G], dim=1)
        q, k = apply_rope(qk, rope).split([H, G], dim=1)
        return q, k, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Each kind's own: (B, H, T, D) outputs of a whole causal sequence."""
        raise NotImplementedError

    def merge(self, y: Tensor, x: Tensor) -> Tensor:
        """The heads y (B, H, T, D) side by side through the output projection; with a gate, each
        head's output first times sigmoid(W_g x) of the layer's input x."""
        B, H, T, D = y.shape
        if self.gate_proj is not None:
            gate = torch.sigmoid(self.gate_proj(x)).view(B, T, H, -1).transpose(1, 2)
            y = y * gate.to(y.dtype)  # (B, H, T, D or 1)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, H * D))

    def attend_documents(self, q: Tensor, k: Tensor, v: Tensor, docs: Documents) -> Tensor:
        """`attend` with no query seeing a key of another document (minitx/documents.py).

        Here, for any kind: each document's piece of each row goes through `attend` on its own,
        which is what that document alone computes, however the kind mixes scores (MTA's
        convolutions included). Pieces of similar lengths share one call (Documents.groups),
        right-padded with zeros: what comes after a query never reaches it (every kind is causal), so the padding
        changes no real output. Kinds with a mask-based path override this."""
        indices, place = docs.gathers()
        rows = [token_rows(t) for t in (q, k, v)]  # once, not once per group
        outs = []
        for index in indices:
            y = self.attend(*(stack_pieces(r, index) for r in rows))
            outs.append(y.transpose(1, 2).flatten(0, 1))  # (pieces x longest, heads, width) token rows
        # A kind's output may differ from q in heads and width (diff, MLA): y's, token by token.
        B, T = q.shape[0], q.shape[2]
        return torch.cat(outs).index_select(0, place).view(B, T, *outs[0].shape[1:]).transpose(1, 2)

    # -- decoding: the cache ------------------------------------------------------------------
    def attend_cached(self, q: Tensor, k: Tensor, v: Tensor, cache: KVCache) -> Tensor:
        """New tokens against the cache, which says which of its keys each new query may see."""
        keys, values, mask = cache.update(k, v)
        if self.sinks is not None:
            return sink_attention(q, keys, values, mask, self.sinks, self.scale)
        return F.scaled_dot_product_attention(
            q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, enable_gqa=True
        )

    def on_prefill(self, q: Tensor, cache: KVCache) -> None:
        """Called after a prompt went into an empty cache: keep what later steps need besides k, v."""

    @classmethod
    def cache_layout(cls, config: ModelConfig, layer: int) -> dict:
        """Keyword arguments of `cache_type` besides the shapes. Full attention: a ring of
        block_size slots; past it the context slides."""
        return dict(capacity=config.block_size, window=config.block_size)

    @classmethod
    def make_cache(cls, config: ModelConfig, layer: int, batch: int, max_len: int | None, dtype, device):
        """The cache a layer of this kind needs (device "meta" sizes it without memory)."""
        sizes = dict(max_len=max_len, dtype=dtype, device=device, **cls.cache_layout(config, layer))
        return cls.cache_type(batch, config.n_kv_head_at(layer), config.head_dim, **sizes)

    # -- FLOPs --------------------------------------------------------------------------------
    def flops_per_token(self, T: int) -> float:
        """Training FLOPs (forward and backward, 3 x forward) per token of this layer over a sequence
        of T tokens, besides the matmuls of its weights (6 per weight of every nn.Linear, which
        Transformer.flops_per_token counts): the products of queries with keys and of the weights
        with values over the causal triangle, T (T + 1) / 2 pairs (minitx/flops.py). QK-norm, a
        gate's product and a sink's logit are elementwise and not counted. A kind whose queries
        see other keys, or that computes more per pair, overrides this (local, diff, MLA, MTA),
        and so should a kind of one's own."""
        return self.pair_flops(T, causal_pairs(T), self.head_dim)

    def executed_flops_per_token(self, T: int, device: torch.device | str = "cpu") -> float:
        """A causal SDPA call over the whole T x T map, as FlopCounterMode counts one (a fused
        kernel may skip the blocks above the diagonal, a fact of one kernel). With sinks,
        `with_sink` puts one key and one query more before the sequence, each head SINK_WIDTH
        features wider."""
        if self.sinks is not None:
            return self.sdpa_flops(T, T + 1, T + 1, self.head_dim + SINK_WIDTH)
        return self.sdpa_flops(T, T, T, self.head_dim)
