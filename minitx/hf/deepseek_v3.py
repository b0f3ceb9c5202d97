"""minitx's MLA <-> transformers' DeepseekV3ForCausalLM with every layer dense (to be written)."""

from __future__ import annotations

from ..config import ModelConfig

MODEL_TYPES: dict[str, str] = {}


def claims(config: ModelConfig) -> bool:
    return "mla" in config.layer_kinds
