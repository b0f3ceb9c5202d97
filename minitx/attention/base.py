"""The layer every attention kind is, and the machinery the softmax kinds share.

`KindLayer` is the interface: what the model, the decoder, the FLOP count and the diagnostics
call on a layer, whatever it computes: `forward(x, rope, cache, docs)`, the decoding cache
(`make_cache`, `new_cache`, `setup_cache`, `reset_cache`, `remove_cache`), `flops_per_token`
(and `executed_flops_per_token`), `init_extra`, and, where a kind has softmax maps, `reference` / `softmax_maps`. A kind that is not
softmax attention over a fused q/k/v projection (MLA's latents, gdn's recurrent state) derives
from it directly.

`Attention` is the softmax machinery on top: projections, RoPE, the cached decode path, attention
maps. A softmax kind is a subclass that fills in two methods:
- `attend(q, k, v)`: the fast path for a whole sequence (training, and prefill of an empty cache);
- `reference(q, k, v)`: the same maths materialised, returning (out, weights): the oracle in
  tests and the source of attention maps.
It may also override `cache_layout` (how many cache slots it needs), `cache_type` (a KVCache
subclass, when it keeps more than keys and values), `on_prefill` and `attend_cached`; and, for the
diagnostics, `softmax_maps` (a kind with more than one map per head) and `visible_keys` (a kind
whose queries see fewer keys than the causal ones).

Three additions of 2024-25 are options of every softmax kind whose options derive from
`SoftmaxOptions` (mha, mqa, gqa, local): QK-norm and the output gate live here, in the shared
projections; learned sinks change the softmax, so each kind's `attend` goes through `with_sink`.

A layer owns its decoding cache: `setup_cache` makes one (`self.kv_cache`), `reset_cache` empties
it. A cache may also be made apart (`new_cache`) and passed to `forward`, as `Transformer.new_cache`
does for several sequences at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import functional
from ..cache import KVCache
from ..config import NORM_EPS, ModelConfig
from ..documents import Documents, stack_pieces, token_rows
from ..flops import causal_pairs
from ..rope import apply_rope

# The features `with_sink` adds to each head: the sink's, padded so that widths stay aligned.
SINK_WIDTH = 8


@dataclass
class SoftmaxOptions:
    """Options of every softmax kind (attention.options.<kind>.*; LocalOptions adds its window)."""

    # RMSNorm over each head's queries and keys (learned weight of head_dim, eps NORM_EPS = 1e-6) before RoPE,
    # as Qwen3, OLMo2 and Gemma 3: logits stay bounded however large the projections grow.
    qk_norm: bool = False
    # One learned logit per head joins every softmax row as a column no value reads (gpt-oss):
    # a head may attend to nothing, p_ij = exp(z_ij) / (exp(s_h) + sum_j exp(z_ij)).
    sinks: bool = False
    # The output times sigmoid(W_g x) before the output projection ("Gated Attention for LLMs",
    # Qwen3-Next): one gate per channel (elementwise) or one per head.
    gate: Literal["none", "elementwise", "head"] = "none"


def norm_float32(norm: nn.Module, x: Tensor) -> Tensor:
    """An RMSNorm of float32 weights over x in float32, returned in x's dtype: under bf16 autocast
    the projections hand it bf16, which the fused kernel refuses beside float32 weights."""
    return norm(x.float()).to(x.dtype)


class KindLayer(nn.Module):
    """The interface of one layer of any attention kind (see the module's docstring).

    A subclass implements `forward`, `make_cache` and `flops_per_token` (REQUIRED); the cache's
    life (new, set up, reset, removed) and the defaults below come with it. What those defaults
    read of a layer is declared here too:
    - `n_head`, its query heads (config.n_head unless the kind sets another): `sdpa_flops`;
    - `project(x, rope)` and `reference(q, k, v)`, for a kind with softmax maps: the default
      `attention_weights` (and so `softmax_maps`). `Attention` has them; a kind without softmax
      maps (gdn) overrides `attention_weights` instead.
    `missing()` names what a class leaves unimplemented; `attention.build` refuses such a class."""

    REQUIRED = ("forward", "make_cache", "flops_per_token")

    n_head: int  # query heads

    # Whether several new tokens may go through the cached path in one call (a long prompt's
    # prefill past block_size): the cache masks every new query by its own position.
    extends_in_chunks = True

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.config = config
        self.layer = layer
        self.block_size = config.block_size
        self.dropout = config.dropout_at("attn")  # on the attention weights
        self.n_head = config.n_head
        self.kv_cache: nn.Module | None = None  # the layer's own cache while set up (setup_cache)

    @classmethod
    def missing(cls) -> list[str]:
        """The methods of REQUIRED this class leaves as KindLayer's (which raise NotImplementedError)."""
        owner = {name: next(c for c in cls.__mro__ if name in vars(c)) for name in cls.REQUIRED}
        return [name for name in cls.REQUIRED if owner[name] is KindLayer]

    def forward(self, x: Tensor, rope=None, cache=None, docs: Documents | None = None) -> Tensor:
        """x (B, T, d_model) -> (B, T, d_model); through `cache` when given (decoding), keeping
        each token inside its document when `docs` is given (training on packed documents)."""
        raise NotImplementedError

    @classmethod
    def make_cache(cls, config: ModelConfig, layer: int, batch: int, max_len: int | None, dtype, device):
        """The cache a layer of this kind needs (device "meta" sizes it without memory): a module
        with `n_seen`, `reset()`, `set_documents(starts)` and `nbytes()`, as KVCache has."""
        raise NotImplementedError

    def flops_per_token(self, T: int) -> float:
        """Training FLOPs per token over T tokens besides the matmuls of its nn.Linear weights, by
        the convention of minitx/flops.py: the work its math needs over the (query, key) pairs its
        queries may see, whatever its code pads or recomputes and wherever it runs. Every kind
        declares its own."""
        raise NotImplementedError

    def executed_flops_per_token(self, T: int, device: torch.device | str = "cpu") -> float:
        """What this layer's code path executes per token on `device`, besides its weights'
        matmuls: padded blocks, both halves of a causal map and the like, which the convention
        leaves out (benchmarks/mfu.py reports it beside the model FLOPs; never a budget). A kind
        that does not say is taken to execute what its math needs."""
        return self.flops_per_token(T)

    def init_extra(self) -> None:
        """Initialise parameters the model's generic init must not touch (none here)."""

    # -- softmax maps, where a kind has them ----------------------------------------------------
    def project(self, x: Tensor, rope) -> tuple[Tensor, Tensor, Tensor]:
        """(q, k, v) of x (B, T, d_model), as `reference` takes them: (B, heads, T, width) each."""
        raise NotImplementedError(f"attention kind {type(self).__name__} has no q/k/v projection")

    def reference(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """(out, weights), the maths materialised: the oracle of a softmax kind's tests."""
        raise NotImplementedError(f"attention kind {type(self).__name__} has no materialised softmax map")

    def attention_weights(self, x: Tensor, rope=None) -> Tensor:
        """(B, H, T, T) attention weights of this layer for input x, from the reference path."""
        q, k, v = self.project(x, rope)
        return self.reference(q, k, v)[1]

    def softmax_maps(self, x: Tensor, rope=None) -> list[Tensor]:
        """Each softmax map of this layer for input x, (B, heads, T, T) probabilities apiece: the
        diagnostics (minitx/evaluation/diagnostics.py) read entropy and sinks off a distribution,
        which a kind that combines several maps (diff) only has before it combines them."""
        return [self.attention_weights(x, rope)]

    def visible_keys(self, T: int, device=None) -> Tensor:
        """(T, T) bool, True where query i may see key j in a sequence of T tokens: the support of
        the maps, whose size normalises the diagnostics' entropy. Causal here; a window narrows it."""
        positions = torch.arange(T, device=device)
        return functional.allowed_mask(positions, positions, causal=True)

    def pair_flops(self, T: int, pairs: int, width: int, value_width: int | None = None) -> float:
        """Per token of T: training FLOPs of `pairs` (query, key) pairs for each of n_head query
        heads, a score `width` wide and a weight times a value `value_width` wide (default:
        `width`) apiece; grouped key/value heads save no arithmetic. 2 FLOPs per multiply-add,
        and the backward's four products (the gradients of the values, the weights, the queries
        and the keys) twice the forward's two: 6 per multiply-add of the forward."""
        value_width = width if value_width is None else value_width
        return 6 * self.n_head * pairs * (width + value_width) / T

    def sdpa_flops(
        self, T: int, queries: int, keys: int, width: int, value_width: int | None = None
    ) -> float:
        """`pair_flops` of every one of `queries` x `keys` pairs: what a dense call computes, the
        executed figure of an SDPA over that rectangle (a fused kernel's recomputation of the
        scores in the backward not counted)."""
        return self.pair_flops(T, queries * keys, width, value_width)

    # -- the decoding cache -------------------------------------------------------------------
    def new_cache(self, batch: int, max_len: int | None = None, dtype=None, device=None):
        """A cache for this layer, not attached to it (pass it to forward); dtype and device of
        the layer's first weight unless given."""
        weight = next(self.parameters())
        return self.make_cache(
            self.config, self.layer, batch, max_len, dtype or weight.dtype, device or weight.device
        )

    def setup_cache(self, batch: int, max_len: int | None = None, dtype=None, device=None):
        """Make this layer's own cache, used by the model's forward while it is set up."""
        self.kv_cache = self.new_cache(batch, max_len, dtype, device)
        return self.kv_cache

    def reset_cache(self) -> None:
        if self.kv_cache is not None:
            self.kv_cache.reset()

    def remove_cache(self) -> None:
        self.kv_cache = None

    @property
    def dropout_p(self) -> float:
        return self.dropout if self.training else 0.0


class Attention(KindLayer):
    """Softmax attention over one fused q/k/v projection: what mha, mqa, gqa, local, mta, diff
    and a kind of one's own (examples/custom_attention.py) share."""

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

    # -- to be filled in by each kind -------------------------------------------------------
    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        raise NotImplementedError

    @classmethod
    def cache_layout(cls, config: ModelConfig, layer: int) -> dict:
        """Keyword arguments of `cache_type` besides the shapes. Full attention: a ring of
        block_size slots; past it the context slides."""
        return dict(capacity=config.block_size, window=config.block_size)

    def on_prefill(self, q: Tensor, cache: KVCache) -> None:
        """Called after a prompt went into an empty cache: keep what later steps need besides k, v."""

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

    # -- shared machinery -------------------------------------------------------------------
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

    def merge(self, y: Tensor, x: Tensor) -> Tensor:
        """The heads y (B, H, T, D) side by side through the output projection; with a gate, each
        head's output first times sigmoid(W_g x) of the layer's input x."""
        B, H, T, D = y.shape
        if self.gate_proj is not None:
            gate = torch.sigmoid(self.gate_proj(x)).view(B, T, H, -1).transpose(1, 2)
            y = y * gate.to(y.dtype)  # (B, H, T, D or 1)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, H * D))

    def with_sink(self, attend, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Attention with sinks through `attend`, any causal attention of (q, k, v) that takes
        the sink as one token before the sequence (and scales by `self.scale`).

        The sink's key [0, ..., 0, 1] meets each query [q, s_h / scale], so its score is exactly
        s_h, while every real score q.k is unchanged (the real keys get a 0 there); its value is 0,
        so it only adds exp(s_h) to each row's denominator. A query one place later sees one key
        more, exactly the sink: the first output dropped and cut back to D features, this is
        attention with sinks. The extra feature is padded to 8, and the values with zeros to the
        same width: fused kernels want equal, aligned widths (on the CPU, SDPA with values
        narrower than the keys takes a path three times slower, measured at T = 1024).
        """
        B, H, T, D = q.shape
        extra = SINK_WIDTH
        sink_feature = (self.sinks / self.scale).to(q.dtype).view(1, H, 1, 1).expand(B, H, T, 1)
        q = F.pad(torch.cat([q, sink_feature], dim=-1), (0, extra - 1, 1, 0))
        k = F.pad(k, (0, extra, 1, 0))
        k[:, :, 0, D] = 1.0
        v = F.pad(v, (0, extra, 1, 0))
        return attend(q, k, v)[:, :, 1:, :D]

    def sink_attention(self, q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
        """Attention with sinks of a few new queries against a cache's keys (mask: (T, keys),
        (B, 1, T, keys) or None), materialised: decoding's scores are one row per query anyway."""
        B, H, T, D = q.shape
        G = keys.shape[1]
        r = H // G  # query heads per key/value head: grouped, never copied
        scores = (q.reshape(B, G, r * T, D) @ keys.to(q.dtype).transpose(-1, -2)) * self.scale
        if mask is not None:  # (T, keys), or (B, 1, T, keys) with documents
            rows = mask.repeat(r, 1) if mask.dim() == 2 else mask.repeat(1, 1, r, 1)
            scores = scores.masked_fill(~rows, float("-inf"))
        sink = self.sinks.to(scores.dtype).view(1, G, r, 1, 1).expand(B, G, r, T, 1).reshape(B, G, r * T, 1)
        norm = torch.logsumexp(torch.cat([scores, sink], dim=-1), dim=-1, keepdim=True)
        out = torch.exp(scores - norm) @ values.to(q.dtype)
        return out.view(B, H, T, D)

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

    def attend_cached(self, q: Tensor, k: Tensor, v: Tensor, cache: KVCache) -> Tensor:
        """New tokens against the cache, which says which of its keys each new query may see."""
        keys, values, mask = cache.update(k, v)
        if self.sinks is not None:
            return self.sink_attention(q, keys, values, mask)
        return F.scaled_dot_product_attention(
            q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, enable_gqa=True
        )

    # -- the decoding cache -------------------------------------------------------------------
    @classmethod
    def make_cache(
        cls, config: ModelConfig, layer: int, batch: int, max_len: int | None, dtype, device
    ) -> KVCache:
        """The cache a layer of this kind needs (device "meta" sizes it without memory)."""
        return cls.cache_type(
            batch,
            config.n_kv_head_at(layer),
            config.head_dim,
            max_len=max_len,
            dtype=dtype,
            device=device,
            **cls.cache_layout(config, layer),
        )

    def new_cache(self, batch: int, max_len: int | None = None, dtype=None, device=None) -> KVCache:
        """A cache for this layer, not attached to it (pass it to forward)."""
        weight = self.qkv_proj.weight
        return self.make_cache(
            self.config, self.layer, batch, max_len, dtype or weight.dtype, device or weight.device
        )

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)
