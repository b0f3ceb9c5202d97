"""Differential attention (Ye et al. 2024, arXiv 2410.05258): the difference of two softmax maps.

Two maps over the same keys cancel the attention both give to irrelevant context, as a
differential amplifier cancels common-mode noise. Query heads pair up, head i with head i + H/2
(and key/value head g with g + G/2, as transformers' DiffLlama lays them out); each pair is one
differential head of twice the width:

    A1, A2  = softmax(q_i k_g^T / sqrt(D)), softmax(q_{i+H/2} k_{g+G/2}^T / sqrt(D))
    out_i   = (A1 - lambda A2) [v_g, v_{g+G/2}]                              (2D wide)
    lambda  = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init                 (one per layer)
    y_i     = (1 - lambda_init) RMSNorm(out_i)                               (no learned weight)

with lambda_init = 0.8 - 0.6 exp(-0.3 l) for 0-based layer l, and the y_i side by side into the
output projection. The projections, RoPE and the KV cache are the shared ones (GQA included:
`attention.n_kv_head`, even); only the attention step differs. Every query head's map multiplies
its pair's 2D-wide values in one SDPA call, queries and keys padded with zeros to that width (no
score changes; fused kernels want equal widths: on the CPU this is 10% faster than one call per
value half, and three times faster than unequal widths, measured at T = 1024). The cost against
MHA is that doubled value width: the difference of the maps is taken after they meet the values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import functional
from ..cache import KVCache
from ..config import ModelConfig
from ..documents import Documents, masked_attention
from ..kinds import KindSpec, OptionError, fail
from .base import Attention

NORM_EPS = 1e-6  # the per-head RMSNorm's eps: minitx's everywhere, DiffLlama's rms_norm_eps on export


@dataclass
class DiffOptions:
    """attention.options.diff"""

    # lambda's constant part, in [0, 1); None: by depth, 0.8 - 0.6 exp(-0.3 layer), as the paper.
    lambda_init: float | None = None
    # std of the normal init of the four lambda vectors (DiffLlama's lambda_std_dev).
    lambda_std: float = 0.1

    def __post_init__(self) -> None:
        if self.lambda_std < 0:
            raise OptionError("lambda_std", f"is {self.lambda_std}", "use a standard deviation of 0 or more")
        # The output is scaled by 1 - lambda_init: at 1 or more it vanishes or flips sign.
        if self.lambda_init is not None and not 0 <= self.lambda_init < 1:
            raise OptionError(
                "lambda_init", f"is {self.lambda_init}", "use a value in [0, 1), or null (by depth)"
            )


def lambda_init_at(layer: int) -> float:
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


def check_diff_model(config: ModelConfig) -> None:
    if config.n_head % 2:
        fail("n_head", f"is {config.n_head}, but kind diff pairs query heads", "use an even n_head")
    for layer, kind in enumerate(config.layer_kinds):
        if kind == "diff" and config.n_kv_head_at(layer) % 2:
            fail(
                "attention.n_kv_head",
                f"is {config.n_kv_head_at(layer)}, but kind diff pairs key/value heads",
                "use an even number of key/value heads (2 or more)",
            )


class DifferentialAttention(Attention):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__(config, layer)
        options: DiffOptions = config.options_at(layer)
        self.lambda_init = lambda_init_at(layer) if options.lambda_init is None else options.lambda_init
        self.lambda_std = options.lambda_std
        D = self.head_dim
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.zeros(D)) for _ in range(4)
        )
        self.init_extra()

    def init_extra(self) -> None:
        for vector in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
            nn.init.normal_(vector, mean=0.0, std=self.lambda_std)

    def lambda_full(self) -> Tensor:
        lambda_1 = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dtype=torch.float32))
        lambda_2 = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dtype=torch.float32))
        return lambda_1 - lambda_2 + self.lambda_init

    @staticmethod
    def pair_values(v: Tensor) -> Tensor:
        """(B, G, S, D) -> (B, G/2, S, 2D): key/value heads g and g + G/2 side by side, the value
        of the pair of query heads that reads them."""
        return torch.cat(v.chunk(2, dim=1), dim=-1)

    def combine(self, out: Tensor) -> Tensor:
        """(B, H, T, 2D) outputs of every query head -> (B, H/2, T, 2D): pair differences, normed."""
        first, second = out.chunk(2, dim=1)  # query heads i and i + H/2
        diff = first - self.lambda_full().to(out.dtype) * second
        normed = F.rms_norm(diff, (diff.shape[-1],), eps=NORM_EPS)
        return (1 - self.lambda_init) * normed

    def flops_per_token(self, T: int) -> float:
        """Both maps, at the padded width: every one of the n_head query heads (the two halves of
        each differential head) meets the keys and its pair's values in one causal SDPA over
        T x T, queries and keys padded with zeros to the values' 2 * head_dim (`differential`).
        Twice MHA's count: the maps are two, and each multiplies values twice as wide."""
        return self.sdpa_flops(T, T, T, 2 * self.head_dim)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return self.differential(q, k, v, mask=None, causal=True)

    def attend_documents(self, q: Tensor, k: Tensor, v: Tensor, docs: Documents) -> Tensor:
        masked = lambda q, k, v, mask: self.differential(q, k, v, mask=mask, causal=False)  # noqa: E731
        return masked_attention(masked, q, k, v, docs)

    def attend_cached(self, q: Tensor, k: Tensor, v: Tensor, cache: KVCache) -> Tensor:
        keys, values, mask = cache.update(k, v)  # mask None: every cached key is visible
        return self.differential(q, keys.to(q.dtype), values.to(q.dtype), mask=mask, causal=False)

    def differential(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        # No dropout on the maps: the difference of two maps has no agreed dropout (DiffLlama
        # refuses it); the model's residual dropout still applies.
        D = q.shape[-1]
        # Query head h reads key/value head g = h // (H/G); heads g and g + G/2 read one pair's values.
        values = self.pair_values(v).repeat(1, 2, 1, 1)  # (B, G, S, 2D)
        q, k = F.pad(q, (0, D)), F.pad(k, (0, D))  # zeros: the same scores, at the values' width
        out = F.scaled_dot_product_attention(
            q, k, values, attn_mask=mask, is_causal=causal, scale=D**-0.5, enable_gqa=True
        )
        return self.combine(out)

    def softmax_maps(self, x: Tensor, rope=None) -> list[Tensor]:
        """[A1, A2], (B, H/2, T, T) each: the two softmax maps before their difference, which is
        no distribution (it has negative weights)."""
        q, k, _ = self.project(x, rope)
        weights = functional.attention(q, k, k, causal=True, return_weights=True)[1]
        return list(weights.chunk(2, dim=1))  # query heads i and i + H/2, as `reference` pairs them

    def reference(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """(out, the differential maps A1 - lambda A2, (B, H/2, T, T)), materialised."""
        _, weights = functional.attention(q, k, v, causal=True, return_weights=True)
        first, second = weights.chunk(2, dim=1)
        maps = first - self.lambda_full().to(weights.dtype) * second
        G = k.shape[1]
        value = self.pair_values(v).repeat_interleave(
            maps.shape[1] // (G // 2), dim=1
        )  # pair i reads kv pair i // r
        out = F.rms_norm(maps @ value, (value.shape[-1],), eps=NORM_EPS)
        return (1 - self.lambda_init) * out, maps


DIFF = KindSpec("diff", DifferentialAttention, options=DiffOptions, check_model=check_diff_model)
