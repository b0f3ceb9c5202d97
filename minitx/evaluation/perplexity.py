"""Held-out loss over a whole token sequence, with sliding windows.

The sequence t_0 .. t_{N-1} has N - 1 targets (t_1 .. t_{N-1}; t_0 has nothing before it to be
predicted from). A window is `context` consecutive inputs and the next token of each; windows
start every `stride` tokens, and the last one is moved back so that it ends exactly at t_{N-1}
(every window is full length: one shape, one batch). A window scores only the targets that no
earlier window scored, so

    every target is scored exactly once,
    the first window's targets see 0 .. context - 1 tokens before them, a later window's at least
    context - stride (stride = context: non-overlapping windows; stride 1: every target sees the
    full context, at context times the cost).

The figures are token-weighted: total negative log-likelihood (nats) / number of targets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class Window:
    begin: int  # index of the window's first input token
    first_scored: int  # offset inside the window of the first target it scores


def window_plan(num_tokens: int, context: int, stride: int) -> list[Window]:
    """The windows that score each of the num_tokens - 1 targets exactly once (see the top)."""
    last_begin = num_tokens - 1 - context  # the window ending at the last token
    if last_begin < 0:
        raise ValueError(f"{num_tokens} tokens cannot fill a window of {context} inputs plus one target")
    if not 1 <= stride <= context:
        raise ValueError(f"stride {stride} must be in 1 .. context ({context})")
    windows = []
    scored_until = 0  # index of the last target scored so far
    begin = 0
    while scored_until < num_tokens - 1:
        begin = min(begin, last_begin)
        # The window's targets are t_{begin+1} .. t_{begin+context}; offset j holds t_{begin+1+j}.
        windows.append(Window(begin, scored_until - begin))
        scored_until = begin + context
        begin += stride
    return windows


def batch_tokens(vocab_size: int) -> int:
    """Tokens per forward pass when no batch size is given: large batches run fastest on a CPU
    (measured), while the float32 logits (tokens x vocab) stay under 256 MB."""
    return max(1, min(8192, 2**26 // vocab_size))


@dataclass
class Scores:
    """Summed losses of the scored targets, overall and by position inside the window."""

    nats: float  # total negative log-likelihood
    tokens: int  # targets scored
    position_nats: np.ndarray  # (context,) summed loss of targets at window offset j (j tokens before them)
    position_tokens: np.ndarray  # (context,) targets scored at offset j

    @property
    def loss(self) -> float:
        return self.nats / self.tokens


def window_losses(model, x: Tensor, y: Tensor) -> Tensor:
    """Per-token loss (B, T) of targets y given inputs x; any T a RoPE model's tables can grow to.

    Goes through embed + forward_embeddings rather than forward, which refuses T > block_size
    (the guard is for generation; a direct longer forward is exactly what extrapolation asks).
    """
    logits = model.forward_embeddings(model.embed(x))
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none").view_as(y)


@torch.inference_mode()
def score_tokens(
    model,
    tokens: Tensor,
    context: int,
    stride: int | None = None,
    batch_size: int = 8,
    on_batch: Callable[[int, int], object] | None = None,
) -> Scores:
    """Scores of every target of the 1-D token sequence `tokens`, windows of `context` inputs.

    `on_batch(done, total)` is called after each batch of windows (for a progress bar).
    """
    stride = context if stride is None else stride
    windows = window_plan(len(tokens), context, stride)
    device = next(model.parameters()).device
    offsets = torch.arange(context + 1)
    position_nats = torch.zeros(context, dtype=torch.float64)
    position_tokens = torch.zeros(context, dtype=torch.long)
    for done in range(0, len(windows), batch_size):
        batch = windows[done : done + batch_size]
        begins = torch.tensor([w.begin for w in batch])
        chunk = tokens[begins[:, None] + offsets].to(device, torch.long)  # (B, context + 1)
        losses = window_losses(model, chunk[:, :-1], chunk[:, 1:]).double().cpu()
        first = torch.tensor([w.first_scored for w in batch])
        scored = offsets[None, :-1] >= first[:, None]  # (B, context)
        position_nats += (losses * scored).sum(0)
        position_tokens += scored.sum(0)
        if on_batch is not None:
            on_batch(min(done + batch_size, len(windows)), len(windows))
    return Scores(
        float(position_nats.sum()), int(position_tokens.sum()), position_nats.numpy(), position_tokens.numpy()
    )
