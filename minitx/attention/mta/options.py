"""Multi-token attention's options (attention.options.mta), with their checks.

Defaults are the paper's language-model setting (Golovneva et al. 2025) as released.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...options import OptionError, fail

# backend "auto": with the C loops (native.py) the plain chunked convolution at every T (the
# factorised path took 2.2x its time at T = 256 and 1.7-1.8x at 1024 and 4096, benchmarks/RESULTS.md);
# without them, the factorised path from this many tokens on (torch's convolution 20-30% faster at
# T = 256, the factorised path 20-25% faster at 1024 and 40-70% at 4096). Here, beside the option
# it sets, so that layer.py and flops.py both read it from below.
FACTORISED_FROM = 512


@dataclass
class MTAOptions:
    """attention.options.mta"""

    query_kernel: int = 6  # c_q: rows looked back along the query axis (current one included)
    key_kernel: int = 11  # c_k: odd, centred along the key axis
    conv_placement: Literal["pre", "post", "both"] = "pre"  # conv on scores, on softmax weights, or both
    conv_layers: list[int] | None = None  # None: every 4th layer, 0-based 2, 6, 10, ...
    head_group: int | None = None  # c_h: heads mixed together (None: all heads)
    head_mix: Literal["none", "pre", "post", "both"] = "both"
    output_norm: bool = True  # per-head RMSNorm and sigmoid gate before the output projection
    query_chunk: int = 256  # queries per chunk: bounds memory at O(chunk * T) instead of O(T^2)
    # Fast path: "factorised" (far keys as one wide matrix product, the band near the diagonal
    # exact), "conv" (the plain chunked convolution), "triton" (tiled kernels, no T x T map; CUDA,
    # or Triton's interpreter on CPU for tests) or "auto" (triton on CUDA without attention dropout;
    # elsewhere conv up to 512 tokens, factorised above: the measured CPU crossover).
    backend: Literal["auto", "factorised", "conv", "triton"] = "auto"
    # As released: RMSNorm eps, float32 softmax and norm statistics under bf16/fp16, the gate's init,
    # the pre-softmax head mix over all heads (only the post-softmax mix uses groups of c_h).
    norm_eps: float = 1e-5
    float32: bool = True
    gate_init: Literal["normal", "zero"] = "normal"
    pre_mix_all_heads: bool = True

    def __post_init__(self) -> None:
        if self.query_kernel < 1:
            raise OptionError("query_kernel", f"is {self.query_kernel}", "use 1 or more")
        if self.key_kernel < 1 or self.key_kernel % 2 == 0:
            raise OptionError(
                "key_kernel",
                f"is {self.key_kernel}, but the key axis is centred so it must be odd",
                f"use {max(1, self.key_kernel + 1)}",
            )
        if not self.norm_eps > 0:
            raise OptionError("norm_eps", f"is {self.norm_eps}", "use a small positive number such as 1e-5")
        if self.query_chunk < 1:
            raise OptionError("query_chunk", f"is {self.query_chunk}", "use 1 or more")
        if self.head_group is not None and self.head_group < 1:
            raise OptionError("head_group", f"is {self.head_group}", "use 1 or more, or leave it unset")

    def conv_layer_set(self, n_layer: int) -> set[int]:
        return set(range(2, n_layer, 4) if self.conv_layers is None else self.conv_layers)


def check_mta_model(config) -> None:
    """The checks that need the whole model: layer indices, head groups, dropout."""
    options: MTAOptions = config.attention.options_of("mta")
    for layer in options.conv_layers or []:
        if not 0 <= layer < config.n_layer:
            fail(
                "attention.options.mta.conv_layers",
                f"layer {layer} is out of range for n_layer={config.n_layer}",
                f"use layer indices 0..{config.n_layer - 1}",
            )
    group = options.head_group or config.n_head
    if config.n_head % group:
        fail(
            "attention.options.mta.head_group",
            f"n_head={config.n_head} is not divisible by {group}",
            "use a divisor of n_head",
        )
    if options.backend == "triton" and config.dropout_at("attn"):
        fail(
            "attention.options.mta.backend",
            f"is 'triton', whose kernels have no attention dropout, but the attention weights' dropout "
            f"is {config.dropout_at('attn')}",
            "set attn_dropout: 0.0 (or dropout: 0.0), or use backend: auto (triton on CUDA where it is 0)",
        )
