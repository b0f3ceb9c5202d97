"""Every attention kind sharded with FSDP2 against the same model whole, for
tests/training/test_fsdp2.py: one forward and backward of a 4-layer model per kind (each from
its configs/<name>.yaml), and the largest difference of loss and of any gradient, written by
rank 0 to --out as JSON.

Run as one of two gloo processes (the test starts both): RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT in the environment.

Each process computes the reference itself (the whole model on the whole batch), then shards a
copy and runs it on its half of the batch: FSDP2 averages the halves' gradients, which is the
whole batch's gradient. A custom operator that met a DTensor, or half a weight, would fail or
differ here.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch.distributed.device_mesh import init_device_mesh

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from minitx.config import ModelConfig  # noqa: E402
from minitx.model import Transformer  # noqa: E402
from minitx.training.sharding import shard_transformer  # noqa: E402

CONFIGS = ("mha", "mqa", "gqa", "local", "mta", "mla", "diff", "gdn", "hybrid", "sinks", "gated", "qknorm")
VOCAB, T, BATCH = 61, 40, 4  # T beyond local's window (32)


def attention_of(name: str) -> dict:
    section = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())["model"]
    return section.get("attention") or {"kind": name}


def perturbed(model: Transformer) -> Transformer:
    """Random weights everywhere, MTA's identity-initialised kernels included, so that every
    parameter has a gradient worth comparing."""
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn_like(param))
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS))
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    results = {}
    for name in args.configs:
        torch.manual_seed(0)
        config = ModelConfig(
            vocab_size=VOCAB, block_size=T, n_layer=4, n_head=4, d_model=64, attention=attention_of(name)
        )
        whole = perturbed(Transformer(config))
        idx = torch.randint(0, VOCAB, (BATCH, T + 1))
        x, y = idx[:, :-1], idx[:, 1:]
        sharded = copy.deepcopy(whole)

        loss = F.cross_entropy(whole(x).flatten(0, 1), y.flatten())
        loss.backward()

        shard_transformer(sharded, mesh)
        rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
        part = F.cross_entropy(sharded(x[rows]).flatten(0, 1), y[rows].flatten())
        part.backward()
        mean = part.detach().clone()
        dist.all_reduce(mean)
        mean /= world

        grads = {n: p.grad.full_tensor() for n, p in sharded.named_parameters()}
        reference = dict(whole.named_parameters())
        grad_diff = max((grads[n] - reference[n].grad).abs().max().item() for n in grads)
        scale = max(p.grad.abs().max().item() for p in reference.values())
        results[name] = {
            "loss_diff": abs(mean.item() - loss.item()),
            "grad_diff": grad_diff,
            "grad_scale": scale,
            "params": len(grads),
            "missing": sorted(set(reference) - set(grads)),
        }
    if rank == 0:
        Path(args.out).write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
