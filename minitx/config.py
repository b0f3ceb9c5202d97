"""Typed configuration: the single source of truth for a model's shape.

Every derived value is a property; every check runs once, in ``__post_init__``, and says what to
change. Configs are plain dataclasses of plain values, so they travel inside checkpoints as a dict
(``asdict``) and come back with ``ModelConfig.from_dict``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, Optional

from .errors import UserError

KINDS = ("mha", "mqa", "gqa", "local", "mta")
# Kinds whose number of key/value heads is read from `n_kv_head` (MHA means n_head, MQA means 1).
KINDS_WITH_KV_HEADS = ("gqa", "local", "mta")


def _fail(field_name: str, problem: str, fix: str) -> None:
    # UserError is a ValueError: Python callers catch ValueError, the command lines print one line.
    raise UserError(f"{field_name}: {problem}; {fix}")


def _check_choice(field_name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        _fail(field_name, f"unknown value {value!r}", f"choose one of {', '.join(map(str, choices))}")


@dataclass
class AttentionConfig:
    """How each layer attends. See docs in the README for every field."""

    kind: Literal["mha", "mqa", "gqa", "local", "mta"] = "mha"
    # Key/value heads for gqa, local and mta (None: as many as query heads). MQA is 1, MHA n_head.
    n_kv_head: Optional[int] = None
    # Local: query i sees keys i - window < j <= i, plus the first n_global positions.
    window: int = 128
    n_global: int = 0
    # Per-layer kinds, repeated to cover n_layer, e.g. ["local", "local", "local", "mha"].
    layers: Optional[list[str]] = None
    # Multi-token attention (Golovneva et al. 2025), defaults from the paper's language-model setting.
    mta_query_kernel: int = 6  # c_q: rows looked back along the query axis (current one included)
    mta_key_kernel: int = 11  # c_k: odd, centred along the key axis
    mta_conv_placement: Literal["pre", "post"] = "pre"  # conv on scores or on softmax weights
    mta_conv_layers: Optional[list[int]] = None  # None: every 4th layer, 0-based 2, 6, 10, ...
    mta_head_group: Optional[int] = None  # c_h: heads mixed together (None: all heads)
    mta_head_mix: Literal["none", "pre", "post", "both"] = "both"
    mta_output_norm: bool = True  # per-head RMSNorm and sigmoid gate before the output projection
    mta_query_chunk: int = 256  # queries per chunk: bounds memory at O(chunk * T) instead of O(T^2)
    # Local fast path: "auto" (compiled flex attention on CUDA, chunked elsewhere), "chunked", "flex".
    local_backend: Literal["auto", "chunked", "flex"] = "auto"

    def __post_init__(self) -> None:
        _check_choice("attention.kind", self.kind, KINDS)
        if self.layers is not None:
            if len(self.layers) == 0:
                _fail("attention.layers", "is empty", "give at least one kind or leave it unset")
            for i, kind in enumerate(self.layers):
                _check_choice(f"attention.layers[{i}]", kind, KINDS)
        kinds = set(self.layers or [self.kind])
        if self.n_kv_head is not None:
            if self.n_kv_head < 1:
                _fail("attention.n_kv_head", f"is {self.n_kv_head}", "use a positive divisor of n_head")
            if not kinds & set(KINDS_WITH_KV_HEADS):
                _fail(
                    "attention.n_kv_head",
                    f"is set but kind {self.kind!r} does not use it (mha has n_head kv heads, mqa has 1)",
                    "remove n_kv_head or use kind gqa",
                )
        if self.window < 1:
            _fail("attention.window", f"is {self.window}", "use a window of at least 1 token")
        if self.n_global < 0:
            _fail("attention.n_global", f"is {self.n_global}", "use 0 or more global tokens")
        if self.mta_query_kernel < 1:
            _fail("attention.mta_query_kernel", f"is {self.mta_query_kernel}", "use 1 or more")
        if self.mta_key_kernel < 1 or self.mta_key_kernel % 2 == 0:
            _fail(
                "attention.mta_key_kernel",
                f"is {self.mta_key_kernel}, but the key axis is centred so it must be odd",
                f"use {max(1, self.mta_key_kernel + 1)}",
            )
        _check_choice("attention.mta_conv_placement", self.mta_conv_placement, ("pre", "post"))
        _check_choice("attention.mta_head_mix", self.mta_head_mix, ("none", "pre", "post", "both"))
        _check_choice("attention.local_backend", self.local_backend, ("auto", "chunked", "flex"))
        if self.mta_query_chunk < 1:
            _fail("attention.mta_query_chunk", f"is {self.mta_query_chunk}", "use 1 or more")
        if self.mta_head_group is not None and self.mta_head_group < 1:
            _fail("attention.mta_head_group", f"is {self.mta_head_group}", "use 1 or more, or leave it unset")

    def layer_kinds(self, n_layer: int) -> list[str]:
        pattern = self.layers or [self.kind]
        return [pattern[i % len(pattern)] for i in range(n_layer)]

    def kv_heads(self, kind: str, n_head: int) -> int:
        if kind == "mha":
            return n_head
        if kind == "mqa":
            return 1
        return self.n_kv_head or n_head

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
        _check_choice("mlp", self.mlp, ("gelu", "swiglu"))
        _check_choice("norm", self.norm, ("rmsnorm", "layernorm"))
        _check_choice("positions", self.positions, ("rope", "learned"))
        if not 0.0 <= self.dropout < 1.0:
            _fail("dropout", f"is {self.dropout}", "use a probability in [0, 1)")
        if self.d_model % self.n_head:
            _fail("d_model", f"{self.d_model} is not divisible by n_head={self.n_head}", "make d_model a multiple of n_head")
        if self.positions == "rope" and self.head_dim % 2:
            _fail("d_model", f"head dimension {self.head_dim} is odd but RoPE rotates pairs", "make d_model / n_head even")
        att = self.attention
        for kind in set(self.layer_kinds):
            n_kv = att.kv_heads(kind, self.n_head)
            if n_kv > self.n_head or self.n_head % n_kv:
                _fail(
                    "attention.n_kv_head",
                    f"n_head={self.n_head} is not divisible by n_kv_head={n_kv}",
                    "use a divisor of n_head (1 is MQA, n_head is MHA)",
                )
        if "mta" in self.layer_kinds:
            for layer in att.mta_conv_layers or []:
                if not 0 <= layer < self.n_layer:
                    _fail(
                        "attention.mta_conv_layers",
                        f"layer {layer} is out of range for n_layer={self.n_layer}",
                        f"use layer indices 0..{self.n_layer - 1}",
                    )
            group = att.mta_head_group or self.n_head
            if self.n_head % group:
                _fail("attention.mta_head_group", f"n_head={self.n_head} is not divisible by {group}", "use a divisor of n_head")

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
        # SwiGLU has three matrices instead of two: 2/3 of 4x keeps the parameter count equal.
        if self.mlp == "swiglu":
            return 64 * ((8 * self.d_model // 3 + 63) // 64)
        return 4 * self.d_model

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
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
            data["attention"] = AttentionConfig(**data["attention"])
        return cls(**data)
