"""minitx's Gated DeltaNet, alone or mixed with softmax layers <-> transformers' Qwen3_5ForCausalLM.

Qwen3.5's dense text model (transformers.models.qwen3_5, model_type qwen3_5_text) is a pre-norm
stack of SwiGLU blocks whose token mixer is, per layer, `linear_attention` (Gated DeltaNet) or
`full_attention` (softmax with q_norm, k_norm and an output gate). A minitx model is exactly one
when it has SwiGLU, RMSNorm, no bias and no learned positions, its gdn layers decay and keep
beta in (0, 1), and its softmax layers (mha, mqa, gqa) have QK-norm, no sinks and the same
key/value heads. What differs is layout or a reparametrisation, each exact:

    minitx                                    Qwen3.5
    RMSNorm weight w (blocks, final, q/k)     zero-centred weight w - 1: it computes x_hat (1 + w')
    gdn q_proj, k_proj, v_proj                in_proj_qkv: [q | k | v] stacked, heads in order
    gdn g_proj, b_proj, a_proj, conv          in_proj_z, in_proj_b, in_proj_a, conv1d [q | k | v]
    gdn norm (RMSNorm of each value head)     norm: a plain weight (RMSNormGated), eps rms_norm_eps
    softmax qkv_proj + gate_proj              q_proj emits per head [query (D) | gate (D)]; k, v apart
    gate: head (one per head)                 that head's row repeated over its D gate rows
    gate: none                                gate rows zero and o_proj doubled: sigmoid(0) = 1/2, and
                                              halving then doubling is exact in binary floats
    RoPE over the whole head                  partial_rotary_factor 1.0 (Qwen3.5's own is 0.25); its
                                              multimodal RoPE with text positions is plain RoPE

The rest agrees as written in modeling_qwen3_5.py: q and k L2-normalised with eps 1e-6 before
the delta rule, scale 1/sqrt(dk), each key head serving consecutive value heads
(repeat_interleave), beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias), SiLU after the
convolution and on the output gate z.

Import reads any Qwen3.5 text model whose RoPE is whole (partial_rotary_factor 1.0) and whose
head_dim is hidden_size / num_attention_heads; its softmax layers come in with an elementwise
gate, which holds every Qwen3.5 gate. Why not the others: OLMo-Hybrid's softmax layers are
post-norm (OLMo 3) with QK-norm over all heads at once, and its gdn output norm has eps 1e-5;
Qwen3-Next is dense only with every layer in mlp_only_layers and fuses q, k, v, z and b, a per key
head (the same maths as Qwen3.5 in another row order): Qwen3.5 is the plain one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..config import AttentionConfig, ModelConfig
from ..errors import UserError, require
from . import convert

MODEL_TYPES = {"qwen3_5_text": "Qwen3_5ForCausalLM"}
ARCHITECTURE = "Qwen3_5ForCausalLM"
SOFTMAX_KINDS = {"mha", "mqa", "gqa"}  # Qwen3.5's full_attention layers
# Qwen3.5's RMSNorm weights are zero-centred: it holds w - 1 where minitx holds w
ZERO_CENTRED = {"norm1.weight", "norm2.weight", "attn.q_norm.weight", "attn.k_norm.weight"}

# minitx name inside blocks.{i}. -> Qwen3.5 name inside model.layers.{i}. of the tensors that only
# change name (the zero-centred norms shift by one); the fused q/k/v, the query's gate and the gdn's
# q/k/v are built apart.
LAYER_NAMES = {
    "norm1": "input_layernorm",
    "norm2": "post_attention_layernorm",
    "mlp.gate": "mlp.gate_proj",
    "mlp.up": "mlp.up_proj",
    "mlp.down": "mlp.down_proj",
}
SOFTMAX_NAMES = {"attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm"}
GDN_NAMES = {
    "attn.g_proj": "linear_attn.in_proj_z",
    "attn.b_proj": "linear_attn.in_proj_b",
    "attn.a_proj": "linear_attn.in_proj_a",
    "attn.conv": "linear_attn.conv1d",
    "attn.norm": "linear_attn.norm",
    "attn.out_proj": "linear_attn.out_proj",
}
GDN_PARAMETERS = ("A_log", "dt_bias")  # blocks.{i}.attn.X <-> model.layers.{i}.linear_attn.X


def renamed_tensors(kind: str) -> dict[str, str]:
    """minitx name -> Qwen3.5 name inside a layer of `kind`, of each tensor that only changes name
    (and shifts by one, where ZERO_CENTRED)."""
    modules = {**LAYER_NAMES, **(GDN_NAMES if kind == "gdn" else SOFTMAX_NAMES)}
    names = {f"{ours}.weight": f"{theirs}.weight" for ours, theirs in modules.items()}
    if kind == "gdn":
        names.update({f"attn.{name}": f"linear_attn.{name}" for name in GDN_PARAMETERS})
    return names


def claims(config: ModelConfig) -> bool:
    return "gdn" in config.layer_kinds


def softmax_layers(config: ModelConfig) -> list[int]:
    return [layer for layer, kind in enumerate(config.layer_kinds) if kind != "gdn"]


def native_class(config: ModelConfig) -> tuple[str | None, str]:
    """(Qwen3_5ForCausalLM, why) or (None, what it cannot hold: the model goes to custom code)."""
    others = set(config.layer_kinds) - SOFTMAX_KINDS - {"gdn"}
    gdn = config.attention.options_of("gdn")
    softmax = [config.options_at(layer) for layer in softmax_layers(config)]
    kv_heads = {config.n_kv_head_at(layer) for layer in softmax_layers(config)}
    found = convert.cannot_hold(
        config,
        (bool(others), f"gdn beside {'/'.join(sorted(others))}"),
        (not gdn.decay, "gdn without decay (DeltaNet)"),
        (gdn.allow_neg_eigval, "gdn with allow_neg_eigval"),
        (
            any(not getattr(options, "qk_norm", False) for options in softmax),
            "softmax layers without qk_norm",
        ),
        (any(getattr(options, "sinks", False) for options in softmax), "learned sinks"),
        (len(kv_heads) > 1, "softmax layers with different key/value head counts"),
    )
    if found:
        return None, found
    if not softmax:
        return ARCHITECTURE, "Gated DeltaNet in every layer: Qwen3.5's linear_attention layers"
    return ARCHITECTURE, "Gated DeltaNet beside gated softmax with QK-norm: Qwen3.5's layer_types"


def gdn_sizes(config: ModelConfig) -> tuple[int, int, int]:
    """(key head width, value head width, value heads) of the model's gdn layers."""
    options = config.attention.options_of("gdn")
    return (
        options.key_head_dim or config.head_dim,
        options.value_head_dim or config.head_dim,
        options.n_value_head or config.n_head,
    )


