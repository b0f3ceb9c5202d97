"""The causality probe: each attention kind from outside minitx, checked whenever a command builds a model.

minitx's first promise is that no token sees a later one. Its built-in kinds keep it because
their tests hold them to it; a kind of a user's own is exactly the one a user compares, and one
whose mask is left out trains silently to a better loss. So train (and ablate's check of its
variants), generate and evaluate probe the layers of every kind registered from outside minitx
before they build the real model: those layers alone, built from the model's config, their
parameters moved away from their initialisation (a part that starts as the identity, or a gate
that starts closed, would hide a leak), each take random inputs at two lengths once as they are
and once with every position from a cut on changed; the first layer whose output moved before
the cut is the leak.

The probe draws its random numbers inside torch.random.fork_rng, from a seed of its own: the
CPU generator a run's seed set is restored, and the run's losses are the same with or without it.
A few milliseconds for a small model (docs/custom-attention.md gives the figure).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from .. import attention
from ..attention.local import MIN_BLOCK
from ..config import ModelConfig
from ..kinds import is_built_in, kind_file, registry
from ..rope import rotary_table, shared_tables
from . import perturb

# A short length, and one past the edges where kinds cut a sequence into blocks (16, 32, 64) that
# is a multiple of none (each capped at the model's block_size).
LENGTHS = (13, MIN_BLOCK + 3)
BATCH = 2
PROBE_SEED = 0
# A causal kind leaves earlier outputs exactly equal, except one that mixes positions in floating
# point (a long convolution by FFT), whose rounding moves them by about 1e-7 of their size.
RELATIVE_TOLERANCE = 1e-5


@dataclass(frozen=True)
class Leak:
    """Where a kind let a later token move an earlier output: its first layer that did so, the
    earliest position there that moved and by how much."""

    kind: str
    file: str
    layer: int
    position: int
    change: float

    def words(self) -> str:
        return (
            f"kind {self.kind} ({self.file}) is not causal: in layer {self.layer} a future token "
            f"changes the output at position {self.position} by {self.change:.3g}"
        )


def outside_layers(config: ModelConfig) -> list[int]:
    """The layers of kinds registered from outside minitx."""
    return [i for i, kind in enumerate(config.layer_kinds) if not is_built_in(registry[kind])]


@dataclass
class ProbedLayers:
    """Attention layers of a model by index, with the rotation table their blocks pass them."""

    config: ModelConfig
    modules: dict[int, nn.Module]
    rope: nn.Module | None


def find_leak(config: ModelConfig) -> Leak | None:
    """The first leak of a kind from outside minitx in a model of `config`, or None (at once,
    building nothing, when every kind is built in). The caller's random state is untouched."""
    layers = outside_layers(config)
    if not layers:
        return None
    with torch.random.fork_rng(devices=[]), one_thread():
        torch.default_generator.manual_seed(PROBE_SEED)  # the CPU's alone: a GPU's is not forked
        probed = outside_kind_layers(config, layers)
        for T in sorted({min(length, config.block_size) for length in LENGTHS}):
            if (leak := first_leak(probed, T)) is not None:
                return leak
    return None


def outside_kind_layers(config: ModelConfig, layers: list[int]) -> ProbedLayers:
    """The given layers alone, built as Transformer builds them (the rest of the model plays no
    part in their leak: a large model's other layers, MLPs and embeddings are not built), their
    parameters moved from their start."""
    with shared_tables():  # as Transformer: a layer that rotates a width of its own shares a table
        rope = rotary_table(config.head_dim, config.block_size) if config.positions == "rope" else None
        modules = {i: attention.build(config, i) for i in layers}
    for module in modules.values():
        module.init_extra()
    perturbed(modules.values())
    return ProbedLayers(config, {i: m.eval() for i, m in modules.items()}, rope)


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one CPU thread for a while: a tiny model's matmuls gain nothing from more, which
    only wait for each other (ten times slower on a busy 2-core machine, measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def perturbed(modules: Iterable[nn.Module]) -> None:
    """Every parameter of the modules perturbed (verify.perturb)."""
    perturb(param for module in modules for param in module.parameters())


@torch.no_grad()
def first_leak(probed: ProbedLayers, T: int) -> Leak | None:
    """The first of the layers whose output before a cut moves when its input from the cut on
    changes (cuts at 1, the middle and the last position), or None.

    Each layer is called as its block calls it, on random inputs of the size the block's norm
    gives: once with the inputs and their changed copies side by side in the batch."""
    x = torch.randn(BATCH, T, probed.config.d_model)
    cuts = sorted({1, T // 2, T - 1} - {0})
    changed = [torch.cat([x[:, :cut], torch.randn_like(x[:, cut:])], dim=1) for cut in cuts]
    rope = probed.rope(0, T) if probed.rope is not None else None
    for layer, module in sorted(probed.modules.items()):
        out = module(torch.cat([x, *changed]), rope, None, None).float()
        before = out[:BATCH]
        for n, cut in enumerate(cuts, start=1):
            moved = (before[:, :cut] - out[n * BATCH : (n + 1) * BATCH, :cut]).abs().amax(dim=(0, 2))
            over = (moved > RELATIVE_TOLERANCE * before.abs().max()).nonzero()
            if len(over):
                position = int(over[0])
                spec = registry[probed.config.layer_kinds[layer]]
                return Leak(spec.name, kind_file(spec), layer, position, float(moved[position]))
    return None
