"""minitx's differential attention <-> transformers' DiffLlamaForCausalLM.

A minitx model is exactly a DiffLlamaForCausalLM when every layer is diff with lambda_init by
depth (DiffLlama computes it from the layer index alone) and the model has SwiGLU, RMSNorm, RoPE
and no bias. The rest agrees as written in modeling_diffllama.py: the same head pairing (query
head i with i + H/2, the value halves along the key/value heads), lambda = exp(lq1.lk1) -
exp(lq2.lk2) + 0.8 - 0.6 exp(-0.3 layer) with 0-based layers, a weightless RMSNorm over each pair's
2 head_dim features with eps rms_norm_eps, and the (1 - lambda_init) scale. The weights are the
Llama family's (convert.py) plus each layer's four lambda vectors. There is no custom-code export
for diff: a model DiffLlama cannot express is refused, saying what to change.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from ..config import AttentionConfig, ModelConfig
from ..errors import UserError
from . import convert

MODEL_TYPES = {"diffllama": "DiffLlamaForCausalLM"}
ARCHITECTURE = "DiffLlamaForCausalLM"
LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")  # named alike on both sides


def claims(config: ModelConfig) -> bool:
    return "diff" in config.layer_kinds


def native_class(config: ModelConfig) -> tuple[str | None, str]:
    """(DiffLlamaForCausalLM, why) or (None, what to change: there is no other way to export diff)."""
    lambda_init = config.attention.options_of("diff").lambda_init
    by_depth = (lambda_init is not None, f"lambda_init={lambda_init}", "lambda_init: null (by depth)")
    why = "differential attention in every layer, lambda_init by depth"
    return convert.only_as(config, "diff", ARCHITECTURE, why, by_depth)


def native_config(config: ModelConfig, architecture: str) -> dict:
    """The config.json fields (before transformers' defaults) of a native export."""
    return dict(
        convert.shape_config(config),
        model_type="diffllama",
        attention_bias=False,
        lambda_std_dev=config.attention.options_of("diff").lambda_std,
    )


def is_lambda(key: str) -> bool:
    return key.rpartition(".")[2] in LAMBDAS


def to_hf_weights(state: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """minitx state dict -> DiffLlama names: the Llama family's, and the lambdas beside q/k/v."""
    out = convert.to_hf_weights({k: v for k, v in state.items() if not is_lambda(k)}, config)
    for key, value in state.items():
        if is_lambda(key):  # blocks.{i}.attn.lambda_q1 -> model.layers.{i}.self_attn.lambda_q1
            _, layer, _, name = key.split(".")
            out[f"model.layers.{layer}.self_attn.{name}"] = value
    return out


def from_hf_weights(hf: dict[str, Tensor], config: ModelConfig, where: str = "weights") -> dict[str, Tensor]:
    """DiffLlama state dict -> minitx names."""
    out = convert.from_hf_weights({k: v for k, v in hf.items() if not is_lambda(k)}, config, where)
    for key, value in hf.items():
        if is_lambda(key):
            _, _, layer, _, name = key.split(".")
            out[f"blocks.{layer}.attn.{name}"] = value
    return out


def model_config_from_hf(
    hf: dict, where: str, log: Callable[[str], None], block_size: int | None = None
) -> ModelConfig:
    """The minitx ModelConfig of a DiffLlama config.json (a dict); what minitx cannot express is a
    UserError naming the field."""
    n_head, d_model = hf["num_attention_heads"], hf["hidden_size"]
    n_kv = hf.get("num_key_value_heads") or n_head
    convert.check_importable(hf, where, d_model // n_head, log)
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise UserError(
            f"{where}: attention_bias/mlp_bias cannot be imported for diff; minitx's diff has no biases"
        )
    attention: dict = {"kind": "diff", "options": {"diff": {"lambda_std": hf.get("lambda_std_dev", 0.1)}}}
    if n_kv != n_head:
        attention["n_kv_head"] = n_kv
    return ModelConfig(
        **convert.shape_from_hf(hf, block_size), bias=False, attention=AttentionConfig(**attention)
    )
