"""Differential attention's ways of computing one layer's attention, forward + backward, on this machine.

    python benchmarks/diff_attention.py                      # T 256 1024 4096, B 8, H 4, D 32
    python benchmarks/diff_attention.py --seq-lens 1024 --repeats 5
    python benchmarks/diff_attention.py --step --seq-lens 256 1024   # whole training steps

Rows, each the attention step of one layer of the default model's shape (4 heads of 32) with
gradients, causal, the same q, k, v:
- mha: one SDPA call over D-wide values, the yardstick;
- diff fused: one SDPA call, every query head against its pair's 2D-wide values, queries and keys
  padded with zeros to 2D (the fused kernel wants one width), the difference after the values:
  what diff did before issue 34, and does on a GPU;
- diff 2H heads: one SDPA call of 2H heads of width D, each query head once per value half (the
  values shared between the copies by SDPA's key/value grouping), the difference after;
- diff tiles: DifferenceOfMaps, the difference of the two maps first, a tile of queries at a time,
  then one product with the 2D-wide values (what diff does on a CPU).
The three diff rows end in the same per-head RMSNorm. Times are the best of --repeats rounds that
take the rows in turn, so a busy spell slows every row alike; each is also a ratio to mha's.

--step: a whole training step instead (forward, backward, AdamW; configs/default.yaml's model with
configs/mha.yaml's or configs/diff.yaml's attention section, as benchmarks/variants.py builds it,
batch 8 x T): mha, diff through the fused call (what diff did before issue 34, forced here) and
diff through the tiles, in turn in one process; wall-clock and this thread's CPU time (which a
busy machine's other processes inflate less).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time

import torch
import torch.nn.functional as F
from variants import VOCAB, attention_section, config_of, default_shape

from minitx import AttentionConfig, ModelConfig, Transformer
from minitx.attention import build, diff
from minitx.attention.diff import DifferenceOfMaps


def two_h_heads(layer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """(B, H, T, 2D) as `fused`, from one SDPA call of 2H heads of width D: copy c of query head h
    reads key head g = h // r and the value half c of g's pair (v_g' or v_{g'+G/2}, g' = g mod G/2)."""
    low, high = v.chunk(2, dim=1)
    values = torch.cat([low, low, high, high], dim=1)  # (B, 2G, S, D)
    out = F.scaled_dot_product_attention(
        torch.cat([q, q], dim=1), torch.cat([k, k], dim=1), values, is_causal=True, enable_gqa=True
    )
    return torch.cat(out.chunk(2, dim=1), dim=-1)


def rows(layer) -> dict:
    lam = layer.lambda_full
    return {
        "mha": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "diff fused": lambda q, k, v: layer.combine(layer.fused(q, k, v, None, True)),
        "diff 2H heads": lambda q, k, v: layer.combine(two_h_heads(layer, q, k, v)),
        "diff tiles": lambda q, k, v: layer.normed(DifferenceOfMaps.apply(q, k, v, lam(), None, True)),
    }


def step_rows() -> dict:
    """name -> (model's attention section, whether diff takes the fused call)."""
    mha, diff_section = attention_section("mha")[0], attention_section("diff")[0]
    return {
        "mha": (mha, False),
        "diff fused (before)": (diff_section, True),
        "diff tiles": (diff_section, False),
    }


def training_steps(T: int, batch: int, repeats: int) -> None:
    """One table row: the best wall-clock and CPU milliseconds of each step row at length T."""
    shape = default_shape()
    tokens = torch.randint(0, VOCAB, (batch, T + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1], tokens[:, 1:]
    runs = {}
    for name, (attention, fused) in step_rows().items():
        torch.manual_seed(0)
        model = Transformer(config_of(shape, attention, block_size=T)).train()
        runs[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3), fused)
    on_device = diff.fused_on
    wall, cpu = dict.fromkeys(runs, float("inf")), dict.fromkeys(runs, float("inf"))
    for round in range(repeats + 1):  # the first round warms up
        for name, (model, optimizer, fused) in runs.items():
            diff.fused_on = (lambda device: True) if fused else on_device
            start, start_cpu = time.perf_counter(), time.thread_time()
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if round:
                wall[name] = min(wall[name], 1000 * (time.perf_counter() - start))
                cpu[name] = min(cpu[name], 1000 * (time.thread_time() - start_cpu))
            diff.fused_on = on_device
    cells = [
        f"{wall[n]:.0f} | {wall[n] / wall['mha']:.2f} | {cpu[n]:.0f} | {cpu[n] / cpu['mha']:.2f}"
        for n in runs
    ]
    print(f"| {T} | " + " | ".join(cells) + f" | {os.getloadavg()[0]:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="rounds over the rows; the best counts")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--step", action="store_true", help="whole training steps of the default model")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.step:
        print(
            f"# {platform.machine()} CPU, {args.threads} torch thread(s), torch {torch.__version__}, "
            f"{datetime.date.today()}; training step of the default model, batch {args.batch} x T, "
            f"AdamW, best of {args.repeats} round-robin\n"
        )
        names = list(step_rows())
        print(
            "| T | " + " | ".join(f"{n} wall (ms) | vs mha | CPU (ms) | vs mha" for n in names) + " | load |"
        )
        print("|---:|" + "---:|---:|---:|---:|" * len(names) + "---:|")
        for T in args.seq_lens:
            training_steps(T, args.batch, args.repeats)
        return
    H, D = 4, 32
    config = ModelConfig(n_head=H, d_model=H * D, attention=AttentionConfig(kind="diff"))
    layer = build(config, 1)
    fns = rows(layer)
    print(
        f"# {platform.machine()} CPU, {args.threads} torch thread(s), torch {torch.__version__}, "
        f"{datetime.date.today()}, load {os.getloadavg()[0]:.1f}; B {args.batch}, H {H}, D {D}, "
        f"causal forward + backward, best of {args.repeats}\n"
    )
    header = "| T | " + " | ".join(f"{name} (ms) | vs mha" for name in fns) + " |"
    print(header + "\n|---:|" + "---:|---:|" * len(fns))
    for T in args.seq_lens:
        q, k, v = (torch.randn(args.batch, H, T, D, requires_grad=True) for _ in range(3))
        best = dict.fromkeys(fns, float("inf"))
        for round in range(args.repeats + 1):  # the first round warms up
            for name, fn in fns.items():
                start = time.perf_counter()
                fn(q, k, v).sum().backward()
                if round:
                    best[name] = min(best[name], 1000 * (time.perf_counter() - start))
        cells = [f"{ms:.1f} | {ms / best['mha']:.2f}" for ms in best.values()]
        print(f"| {T} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
