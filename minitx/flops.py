"""The FLOP convention: what `Transformer.flops_per_token` counts, whatever device or code path.

Model FLOPs, the arithmetic a design needs by its math, as torchtitan, PaLM and Chinchilla count
them: how the code tiles, pads, fuses or recomputes, and where it runs, change nothing. Per token
of a training sequence of T tokens, forward and backward (3 x the forward: the backward's
gradients of inputs and of weights are a product each), 2 FLOPs per multiply-add:

- 6 per matmul weight: every nn.Linear weight, the output layer's at the vocabulary the model is
  built with (once when tied to the token table, whose lookup is no matmul), times the times a
  token uses it (MTA's output gate, one Linear(head_dim, 1), serves every head);
- plus each layer's attention work over the (query, key) pairs its queries may see, and nothing
  else: the causal triangle, T (T + 1) / 2 pairs, for full attention (not the T x T square a dense
  kernel fills in), sum_i min(i + 1, W) for a window of W, each pair's products as the kind's math
  has them (attention/*.py: `flops_per_token` beside each kind's code).

Not counted, in any kind: elementwise work (softmax, norms, RoPE, activations, gates' products,
a sink's logit), recomputation (activation checkpointing, a fused kernel's scores in the
backward), padding, and packed documents' masks (the count is of a sequence of T tokens).

What a code path executes on a device (padded blocks, both halves of a causal map, recomputed
chunks) is a second figure under another name, `Transformer.executed_flops_per_token`: it
varies with the device and the backend and is never a budget.

FLOP_CONVENTION names this count in what a run records (summary.json: `flop_convention`). Runs
recorded without one used the count before it, minitx-flops/1: what each kind's code computed on
the device it trained on (the whole T x T map for SDPA, local's padded blocks, diff's tiles on a
CPU and its fused call on a GPU, MTA's chunks with their history rows).
"""

from __future__ import annotations

FLOP_CONVENTION = "minitx-flops/2"
OLDER_CONVENTION = "minitx-flops/1"  # what a record without `flop_convention` used


def causal_pairs(T: int) -> int:
    """(query, key) pairs of causal attention over T tokens: query i sees keys 0..i."""
    return T * (T + 1) // 2


def window_pairs(T: int, window: int, n_global: int = 0) -> int:
    """Pairs of a sliding window over T tokens: query i sees its last min(i + 1, window) keys, and
    those of the first n_global positions that lie before the window (min(n_global, i + 1 - window))."""
    near = causal_pairs(T) if T <= window else causal_pairs(window) + (T - window) * window
    past = max(0, T - window)  # queries whose window has left position 0 behind: 1, 2, ... keys before it
    far = causal_pairs(past) if past <= n_global else causal_pairs(n_global) + (past - n_global) * n_global
    return near + far
