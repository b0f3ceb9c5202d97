"""The attention kinds. Adding a kind is one file (its module and its KindSpec) and one line here.

Each kind's KindSpec (see minitx/kinds.py) declares its options, its checks, its number of
key/value heads and its module; the module decides its cache. Config validation reads the same
registry, so config.py knows no kind by name.
"""

from __future__ import annotations

from ..config import ModelConfig
from ..kinds import KindSpec, register, registry
from . import diff, gdn, grouped, local, mla, mta
from .kind_layer import KindLayer
from .softmax import Attention

register(grouped.MHA)  # n_kv_head = n_head
register(grouped.MQA)  # n_kv_head = 1
register(grouped.GQA)  # 1 < n_kv_head < n_head
register(local.LOCAL)
register(mta.MTA)
register(mla.MLA)
register(diff.DIFF)
register(gdn.GDN)  # Gated DeltaNet: linear attention, a recurrent state


def build(config: ModelConfig, layer: int) -> KindLayer:
    """Layer `layer`'s attention, of the kind the config names there (mha: softmax.py's Attention
    with grouped.py's attend)."""
    spec = registry[config.layer_kinds[layer]]
    check_layer_class(spec)
    return spec.module(config, layer)


def check_layer_class(spec: KindSpec) -> None:
    """A kind's layer class must be a KindLayer that implements what KindLayer.REQUIRED names: a
    TypeError naming the kind, the class and what it lacks when the model is built, not at a
    first forward or cache."""
    cls = spec.module
    if not (isinstance(cls, type) and issubclass(cls, KindLayer)):
        raise TypeError(
            f"attention kind {spec.name}: its layer class {cls!r} is not a subclass of minitx.KindLayer"
        )
    if cls.missing():
        raise TypeError(
            f"attention kind {spec.name}: its layer class {cls.__qualname__} does not implement "
            f"{', '.join(cls.missing())} (KindLayer.REQUIRED, minitx/attention/kind_layer.py)"
        )


__all__ = ["Attention", "KindLayer", "build"]
