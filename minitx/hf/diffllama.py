"""minitx's differential attention <-> transformers' DiffLlamaForCausalLM (to be written)."""

from __future__ import annotations

from ..config import ModelConfig

MODEL_TYPES: dict[str, str] = {}


def claims(config: ModelConfig) -> bool:
    return "diff" in config.layer_kinds
