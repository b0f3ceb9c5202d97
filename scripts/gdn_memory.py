"""How long gdn's memory is on Zoology's MQAR: the decay each gdn layer applies per token, and what
is left of a pair by the time its query comes.

Gated DeltaNet multiplies its state by alpha_t = exp(g_t) at every token, g_t = -exp(A_log) *
softplus(W_a x_t + dt_bias) (minitx/attention/gdn/delta_rule.py), so a pair written d tokens before its
query reaches it scaled by exp(g summed over those d tokens). Two uses:

    # a trained checkpoint: each layer's mean g per token (on the pairs, the filler and the
    # queries), its memory 1 / -g in tokens, and the share of a pair kept to its query
    python scripts/gdn_memory.py ckpt --ckpt runs/zoology_256_16/checkpoints/last.ckpt --pairs 16 --seq-len 256

    # a reduced run (the slow test's setting: vocabulary 128, (64, 8), batch 64, AdamW, clipped at
    # 1), printing the per-query accuracy and each layer's g every 100 steps
    python scripts/gdn_memory.py train --seed 0 --steps 1000 --lr 3e-3
    python scripts/gdn_memory.py train --seed 0 --no-decay          # DeltaNet, the same seed
    python scripts/gdn_memory.py train --seed 0 --long-memory       # every decay starts near 1

A model with no gdn layer with decay has nothing to read; the script says so.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from minitx.attention.gdn import GatedDeltaNet
from minitx.data.toy import IGNORE_INDEX, toy_batch
from minitx.data.zoology import ZoologyConfig, query_distances, zoology_sample
from minitx.model import Transformer
from minitx.trained_model import load_checkpoint
from minitx.training.quick import train_on_task, zoology_reduced_model


@torch.no_grad()
def layer_decays(model: Transformer, x: torch.Tensor) -> list[torch.Tensor]:
    """Each gdn layer's g (B, T), its log-decay per token averaged over value heads, on input x."""
    layers = [m for m in model.modules() if isinstance(m, GatedDeltaNet) and m.decay]
    found: list[torch.Tensor] = []

    def read(layer, args):
        h = args[0]  # the layer's input, as its forward sees it
        g = -layer.A_log.float().exp() * F.softplus(layer.a_proj(h).float() + layer.dt_bias.float())
        found.append(g.mean(-1))

    hooks = [layer.register_forward_pre_hook(read) for layer in layers]
    try:
        model(x)
    finally:
        for hook in hooks:
            hook.remove()
    return found


def describe(g: torch.Tensor, x: torch.Tensor, pairs: int, distance: float) -> str:
    """One layer's decay: mean g on the pairs, the filler (token 0) and the queries, its memory."""
    rest = x[:, 2 * pairs :]
    parts = {
        "pairs": g[:, : 2 * pairs],
        "filler": g[:, 2 * pairs :][rest == 0],
        "queries": g[:, 2 * pairs :][rest != 0],
    }
    mean = float(g.mean())
    memory = float("inf") if mean == 0 else -1.0 / mean
    text = ", ".join(f"{name} {float(part.mean()):.4f}" for name, part in parts.items())
    return (
        f"g per token: {text}; memory 1/-g {memory:.1f} tokens; "
        f"kept over the median distance {distance:.0f}: {np.exp(mean * distance):.3g}"
    )


def from_checkpoint(args) -> None:
    model, _, _ = load_checkpoint(args.ckpt)
    config = ZoologyConfig(vocab=args.vocab, pairs=args.pairs, seq_len=args.seq_len)
    samples = [zoology_sample(config, 12345, i) for i in range(args.samples)]
    x, _ = toy_batch(samples, None, config.pad_id)
    decays = layer_decays(model.eval(), x)
    if not decays:
        sys.exit("gdn_memory: the checkpoint has no gdn layer with decay (DeltaNet forgets nothing)")
    distance = float(np.median(query_distances(config, samples)))
    for layer, g in enumerate(decays):
        print(f"gdn layer {layer}: {describe(g, x, config.pairs, distance)}")


def train(args) -> None:
    task = ZoologyConfig(vocab=128, pairs=8, seq_len=64)
    torch.manual_seed(args.seed)
    model = Transformer(zoology_reduced_model("gdn", 64, decay=args.decay))
    if args.long_memory and args.decay:
        with torch.no_grad():  # A = 1, dt = 1e-3: g = -1e-3 at every token, a memory of 1,000 tokens
            for layer in (m for m in model.modules() if isinstance(m, GatedDeltaNet)):
                layer.A_log.fill_(0.0)
                layer.dt_bias.fill_(math.log(math.expm1(1e-3)))  # softplus^-1(1e-3)
    tests = [zoology_sample(task, 99, i) for i in range(300)]
    tx, ty = toy_batch(tests, None, task.pad_id)
    at = ty != IGNORE_INDEX
    distance = float(np.median(query_distances(task, tests)))
    start = time.time()

    @torch.no_grad()
    def report(step: int, model: Transformer) -> None:
        accuracy = float((model(tx, at=at).argmax(-1) == ty[at]).float().mean())
        layers = " | ".join(
            f"layer {i}: {describe(g, tx, task.pairs, distance)}"
            for i, g in enumerate(layer_decays(model, tx))
        )
        print(
            f"step {step}: per-query accuracy {accuracy:.3f}  {layers}  ({time.time() - start:.0f} s)",
            flush=True,
        )

    train_on_task(model, task, args.steps, batch=64, lr=args.lr, seed=args.seed, every=100, report=report)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ckpt = sub.add_parser("ckpt", help="the decay a trained checkpoint applies")
    ckpt.add_argument("--ckpt", required=True, help="a checkpoint of a run on data.source zoology")
    ckpt.add_argument("--vocab", type=int, default=8192)
    ckpt.add_argument("--pairs", type=int, default=8)
    ckpt.add_argument("--seq-len", type=int, default=128)
    ckpt.add_argument("--samples", type=int, default=32, help="fresh samples (seed 12345)")
    run = sub.add_parser("train", help="a reduced run, its accuracy and decay every 100 steps")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--steps", type=int, default=1000)
    run.add_argument("--lr", type=float, default=3e-3)
    run.add_argument("--no-decay", dest="decay", action="store_false", help="DeltaNet: gdn without decay")
    run.add_argument(
        "--long-memory",
        action="store_true",
        help="start every layer's decay at A = 1, dt = 1e-3 (1,000 tokens) instead of the random draw",
    )
    args = parser.parse_args()
    (from_checkpoint if args.command == "ckpt" else train)(args)


if __name__ == "__main__":
    main()
