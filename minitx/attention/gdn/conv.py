"""Gated DeltaNet's short convolution: causal and depthwise over q, k and v, of conv_size taps,
followed by SiLU (fla's ShortConvolution). Its last conv_size - 1 inputs are what the decoding
cache keeps of it; with documents, no input from before a token's document reaches the token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ...documents import Documents

# Up to this many tokens the short convolution is a product and a sum: conv1d costs ~0.2 ms per
# call on a CPU whatever the length, 30x the arithmetic of one token (benchmarks/RESULTS.md).
FEW_TOKENS = 64


def short_convolution(
    mixed: Tensor, weight: Tensor, window: Tensor | None, docs: Documents | None, start: int
) -> tuple[Tensor, Tensor]:
    """SiLU of the causal depthwise convolution by `weight` (channels, 1, K) of mixed (B, T, channels) whose first token sits
    at `start`, after `window` (the cache's last conv_size - 1 inputs, or zeros); with documents
    no input from before a token's document reaches it. Returns it and the new window."""
    B, T, _ = mixed.shape
    K = weight.shape[-1]
    if window is None:
        padded = F.pad(mixed, (0, 0, K - 1, 0))
    else:
        padded = torch.cat([window.to(mixed.dtype), mixed], dim=1)
    if docs is None and T <= FEW_TOKENS:  # decoding: the products, without conv1d's setup
        out = (padded.unfold(1, K, 1) * weight.squeeze(1)).sum(-1)
    elif docs is None:
        out = F.conv1d(padded.transpose(1, 2), weight, groups=weight.shape[0]).transpose(1, 2)
    else:
        windows = padded.unfold(1, K, 1)  # (B, T, channels, K): inputs at start + t - K + 1 + j
        source = start + torch.arange(T, device=mixed.device)[:, None] - (K - 1)
        source = source + torch.arange(K, device=mixed.device)
        seen = (source[None] >= docs.starts[:, :, None]).to(mixed.dtype)  # (B, T, K)
        out = torch.einsum("btck,btk,ck->btc", windows, seen, weight.squeeze(1))
    window = padded[:, padded.shape[1] - (K - 1) :]
    if docs is not None:  # keep only the running document's inputs: nothing from before it stays
        kept = start + T - (K - 1) + torch.arange(K - 1, device=mixed.device)
        window = window * (kept[None] >= docs.starts[:, -1:]).to(window.dtype)[..., None]
    return F.silu(out), window
