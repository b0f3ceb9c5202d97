"""Typed configuration: the single source of truth for a model's shape.

Every derived value is a property; every check runs once, in ``__post_init__``, and says what to
change. Configs are plain dataclasses of plain values, so they travel inside checkpoints as a dict
(``asdict``) and come back with ``ModelConfig.from_dict``.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from . import kinds
from .errors import UserError
from .files import upgrade
from .options import check_type, nearest
from .options import fail as _fail

# minitx's RMSNorm eps, everywhere: the blocks' and the final norm, QK-norm, diff's per-head norm,
# mla's latent norms, gdn's output norm and its L2 norms of q and k. One value, because export
# relies on them agreeing: it writes this as rms_norm_eps, and DeepseekV3's latent norms and
# Qwen3.5's L2 norms are 1e-6 in transformers' code whatever rms_norm_eps says.
NORM_EPS = 1e-6
DROPOUT_FIELDS = ("dropout", "embed_dropout", "attn_dropout", "resid_dropout")  # training only


@dataclass
class AttentionConfig:
    """How each layer attends: which kind, and each kind's own options.

    The options of a kind are defined beside its layer (e.g. LocalOptions in attention/local.py)
    and written under its name: `options: {local: {window: 64}}`, `--model.attention.options.local.window 64`.
    After checking, `options` holds every option of every kind the layers use (defaults filled in),
    so a saved config says exactly what the model computed.
    """

    kind: str = "mha"  # a registered kind: mha, mqa, gqa, local, mta, ..., or one of kind_modules'
    # Per-layer kinds, repeated to cover n_layer, e.g. ["local", "local", "local", "mha"].
    layers: list[str] | None = None
    # Key/value heads of the kinds that group heads (gqa, local, mta; None: as many as query
    # heads). Shared, not a kind's option: a mix of kinds uses one n_kv_head. MQA is 1, MHA n_head.
    n_kv_head: int | None = None
    # Each used kind's options by kind name, e.g. {"mta": {"query_kernel": 6, "conv_layers": [2]}}.
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Modules that register kinds of your own: module names or .py file paths. A config only
    # records them; the commands import them (kinds.import_kind_modules), never this class.
    kind_modules: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Building a config runs no code of anyone's: kind_modules must already be imported.
        kinds.spec_of("attention.kind", self.kind, self.kind_modules)
        if self.layers is not None:
            if len(self.layers) == 0:
                _fail("attention.layers", "is empty", "give at least one kind or leave it unset")
            for i, kind in enumerate(self.layers):
                kinds.spec_of(f"attention.layers[{i}]", kind, self.kind_modules)
        used = used_kinds(self.kind, self.layers)
        if self.n_kv_head is not None:
            if not any(kinds.registry[kind].reads_n_kv_head for kind in used):
                _fail(
                    "attention.n_kv_head",
                    f"is set to {self.n_kv_head} but kind {'/'.join(used)} has a fixed number of key/value heads",
                    f"remove it, or use a kind that reads it ({', '.join(kinds.kinds_reading_n_kv_head())})",
                )
            if self.n_kv_head < 1:
                _fail("attention.n_kv_head", f"is {self.n_kv_head}", "use a positive divisor of n_head")
        given = dict(self.options or {})
        # Sections at their defaults pass here: a parse that instantiates this class (jsonargparse's)
        # hands them on when a later flag changes the kind. The train command refuses any a user
        # wrote (check_given_options, with the options as written).
        check_given_options({kind: s for kind, s in given.items() if not _is_default(kind, s)}, used)
        typed = {kind: kinds.build_options(kind, given.get(kind) or {}) for kind in used}
        # Plain values, every option filled in: what asdict, checkpoints and run configs hold.
        self.options = {kind: asdict(value) for kind, value in typed.items() if value is not None}

    def options_of(self, kind: str) -> Any:
        """The options object of a kind the layers use (None for a kind without options)."""
        if kind not in self.options:
            return None
        return kinds.registry[kind].options(**self.options[kind])

    def with_options(self, kind: str, **changes: Any) -> AttentionConfig:
        """A copy with some of one kind's options changed, e.g. with_options("mta", backend="conv")."""
        options = {**self.options, kind: {**self.options.get(kind, {}), **changes}}
        return dataclasses.replace(self, options=options)

    def layer_kinds(self, n_layer: int) -> list[str]:
        pattern = self.layers or [self.kind]
        return [pattern[i % len(pattern)] for i in range(n_layer)]

    def kv_heads(self, kind: str, n_head: int) -> int:
        return kinds.registry[kind].kv_heads(self, n_head)


def used_kinds(kind: str, layers: list[str] | None) -> list[str]:
    """The kinds an attention section's layers use, each once, in the order they first appear."""
    return list(dict.fromkeys(layers or [kind]))


