"""What every optimiser is built over: the parameters, and the decisions made on their true shapes.

Wrappers (FSDP, activation checkpointing, torch.compile) rename parameters and may flatten them,
so each decision (weight decay or not, Muon's matrix or not) is made on the unwrapped model's
parameters, by their clean names, and looked up for the wrapped ones.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# MTA's key-query convolution and head-mixing matrices start as the identity. Weight decay pulls
# parameters towards zero, which for these means towards "no attention" rather than towards the
# plain attention they start from, so they are not decayed even though they are matrices.
NO_DECAY_NAMES = ("kq_conv", "kq_conv_post", "mix_pre", "mix_post")
# Prefixes wrappers put in parameter names (FSDP, activation checkpointing, torch.compile).
_WRAPPER_PREFIXES = re.compile(r"(_fsdp_wrapped_module\.|_checkpoint_wrapped_module\.|_orig_mod\.)")


def clean_name(name: str) -> str:
    """A parameter's name without the prefixes wrappers put in it."""
    return _WRAPPER_PREFIXES.sub("", name)


def decays(name: str, param: Tensor) -> bool:
    """Weight decay on matrices (dim >= 2: linear weights, and embeddings as in nanoGPT), not on
    norms, biases, gates' biases or MTA's identity-initialised kernels."""
    return param.dim() >= 2 and name.rsplit(".", 1)[-1] not in NO_DECAY_NAMES


@dataclass(frozen=True)
class Parameters:
    """What an optimiser is built over: the parameters as the (perhaps wrapped) model names them,
    and the unwrapped model's as tensors of their true shapes on the meta device, by clean name,
    on which the optimisers decide (`decays`, muon.muon_matrix)."""

    named: list[tuple[str, Tensor]]
    unwrapped: dict[str, Tensor]
    fused: bool = False  # torch's fused AdamW kernel (CUDA)

    @classmethod
    def of(cls, model: torch.nn.Module, fused: bool = False) -> Parameters:
        """An unwrapped model's parameters (a wrapped one's: give `named` and `unwrapped` yourself)."""
        named = list(model.named_parameters())
        return cls(named, true_shapes(named), fused)

    def chosen(self, rule: Callable[[str, Tensor], bool]) -> set[str]:
        """The clean names of the parameters `rule(name, parameter)` picks, on the true shapes."""
        return {name for name, param in self.unwrapped.items() if rule(name, param)}


def true_shapes(named: Sequence[tuple[str, Tensor]]) -> dict[str, Tensor]:
    """Each parameter by clean name as a meta tensor of its shape: what the decisions need, kept
    from before a wrapper flattens the parameters, at no memory."""
    return {clean_name(name): torch.empty(param.shape, device="meta") for name, param in named}


def optimizer_groups(
    named_params: Sequence[tuple[str, Tensor]], weight_decay: float, decay_names: set[str] | None = None
) -> list[dict]:
    """Two AdamW groups: decayed matrices and undecayed rest. `decay_names` (clean names) overrides
    the shape rule, for wrappers such as FSDP that flatten parameters after the decision was made."""
    decay, no_decay = [], []
    for name, param in named_params:
        if not param.requires_grad:
            continue
        clean = clean_name(name)
        wants_decay = clean in decay_names if decay_names is not None else decays(clean, param)
        (decay if wants_decay else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
