"""KindLayer: the interface every attention kind's layer meets, whatever it computes: what the
model, the decoder, the FLOP count and the diagnostics call on a layer. Softmax attention over a
fused q/k/v projection is `Attention` (softmax.py), built on this; a kind that is not (MLA's
latents, gdn's recurrent state) derives from KindLayer directly.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .. import functional
from ..config import ModelConfig
from ..documents import Documents


def at_least_float32(x: Tensor) -> Tensor:
    """x in float32 if it is in a half type; float32 and float64 stay (a float64 model, the tests'
    reference, computes in float64 throughout)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def norm_float32(norm: nn.Module, x: Tensor) -> Tensor:
    """An RMSNorm over x in float32 at least, returned in x's dtype: under bf16 autocast the
    projections hand it bf16, which the fused kernel refuses beside float32 weights."""
    return norm(at_least_float32(x)).to(x.dtype)


class KindLayer(nn.Module):
    """The interface of one layer of any attention kind (see the module's docstring).

    A subclass implements `forward`, `make_cache` and `flops_per_token` (REQUIRED); `new_cache`
    and the defaults below come with it. What those defaults read of a layer is declared here too:
    - `n_head`, its query heads (config.n_head unless the kind sets another): `sdpa_flops`;
    - `project(x, rope)` and `reference(q, k, v)`, for a kind with softmax maps: the default
      `attention_weights` (and so `softmax_maps`). `Attention` has them; a kind without softmax
      maps (gdn) overrides `attention_weights` instead.
    `missing()` names what a class leaves unimplemented; `attention.build` refuses such a class."""

    REQUIRED = ("forward", "make_cache", "flops_per_token")

    n_head: int  # query heads

    # Whether several new tokens may go through the cached path in one call (a long prompt's
    # prefill past block_size): the cache masks every new query by its own position.
    extends_in_chunks = True

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.config = config
        self.layer = layer
        self.block_size = config.block_size
        self.dropout = config.dropout_at("attn")  # on the attention weights
        self.n_head = config.n_head

    @classmethod
    def missing(cls) -> list[str]:
        """The methods of REQUIRED this class leaves as KindLayer's (which raise NotImplementedError)."""
        owner = {name: next(c for c in cls.__mro__ if name in vars(c)) for name in cls.REQUIRED}
        return [name for name in cls.REQUIRED if owner[name] is KindLayer]

    def forward(self, x: Tensor, rope=None, cache=None, docs: Documents | None = None) -> Tensor:
        """x (B, T, d_model) -> (B, T, d_model); through `cache` when given (decoding), keeping
        each token inside its document when `docs` is given (training on packed documents)."""
        raise NotImplementedError

    @property
    def dropout_p(self) -> float:
        return self.dropout if self.training else 0.0

    # -- the decoding cache -------------------------------------------------------------------
    @classmethod
    def make_cache(cls, config: ModelConfig, layer: int, batch: int, max_len: int | None, dtype, device):
        """The cache a layer of this kind needs (device "meta" sizes it without memory): a module
        with `n_seen`, `reset()`, `set_documents(starts)` (a DecodingCache's) and `nbytes()`."""
        raise NotImplementedError

    def new_cache(self, batch: int, max_len: int | None = None, dtype=None, device=None):
        """A cache for this layer (Transformer.new_cache gathers them in a ModelCache); dtype and
        device of the layer's first weight unless given."""
        weight = next(self.parameters())
        return self.make_cache(
            self.config, self.layer, batch, max_len, dtype or weight.dtype, device or weight.device
        )

    # -- FLOPs --------------------------------------------------------------------------------
    def flops_per_token(self, T: int) -> float:
        """Training FLOPs per token over T tokens besides the matmuls of its nn.Linear weights, by
        the convention of minitx/flops.py: the work its math needs over the (query, key) pairs its
        queries may see, whatever its code pads or recomputes and wherever it runs. Every kind
        declares its own."""
        raise NotImplementedError

    def executed_flops_per_token(self, T: int, device: torch.device | str = "cpu") -> float:
        """What this layer's code path executes per token on `device`, besides its weights'
        matmuls: padded blocks, both halves of a causal map and the like, which the convention
        leaves out (benchmarks/mfu.py reports it beside the model FLOPs; never a budget). A kind
        that does not say is taken to execute what its math needs."""
        return self.flops_per_token(T)

    def pair_flops(self, T: int, pairs: int, width: int, value_width: int | None = None) -> float:
        """Per token of T: training FLOPs of `pairs` (query, key) pairs for each of n_head query
        heads, a score `width` wide and a weight times a value `value_width` wide (default:
        `width`) apiece; grouped key/value heads save no arithmetic. 2 FLOPs per multiply-add,
        and the backward's four products (the gradients of the values, the weights, the queries
        and the keys) twice the forward's two: 6 per multiply-add of the forward."""
        value_width = width if value_width is None else value_width
        return 6 * self.n_head * pairs * (width + value_width) / T

    def sdpa_flops(
        self, T: int, queries: int, keys: int, width: int, value_width: int | None = None
    ) -> float:
        """`pair_flops` of every one of `queries` x `keys` pairs: what a dense call computes, the
        executed figure of an SDPA over that rectangle (a fused kernel's recomputation of the
        scores in the backward not counted)."""
        return self.pair_flops(T, queries * keys, width, value_width)

    def init_extra(self) -> None:
        """Initialise parameters the model's generic init must not touch (none here)."""

    # -- softmax maps, where a kind has them ----------------------------------------------------
    def project(self, x: Tensor, rope) -> tuple[Tensor, Tensor, Tensor]:
        """(q, k, v) of x (B, T, d_model), as `reference` takes them: (B, heads, T, width) each."""
        raise NotImplementedError(f"attention kind {type(self).__name__} has no q/k/v projection")

    def reference(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """(out, weights), the maths materialised: the oracle of a softmax kind's tests."""
        raise NotImplementedError(f"attention kind {type(self).__name__} has no materialised softmax map")

    def attention_weights(self, x: Tensor, rope=None) -> Tensor:
        """(B, H, T, T) attention weights of this layer for input x, from the reference path."""
        q, k, v = self.project(x, rope)
        return self.reference(q, k, v)[1]

    def softmax_maps(self, x: Tensor, rope=None) -> list[Tensor]:
        """Each softmax map of this layer for input x, (B, heads, T, T) probabilities apiece: the
        diagnostics (minitx/evaluation/diagnostics.py) read entropy and sinks off a distribution,
        which a kind that combines several maps (diff) only has before it combines them."""
        return [self.attention_weights(x, rope)]

    def visible_keys(self, T: int, device=None) -> Tensor:
        """(T, T) bool, True where query i may see key j in a sequence of T tokens: the support of
        the maps, whose size normalises the diagnostics' entropy. Causal here; a window narrows it."""
        positions = torch.arange(T, device=device)
        return functional.allowed_mask(positions, positions, causal=True)
