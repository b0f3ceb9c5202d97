"""Typed configuration: the single source of truth for a model's shape.

Every derived value is a property; every check runs once, in ``__post_init__``, and says what to
change. Configs are plain dataclasses of plain values, so they travel inside checkpoints as a dict
(``asdict``) and come back with ``ModelConfig.from_dict``.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Literal

from . import kinds
from .errors import UserError
from .kinds import check_choice as _check_choice
from .kinds import fail as _fail

# Fields every kind reads; any other field is an option of the kinds whose spec lists it.
SHARED_FIELDS = ("kind", "layers")


@dataclass
class AttentionConfig:
    """How each layer attends. See docs in the README for every field.

    A kind's options are the fields its registry entry (minitx.kinds.KindSpec) lists; a field set
    away from its default must be read by at least one layer's kind, or the config is refused.
    """

    kind: str = "mha"  # a registered kind: mha, mqa, gqa, local, mta (see minitx/attention/__init__.py)
    # Key/value heads for gqa, local and mta (None: as many as query heads). MQA is 1, MHA n_head.
    n_kv_head: int | None = None
    # Local: query i sees keys i - window < j <= i, plus the first n_global positions.
    window: int = 128
    n_global: int = 0
    # Per-layer kinds, repeated to cover n_layer, e.g. ["local", "local", "local", "mha"].
    layers: list[str] | None = None
    # Multi-token attention (Golovneva et al. 2025), defaults from the paper's language-model setting.
    mta_query_kernel: int = 6  # c_q: rows looked back along the query axis (current one included)
    mta_key_kernel: int = 11  # c_k: odd, centred along the key axis
    mta_conv_placement: Literal["pre", "post", "both"] = "pre"  # conv on scores, on softmax weights, or both
    mta_conv_layers: list[int] | None = None  # None: every 4th layer, 0-based 2, 6, 10, ...
    mta_head_group: int | None = None  # c_h: heads mixed together (None: all heads)
    mta_head_mix: Literal["none", "pre", "post", "both"] = "both"
    mta_output_norm: bool = True  # per-head RMSNorm and sigmoid gate before the output projection
    mta_query_chunk: int = 256  # queries per chunk: bounds memory at O(chunk * T) instead of O(T^2)
    # Fast path: "factorised" (far keys as one wide matrix product, the band near the diagonal
    # exact), "conv" (the plain chunked convolution), "triton" (tiled kernels, no T x T map; CUDA,
    # or Triton's interpreter on CPU for tests) or "auto" (triton on CUDA without attention dropout;
    # elsewhere conv up to 512 tokens, factorised above: the measured CPU crossover).
    mta_backend: Literal["auto", "factorised", "conv", "triton"] = "auto"
    # As released: RMSNorm eps, float32 softmax and norm statistics under bf16/fp16, the gate's init,
    # the pre-softmax head mix over all heads (only the post-softmax mix uses groups of c_h).
    mta_norm_eps: float = 1e-5
    mta_float32: bool = True
    mta_gate_init: Literal["normal", "zero"] = "normal"
    mta_pre_mix_all_heads: bool = True
    # Local fast path: "auto" (compiled flex attention on CUDA, chunked elsewhere), "chunked", "flex".
    local_backend: Literal["auto", "chunked", "flex"] = "auto"

    def __post_init__(self) -> None:
        kinds.spec_of("attention.kind", self.kind)
        if self.layers is not None:
            if len(self.layers) == 0:
                _fail("attention.layers", "is empty", "give at least one kind or leave it unset")
            for i, kind in enumerate(self.layers):
                kinds.spec_of(f"attention.layers[{i}]", kind)
        specs = [kinds.registry[kind] for kind in dict.fromkeys(self.layers or [self.kind])]
        self._refuse_unused_options(specs)
        if self.n_kv_head is not None and self.n_kv_head < 1:
            _fail("attention.n_kv_head", f"is {self.n_kv_head}", "use a positive divisor of n_head")
        for spec in specs:
            if spec.check is not None:
                spec.check(self)

    def _refuse_unused_options(self, specs: list) -> None:
        """A field that differs from its default but that no layer's kind reads is a mistake."""
        used = {option for spec in specs for option in spec.options}
        for f in fields(self):
            if f.name in SHARED_FIELDS or f.name in used or getattr(self, f.name) == _default(f):
                continue
            readers = [spec.name for spec in kinds.registry.values() if f.name in spec.options]
            _fail(
                f"attention.{f.name}",
                f"is set to {getattr(self, f.name)!r} but does not apply to kind {'/'.join(s.name for s in specs)}",
                f"remove it, or use a kind that reads it ({', '.join(readers) or 'none'})",
            )

    def layer_kinds(self, n_layer: int) -> list[str]:
        pattern = self.layers or [self.kind]
        return [pattern[i % len(pattern)] for i in range(n_layer)]

    def kv_heads(self, kind: str, n_head: int) -> int:
        return kinds.registry[kind].kv_heads(self, n_head)

    def mta_conv_layer_set(self, n_layer: int) -> set[int]:
        if self.mta_conv_layers is None:
            return set(range(2, n_layer, 4))
        return set(self.mta_conv_layers)


