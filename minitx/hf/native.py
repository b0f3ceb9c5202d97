"""Which transformers class a minitx model is, and back: one module per family of architectures.

    convert.py       Llama, Mistral, Ministral, Qwen2, Qwen3   (mha, mqa, gqa, local; QK-norm)
    deepseek_v3.py   DeepseekV3                                (mla)
    diffllama.py     DiffLlama                                 (diff)
    qwen3_5.py       Qwen3.5's dense text model                (gdn, alone or beside mha/mqa/gqa)

A family module has:
    MODEL_TYPES                      {config.json model_type: class name} that it imports
    claims(config) -> bool           the model's attention kinds are this family's to export
    native_class(config)             (class name, why) or (None, why not)
    native_config(config, class)     the config.json fields of an export
    to_hf_weights(state, config)     minitx state dict -> the class's names
    model_config_from_hf(hf, where, log, block_size) -> ModelConfig
    from_hf_weights(hf_state, config, where) -> minitx state dict
A model no family claims, or one its family cannot express, is exported with custom code
(modeling_minitx.py) where that code knows its kinds.
"""

from __future__ import annotations

from types import ModuleType

from ..config import ModelConfig
from ..errors import UserError
from . import convert, deepseek_v3, diffllama, qwen3_5

FAMILIES: tuple[ModuleType, ...] = (convert, deepseek_v3, diffllama, qwen3_5)  # each claims kinds of its own


def family_of(config: ModelConfig) -> ModuleType | None:
    """The family whose kinds the model uses, or None (kinds no native class has, e.g. MTA)."""
    return next((family for family in FAMILIES if family.claims(config)), None)


def native_class(config: ModelConfig) -> tuple[str | None, str]:
    family = family_of(config)
    if family is None:
        return None, f"attention {'/'.join(dict.fromkeys(config.layer_kinds))}"
    return family.native_class(config)


def importable() -> dict[str, str]:
    """{model_type: class name} of every architecture minitx imports."""
    return {kind: name for family in FAMILIES for kind, name in family.MODEL_TYPES.items()}


def family_of_hf(hf: dict, where: str) -> ModuleType:
    model_type = hf.get("model_type")
    for family in FAMILIES:
        if model_type in family.MODEL_TYPES:
            return family
    name = ", ".join(hf.get("architectures") or []) or f"model_type {model_type!r}"
    raise UserError(
        f"{where}: architecture {name} cannot be imported; minitx imports {', '.join(importable().values())}"
    )
