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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class Window:
    begin: int  # index of the window's first input token
    first_scored: int  # offset inside the window of the first target it scores


class WindowPlan(Sequence[Window]):
    """The windows that score each of the num_tokens - 1 targets exactly once (see the top), worked
    out by index instead of listed: window i begins at min(i * stride, last) and scores from where
    window i - 1 stopped, so a plan costs nothing however many windows it has (a validation set of
    100M tokens at stride 1 has 100M)."""

    def __init__(self, num_tokens: int, context: int, stride: int):
        self.last_begin = num_tokens - 1 - context  # the window ending at the last token
        if self.last_begin < 0:
            raise ValueError(f"{num_tokens} tokens cannot fill a window of {context} inputs plus one target")
        if not 1 <= stride <= context:
            raise ValueError(f"stride {stride} must be in 1 .. context ({context})")
        self.context, self.stride = context, stride
        # The first window whose begin reaches last_begin is the last: ceil(last_begin / stride) + 1.
        self.count = -(-self.last_begin // stride) + 1

    def __len__(self) -> int:
        return self.count

    def begin(self, i: int) -> int:
        return min(i * self.stride, self.last_begin)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        i = index + self.count if index < 0 else index
        if not 0 <= i < self.count:
            raise IndexError(f"window {index} of {self.count}")
        scored_until = 0 if i == 0 else self.begin(i - 1) + self.context  # the last target scored before
        return Window(self.begin(i), scored_until - self.begin(i))


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
    windows = WindowPlan(len(tokens), context, stride)
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
