"""The attention registry: kind -> module. Adding a kind is one file and one line here."""

from __future__ import annotations

from ..config import ModelConfig
from .base import Attention, apply_rope
from .grouped import GroupedQueryAttention
from .local import LocalAttention
from .multi_token import MultiTokenAttention

registry: dict[str, type[Attention]] = {
    "mha": GroupedQueryAttention,  # n_kv_head = n_head
    "mqa": GroupedQueryAttention,  # n_kv_head = 1
    "gqa": GroupedQueryAttention,  # 1 < n_kv_head < n_head
    "local": LocalAttention,
    "mta": MultiTokenAttention,
}


def build(config: ModelConfig, layer: int) -> Attention:
    return registry[config.layer_kinds[layer]](config, layer)


__all__ = ["Attention", "apply_rope", "build", "registry"]
