"""The registry of attention kinds: what each kind declares about itself, in plain Python.

A `KindSpec` says which AttentionConfig fields a kind reads, how it checks them, how many
key/value heads it has, and which module implements it (the module in turn decides its cache).
This file imports nothing heavy, so `config` can validate against the registry without importing
the attention modules; `minitx.attention` fills the registry when it is imported (and `minitx`
imports it), one `register(...)` line per kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import UserError


def fail(field_name: str, problem: str, fix: str) -> None:
    # UserError is a ValueError: Python callers catch ValueError, the command lines print one line.
    raise UserError(f"{field_name}: {problem}; {fix}")


def check_choice(field_name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        fail(field_name, f"unknown value {value!r}", f"choose one of {', '.join(map(str, choices))}")


def kv_heads_from_config(attention, n_head: int) -> int:
    """Key/value heads of a kind that reads `n_kv_head` (None: as many as query heads)."""
    return attention.n_kv_head or n_head


@dataclass(frozen=True)
class KindSpec:
    """What one attention kind knows about itself.

    name: the value of `attention.kind` / an entry of `attention.layers`.
    module: the layer class, called as module(model_config, layer_index).
    options: the AttentionConfig fields this kind reads (besides kind and layers). A field that
        no layer of a model reads must keep its default, or the config is refused.
    kv_heads: (attention_config, n_head) -> key/value heads of one layer of this kind.
    check: checks of the kind's options that need only the AttentionConfig.
    check_model: checks that need the whole ModelConfig (n_layer, n_head, ...).
    """

    name: str
    module: type
    options: tuple[str, ...] = ()
    kv_heads: Callable[[Any, int], int] = kv_heads_from_config
    check: Callable[[Any], None] | None = None
    check_model: Callable[[Any], None] | None = None


registry: dict[str, KindSpec] = {}


def register(spec: KindSpec) -> KindSpec:
    """Add a kind (or replace the one of the same name); returns the spec."""
    registry[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    registry.pop(name, None)


def spec_of(field_name: str, kind: str) -> KindSpec:
    if kind not in registry:
        check_choice(field_name, kind, tuple(registry))
    return registry[kind]
