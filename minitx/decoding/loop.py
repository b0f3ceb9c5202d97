"""The decode loop behind `Transformer.generate`: a prompt extended token by token.

Each step turns the logits of the last position into one new token per row (sampling.py: greedy
at temperature 0, else a filtered sample).

Without a cache every step runs the model on the last block_size tokens (a crop, as nanoGPT does).
With a cache the prompt is run once (prefill) and each step feeds only the newest token, reading
the keys and values of earlier tokens from per-layer caches (see minitx/cache.py). The two agree
up to float rounding while the sequence fits in block_size. Past it:

- RoPE models keep going with a sliding cache: every layer attends to the last block_size
  positions (the ring of slots overwrites the oldest token). A one-layer model then equals the
  crop exactly, because only relative offsets matter to RoPE. A deeper model does not: the cached
  keys of a token were computed while that token could still see tokens the crop has dropped, so
  the cache acts as sliding-window attention of width block_size in every layer (like Mistral's
  rolling buffer) with a receptive field of n_layer * block_size. The difference is small and the
  cost per token stays flat instead of growing to a full block_size forward pass. (Local layers
  whose windows together reach back less than block_size see no difference.)
- Local attention with global tokens keeps the *sequence's* first n_global tokens as globals
  (attention sinks), where the crop would make its own first tokens global.
- A prompt longer than block_size is prefilled with its first block_size tokens and fed the rest
  in chunks of block_size (one token at a time for MTA), exactly as if the model had generated them.
- Models with learned positions cannot slide: a prompt longer than block_size is a UserError, and
  once generation reaches block_size each step runs the model on the last block_size tokens, as
  without the cache (equal to the crop).

A compiled model (`torch.compile(model)`, or `generate.py --compile`) decodes through the same
loop; see COMPILED_DECODING for how it keeps to a handful of graphs.

This module sits below the model (the model's `generate` delegates here) and takes the model as
an argument; it imports nothing from minitx.model.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

import torch
from torch import Tensor

from ..errors import UserError
from .sampling import check_options, pick_next

# torch.compile settings while decoding. The caches count tokens in plain ints on their modules
# (the cheapest bookkeeping in eager, where a step is about a millisecond of Python), and dynamo
# takes an int attribute of a module for a constant: it would compile a graph for every position
# until its recompile limit, then run eager. Made a symbol, the count serves every step from one
# graph; the prefill's boolean indexing (which prompt tokens fit the ring) then traces too. Each
# cache still specialises a few ways (before and after its ring fills; under inductor, whether the
# slot written is the ring's first), a product over a mix of kinds: 10 graphs for three kinds
# (tests/generation/test_generation.py), past the default limit of 8, hence 32. Read only while a compiled
# model is called; an older torch that lacks a setting goes without it.
COMPILED_DECODING = dict(
    allow_unspec_int_on_nn_module=True, capture_dynamic_output_shape_ops=True, recompile_limit=32
)


def compiled_decoding():
    """COMPILED_DECODING in force (a context manager). Nothing while torch._dynamo is not imported:
    no model can be compiled then (torch.compile imports it), and importing it only to set its
    options would cost an eager decode (and `import minitx`) more than a second."""
    if "torch._dynamo" not in sys.modules:
        return contextlib.nullcontext()
    import torch._dynamo

    config = torch._dynamo.config
    return config.patch(**{name: value for name, value in COMPILED_DECODING.items() if hasattr(config, name)})


def check_prompt_fits(config, prompt_len: int) -> None:
    """With a cache, a model with learned positions cannot take a prompt longer than its context."""
    if config.positions != "rope" and prompt_len > config.block_size:
        raise UserError(
            f"prompt has {prompt_len} tokens but the model's context is block_size={config.block_size} and its "
            "learned positions cannot slide; shorten the prompt"
        )


# -- the decode loop --------------------------------------------------------------------------------


class CroppedSteps:
    """No cache: every step runs the model on the last block_size tokens."""

    def __init__(self, model):
        self.model, self.block_size = model, model.config.block_size

    def prefill(self, idx: Tensor) -> Tensor:
        return self.step(idx)

    def step(self, idx: Tensor) -> Tensor:
        return self.model(idx[:, -self.block_size :])[:, -1]


class CachedSteps(CroppedSteps):
    """Feeds a growing sequence to the model through a KV cache and hands back next-token logits."""

    def __init__(self, model, batch: int, max_len: int):
        super().__init__(model)
        self.can_slide = model.config.positions == "rope"
        self.cache = model.new_cache(batch, max_len)

    def prefill(self, idx: Tensor) -> Tensor:
        logits = self.model(idx[:, : self.block_size], cache=self.cache)[:, -1]
        # Past the context (RoPE only): the rest in chunks of block_size tokens. The cache masks each
        # new query by absolute position, so a chunk sees exactly what one token at a time would;
        # a kind whose cached path needs one token per call says so (`extends_in_chunks`).
        chunk = self.block_size if all(block.attn.extends_in_chunks for block in self.model.blocks) else 1
        for t in range(self.block_size, idx.shape[1], chunk):
            logits = self.model(idx[:, t : t + chunk], cache=self.cache)[:, -1]
        return logits

    def step(self, idx: Tensor) -> Tensor:
        """Logits after idx (B, T), whose last token is the only one the cache has not seen."""
        if not self.can_slide and idx.shape[1] > self.block_size:
            return super().step(idx)  # learned positions end at block_size: the last block_size anew
        return self.model(idx[:, -1:], cache=self.cache)[:, -1]


@torch.inference_mode()  # no autograd bookkeeping at all: about a fifth of a decode step's time
def generate(
    model,
    idx: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    on_token: Callable[[Tensor], object] | None = None,
) -> Tensor:
    """Extend idx (B, T) by up to max_new_tokens tokens; returns (B, T + n). temperature 0 is greedy.
    `generator` makes sampling reproducible. With `eos_id`, a row that produced it keeps producing
    it, and generation stops once every row has. `on_token` is called with each step's new tokens
    (B,), for streaming."""
    check_options(max_new_tokens, temperature, top_k, top_p)
    if idx.dim() != 2 or idx.shape[1] == 0:
        raise UserError(
            f"prompt: expected token ids of shape (batch, length >= 1), got {tuple(idx.shape)}; give at least one token"
        )
    B, T = idx.shape
    if use_cache:
        check_prompt_fits(model.config, T)
    out = torch.empty(B, T + max_new_tokens, dtype=torch.long, device=idx.device)
    out[:, :T] = idx
    if max_new_tokens == 0:
        return out
    finished = torch.zeros(B, dtype=torch.bool, device=idx.device)
    was_training = model.training
    model.eval()
    try:
        with compiled_decoding():
            steps = CachedSteps(model, B, T + max_new_tokens) if use_cache else CroppedSteps(model)
            logits = steps.prefill(out[:, :T])  # an inference tensor, as every later step's input
            length = T
            while True:
                token = pick_next(logits, temperature, top_k, top_p, generator)
                if eos_id is not None:
                    token = torch.where(finished, eos_id, token)  # finished rows only pad
                    finished |= token == eos_id
                out[:, length] = token
                length += 1
                if on_token is not None:
                    on_token(token)
                if length == T + max_new_tokens or (eos_id is not None and bool(finished.all())):
                    break
                logits = steps.step(out[:, :length])
    finally:
        model.train(was_training)
    return out[:, :length]
