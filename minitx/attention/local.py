"""Local (sliding-window) attention: query i sees keys i - window < j <= i, plus n_global sinks.

The work must be O(T * window): a dense -inf mask handed to SDPA would still compute T x T scores.
The portable path cuts the sequence into blocks of C >= window queries; every query's window then
lies within its own block and the one before it, so each block attends to 2C keys (plus the
global ones). On CUDA, compiled flex attention does the same block-sparse work in one kernel.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import functional
from ..compiling import compiled_flex_attention
from ..config import ModelConfig
from ..documents import Documents, flex_documents, masked_attention
from ..flops import window_pairs
from ..kinds import KindSpec
from ..options import OptionError, fail
from .sinks import SINK_WIDTH, with_sink
from .softmax import Attention, SoftmaxOptions

MIN_BLOCK = 64  # tiny windows still get blocks of this size: fewer, larger matmuls


@dataclass
class LocalOptions(SoftmaxOptions):
    """attention.options.local: the window, and the options every softmax kind has."""

    window: int = 128  # query i sees keys i - window < j <= i ...
    n_global: int = 0  # ... plus the first n_global positions (attention sinks)
    # "auto": compiled flex attention on CUDA, chunked elsewhere.
    backend: Literal["auto", "chunked", "flex"] = "auto"

    def __post_init__(self) -> None:
        if self.window < 1:
            raise OptionError("window", f"is {self.window}", "use a window of at least 1 token")
        if self.n_global < 0:
            raise OptionError("n_global", f"is {self.n_global}", "use 0 or more global tokens")


class LocalAttention(Attention):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__(config, layer)
        options: LocalOptions = config.options_at(layer)
        self.window, self.n_global, self.backend = options.window, options.n_global, options.backend

    @classmethod
    def cache_layout(cls, config: ModelConfig, layer: int) -> dict:
        # Past block_size the context slides as for full attention, so the window never exceeds it.
        options: LocalOptions = config.options_at(layer)
        window = min(options.window, config.block_size)
        n_sink = min(options.n_global, config.block_size)
        return dict(capacity=window + n_sink, window=window, n_sink=n_sink)

    def flops_per_token(self, T: int) -> float:
        """The window's pairs (minitx/flops.py): query i sees min(i + 1, window) keys, and the
        n_global first ones before them. A window of T or more is causal attention. A sink is a
        logit, not a key: nothing more."""
        return self.pair_flops(T, window_pairs(T, self.window, self.n_global), self.head_dim)

    def executed_flops_per_token(self, T: int, device: torch.device | str = "cpu") -> float:
        """The chunked path's blocks: `chunked_local` pads the queries to n blocks of
        C = min(max(window, MIN_BLOCK), T) and gives each block 2C keys plus the n_global ones,
        so n * C * (2C + n_global) scores (a window under MIN_BLOCK still costs 2 * MIN_BLOCK
        keys a query); a window that covers the sequence is plain causal SDPA over T x T. With
        sinks, the sink is a token before the sequence (a global one more) and each head
        SINK_WIDTH features wider (`with_sink`). On CUDA flex attention skips instead the 128 x
        128 blocks that lie wholly outside the window; the figure is the chunked path's."""
        length, width, n_global = T, self.head_dim, self.n_global
        if self.sinks is not None:
            length, width, n_global = T + 1, width + SINK_WIDTH, n_global + 1
        if self.window >= length:
            return self.sdpa_flops(T, length, length, width)
        C = min(max(self.window, MIN_BLOCK), length)
        n = -(-length // C)
        return self.sdpa_flops(T, n * C, 2 * C + n_global, width)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.sinks is None:
            return self.attend_window(q, k, v, self.n_global)

        # The sink goes in as a token before the sequence (see sinks.with_sink), always in view: one
        # global token more. The window is unchanged: every real token moved by one place.
        window = functools.partial(self.attend_window, n_global=self.n_global + 1, scale=self.scale)
        return with_sink(window, q, k, v, self.sinks, self.scale)

    def attend_window(self, q: Tensor, k: Tensor, v: Tensor, n_global: int, scale=None) -> Tensor:
        T = q.shape[2]
        if self.window >= T:  # the window covers every earlier token: plain causal attention
            return F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout_p, is_causal=True, scale=scale, enable_gqa=True
            )
        if self.use_flex(q):
            return flex_local(q, k, v, self.window, n_global, scale)
        return chunked_local(q, k, v, self.window, n_global, self.dropout_p, scale)

    def attend_documents(self, q: Tensor, k: Tensor, v: Tensor, docs: Documents) -> Tensor:
        # n_global is 0 here (check_local_model): global tokens are the sequence's first ones. A
        # sink enters as one token before the sequence (with_sink), in view of every document.
        leading = 0 if self.sinks is None else 1
        if self.use_flex(q):  # block-sparse: the window and the documents in one block mask
            attend = functools.partial(
                flex_documents, docs=docs, window=self.window, leading=leading, scale=self.scale
            )
        elif self.window >= q.shape[2]:  # the window covers every earlier token: the documents' mask alone
            attend = functools.partial(masked_attention, self.masked, docs=docs, leading=leading)
        else:
            starts = F.pad(docs.starts - docs.offset + leading, (leading, 0))  # as indices of q's rows

            def attend(q, k, v):
                return chunked_local(q, k, v, self.window, leading, self.dropout_p, self.scale, starts)

        return attend(q, k, v) if self.sinks is None else with_sink(attend, q, k, v, self.sinks, self.scale)

    def use_flex(self, q: Tensor) -> bool:
        """Compiled flex attention: asked for, or `auto` on CUDA; it has no dropout."""
        wanted = self.backend == "flex" or (self.backend == "auto" and q.is_cuda)
        return wanted and self.dropout_p == 0.0

    def masked(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout_p, scale=self.scale, enable_gqa=True
        )

    def reference(self, q: Tensor, k: Tensor, v: Tensor):
        return functional.attention(
            q, k, v, window=self.window, n_global=self.n_global, sinks=self.sinks, return_weights=True
        )

    def visible_keys(self, T: int, device=None) -> Tensor:
        positions = torch.arange(T, device=device)  # the reference's mask: the window and the globals
        return functional.allowed_mask(positions, positions, window=self.window, n_global=self.n_global)


