"""A plain loop for the synthetic tasks, without Lightning: AdamW on fresh samples, the logits at
the scored positions only (as MinitxLM's step), gradients clipped at 1. What the known-answer slow
tests (tests/known_answers) and the reduced diagnostics (scripts/gdn_memory.py) train with: a few
hundred steps of a small model, in-process."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..data.toy import IGNORE_INDEX, ToyTrainBatches
from ..model import Transformer


def zoology_reduced_model(kind: str, block_size: int, vocab: int = 128, **options) -> ModelConfig:
    """Zoology's model (2 layers of one head of 64, no MLP, LayerNorm with biases, learned
    positions) at a small vocabulary; `options` are the kind's (attention.options.<kind>)."""
    return ModelConfig(
        vocab_size=vocab,
        block_size=block_size,
        n_layer=2,
        n_head=1,
        d_model=64,
        mlp="none",
        norm="layernorm",
        bias=True,
        positions="learned",
        attention={"kind": kind, "options": {kind: options} if options else {}},
    )


def train_on_task(
    model: Transformer,
    task,
    steps: int,
    batch: int,
    lr: float,
    seed: int = 0,
    every: int = 0,
    report: Callable[[int, Transformer], None] | None = None,
) -> Transformer:
    """Train `model` on `steps` fresh batches of `task` (the stream `seed`); with `report`, call
    report(step, model) before step 0, every `every` steps and after the last, the model in eval
    mode meanwhile. Returns the model in eval mode."""
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    batches = ToyTrainBatches(task, seed, train_size=10**9, batch_size=batch)
    for step in range(steps + 1):
        if report is not None and (step == steps or (every and step % every == 0)):
            model.eval()
            report(step, model)
        if step == steps:
            break
        model.train()
        x, y = batches.batch(step)
        scored = y != IGNORE_INDEX
        loss = F.cross_entropy(model(x, at=scored), y[scored])
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
    return model.eval()
