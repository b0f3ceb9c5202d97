"""nanoGPT's CPU recipe for shakespeare_char in plain PyTorch: the reference benchmarks/nanogpt_recipe.py
times minitx against. Written for this repository from the recipe's description (nanoGPT's
README CPU line over its config/train_shakespeare_char.py), not copied from nanoGPT.

The recipe: a GPT of 4 layers, 4 heads, width 128, context 64, learned positions, LayerNorm, GELU,
no bias (nanoGPT's train.py default), the output layer tied to the token table; batches of 12
random windows of a uint16 token file read through a memory map; AdamW (betas 0.9, 0.99, weight
decay 0.1 on every tensor of two or more dimensions), lr 1e-3 warmed up over 100 iterations and
then a cosine down to 1e-4 at the last one; gradients clipped at 1.0; the loss read and a line
printed at every iteration (--log_interval=1); every 250 iterations and at the end, the mean loss
of 20 random batches of each split (--eval_iters=20), and a checkpoint when the validation loss
improved. Imports torch and numpy only, as a nanoGPT run does.

    python benchmarks/nanogpt_reference.py --data DIR --vocab 76 --iters 1000 --out times.json

DIR holds train.bin and val.bin (uint16 token ids); benchmarks/nanogpt_recipe.py writes them from
minitx's own prepared Shakespeare, so both sides train on the same tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

CONTEXT, LAYERS, HEADS, WIDTH, BATCH = 64, 4, 4, 128, 12
LR, MIN_LR, WARMUP, BETAS, DECAY, CLIP = 1e-3, 1e-4, 100, (0.9, 0.99), 0.1, 1.0
EVAL_EVERY, EVAL_BATCHES = 250, 20


class SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.out = nn.Linear(WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        heads = [t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in self.qkv(x).split(C, dim=2)]
        y = F.scaled_dot_product_attention(*heads, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH, bias=False)
        self.attn = SelfAttention()
        self.norm2 = nn.LayerNorm(WIDTH, bias=False)
        self.up = nn.Linear(WIDTH, 4 * WIDTH, bias=False)
        self.down = nn.Linear(4 * WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, WIDTH)
        self.positions = nn.Embedding(CONTEXT, WIDTH)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH, bias=False)
        self.head = nn.Linear(WIDTH, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() >= 2:  # GPT-2's init; the projections into the residual stream scaled down
                std = 0.02 / math.sqrt(2 * LAYERS) if name.endswith(("out.weight", "down.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def batch(data: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(len(data) - CONTEXT, (BATCH,)).tolist()
    x = torch.stack([torch.from_numpy(data[s : s + CONTEXT].astype(np.int64)) for s in starts])
    y = torch.stack([torch.from_numpy(data[s + 1 : s + 1 + CONTEXT].astype(np.int64)) for s in starts])
    return x, y


def lr_at(it: int, iters: int) -> float:
    if it < WARMUP:
        return LR * (it + 1) / (WARMUP + 1)
    if it > iters:
        return MIN_LR
    progress = (it - WARMUP) / (iters - WARMUP)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * progress)) * (LR - MIN_LR)


@torch.no_grad()
def evaluate(model: GPT, splits: dict[str, np.ndarray]) -> dict[str, float]:
    model.eval()
    means = {
        name: float(np.mean([model(*batch(data)).item() for _ in range(EVAL_BATCHES)]))
        for name, data in splits.items()
    }
    model.train()
    return means


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", required=True, help="directory with train.bin and val.bin (uint16 ids)")
    parser.add_argument(
        "--vocab", type=int, required=True, help="the tokenizer's size: rows of the token table"
    )
    parser.add_argument(
        "--iters", type=int, default=1000, help="training iterations (the schedule's length too)"
    )
    parser.add_argument("--out", required=True, help="JSON file for the step times, evaluations and losses")
    parser.add_argument("--checkpoint-dir", default=None, help="where ckpt.pt goes (default: --data)")
    args = parser.parse_args()

    torch.manual_seed(1337)
    splits = {
        name: np.memmap(os.path.join(args.data, f"{name}.bin"), dtype=np.uint16, mode="r")
        for name in ("train", "val")
    }
    model = GPT(args.vocab)
    decayed = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decayed, "weight_decay": DECAY}, {"params": rest, "weight_decay": 0.0}],
        lr=LR,
        betas=BETAS,
    )
    checkpoint = os.path.join(args.checkpoint_dir or args.data, "ckpt.pt")
    best, evals, losses, ends, cpu = float("inf"), [], [], [], []
    x, y = batch(splits["train"])
    start = last = time.perf_counter()
    cpu_start, first_step = time.process_time(), time.time()
    for it in range(args.iters + 1):
        if it % EVAL_EVERY == 0 or it == args.iters:
            began, cpu_began = time.perf_counter(), time.process_time()
            means = evaluate(model, splits)
            print(f"step {it}: train loss {means['train']:.4f}, val loss {means['val']:.4f}", flush=True)
            evals.append(
                {
                    "step": it,
                    "start": began - start,
                    "seconds": time.perf_counter() - began,
                    "cpu_seconds": time.process_time() - cpu_began,
                    **means,
                }
            )
            if means["val"] < best and it > 0:
                best = means["val"]
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": it}
                torch.save(state, checkpoint)
        if it == args.iters:
            break
        for group in optimizer.param_groups:
            group["lr"] = lr_at(it, args.iters)
        loss = model(x, y)
        x, y = batch(splits["train"])  # the next batch, drawn while nothing waits on it
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        now = time.perf_counter()
        losses.append(loss.item())
        print(f"iter {it}: loss {losses[-1]:.4f}, time {(now - last) * 1000:.2f}ms", flush=True)
        ends.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
        last = now
    with open(args.out, "w") as file:
        record = {
            "step_ends": ends,
            "step_cpu": cpu,
            "evals": evals,
            "losses": losses,
            "val_loss": evals[-1]["val"],
            "first_step": first_step,
            "first_step_cpu": cpu_start,  # the process's CPU time (imports, data, model) before it
        }
        json.dump(record, file)


if __name__ == "__main__":
    main()
