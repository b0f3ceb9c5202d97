"""Multi-head latent attention (MLA; DeepSeek-V2, arXiv 2405.04434, and V3): a small cache per token.

Each token is squeezed into one latent c_kv (kv_lora_rank numbers, RMS-normed), from which every
head expands its own keys and values, plus one small rotary key k_rope that all heads share:

    c_kv    = RMSNorm(W_dkv x)                                    (r)      cached
    k_rope  = RoPE(W_kr x)                                        (d_r)    cached, one for all heads
    k_h     = [W_uk,h c_kv ; k_rope]                              (nope + d_r)
    v_h     = W_uv,h c_kv                                         (v_head_dim)
    q_h     = [q_nope,h ; RoPE(q_rope,h)] from W_q x, or from W_uq RMSNorm(W_dq x) (q_lora_rank)
    out     = W_o [softmax(q_h . k_h / sqrt(nope + d_r)) v_h]_h

The cache holds c_kv and k_rope only: r + d_r numbers per token and layer, where GQA holds
2 * n_kv_head * head_dim. Decoding never expands them again: W_uk folds into the query and W_uv
comes after the weighted sum (DeepSeek's "absorbed" projections):

    q_h . k_h        = (W_uk,h^T q_nope,h) . c_kv + q_rope,h . k_rope   (a query in latent space)
    sum_j p_j v_h,j  = W_uv,h (sum_j p_j c_kv,j)                        (attend over the latents)

Why RoPE gets its own small key ("decoupled RoPE"): a rotation between W_uk and the score would
depend on the key's position, and W_uk could no longer be folded into the query.

Training (and a prompt into an empty cache) expands keys and values of its T tokens and runs SDPA;
tests/attention/test_mla.py holds both paths to each other and to transformers' DeepseekV3Attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import functional
from ..cache import KVCache
from ..config import NORM_EPS, ModelConfig
from ..documents import Documents, masked_attention
from ..flops import causal_pairs
from ..kinds import KindSpec
from ..options import OptionError, fail
from ..rope import apply_rope, rotary_table
from .kind_layer import KindLayer, at_least_float32, norm_float32


@dataclass
class MLAOptions:
    """attention.options.mla: the latent widths, named as in transformers' DeepseekV3Config.

    The defaults suit the default model (d_model 128, 4 heads of 32): 64 + 16 = 80 cached numbers
    per token and layer, against 256 for MHA and 128 for GQA with 2 key/value heads."""

    kv_lora_rank: int = 64  # r: the cached latent c_kv that keys and values expand from
    q_lora_rank: int | None = None  # None: queries straight from x (V2-Lite); else via a normed latent
    qk_rope_head_dim: int = 16  # d_r: the shared rotary key (cached) and each query's rotary part
    qk_nope_head_dim: int | None = None  # each head's query/key part without RoPE; None: head_dim
    v_head_dim: int | None = None  # each head's value width; None: head_dim

    def __post_init__(self) -> None:
        if self.kv_lora_rank < 1:
            raise OptionError("kv_lora_rank", f"is {self.kv_lora_rank}", "use a positive width such as 64")
        if self.q_lora_rank is not None and self.q_lora_rank < 1:
            raise OptionError(
                "q_lora_rank",
                f"is {self.q_lora_rank}",
                "use a positive width, or null for queries straight from x",
            )
        if self.qk_rope_head_dim < 2 or self.qk_rope_head_dim % 2:
            raise OptionError(
                "qk_rope_head_dim",
                f"is {self.qk_rope_head_dim}, but RoPE rotates pairs",
                "use a positive even width such as 16",
            )
        for name in ("qk_nope_head_dim", "v_head_dim"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise OptionError(name, f"is {value}", "use a positive width, or leave it unset (head_dim)")


def check_mla_model(config: ModelConfig) -> None:
    if config.positions != "rope":
        fail(
            "positions",
            f"is {config.positions!r}, but attention kind mla rotates a key part of its own (decoupled RoPE)",
            "set positions: rope",
        )


class LatentCache(KVCache):
    """MLA's cache: per token the normed latent c_kv (kept in `k`, kv_lora_rank wide) and the rotated
    shared key k_rope (kept in `v`, qk_rope_head_dim wide), one "head" each. The ring, the position
    tags and the masks are KVCache's, so past block_size the context slides as for full attention."""

    def __init__(self, batch: int, kv_lora_rank: int, capacity: int, *, rope_dim: int, **kwargs):
        super().__init__(batch, 1, kv_lora_rank, capacity, **kwargs)
        # KVCache made `v` as wide as `k`; the rotary keys are narrower.
        shape = (batch, 1, self.capacity, rope_dim)
        self.register_buffer("v", self.k.new_zeros(shape), persistent=False)