def check_given_options(given: dict, used: list[str]) -> None:
    """Refuse a section of options (non-empty) given for a kind no layer uses: it would change
    nothing, and a user who wrote it meant a model it does not build."""
    for kind, section in given.items():
        if kind not in used and section:
            known = kind in kinds.registry
            _fail(
                f"attention.options.{kind}",
                f"sets options of kind {kind}, but the layers are of kind {'/'.join(used)}"
                if known
                else f"there is no kind {kind!r}{nearest(kind, used)}",
                f"remove it, or add {kind} to attention.kind or attention.layers"
                if known
                else f"write the options of a kind the layers use ({', '.join(used)})",
            )


def _is_default(kind: str, section: Any) -> bool:
    """An options section that changes nothing (all defaults) may name a kind no layer uses."""
    spec = kinds.registry.get(kind)
    if spec is None or spec.options is None:
        return not section
    try:
        return kinds.build_options(kind, section or {}) == spec.options()
    except ValueError:
        return False


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class ModelConfig:
    """The shape of a decoder-only transformer."""

    vocab_size: int = 65
    block_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    mlp: Literal["gelu", "swiglu", "none"] = "gelu"  # none: attention-only blocks (Zoology's recall models)
    mlp_hidden_size: int | None = None  # the MLP's hidden width; None: derived from d_model (mlp_hidden)
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    positions: Literal["rope", "learned"] = "rope"
    dropout: float = 0.0  # every dropout below that is not set on its own
    # GPT-2's three places, each its own probability when set (None: `dropout`): the embeddings
    # (token + position, before the first block), the attention weights, and what each block adds
    # to the residual stream (attention's and the MLP's outputs). Zoology's recall models drop the
    # first two and not the third (configs/known_answers/zoology.yaml), and that decides whether
    # MHA leaves the 1/K plateau of MQAR within its budget (docs/results/known_answers/).
    embed_dropout: float | None = None
    attn_dropout: float | None = None
    resid_dropout: float | None = None
    bias: bool = False
    tie_embeddings: bool = True
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    # The token id that starts each document (the tokenizer's end-of-text); set, no token attends
    # across a document start (minitx/documents.py). None: windows are attended as one text.
    document_token: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.attention, dict):
            self.attention = AttentionConfig(**self.attention)
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "d_model"):
            value = getattr(self, name)
            if not _is_whole(value) or value < 1:
                _fail(name, f"is {value!r}", "use a positive whole number")
        width = self.mlp_hidden_size
        if width is not None and (not _is_whole(width) or width < 1):
            _fail(
                "mlp_hidden_size",
                f"is {width!r}",
                "use a positive whole number, or leave it unset (derived from d_model)",
            )
        hints = typing.get_type_hints(ModelConfig)
        for name in ("mlp", "norm", "positions"):  # each choice is stated once, as its Literal
            check_type(name, getattr(self, name), hints[name])
        token = self.document_token
        if token is not None and (not _is_whole(token) or not 0 <= token < self.vocab_size):
            _fail(
                "document_token",
                f"is {token!r}",
                f"use a token id in [0, vocab_size={self.vocab_size}) (the end-of-text id), or leave it unset",
            )
        for name in DROPOUT_FIELDS:
            p = getattr(self, name)
            if p is None and name != "dropout":
                continue
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
                hint = "" if name == "dropout" else ", or leave it unset (model.dropout)"
                _fail(name, f"is {p!r}", f"use a probability in [0, 1){hint}")
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

    def dropout_at(self, place: Literal["embed", "attn", "resid"]) -> float:
        """The dropout probability at `place` (see embed_dropout): its own setting, else `dropout`."""
        own = getattr(self, f"{place}_dropout")
        return self.dropout if own is None else own

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
        if self.mlp == "none":
            return 0
        if self.mlp_hidden_size is not None:  # set by hand, or by an ablation's `match` (equal budgets)
            return self.mlp_hidden_size
        # SwiGLU has three matrices instead of two: 2/3 of 4x keeps the parameter count equal.
        if self.mlp == "swiglu":
            return 64 * ((8 * self.d_model // 3 + 63) // 64)
        return 4 * self.d_model

    def options_at(self, layer: int) -> Any:
        """The options of layer's kind (None for a kind without options)."""
        return self.attention.options_of(self.layer_kinds[layer])

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        """A config as to_dict gives it (a checkpoint's, once files/upgrade.py has read it in
        today's spelling); a field it lacks takes its default."""
        if unknown := sorted(set(data) - {f.name for f in fields(cls)}):
            raise UserError(f"model config: unknown field(s) {', '.join(unknown)}; remove them")
        data = dict(data)
        if isinstance(data.get("attention"), dict):
            section = data["attention"]
            for name in section:
                if renamed := upgrade.renamed_key(f"attention.{name}"):
                    raise UserError(
                        f"attention.{name}: this setting is now {renamed}; write that instead (the value is the same)"
                    )
            if bad := sorted(set(section) - {f.name for f in fields(AttentionConfig)}):
                raise UserError(f"attention config: unknown field(s) {', '.join(bad)}; remove them")
            data["attention"] = AttentionConfig(**section)
        return cls(**data)
