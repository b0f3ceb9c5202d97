"""Sampling: one new token per row from the logits of the last position.

Greedy (argmax) at temperature 0, otherwise a sample from softmax(logits / temperature) after the
optional top-k and top-p (nucleus) filters. The decode loop (loop.py) calls `pick_next` each step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import UserError, require


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Logits with everything below the k-th largest of each row set to -inf (ties kept)."""
    if k >= logits.shape[-1]:
        return logits
    kth_largest = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Logits outside the nucleus set to -inf: the fewest most likely tokens whose probabilities
    add up to at least p. The most likely token always stays."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # probability of the tokens ranked above
    drop_sorted = mass_before >= p  # the nucleus is already complete without this token
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def pick_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One token id per row of logits (B, vocab): argmax at temperature 0, else a filtered sample."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1, generator=generator).squeeze(-1)


def check_options(
    max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None, cli: bool = False
) -> None:
    """Raise UserError naming the first bad option (as a --flag when `cli`) and its fix."""

    def name(option: str) -> str:
        return "--" + option.replace("_", "-") if cli else option

    require(max_new_tokens >= 0, f"{name('max_new_tokens')}: is {max_new_tokens}; use 0 or more")
    # Not `require(temperature >= 0)`: a nan is the caller's to refuse (generation/inputs.py).
    if temperature < 0:
        raise UserError(f"{name('temperature')}: is {temperature}; use 0 (greedy) or more")
    if top_k is not None and top_k < 1:
        raise UserError(f"{name('top_k')}: is {top_k}; use 1 or more, or leave it unset")
    if top_p is not None and not 0 < top_p <= 1:
        raise UserError(f"{name('top_p')}: is {top_p}; use a probability in (0, 1], or leave it unset")
