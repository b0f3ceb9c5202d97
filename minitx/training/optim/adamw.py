"""AdamW on every parameter, weight decay on matrices only (groups.decays); model.optimizer adamw.

It reads only the settings every optimiser shares (lr, betas, eps, weight_decay: settings.py).
"""

from __future__ import annotations

from typing import Any

import torch

from .groups import Parameters, decays, optimizer_groups


def build_adamw(settings: Any, params: Parameters) -> torch.optim.Optimizer:
    """torch.optim.AdamW from `settings` (an Optimisation), in two groups: decayed and not."""
    return adamw(
        optimizer_groups(params.named, settings.weight_decay, params.chosen(decays)), settings, params.fused
    )


def adamw(groups: list[dict], settings: Any, fused: bool = False) -> torch.optim.AdamW:
    """torch.optim.AdamW over `groups` with the shared settings' lr, betas and eps."""
    return torch.optim.AdamW(
        groups, lr=settings.lr, betas=tuple(settings.betas), eps=settings.eps, fused=fused
    )
