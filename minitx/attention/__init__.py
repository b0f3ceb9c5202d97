"""The attention kinds. Adding a kind is one file (its module and its KindSpec) and one line here.

Each kind's KindSpec (see minitx/kinds.py) declares its options, its checks, its number of
key/value heads and its module; the module decides its cache. Config validation reads the same
registry, so config.py knows no kind by name.
"""

from __future__ import annotations

from ..config import ModelConfig
from ..kinds import KindSpec, register, registry
from ..rope import apply_rope
from . import diff, gdn, grouped, local, mla, mta
from .base import Attention, KindLayer

register(grouped.MHA)  # n_kv_head = n_head
register(grouped.MQA)  # n_kv_head = 1
register(grouped.GQA)  # 1 < n_kv_head < n_head
register(local.LOCAL)
register(mta.MTA)
register(mla.MLA)
register(diff.DIFF)
register(gdn.GDN)  # Gated DeltaNet: linear attention, a recurrent state


def build(config: ModelConfig, layer: int) -> KindLayer:
    return registry[config.layer_kinds[layer]].module(config, layer)


__all__ = ["Attention", "KindLayer", "KindSpec", "apply_rope", "build", "register", "registry"]
