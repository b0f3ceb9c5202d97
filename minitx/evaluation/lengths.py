"""Loss at other context lengths than the one trained on, and loss by position in the context.

Every length scores the same text with non-overlapping windows of that many tokens, through one
direct forward per window. RoPE models run any length (their rotation tables grow; all attention
kinds accept it); models with learned positions have no embedding past block_size, so longer
lengths are skipped with that reason.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from torch import Tensor

from .perplexity import Scores, score_tokens


def default_lengths(block_size: int) -> list[int]:
    """block_size / 4 .. 8 x block_size, doubling (64 .. 2048 for block_size 256)."""
    return sorted({max(1, block_size * 2**k // 4) for k in range(6)})


def length_refusal(config, length: int) -> str | None:
    """Why a model cannot run windows of `length` tokens, or None if it can."""
    if config.positions == "learned" and length > config.block_size:
        return f"learned positions stop at block_size={config.block_size}"
    return None


def position_buckets(scores: Scores) -> dict[str, list]:
    """Mean loss by position inside the window, in buckets [0, 1), [1, 2), [2, 4), [4, 8), ...

    Position p means p tokens came before the target in its window. Doubling buckets keep
    the early positions, where the loss moves fastest, apart and the curve short.
    """
    context = len(scores.position_tokens)
    edges = [0] + [2**k for k in range(int(np.log2(context)) + 1)] + [context]
    edges = sorted(set(edge for edge in edges if edge <= context))
    curve: dict[str, list] = {"start": [], "end": [], "loss": [], "tokens": []}
    for start, end in zip(edges[:-1], edges[1:]):
        tokens = int(scores.position_tokens[start:end].sum())
        if tokens:  # with stride < context the first positions are scored in the first window only
            curve["start"].append(start)
            curve["end"].append(end)
            curve["loss"].append(float(scores.position_nats[start:end].sum() / tokens))
            curve["tokens"].append(tokens)
    return curve


def length_sweep(
    model,
    tokens: Tensor,
    lengths: list[int],
    batch_tokens: int,
    on_batch: Callable[[int, int], object] | None = None,
) -> dict[str, dict]:
    """{"<length>": {"loss", "tokens", "by_position"} or {"skipped": reason}} for each length, on
    the 1-D token sequence `tokens`."""
    results: dict[str, dict] = {}
    targets = len(tokens) - 1
    for length in lengths:
        reason = length_refusal(model.config, length)
        if reason is None and length > targets:
            reason = f"the text has {targets} tokens to score, fewer than one window of {length}"
        if reason is not None:
            results[str(length)] = {"skipped": reason}
            continue
        scores = score_tokens(model, tokens, length, length, max(1, batch_tokens // length), on_batch)
        results[str(length)] = {
            "loss": scores.loss,
            "tokens": scores.tokens,
            "by_position": position_buckets(scores),
        }
    return results
