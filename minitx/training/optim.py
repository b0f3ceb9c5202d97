"""The optimiser: AdamW with weight decay on matrices only, linear warmup then cosine decay."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import torch
from torch import Tensor

from ..errors import UserError

# MTA's key-query convolution and head-mixing matrices start as the identity. Weight decay pulls
# parameters towards zero, which for these means towards "no attention" rather than towards the
# plain attention they start from, so they are not decayed even though they are matrices.
NO_DECAY_NAMES = ("kq_conv", "kq_conv_post", "mix_pre", "mix_post")
# Prefixes wrappers put in parameter names (FSDP, activation checkpointing, torch.compile).
_WRAPPER_PREFIXES = re.compile(r"(_fsdp_wrapped_module\.|_checkpoint_wrapped_module\.|_orig_mod\.)")


def decays(name: str, param: Tensor) -> bool:
    """Weight decay on matrices (dim >= 2: linear weights, and embeddings as in nanoGPT), not on
    norms, biases, gates' biases or MTA's identity-initialised kernels."""
    return param.dim() >= 2 and name.rsplit(".", 1)[-1] not in NO_DECAY_NAMES


def optimizer_groups(
    named_params: Sequence[tuple[str, Tensor]], weight_decay: float, decay_names: set[str] | None = None
) -> list[dict]:
    """Two AdamW groups: decayed matrices and undecayed rest. `decay_names` (clean names) overrides
    the shape rule, for wrappers such as FSDP that flatten parameters after the decision was made."""
    decay, no_decay = [], []
    for name, param in named_params:
        if not param.requires_grad:
            continue
        clean = _WRAPPER_PREFIXES.sub("", name)
        wants_decay = clean in decay_names if decay_names is not None else decays(clean, param)
        (decay if wants_decay else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def lr_at(step: int, lr: float, min_lr: float, warmup_steps: int, max_steps: int) -> float:
    """Linear warmup from lr/warmup_steps to lr over `warmup_steps`, then cosine decay to `min_lr`
    at `max_steps`, and min_lr after that."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def adamw_with_schedule(
    groups: list[dict],
    *,
    lr: float,
    min_lr: float,
    warmup_steps: int,
    max_steps: int,
    betas: Sequence[float],
    eps: float,
    fused: bool,
) -> dict:
    """AdamW over `groups` and a LambdaLR stepped every optimiser step, as configure_optimizers returns them."""
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused)

    def factor(step: int) -> float:  # a plain function: LambdaLR keeps no state of it
        return lr_at(step, lr, min_lr, warmup_steps, max_steps) / lr

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return {
        "optimizer": optimizer,
        "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
    }


def check_optimiser(
    prefix: str, *, lr: float, min_lr: float, warmup_steps: int, weight_decay: float, betas: Sequence[float]
) -> None:
    """The optimiser settings' checks; errors name `<prefix>.<setting>`."""
    if not lr > 0:
        raise UserError(f"{prefix}.lr: is {lr}; use a positive learning rate such as 1e-3")
    if not 0 <= min_lr <= lr:
        raise UserError(f"{prefix}.min_lr: is {min_lr}; use a value between 0 and model.lr={lr}")
    if warmup_steps < 0:
        raise UserError(f"{prefix}.warmup_steps: is {warmup_steps}; use 0 or more")
    if weight_decay < 0:
        raise UserError(f"{prefix}.weight_decay: is {weight_decay}; use 0 or more")
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise UserError(f"{prefix}.betas: is {list(betas)}; use two numbers in [0, 1), e.g. [0.9, 0.95]")
