"""minitx's MLA <-> transformers' DeepseekV3ForCausalLM with every layer dense.

A minitx model is exactly a DeepseekV3ForCausalLM when every layer is mla and it has SwiGLU,
RMSNorm, RoPE and no bias: DeepSeek's MLP is SwiGLU, and first_k_dense_replace = n_layer makes
every layer's MLP the dense one (the layers after it would be mixture-of-experts, which minitx has
not got). The rest agrees as written in configuration_deepseek_v3.py:

    kv_lora_rank, q_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim   minitx's options
    rope_interleave false       minitx rotates the pairs (x_i, x_{i + d_r/2}): transformers' rotate_half
    softmax scale               1/sqrt(qk_nope_head_dim + qk_rope_head_dim) with default RoPE, as minitx
    kv_a_layernorm, q_a_layernorm   RMSNorm with eps 1e-6, whatever rms_norm_eps says, as minitx

The weights only change names: minitx keeps transformers' fused layouts (kv_a_proj_with_mqa is
[c_kv | k_rope], kv_b_proj each head's rows [nope | v]). There is no custom-code export for mla:
a model DeepseekV3 cannot express is refused, saying what to change.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from ..config import AttentionConfig, ModelConfig
from ..errors import UserError
from . import convert

MODEL_TYPES = {"deepseek_v3": "DeepseekV3ForCausalLM"}
ARCHITECTURE = "DeepseekV3ForCausalLM"

# minitx name inside blocks.{i}. -> transformers name inside model.layers.{i}.
MLA_NAMES = {
    "attn.q_proj": "self_attn.q_proj",
    "attn.q_down": "self_attn.q_a_proj",
    "attn.q_latent_norm": "self_attn.q_a_layernorm",
    "attn.q_up": "self_attn.q_b_proj",
    "attn.kv_down": "self_attn.kv_a_proj_with_mqa",
    "attn.kv_latent_norm": "self_attn.kv_a_layernorm",
    "attn.kv_up": "self_attn.kv_b_proj",
    "attn.out_proj": "self_attn.o_proj",
}
NAMES = {**{k: v for k, v in convert.LAYER_NAMES.items() if not k.startswith("attn.")}, **MLA_NAMES}


def claims(config: ModelConfig) -> bool:
    return "mla" in config.layer_kinds


def native_class(config: ModelConfig) -> tuple[str | None, str]:
    """(DeepseekV3ForCausalLM, why) or (None, what to change: there is no other way to export mla)."""
    return convert.only_as(
        config, "mla", ARCHITECTURE, "MLA in every layer, dense MLPs (first_k_dense_replace = n_layer)"
    )


def native_config(config: ModelConfig, architecture: str) -> dict:
    """The config.json fields (before transformers' defaults) of a native export."""
    options = config.attention.options_of("mla")
    return dict(
        convert.shape_config(config),
        model_type="deepseek_v3",
        first_k_dense_replace=config.n_layer,  # every layer's MLP dense: no mixture-of-experts
        num_mtp_layers=0,  # no multi-token-prediction module
        num_key_value_heads=config.n_head,  # keys and values are expanded per head
        head_dim=options.qk_rope_head_dim,  # DeepseekV3's head_dim is its rotary width
        kv_lora_rank=options.kv_lora_rank,
        q_lora_rank=options.q_lora_rank,
        qk_rope_head_dim=options.qk_rope_head_dim,
        qk_nope_head_dim=options.qk_nope_head_dim or config.head_dim,
        v_head_dim=options.v_head_dim or config.head_dim,
        rope_interleave=False,
        attention_bias=False,
    )


def to_hf_weights(state: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """minitx state dict -> DeepseekV3 names."""
    return convert.to_hf_weights(state, config, NAMES)


def from_hf_weights(hf: dict[str, Tensor], config: ModelConfig, where: str = "weights") -> dict[str, Tensor]:
    """DeepseekV3 state dict -> minitx names. Layers past num_hidden_layers (the multi-token-
    prediction module of DeepSeek's checkpoints) are left out, as transformers leaves them."""

    def beyond(key: str) -> bool:
        layer = key.removeprefix("model.layers.").partition(".")[0]
        return key.startswith("model.layers.") and layer.isdigit() and int(layer) >= config.n_layer

    def refuse(out: dict[str, Tensor], key: str, layer: str, inner: str) -> None:
        convert.refuse_unexpected([key], where, "all-dense DeepseekV3 layers")

    within = {key: value for key, value in hf.items() if not beyond(key)}
    top, names = convert.inverted(convert.TOP_NAMES), convert.inverted(NAMES)
    return convert.renamed(within, top, names, "model.layers.", "blocks.", refuse)


def model_config_from_hf(
    hf: dict, where: str, log: Callable[[str], None], block_size: int | None = None
) -> ModelConfig:
    """The minitx ModelConfig of a DeepseekV3 config.json (a dict); what minitx cannot express is
    a UserError naming the field."""
    n_layer, n_head, d_model = hf["num_hidden_layers"], hf["num_attention_heads"], hf["hidden_size"]
    if (dense := hf.get("first_k_dense_replace") or 0) < n_layer:
        raise UserError(
            f"{where}: first_k_dense_replace={dense} makes layers {dense}..{n_layer - 1} mixture-of-experts, "
            f"which minitx cannot import; only all-dense models (first_k_dense_replace >= num_hidden_layers={n_layer}) import"
        )
    if hf.get("rope_interleave", True):  # transformers' default
        raise UserError(
            f"{where}: rope_interleave=true cannot be imported; minitx rotates the pairs (x_i, x_(i+d/2)), "
            "which is rope_interleave: false"
        )
    head_dim = d_model // n_head
    # its head_dim is the rotary width, not the heads' width
    convert.check_importable({**hf, "head_dim": None}, where, head_dim, log)
    options = dict(
        kv_lora_rank=hf["kv_lora_rank"],
        q_lora_rank=hf.get("q_lora_rank"),
        qk_rope_head_dim=hf["qk_rope_head_dim"],
        # the widths minitx derives from head_dim are left unset, so a round trip gives the same config
        qk_nope_head_dim=None if hf["qk_nope_head_dim"] == head_dim else hf["qk_nope_head_dim"],
        v_head_dim=None if hf["v_head_dim"] == head_dim else hf["v_head_dim"],
    )
    return ModelConfig(
        **convert.shape_from_hf(hf, block_size),
        # DeepSeek's attention_bias is on q_a_proj, kv_a_proj_with_mqa and o_proj, as minitx's bias
        # in an mla layer; the biases minitx has besides (the MLP's) are zeros (`complete_biases`).
        bias=bool(hf.get("attention_bias", False)),
        attention=AttentionConfig(kind="mla", options={"mla": options}),
    )