@dataclass
class ModelConfig:
    """The shape of a decoder-only transformer."""

    vocab_size: int = 65
    block_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    mlp: Literal["gelu", "swiglu"] = "gelu"
    mlp_hidden_size: int | None = None  # the MLP's hidden width; None: derived from d_model (mlp_hidden)
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    positions: Literal["rope", "learned"] = "rope"
    dropout: float = 0.0
    bias: bool = False
    tie_embeddings: bool = True
    attention: AttentionConfig = field(default_factory=AttentionConfig)

    def __post_init__(self) -> None:
        if isinstance(self.attention, dict):
            self.attention = AttentionConfig(**self.attention)
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "d_model"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                _fail(name, f"is {value!r}", "use a positive whole number")
        width = self.mlp_hidden_size
        if width is not None and (not isinstance(width, int) or isinstance(width, bool) or width < 1):
            _fail(
                "mlp_hidden_size",
                f"is {width!r}",
                "use a positive whole number, or leave it unset (derived from d_model)",
            )
        _check_choice("mlp", self.mlp, ("gelu", "swiglu"))
        _check_choice("norm", self.norm, ("rmsnorm", "layernorm"))
        _check_choice("positions", self.positions, ("rope", "learned"))
        if not 0.0 <= self.dropout < 1.0:
            _fail("dropout", f"is {self.dropout}", "use a probability in [0, 1)")
        if self.d_model % self.n_head:
            _fail(
                "d_model",
                f"{self.d_model} is not divisible by n_head={self.n_head}",
                "make d_model a multiple of n_head",
            )
        if self.positions == "rope" and self.head_dim % 2:
            _fail(
                "d_model",
                f"head dimension {self.head_dim} is odd but RoPE rotates pairs",
                "make d_model / n_head even",
            )
        for kind in dict.fromkeys(self.layer_kinds):
            n_kv = self.attention.kv_heads(kind, self.n_head)
            if n_kv > self.n_head or self.n_head % n_kv:
                _fail(
                    "attention.n_kv_head",
                    f"n_head={self.n_head} is not divisible by n_kv_head={n_kv}",
                    "use a divisor of n_head (1 is MQA, n_head is MHA)",
                )
            check_model = kinds.registry[kind].check_model
            if check_model is not None:
                check_model(self)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def layer_kinds(self) -> list[str]:
        return self.attention.layer_kinds(self.n_layer)

    def n_kv_head_at(self, layer: int) -> int:
        return self.attention.kv_heads(self.layer_kinds[layer], self.n_head)

    @property
    def mlp_hidden(self) -> int:
        if self.mlp_hidden_size is not None:  # set by hand, or by an ablation's `match` (equal budgets)
            return self.mlp_hidden_size
        # SwiGLU has three matrices instead of two: 2/3 of 4x keeps the parameter count equal.
        if self.mlp == "swiglu":
            return 64 * ((8 * self.d_model // 3 + 63) // 64)
        return 4 * self.d_model

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(f"model config: unknown field(s) {', '.join(unknown)}; remove them")
        data = dict(data)
        if isinstance(data.get("attention"), dict):
            att_known = {f.name for f in fields(AttentionConfig)}
            bad = sorted(set(data["attention"]) - att_known)
            if bad:
                raise UserError(f"attention config: unknown field(s) {', '.join(bad)}; remove them")
            data["attention"] = AttentionConfig(**_options_read(data["attention"]))
        return cls(**data)


def _options_read(attention: dict) -> dict:
    """A stored attention config without the options none of its kinds reads.

    Such options change nothing in the model; a checkpoint may carry them with values that were
    the defaults of the version that saved it. Refusing them is for what a user writes, so a stored
    config drops them instead (unknown kinds are left for validation to name).
    """
    layer_kinds = attention.get("layers") or [attention.get("kind", AttentionConfig.kind)]
    if any(kind not in kinds.registry for kind in layer_kinds):
        return attention
    read = {option for kind in layer_kinds for option in kinds.registry[kind].options}
    return {key: value for key, value in attention.items() if key in SHARED_FIELDS or key in read}


def _default(f) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default