def chunked_local(q, k, v, window: int, n_global: int = 0, dropout_p=0.0, scale=None, starts=None) -> Tensor:
    """Sliding-window attention in blocks: O(T * window) time and memory. With `starts` (B, T), the
    index where each query's document begins, no query sees a key before it (but the n_global)."""
    B, H, T, D = q.shape
    G, Dv = k.shape[1], v.shape[-1]
    C = min(max(window, MIN_BLOCK), T)  # block size; C >= window keeps each window in two blocks
    n = -(-T // C)
    pad = n * C - T
    if pad:  # padded keys lie in every real query's future, so the causal mask hides them
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))

    def with_previous_block(t: Tensor) -> Tensor:  # (B, G, n*C, D) -> (B*n, G, 2C [+ globals], D)
        width = t.shape[-1]
        blocks = t.reshape(B, G, n, C, width)  # q, k, v may be strided views of one projection
        previous = F.pad(blocks, (0, 0, 0, 0, 1, 0))[:, :, :-1]  # block -1 is zeros, masked out below
        parts = [previous, blocks]
        if n_global:
            parts.append(t[:, :, None, :n_global].expand(B, G, n, n_global, width))
        return torch.cat(parts, dim=3).transpose(1, 2).reshape(B * n, G, -1, width)

    keys, values = with_previous_block(k), with_previous_block(v)
    queries = q.reshape(B, H, n, C, D).transpose(1, 2).reshape(B * n, H, C, D)
    # Compiled, the mask is built into the graph once; dynamo would trace past the lru_cache anyway
    # (and warn that it does).
    block_mask = _block_mask.__wrapped__ if torch.compiler.is_compiling() else _block_mask
    mask = block_mask(n, C, window, n_global, q.device)  # (n, 1, C, keys)
    if starts is None:
        mask = mask.expand(B, n, 1, C, mask.shape[-1]).reshape(B * n, 1, C, -1)
    else:  # the same blocks, each query's keys cut at its document's start
        first = F.pad(starts, (0, pad)).view(B, n, C, 1)  # padded queries are cut off at the end anyway
        k_pos = torch.arange(-C, (n - 1) * C, C, device=q.device).view(n, 1, 1) + torch.arange(
            2 * C, device=q.device
        )
        same = (k_pos >= first) | (k_pos < n_global)  # (B, n, C, 2C)
        if n_global:
            same = torch.cat([same, same.new_ones(B, n, C, n_global)], dim=-1)
        mask = (mask.view(1, n, 1, C, -1) & same.view(B, n, 1, C, -1)).reshape(B * n, 1, C, -1)
    out = F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=mask, dropout_p=dropout_p, scale=scale, enable_gqa=True
    )
    return out.view(B, n, H, C, Dv).transpose(1, 2).reshape(B, H, n * C, Dv)[:, :, :T]


@functools.lru_cache(maxsize=32)
def _block_mask(n: int, C: int, window: int, n_global: int, device) -> Tensor:
    q_pos = torch.arange(n * C, device=device).view(n, C, 1)
    block_start = q_pos[:, :1, :] - q_pos[:, :1, :] % C  # first position of each query block
    k_pos = block_start - C + torch.arange(2 * C, device=device).view(1, 1, 2 * C)
    allowed = (k_pos >= 0) & (k_pos <= q_pos) & (q_pos - k_pos < window)
    if n_global:
        g_pos = torch.arange(n_global, device=device).view(1, 1, n_global)
        # A global key already inside the window is counted there, not twice.
        allowed_global = (g_pos <= q_pos) & (q_pos - g_pos >= window)
        allowed = torch.cat([allowed, allowed_global.expand(n, C, n_global)], dim=-1)
    return allowed.unsqueeze(1)


# Made outside inference mode even when generation asks first: flex attention's backward (CUDA
# only) saves the block mask's tensors, which an inference tensor cannot be.
@functools.lru_cache(maxsize=32)
@torch.inference_mode(False)
def _flex_block_mask(T: int, window: int, n_global: int, device):
    from torch.nn.attention.flex_attention import create_block_mask

    def sliding_window(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & ((q_idx - kv_idx < window) | (kv_idx < n_global))

    return create_block_mask(sliding_window, None, None, T, T, device=device)


def flex_local(
    q: Tensor, k: Tensor, v: Tensor, window: int, n_global: int = 0, scale: float | None = None
) -> Tensor:
    """Block-sparse sliding window through compiled flex attention (CUDA, or CPU for testing)."""
    block_mask = _flex_block_mask(q.shape[2], window, n_global, q.device)
    return compiled_flex_attention()(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)


def check_local_model(config: ModelConfig) -> None:
    if config.document_token is not None and config.attention.options_of("local").n_global:
        # The cache keeps the sequence's first tokens as the global ones; each document would need its own.
        fail(
            "attention.options.local.n_global",
            "global tokens are the first of the sequence, which with document_token set lie in another document",
            "set n_global to 0 (a learned sink, sinks: true, is in view of every document), or unset document_token",
        )


LOCAL = KindSpec("local", LocalAttention, options=LocalOptions, check_model=check_local_model)
