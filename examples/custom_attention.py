"""An attention kind of your own, in your own file: scalable-softmax attention ("ssmax").

Softmax over n keys flattens as n grows: with scores of a fixed spread, the largest weight falls
like 1/n, so a long context blurs attention. Scalable-Softmax (Nakanishi, 2025) multiplies each
query's scores by s * log(n), where n is the number of keys that query sees and s is learned:

    weights_i = softmax(s * log(n_i) * q_i k^T / sqrt(D))      n_i = i + 1 for a causal query i

Scaling the scores of query i is scaling q_i, so the fast path is PyTorch's SDPA on scaled queries,
and the cached path needs only n, which the cache's mask gives. Everything else (projections,
RoPE, grouped key/value heads, the KV cache, checkpoints) is minitx's, unchanged.

How minitx finds this kind: the config names this file in `attention.kind_modules`, which
train.py imports before the kinds are checked; the file registers its KindSpec. Nothing in minitx
is edited. Train it beside MHA, then generate, consenting to the checkpoint's import of this file
(a checkpoint imports no code without --trust-kind-modules):

    python -m minitx.verify examples/custom_attention.py     # each check of the kind: ok, or what is wrong
    python train.py --config examples/custom_attention.yaml
    python train.py --config examples/custom_attention.yaml --model.attention.options.ssmax.scale_init 0.5
    python generate.py --ckpt runs/custom_attention/checkpoints/last.ckpt --trust-kind-modules

docs/attention.md ("Your own attention kind") walks through this file.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minitx import Attention, KindSpec, ModelConfig, OptionError, functional, register


@dataclass
class SSMaxOptions:
    """attention.options.ssmax: the kind's own settings, with their checks."""

    scale_init: float = 1.0  # s before training; s * log(n) multiplies the scores
    per_head: bool = True  # one s per head, or one s shared by the layer's heads

    def __post_init__(self) -> None:
        if not self.scale_init > 0:
            raise OptionError("scale_init", f"is {self.scale_init}", "use a positive number such as 1.0")


class SSMaxAttention(Attention):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__(config, layer)  # q/k/v projections, output projection, n_kv_head, ...
        options: SSMaxOptions = config.options_at(layer)
        self.scale_init = options.scale_init
        self.s = nn.Parameter(torch.full((self.n_head if options.per_head else 1,), options.scale_init))

    def init_extra(self) -> None:
        # The model's generic init touches Linear and Embedding only; s starts where the option says.
        with torch.no_grad():
            self.s.fill_(self.scale_init)

    def scaled(self, q: Tensor, n_keys: Tensor) -> Tensor:
        """q (B, H, T, D) with row i multiplied by s_h * log(n_i); n_keys (T,) or a number."""
        factor = self.s.view(-1, 1) * torch.log(torch.as_tensor(n_keys, dtype=q.dtype, device=q.device))
        return q * factor.unsqueeze(-1).to(q.dtype)

    def causal_counts(self, T: int, device) -> Tensor:
        return torch.arange(1, T + 1, device=device)  # query i sees keys 0..i

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        q = self.scaled(q, self.causal_counts(q.shape[2], q.device))
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout_p, is_causal=True, enable_gqa=True
        )

    def reference(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # The maths materialised (minitx's plain softmax(QK^T/sqrt(D))V on scaled queries): the
        # oracle the tests hold the fast and cached paths to, and the source of attention maps.
        q = self.scaled(q, self.causal_counts(q.shape[2], q.device))
        return functional.attention(q, k, v, causal=True, return_weights=True)

    def attend_cached(self, q: Tensor, k: Tensor, v: Tensor, cache) -> Tensor:
        keys, values, mask = cache.update(k, v)  # mask: (T, keys) or None when every key is seen
        n_keys = keys.shape[2] if mask is None else mask.sum(-1)
        return F.scaled_dot_product_attention(
            self.scaled(q, n_keys), keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, enable_gqa=True
        )


# One line makes the kind known; it reads attention.n_kv_head like GQA (None: one per query head).
SSMAX = register(KindSpec("ssmax", SSMaxAttention, options=SSMaxOptions))
