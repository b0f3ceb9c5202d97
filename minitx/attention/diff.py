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
`attention.n_kv_head`, even); only the attention step differs.

Two ways to compute it, the same numbers:
- on a CPU, `DifferenceOfMaps`: for a tile of queries at a time, both maps materialised, their
  difference taken first, then one product with the 2D-wide values. That is MHA's arithmetic
  (H/2 maps of 2D-wide values), at the price of maps that no fused kernel keeps in registers; a
  tile of at most TILE_SCORES scores keeps memory linear in T, and the backward recomputes each
  tile's maps instead of keeping them.
- on a GPU, and for decoding's few queries anywhere, one fused SDPA call: every query head's map
  meets its pair's 2D-wide values, queries and keys padded with zeros to that width (no score
  changes; fused kernels want equal widths), and the difference is taken after the values: twice
  the value-side work, but a fused kernel's.
On the 2-core development CPU the tiles' forward + backward took 0.58, 0.75 and 0.83 of the fused
call's time at T = 256, 1024 and 4096, and the default model's training step 1.06-1.16x MHA's at
T = 1024 against 1.39-1.42x (benchmarks/diff_attention.py; benchmarks/RESULTS.md, issue 34).
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
from .softmax import Attention


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


# A tile is a chunk of QUERY_CHUNK queries of as many whole sequences as fit TILE_SCORES scores of
# one map (2 MiB in float32), at least one: memory linear in T. Smaller tiles pay per-call overheads, larger ones
# leave the cache: on the development CPU at T = 1024, forward + backward took 1.37, 1.12 and 1.20x
# MHA's at 2^18, 2^19 and 2^20 scores, and chunks of 16 or 32 queries 1.4-1.9x.
QUERY_CHUNK = 64
TILE_SCORES = 1 << 19


def fused_on(device: torch.device) -> bool:
    """Whether differential attention takes the fused SDPA call (a GPU) rather than the tiles."""
    return device.type not in ("cpu", "meta")