def native_config(config: ModelConfig, architecture: str) -> dict:
    """The config.json fields (before transformers' defaults) of a native export."""
    key_dim, value_dim, value_heads = gdn_sizes(config)
    softmax = softmax_layers(config)
    hf = convert.shape_config(config)
    hf.update(
        model_type="qwen3_5_text",
        num_key_value_heads=config.n_kv_head_at(softmax[0]) if softmax else config.n_head,
        rope_parameters=dict(hf["rope_parameters"], partial_rotary_factor=1.0),
        attention_bias=False,
        layer_types=[
            "linear_attention" if kind == "gdn" else "full_attention" for kind in config.layer_kinds
        ],
        linear_conv_kernel_dim=config.attention.options_of("gdn").conv_size,
        linear_num_key_heads=config.n_head,
        linear_num_value_heads=value_heads,
        linear_key_head_dim=key_dim,
        linear_value_head_dim=value_dim,
    )
    if not softmax:
        # transformers 5.24's DynamicCache takes the sequence's length from an attention layer and
        # raises when there is none: a model of linear layers only runs and generates without it.
        hf["use_cache"] = False
    return hf


def to_hf_weights(state: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """minitx state dict -> Qwen3.5 names and forms (see the module's docstring)."""
    out = convert.renamed(state, convert.TOP_NAMES, {}, "blocks.", "", lambda *_: None)  # the layers below
    out["model.norm.weight"] = out["model.norm.weight"] - 1
    H, D = config.n_head, config.head_dim
    for layer, kind in enumerate(config.layer_kinds):
        ours, theirs = f"blocks.{layer}.", f"model.layers.{layer}."
        for name, hf_name in renamed_tensors(kind).items():
            value = state[ours + name]
            out[theirs + hf_name] = value - 1 if name in ZERO_CENTRED else value
        if kind == "gdn":
            qkv = [state[f"{ours}attn.{part}_proj.weight"] for part in "qkv"]
            out[f"{theirs}linear_attn.in_proj_qkv.weight"] = torch.cat(qkv, dim=0)
            continue
        q, k, v = state[f"{ours}attn.qkv_proj.weight"].split(convert.qkv_sizes(config, layer), dim=0)
        gate, doubled = query_gate(state, f"{ours}attn.", config, layer)
        # Qwen3.5's q_proj: per head its D query rows, then its D gate rows
        out[f"{theirs}self_attn.q_proj.weight"] = torch.cat(
            [q.view(H, D, -1), gate.view(H, D, -1)], 1
        ).flatten(0, 1)
        out[f"{theirs}self_attn.k_proj.weight"] = k.contiguous()
        out[f"{theirs}self_attn.v_proj.weight"] = v.contiguous()
        out[f"{theirs}self_attn.o_proj.weight"] = state[f"{ours}attn.out_proj.weight"] * (2 if doubled else 1)
    return out


def query_gate(state: dict[str, Tensor], prefix: str, config: ModelConfig, layer: int) -> tuple[Tensor, bool]:
    """(the gate's weight, one row per query channel, and whether o_proj must double): an
    elementwise gate as it is, a per-head gate's row repeated over its head's channels, no gate as
    zeros (sigmoid 1/2, which the doubled o_proj undoes exactly)."""
    gate = state.get(f"{prefix}gate_proj.weight")
    H, D = config.n_head, config.head_dim
    if gate is None:
        return torch.zeros(H * D, config.d_model, dtype=state[f"{prefix}qkv_proj.weight"].dtype), True
    if gate.shape[0] == H:
        return gate.repeat_interleave(D, dim=0), False
    return gate, False


def from_hf_weights(hf: dict[str, Tensor], config: ModelConfig, where: str = "weights") -> dict[str, Tensor]:
    """Qwen3.5 state dict -> minitx names and forms: every softmax layer with an elementwise gate."""
    out: dict[str, Tensor] = {}
    seen = set()

    def take(name: str) -> Tensor:
        require(name in hf, f"{where}: lacks {name}; the weights are incomplete")
        seen.add(name)
        return hf[name]

    out["tok_emb.weight"] = take("model.embed_tokens.weight")
    out["norm.weight"] = take("model.norm.weight") + 1
    if "lm_head.weight" in hf:
        out["lm_head.weight"] = take("lm_head.weight")
    H, D = config.n_head, config.head_dim
    for layer, kind in enumerate(config.layer_kinds):
        ours, theirs = f"blocks.{layer}.", f"model.layers.{layer}."
        for name, hf_name in renamed_tensors(kind).items():
            value = take(theirs + hf_name)
            out[ours + name] = value + 1 if name in ZERO_CENTRED else value
        if kind == "gdn":
            key_dim, value_dim, value_heads = gdn_sizes(config)
            sizes = [H * key_dim, H * key_dim, value_heads * value_dim]
            qkv = take(f"{theirs}linear_attn.in_proj_qkv.weight").split(sizes, dim=0)
            for part, piece in zip("qkv", qkv):
                out[f"{ours}attn.{part}_proj.weight"] = piece.contiguous()
            continue
        query, gate = take(f"{theirs}self_attn.q_proj.weight").view(H, 2 * D, -1).split(D, dim=1)
        k, v = (take(f"{theirs}self_attn.{part}_proj.weight") for part in "kv")
        out[f"{ours}attn.qkv_proj.weight"] = torch.cat([query.flatten(0, 1), k, v], dim=0)
        out[f"{ours}attn.gate_proj.weight"] = gate.flatten(0, 1)
        out[f"{ours}attn.out_proj.weight"] = take(f"{theirs}self_attn.o_proj.weight")
    convert.refuse_unexpected(
        sorted(key for key in hf if key not in seen), where, "Qwen3.5's dense text layers"
    )
    return out


def model_config_from_hf(
    hf: dict, where: str, log: Callable[[str], None], block_size: int | None = None
) -> ModelConfig:
    """The minitx ModelConfig of a Qwen3.5 text config.json (a dict); what minitx cannot express
    is a UserError naming the field."""
    n_head, d_model = hf["num_attention_heads"], hf["hidden_size"]
    head_dim = d_model // n_head
    convert.check_importable(hf, where, head_dim, log)
    rope = hf.get("rope_parameters") or {}
    if float(rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))) != 1.0:
        raise UserError(
            f"{where}: partial_rotary_factor={rope.get('partial_rotary_factor')} cannot be imported; "
            "minitx's RoPE turns every feature of a head (1.0)"
        )
    if hf.get("attention_bias"):
        raise UserError(
            f"{where}: attention_bias=true cannot be imported; minitx's gdn models have no biases"
        )
    if hf.get("linear_num_key_heads", n_head) != n_head:
        raise UserError(
            f"{where}: linear_num_key_heads={hf['linear_num_key_heads']} is not num_attention_heads={n_head}; "
            "minitx's gdn has one key head per attention head"
        )
    n_kv = hf.get("num_key_value_heads") or n_head
    full_kind = "mha" if n_kv == n_head else "mqa" if n_kv == 1 else "gqa"
    kinds = ["gdn" if kind == "linear_attention" else full_kind for kind in hf["layer_types"]]
    gdn: dict = {"conv_size": hf.get("linear_conv_kernel_dim", 4)}
    for field, name, default in (
        ("key_head_dim", "linear_key_head_dim", head_dim),
        ("value_head_dim", "linear_value_head_dim", head_dim),
        ("n_value_head", "linear_num_value_heads", n_head),
    ):
        if hf.get(name, default) != default:
            gdn[field] = hf[name]
    options: dict = {"gdn": gdn}
    if full_kind in kinds:
        options[full_kind] = {"qk_norm": True, "gate": "elementwise"}
    attention: dict = {"kind": kinds[0], "options": options}
    if len(set(kinds)) > 1:
        attention["layers"] = kinds
    if full_kind == "gqa" and full_kind in kinds:
        attention["n_kv_head"] = n_kv
    return ModelConfig(
        **convert.shape_from_hf(hf, block_size), bias=False, attention=AttentionConfig(**attention)
    )
