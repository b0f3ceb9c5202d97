"""minitx <-> transformers' Llama family (Llama, Mistral, Ministral, Qwen2, Qwen3): configs and weights.

A minitx model is exactly one of these classes when it has SwiGLU, RMSNorm, RoPE, no bias, the
same number of key/value heads in every layer, no sinks and no output gate:

    only full attention (MHA, MQA, GQA)              -> LlamaForCausalLM
    only local attention without global tokens       -> MistralForCausalLM (sliding_window)
    local and full layers                            -> MinistralForCausalLM (layer_types)
    QK-norm in every layer (full, local or both)     -> Qwen3ForCausalLM (q_norm, k_norm)

Import reads these and Qwen2 (whose q/k/v biases become minitx biases, the others zero).
The window rules agree: minitx's query i sees keys i - window < j <= i, transformers' sliding
window keeps kv_idx > q_idx - sliding_window. RoPE agrees too: minitx rotates the pairs
(x[i], x[i + D/2]), which is transformers' rotate_half. Qwen3's q_norm and k_norm are minitx's: an
RMSNorm of head_dim over each head before RoPE. Only the fused q/k/v projection differs:
minitx's `qkv_proj` is q, k and v stacked along the output axis.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from ..config import NORM_EPS, AttentionConfig, ModelConfig
from ..errors import UserError

ROPE_BASE = 10000.0  # minitx's RoPE base
MODEL_TYPES = {  # what this family imports
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "ministral": "MinistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

# minitx name inside blocks.{i}. -> transformers name inside model.layers.{i}. (q/k/v apart)
LAYER_NAMES = {
    "norm1": "input_layernorm",
    "attn.out_proj": "self_attn.o_proj",
    "attn.q_norm": "self_attn.q_norm",
    "attn.k_norm": "self_attn.k_norm",
    "norm2": "post_attention_layernorm",
    "mlp.gate": "mlp.gate_proj",
    "mlp.up": "mlp.up_proj",
    "mlp.down": "mlp.down_proj",
}
TOP_NAMES = {"tok_emb": "model.embed_tokens", "norm": "model.norm", "lm_head": "lm_head"}


# The kinds an export can carry: natively (see native.py) or in modeling_minitx.py.
EXPORTABLE_KINDS = {"mha", "mqa", "gqa", "local", "mta", "mla", "diff", "gdn"}
NATIVE_ONLY_KINDS = {"mla", "diff"}  # modeling_minitx.py does not know them: native or refused
FAMILY_KINDS = {"mha", "mqa", "gqa", "local"}  # the kinds of this family's layers


def claims(config: ModelConfig) -> bool:
    return set(config.layer_kinds) <= FAMILY_KINDS


def native_class(config: ModelConfig) -> tuple[str | None, str]:
    """(transformers class name or None, why) for a minitx config."""
    kinds = set(config.layer_kinds)
    kv_heads = {config.n_kv_head_at(layer) for layer in range(config.n_layer)}
    shared = [config.options_at(layer) for layer in range(config.n_layer)]
    qk_norm = {options.qk_norm for options in shared}
    found = cannot_hold(
        config,
        ("local" in kinds and config.attention.options_of("local").n_global > 0, "global tokens"),
        (len(kv_heads) > 1, "layers with different key/value head counts"),
        (any(options.sinks for options in shared), "learned sinks"),
        (any(options.gate != "none" for options in shared), "an output gate"),
        (len(qk_norm) > 1, "QK-norm in some layers only"),
    )
    if found:
        return None, found
    if qk_norm == {True}:
        return "Qwen3ForCausalLM", "QK-norm in every layer: Qwen3's q_norm and k_norm"
    if kinds == {"local"}:
        return "MistralForCausalLM", "local attention in every layer: a sliding window"
    if "local" in kinds:
        return "MinistralForCausalLM", "local and full layers: sliding-window layer_types"
    return "LlamaForCausalLM", "full attention with SwiGLU, RMSNorm, RoPE, no bias"


def shape_config(config: ModelConfig) -> dict:
    """config.json fields every native family shares: sizes, SwiGLU, RMSNorm eps, default RoPE."""
    return dict(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.mlp_hidden,
        num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head,
        num_key_value_heads=config.n_kv_head_at(0),
        head_dim=config.head_dim,
        hidden_act="silu",
        max_position_embeddings=config.block_size,
        rms_norm_eps=NORM_EPS,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_BASE},
        tie_word_embeddings=config.tie_embeddings,
        attention_dropout=0.0,
    )


def native_config(config: ModelConfig, architecture: str) -> dict:
    """The config.json fields (before transformers' defaults) of a native export."""
    hf = shape_config(config)
    if architecture == "LlamaForCausalLM":
        hf.update(model_type="llama", attention_bias=False, mlp_bias=False)
    elif architecture == "MistralForCausalLM":
        hf.update(model_type="mistral", sliding_window=config.attention.options_of("local").window)
    else:
        local = config.attention.options_of("local")
        layer_types = [
            "sliding_attention" if kind == "local" else "full_attention" for kind in config.layer_kinds
        ]
        if architecture == "Qwen3ForCausalLM":
            hf.update(model_type="qwen3", attention_bias=False, use_sliding_window=local is not None)
        else:
            hf.update(model_type="ministral")
        hf.update(sliding_window=local.window if local else None, layer_types=layer_types)
    return hf


def renamed(
    state: dict[str, Tensor],
    top: dict[str, str],
    layers: dict[str, str],
    source: str,
    target: str,
    other: Callable[[dict[str, Tensor], str, str, str], None],
) -> dict[str, Tensor]:
    """`state` under other names, in its order: a top-level module's by `top`, a layer's
    (`{source}{i}.{inner}.{param}`) by `layers` as `{target}{i}.{layers[inner]}.{param}`. Every
    other tensor goes to other(out, key, i, inner) (i and inner "" outside the layers), which adds
    what it makes of it to `out`, leaves it out or raises."""
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        name, _, param = key.rpartition(".")
        layer, _, inner = (
            name.removeprefix(source).partition(".") if name.startswith(source) else ("", "", "")
        )
        if name in top:
            out[f"{top[name]}.{param}"] = value
        elif inner in layers:
            out[f"{target}{layer}.{layers[inner]}.{param}"] = value
        else:
            other(out, key, layer, inner)
    return out


def refuse_unexpected(keys: Iterable[str], where: str, importable: str) -> None:
    """The UserError for the first of `keys` that is not a rotary table (transformers' inv_freq,
    which some checkpoints carry and no model needs)."""
    for key in keys:
        if not key.endswith("rotary_emb.inv_freq"):
            raise UserError(f"{where}: unexpected tensor {key!r}; only {importable} can be imported")


def to_hf_weights(
    state: dict[str, Tensor], config: ModelConfig, names: dict[str, str] = LAYER_NAMES
) -> dict[str, Tensor]:
    """minitx state dict -> transformers names: the layers' by `names` (the Llama family's by
    default), q/k/v split out of a fused qkv_proj."""

    def split_qkv(out: dict[str, Tensor], key: str, layer: str, inner: str) -> None:
        if inner != "attn.qkv_proj":
            raise KeyError(inner)  # a module the export's checks let through and `names` lacks
        param = key.rpartition(".")[2]
        for part, piece in zip("qkv", state[key].split(qkv_sizes(config, int(layer)), dim=0)):
            out[f"model.layers.{layer}.self_attn.{part}_proj.{param}"] = piece.contiguous()

    return renamed(state, TOP_NAMES, names, "blocks.", "model.layers.", split_qkv)


def from_hf_weights(hf: dict[str, Tensor], config: ModelConfig, where: str = "weights") -> dict[str, Tensor]:
    """transformers Llama-family state dict -> minitx names (q/k/v stacked into qkv_proj). Biases
    stay as they are; `complete_biases` adds the ones minitx has and the import lacks."""
    qkv = {f"self_attn.{part}_proj" for part in "qkv"}  # gathered below

    def refuse(out: dict[str, Tensor], key: str, layer: str, inner: str) -> None:
        if inner not in qkv:
            refuse_unexpected([key], where, "plain Llama-family layers")

    out = renamed(hf, inverted(TOP_NAMES), inverted(LAYER_NAMES), "model.layers.", "blocks.", refuse)
    for layer in range(config.n_layer):
        prefix = f"model.layers.{layer}.self_attn."
        for param in ("weight", "bias"):
            parts = [hf.get(f"{prefix}{part}_proj.{param}") for part in "qkv"]
            if all(part is not None for part in parts):
                out[f"blocks.{layer}.attn.qkv_proj.{param}"] = torch.cat(parts, dim=0)
            elif param == "weight":
                raise UserError(
                    f"{where}: layer {layer} lacks its q/k/v projections; the weights are incomplete"
                )
    return out


def inverted(names: dict[str, str]) -> dict[str, str]:
    """A table of minitx name -> transformers name, read the other way."""
    return {value: key for key, value in names.items()}


def complete_biases(state: dict[str, Tensor], expected: dict[str, Tensor]) -> dict[str, Tensor]:
    """The imported weights, with zeros for the biases they lack (Qwen2 has q/k/v biases only)."""
    out = dict(state)
    for key, value in expected.items():
        if key not in out and key.endswith(".bias"):  # the weights' dtype: `expected` may be on meta
            out[key] = torch.zeros(value.shape, dtype=state["tok_emb.weight"].dtype)
    return out


def qkv_sizes(config: ModelConfig, layer: int) -> list[int]:
    q, kv = config.n_head * config.head_dim, config.n_kv_head_at(layer) * config.head_dim
    return [q, kv, kv]


def pool_kv_heads(
    state: dict[str, Tensor], source: ModelConfig, target: ModelConfig, log: Callable[[str], None]
) -> dict[str, Tensor]:
    """Each layer's key and value heads mean-pooled over groups of consecutive heads, where the
    target has fewer than the source (GQA paper, Ainslie et al. 2023: MHA -> GQA/MQA before
    up-training). Query head h reads kv head h // (n_head / n_kv_head) in minitx, so group g is
    source heads g*r .. g*r + r - 1 with r = source kv heads / target kv heads."""
    out = dict(state)
    pooled = []
    for layer in range(target.n_layer):
        have, want = source.n_kv_head_at(layer), target.n_kv_head_at(layer)
        if have == want:
            continue
        if want > have or have % want:
            raise UserError(
                f"attention.n_kv_head: layer {layer} of the imported model has {have} key/value heads, which cannot be "
                f"pooled into {want}; use a divisor of {have}"
            )
        for param in ("weight", "bias"):
            key = f"blocks.{layer}.attn.qkv_proj.{param}"
            if key in state:
                out[key] = pool_qkv(state[key], source.n_head, have, want, source.head_dim)
        pooled.append(f"{layer}: {have}->{want}")
    if pooled:
        log(
            f"init_from: mean-pooled key/value heads per group (Ainslie et al. 2023) in layer(s) {', '.join(pooled)}"
        )
    return out


def pool_qkv(fused: Tensor, n_head: int, have: int, want: int, head_dim: int) -> Tensor:
    q, k, v = fused.split([n_head * head_dim, have * head_dim, have * head_dim], dim=0)
    rest = fused.shape[1:]

    def pool(t: Tensor) -> Tensor:
        grouped = t.float().reshape(want, have // want, head_dim, *rest).mean(dim=1)
        return grouped.reshape(want * head_dim, *rest).to(t.dtype)

    return torch.cat([q, pool(k), pool(v)], dim=0)


def model_config_from_hf(
    hf: dict, where: str, log: Callable[[str], None], block_size: int | None = None
) -> ModelConfig:
    """The minitx ModelConfig of a Llama/Mistral/Qwen2 config.json (a dict); what minitx cannot
    express is a UserError naming the field."""
    n_head, d_model = hf["num_attention_heads"], hf["hidden_size"]
    n_kv = hf.get("num_key_value_heads") or n_head
    check_importable(hf, where, d_model // n_head, log)
    full_kind = "mha" if n_kv == n_head else "mqa" if n_kv == 1 else "gqa"
    kinds = ["local" if sliding else full_kind for sliding in sliding_layers(hf)]
    attention: dict = {"kind": kinds[0]} if len(set(kinds)) == 1 else {"kind": kinds[0], "layers": kinds}
    options: dict = {kind: {} for kind in kinds}
    if "local" in kinds:
        options["local"]["window"] = hf["sliding_window"]
    if hf["model_type"] == "qwen3":  # q_norm and k_norm in every layer
        for kind in options:
            options[kind]["qk_norm"] = True
    attention["options"] = options
    if n_kv not in (1, n_head) or ("local" in kinds and n_kv != n_head):
        attention["n_kv_head"] = n_kv
    return ModelConfig(
        **shape_from_hf(hf, block_size), bias=has_bias(hf), attention=AttentionConfig(**attention)
    )


def shape_from_hf(hf: dict, block_size: int | None) -> dict:
    """ModelConfig fields every imported family shares: sizes, and SwiGLU, RMSNorm, RoPE."""
    return dict(
        vocab_size=hf["vocab_size"],
        block_size=block_size or hf.get("max_position_embeddings") or 2048,
        n_layer=hf["num_hidden_layers"],
        n_head=hf["num_attention_heads"],
        d_model=hf["hidden_size"],
        mlp="swiglu",
        mlp_hidden_size=hf["intermediate_size"],
        norm="rmsnorm",
        positions="rope",
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )


def shape_reasons(config: ModelConfig) -> list[tuple[bool, str, str]]:
    """(bad, what the model has, what it needs) for the parts every native family shares."""
    return [
        (config.mlp != "swiglu", f"mlp={config.mlp}", "mlp: swiglu"),
        (config.norm != "rmsnorm", f"norm={config.norm}", "norm: rmsnorm"),
        (config.positions != "rope", f"positions={config.positions}", "positions: rope"),
        (config.bias, "bias=true", "bias: false"),
    ]


def cannot_hold(config: ModelConfig, *reasons: tuple[bool, str]) -> str:
    """What the model has that a native class cannot hold, of the parts every family shares and the
    (bad, what it has) given; '' when nothing."""
    return ", ".join(has for bad, has, *_ in (*shape_reasons(config), *reasons) if bad)


def only_as(
    config: ModelConfig, kind: str, architecture: str, why: str, *reasons: tuple[bool, str, str]
) -> tuple[str | None, str]:
    """(architecture, why) for a model of a kind that exports only natively (no custom code knows
    it), or (None, one line saying what to change) when it is not that kind in every layer, lacks
    a shape every native family shares, or any other (bad, what it has, what it needs) holds."""
    kinds = list(dict.fromkeys(config.layer_kinds))
    every_layer = (kinds != [kind], f"attention {'/'.join(kinds)}", f"{kind} in every layer")
    found = [(has, want) for bad, has, want in (every_layer, *reasons, *shape_reasons(config)) if bad]
    if not found:
        return architecture, why
    return None, (
        f"{', '.join(has for has, _ in found)}: {kind} exports only as {architecture}, which needs "
        f"{', '.join(want for _, want in found)}; set that in the model config and train again"
    )


def has_bias(hf: dict) -> bool:
    """Llama's biases are optional, Qwen2 always has q/k/v biases, Mistral has none. minitx has
    all or none: the ones the import lacks are zeros (`complete_biases`)."""
    if hf["model_type"] in ("llama", "qwen3"):
        return bool(hf.get("attention_bias") or hf.get("mlp_bias"))
    return hf["model_type"] == "qwen2"


def sliding_layers(hf: dict) -> list[bool]:
    """Per layer: does it use a sliding window?"""
    n_layer, window = hf["num_hidden_layers"], hf.get("sliding_window")
    if hf["model_type"] == "llama" or window is None:
        return [False] * n_layer
    if hf["model_type"] == "mistral":
        return [True] * n_layer
    if hf["model_type"] in ("qwen2", "qwen3") and not hf.get("use_sliding_window", False):
        return [False] * n_layer
    types = hf.get("layer_types") or [  # Qwen2's older rule; Ministral always writes layer_types
        "sliding_attention" if layer >= hf.get("max_window_layers", 28) else "full_attention"
        for layer in range(n_layer)
    ]
    return [kind == "sliding_attention" for kind in types]


def check_importable(hf: dict, where: str, head_dim: int, log: Callable[[str], None]) -> None:
    """Refuse what minitx's layers cannot compute; warn about a different RMSNorm eps."""
    if hf.get("hidden_act", "silu") != "silu":
        raise UserError(
            f"{where}: hidden_act={hf['hidden_act']!r} cannot be imported; minitx's SwiGLU uses silu"
        )
    if hf.get("head_dim") not in (None, head_dim):
        raise UserError(
            f"{where}: head_dim={hf['head_dim']} is not hidden_size / num_attention_heads = {head_dim}; minitx cannot import it"
        )
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    theta = rope.get("rope_theta", hf.get("rope_theta", ROPE_BASE))
    if rope.get("rope_type", rope.get("type", "default")) != "default" or float(theta) != ROPE_BASE:
        raise UserError(
            f"{where}: RoPE {rope.get('rope_type', 'default')} with theta {theta} cannot be imported; "
            f"minitx's RoPE is the default one with base {ROPE_BASE:g}"
        )
    if (eps := hf.get("rms_norm_eps", NORM_EPS)) != NORM_EPS:
        log(f"init_from: rms_norm_eps={eps} becomes minitx's {NORM_EPS}: the logits shift slightly")