def tiles(B: int, H: int, T: int, S: int) -> list[tuple[slice, slice]]:
    """(sequences, queries): the tiles of B sequences of T queries of H heads against S keys."""
    per_tile = max(1, TILE_SCORES // (H * QUERY_CHUNK * S))
    return [
        (slice(b, b + per_tile), slice(t, min(t + QUERY_CHUNK, T)))
        for b in range(0, B, per_tile)
        for t in range(0, T, QUERY_CHUNK)
    ]


def tile_rows(t: Tensor, tile, r: int) -> Tensor:
    """The tile's queries of t (B, heads, T, width), r heads per group stacked as the rows of
    one product: (b, heads / r, r * queries, width)."""
    sequences, queries = tile
    return t.unflatten(1, (-1, r))[sequences, :, :, queries].flatten(2, 3)


def set_tile_rows(t: Tensor, tile, r: int, rows: Tensor) -> None:
    sequences, queries = tile
    t.unflatten(1, (-1, r))[sequences, :, :, queries] = rows.unflatten(2, (r, -1))


def tile_keys(t: Tensor, tile, causal: bool) -> Tensor:
    """The keys (or values) a tile's queries may see of t (B, heads, S, width): a view."""
    sequences, queries = tile
    return t[sequences, :, : queries.stop] if causal else t[sequences]


class DifferenceOfMaps(torch.autograd.Function):
    """(A1 - lambda A2) [v_g, v_{g+G/2}] of every pair of query heads, a tile of queries at a time.

    q (B, H, T, D); k, v (B, G, S, D); lam a 0-dim tensor; mask None or boolean (B, 1, T, S),
    True where a query may see a key; causal: query t sees keys up to t (T == S).
    Out (B, H/2, T, 2D): pair i is query heads i and i + H/2 over key/value heads g and g + G/2,
    g = i // r for r = H / G query heads per key/value head.

    Maps are float32 (float64 for float64 inputs) whatever the inputs' dtype, as in SDPA. The backward recomputes each tile's
    maps and goes through both softmaxes by hand: with M = A1 - lambda A2 and dM = dOut V^T,
        dV = M^T dOut,   dS1 = A1 (dM - rowsum(dM A1)),   dS2 = -lambda A2 (dM - rowsum(dM A2)),
        dlambda = -sum(dM A2),
    then dS to q and k as in any attention (dS2's -lambda applied to the whole gradients).
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, lam: Tensor, mask: Tensor | None, causal: bool):
        # Contiguous once: every tile reads the keys up to its end, and a strided slice of the
        # fused projection would be copied by each product.
        q, k, values = q.contiguous(), k.contiguous(), DifferentialAttention.pair_values(v)
        B, H, T, D = q.shape
        r = H // k.shape[1]
        out = q.new_empty(B, H // 2, T, 2 * D)
        future = torch.ones(QUERY_CHUNK, QUERY_CHUNK, dtype=torch.bool, device=q.device).triu(1)
        for tile in tiles(B, H, T, k.shape[2]):
            maps, _ = tile_maps(q, k, lam, mask, causal, future, tile)
            set_tile_rows(out, tile, r, maps.to(values.dtype) @ tile_keys(values, tile, causal))
        ctx.causal = causal
        ctx.save_for_backward(q, k, values, lam, mask)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, values, lam, mask = ctx.saved_tensors
        B, H, T, D = q.shape
        G, causal = k.shape[1], ctx.causal
        r = H // G
        grad_q, grad_k, grad_values = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(values)
        grad_lam = torch.zeros((), dtype=maps_dtype(q), device=q.device)
        grad_out = grad_out.to(values.dtype)
        future = torch.ones(QUERY_CHUNK, QUERY_CHUNK, dtype=torch.bool, device=q.device).triu(1)
        for tile in tiles(B, H, T, k.shape[2]):
            maps, probs = tile_maps(q, k, lam, mask, causal, future, tile)
            grad_tile = tile_rows(grad_out, tile, r)
            tile_keys(grad_values, tile, causal).add_(maps.to(values.dtype).transpose(-1, -2) @ grad_tile)
            grad_maps = (grad_tile @ tile_keys(values, tile, causal).transpose(-1, -2)).to(probs.dtype)
            grad_scores = probs * grad_maps.unsqueeze(1)  # both maps meet dM; A (dM - rowsum(dM A)):
            row_sums = grad_scores.sum(-1, keepdim=True)  # (b, 2, G/2, rows, 1)
            grad_lam -= row_sums[:, 1].sum()
            grad_scores = grad_scores.addcmul_(probs, row_sums, value=-1).flatten(1, 2).to(q.dtype)
            set_tile_rows(grad_q, tile, r, grad_scores @ tile_keys(k, tile, causal))
            tile_keys(grad_k, tile, causal).add_(grad_scores.transpose(-1, -2) @ tile_rows(q, tile, r))
        scale = D**-0.5
        grad_q[:, : H // 2] *= scale
        grad_q[:, H // 2 :] *= -lam.to(q.dtype) * scale  # the second map of each pair enters with -lambda
        grad_k[:, : G // 2] *= scale
        grad_k[:, G // 2 :] *= -lam.to(k.dtype) * scale
        grad_v = torch.cat(grad_values.chunk(2, dim=-1), dim=1)
        return grad_q, grad_k, grad_v, grad_lam.to(lam.dtype), None, None


def maps_dtype(q: Tensor) -> torch.dtype:
    """float32, or q's dtype where wider (float64, as the tests' gradients use)."""
    return torch.promote_types(q.dtype, torch.float32)


def tile_maps(
    q: Tensor, k: Tensor, lam: Tensor, mask: Tensor | None, causal: bool, future: Tensor, tile
) -> tuple[Tensor, Tensor]:
    """(A1 - lambda A2 (b, G/2, rows, keys), both maps (b, 2, G/2, rows, keys)) of a tile in
    `maps_dtype`; rows: the tile's queries of the r query heads of one key/value head. future: True
    above the diagonal of a (QUERY_CHUNK, QUERY_CHUNK) block, made once per call."""
    sequences, queries = tile
    G, r = k.shape[1], q.shape[1] // k.shape[1]
    keys = tile_keys(k, tile, causal)
    scores = ((tile_rows(q, tile, r) * q.shape[-1] ** -0.5) @ keys.transpose(-1, -2)).to(maps_dtype(q))
    grid = scores.view(scores.shape[0], G, r, -1, keys.shape[2])  # (b, G, r, queries, keys)
    if causal:  # the tile's last keys are its own queries' positions: above the diagonal is future
        n = queries.stop - queries.start
        grid[..., -n:].masked_fill_(future[:n, :n], -math.inf)
    if mask is not None:
        grid.masked_fill_(~mask[sequences, :, queries].unsqueeze(2), -math.inf)
    probs = torch.softmax(scores, dim=-1).unflatten(1, (2, G // 2))
    return torch.addcmul(probs[:, 0], probs[:, 1], lam.to(probs.dtype), value=-1), probs


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
        lambda_1 = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dtype=maps_dtype(self.lambda_q1)))
        lambda_2 = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dtype=maps_dtype(self.lambda_q2)))
        return lambda_1 - lambda_2 + self.lambda_init

    @staticmethod
    def pair_values(v: Tensor) -> Tensor:
        """(B, G, S, D) -> (B, G/2, S, 2D): key/value heads g and g + G/2 side by side, the value
        of the pair of query heads that reads them."""
        return torch.cat(v.chunk(2, dim=1), dim=-1)

    def combine(self, out: Tensor) -> Tensor:
        """(B, H, T, 2D) outputs of every query head -> (B, H/2, T, 2D): pair differences, normed."""
        first, second = out.chunk(2, dim=1)  # query heads i and i + H/2
        return self.normed(first - self.lambda_full().to(out.dtype) * second)

    def normed(self, diff: Tensor) -> Tensor:
        """(1 - lambda_init) RMSNorm of each differential head's output (B, H/2, T, 2D)."""
        return (1 - self.lambda_init) * F.rms_norm(diff, (diff.shape[-1],), eps=NORM_EPS)

    def flops_per_token(self, T: int) -> float:
        """The two maps and one product with the values over the causal pairs (minitx/flops.py):
        all n_head query heads score head_dim wide (each differential head's two maps), and each
        of the n_head / 2 differences meets the 2 * head_dim-wide values, whichever path computes
        them: MHA's count."""
        H, D, pairs = self.n_head, self.head_dim, causal_pairs(T)
        return 6 * pairs * (H * D + (H // 2) * 2 * D) / T

    def executed_flops_per_token(self, T: int, device: torch.device | str = "cpu") -> float:
        """As `differential` computes on `device`. Tiles (a CPU, or the meta device): each chunk
        of queries scores the keys up to its last query, n_head maps head_dim wide, and the
        n_head / 2 differences meet values 2 * head_dim wide (the backward's recomputation of
        each tile's maps not counted). The fused call (a GPU): all n_head maps over T x T,
        queries and keys padded to the values' 2 * head_dim, twice MHA's dense count."""
        if fused_on(torch.device(device)):
            return self.sdpa_flops(T, T, T, 2 * self.head_dim)
        scored = sum(
            min(t + QUERY_CHUNK, T) * (min(t + QUERY_CHUNK, T) - t) for t in range(0, T, QUERY_CHUNK)
        )
        return 6 * self.n_head * scored * 2 * self.head_dim / T

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return self.differential(q, k, v, mask=None, causal=True)

    def attend_documents(self, q: Tensor, k: Tensor, v: Tensor, docs: Documents) -> Tensor:
        masked = lambda q, k, v, mask: self.differential(q, k, v, mask=mask, causal=False)  # noqa: E731
        return masked_attention(masked, q, k, v, docs)

    def attend_cached(self, q: Tensor, k: Tensor, v: Tensor, cache: KVCache) -> Tensor:
        keys, values, mask = cache.update(k, v)  # mask None: every cached key is visible
        # The fused call on any device: a step's few queries are a chain of small operations,
        # fewer this way (decoding at 0.72 of MHA's tokens/s against 0.59 through the tiles).
        out = self.fused(q, keys.to(q.dtype), values.to(q.dtype), mask=mask, causal=False)
        return self.combine(out)

    def differential(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        """The differential heads (B, H/2, T, 2D) of q (B, H, T, D) and k, v (B, G, S, D); mask
        None or boolean, broadcastable to (B, 1, T, S), True where a query may see a key."""
        # No dropout on the maps: the difference of two maps has no agreed dropout (DiffLlama
        # refuses it); the model's residual dropout still applies.
        if fused_on(q.device):
            return self.combine(self.fused(q, k, v, mask, causal))
        if mask is not None:
            mask = mask.expand(q.shape[0], 1, q.shape[2], k.shape[2])
        return self.normed(DifferenceOfMaps.apply(q, k, v, self.lambda_full(), mask, causal))

    def fused(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        """(B, H, T, 2D): every query head's map times its pair's values, in one SDPA call."""
        D = q.shape[-1]
        # Query head h reads key/value head g = h // (H/G); heads g and g + G/2 read one pair's values.
        values = self.pair_values(v).repeat(1, 2, 1, 1)  # (B, G, S, 2D)
        q, k = F.pad(q, (0, D)), F.pad(k, (0, D))  # zeros: the same scores, at the values' width
        return F.scaled_dot_product_attention(
            q, k, values, attn_mask=mask, is_causal=causal, scale=D**-0.5, enable_gqa=True
        )

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
        G = k.shape[1]  # pair i reads kv pair i // r
        value = self.pair_values(v).repeat_interleave(maps.shape[1] // (G // 2), dim=1)
        out = F.rms_norm(maps @ value, (value.shape[-1],), eps=NORM_EPS)
        return (1 - self.lambda_init) * out, maps


DIFF = KindSpec("diff", DifferentialAttention, options=DiffOptions, check_model=check_diff_model)