class MultiHeadLatentAttention(KindLayer):
    cache_type = LatentCache

    def __init__(self, config: ModelConfig, layer: int):
        # The interface alone (KindLayer), not Attention: its fused q/k/v projection has no place
        # here, and QK-norm, sinks and gates are the options of the softmax kinds that have it.
        super().__init__(config, layer)
        options: MLAOptions = config.options_at(layer)
        self.n_head = self.n_kv_head = config.n_head  # every head expands keys and values of its own
        self.head_dim = config.head_dim
        self.rank, self.rope_dim = options.kv_lora_rank, options.qk_rope_head_dim
        self.nope_dim = options.qk_nope_head_dim or config.head_dim
        self.v_dim = options.v_head_dim or config.head_dim
        H, d, qk = self.n_head, config.d_model, self.nope_dim + self.rope_dim
        # Biases where DeepSeek's attention_bias puts them: on the down- and output projections.
        self.q_proj = self.q_down = self.q_latent_norm = self.q_up = None
        if options.q_lora_rank is None:
            self.q_proj = nn.Linear(d, H * qk, bias=False)  # W_q
        else:
            self.q_down = nn.Linear(d, options.q_lora_rank, bias=config.bias)  # W_dq
            self.q_latent_norm = nn.RMSNorm(options.q_lora_rank, eps=NORM_EPS)
            self.q_up = nn.Linear(options.q_lora_rank, H * qk, bias=False)  # W_uq
        self.kv_down = nn.Linear(d, self.rank + self.rope_dim, bias=config.bias)  # W_dkv and W_kr, one matmul
        self.kv_latent_norm = nn.RMSNorm(self.rank, eps=NORM_EPS)
        # W_uk and W_uv in one matrix, each head's rows [nope | v] (transformers' kv_b_proj layout).
        self.kv_up = nn.Linear(self.rank, H * (self.nope_dim + self.v_dim), bias=False)
        self.out_proj = nn.Linear(H * self.v_dim, d, bias=config.bias)
        # RoPE over d_r features: the model's table turns head_dim features, at other frequencies.
        # Built inside a Transformer, every MLA layer of the model gets the same table (rotary_table).
        self.rotary = rotary_table(self.rope_dim, config.block_size)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.nope_dim + self.rope_dim)  # q_h and k_h have nope + d_r features

    # -- from x to queries and latents ------------------------------------------------------------
    def compress(self, x: Tensor, start: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, H, T, nope + d_r), c_kv (B, 1, T, r) and k_rope (B, 1, T, d_r) of x (B, T, d_model)
        whose first token sits at position `start`, RoPE applied to the rotary parts."""
        B, T, _ = x.shape
        rope = self.rotary(start, T)
        if self.q_proj is not None:
            q = self.q_proj(x)
        else:
            q = self.q_up(norm_float32(self.q_latent_norm, self.q_down(x)))
        q = q.view(B, T, self.n_head, -1).transpose(1, 2)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        c_kv, k_rope = self.kv_down(x).unsqueeze(1).split([self.rank, self.rope_dim], -1)
        q = torch.cat([q_nope, apply_rope(q_rope, rope)], dim=-1)
        return q, norm_float32(self.kv_latent_norm, c_kv), apply_rope(k_rope, rope)

    def expand(self, c_kv: Tensor, k_rope: Tensor) -> tuple[Tensor, Tensor]:
        """Keys (B, H, T, nope + d_r) and values (B, H, T, v) of each head from the latents."""
        B, _, T, _ = c_kv.shape
        kv = self.kv_up(c_kv.squeeze(1)).view(B, T, self.n_head, -1).transpose(1, 2)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_rope.expand(B, self.n_head, T, self.rope_dim)], dim=-1)
        return k, v

    def project(self, x: Tensor, rope=None, start: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v with every head expanded (the model's `rope` is not used: see `rotary`)."""
        q, c_kv, k_rope = self.compress(x, start)
        return (q, *self.expand(c_kv, k_rope))

    def absorbed(self) -> tuple[Tensor, Tensor]:
        """W_uk (H, nope, r) and W_uv (H, v, r): views of kv_up's weight, head by head."""
        weight = self.kv_up.weight.view(self.n_head, self.nope_dim + self.v_dim, self.rank)
        return weight.split([self.nope_dim, self.v_dim], dim=1)

    # -- attention ------------------------------------------------------------------------------
    def forward(
        self, x: Tensor, rope=None, cache: KVCache | None = None, docs: Documents | None = None
    ) -> Tensor:
        start = cache.n_seen if cache is not None else 0
        q, c_kv, k_rope = self.compress(x, start)
        if cache is not None and cache.n_seen > 0:
            y = self.attend_cached(q, c_kv, k_rope, cache)
        else:  # training, or a prompt into an empty cache: expand this call's tokens, then SDPA
            k, v = self.expand(c_kv, k_rope)
            y = self.attend(q, k, v) if docs is None else self.attend_documents(q, k, v, docs)
            if cache is not None:
                cache.append(c_kv, k_rope)
        B, H, T, _ = y.shape
        return self.out_proj(y.transpose(1, 2).reshape(B, T, H * self.v_dim))

    def flops_per_token(self, T: int) -> float:
        """The causal pairs (minitx/flops.py) with every head expanded: scores nope + d_r wide,
        values v_head_dim. The latent expansions (kv_up, q_up) are linear layers over the tokens,
        in the 6 per weight of Transformer.flops_per_token; decoding's absorbed path is not
        training and is not counted."""
        return self.pair_flops(T, causal_pairs(T), self.nope_dim + self.rope_dim, self.v_dim)

    def executed_flops_per_token(self, T: int, device: torch.device | str = "cpu") -> float:
        """Causal SDPA over T x T at the width `sdpa` pads to: the narrower of the queries' and
        the values' widths padded to the wider."""
        return self.sdpa_flops(T, T, T, max(self.nope_dim + self.rope_dim, self.v_dim))

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return self.sdpa(q, k, v, mask=None)

    def attend_documents(self, q: Tensor, k: Tensor, v: Tensor, docs: Documents) -> Tensor:
        return masked_attention(self.sdpa, q, k, v, docs)

    def sdpa(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Causal attention, or under a boolean `mask` (True: may see) that says more."""
        # Fused kernels want queries, keys and values of one width (on the CPU, SDPA takes a path
        # three times slower otherwise, measured at T = 1024): pad the narrower side with zeros,
        # which changes no score and no output feature, then cut the output back.
        qk, dv = q.shape[-1], v.shape[-1]
        if qk > dv:
            v = F.pad(v, (0, qk - dv))
        elif dv > qk:
            q, k = F.pad(q, (0, dv - qk)), F.pad(k, (0, dv - qk))
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout_p, is_causal=mask is None, scale=self.scale
        )
        return out[..., :dv]

    def reference(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # functional.attention scales by 1/sqrt(q's width) = 1/sqrt(nope + d_r), as `scale` does.
        return functional.attention(q, k, v, causal=True, return_weights=True)

    def attend_cached(self, q: Tensor, c_kv: Tensor, k_rope: Tensor, cache: KVCache) -> Tensor:
        """New queries (B, H, T, nope + d_r) against the cached latents, absorbed: keys and values
        are never expanded per head. Returns (B, H, T, v)."""
        latents, rope_keys, mask = cache.update(c_kv, k_rope)  # (B, 1, S, r), (B, 1, S, d_r), (T, S)
        latents, rope_keys = latents.to(q.dtype), rope_keys.to(q.dtype)
        B, H, T, _ = q.shape
        S = latents.shape[2]
        W_uk, W_uv = self.absorbed()
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope, W_uk.to(q.dtype))  # W_uk,h^T q_nope,h
        # All heads read the same latents: fold heads into rows, one matmul per batch entry.
        scores = q_latent.reshape(B, 1, H * T, self.rank) @ latents.transpose(-1, -2)
        scores = scores + q_rope.reshape(B, 1, H * T, self.rope_dim) @ rope_keys.transpose(-1, -2)
        scores = scores.view(B, H, T, S) * self.scale
        if mask is not None:  # (T, S) or (B, 1, T, S): which cached tokens each new query may see
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(at_least_float32(scores), dim=-1).to(q.dtype)
        mixed = (weights.view(B, 1, H * T, S) @ latents).view(B, H, T, self.rank)  # sum_j p_j c_kv,j
        return torch.einsum("bhtr,hvr->bhtv", mixed, W_uv.to(q.dtype))  # then W_uv,h

    # -- the decoding cache ---------------------------------------------------------------------
    @classmethod
    def make_cache(cls, config: ModelConfig, layer: int, batch: int, max_len: int | None, dtype, device):
        options: MLAOptions = config.options_at(layer)
        sizes = dict(max_len=max_len, dtype=dtype, device=device, rope_dim=options.qk_rope_head_dim)
        # Full attention's: a ring of block_size slots; past it the context slides.
        return cls.cache_type(
            batch, options.kv_lora_rank, config.block_size, window=config.block_size, **sizes
        )


MLA = KindSpec(
    "mla",
    MultiHeadLatentAttention,
    options=MLAOptions,
    kv_heads=lambda attention, n_head: n_head,  # expanded per head; the cache holds one shared latent
    reads_n_kv_head=False,
    check_model=check_mla_model,
)
