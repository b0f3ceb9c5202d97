"""SDPA's forward + backward time when queries/keys and values differ in width, on this machine.

    python benchmarks/sdpa_widths.py                 # B 8, H 4, T 1024, one thread
    python benchmarks/sdpa_widths.py --seq-len 256

Why it matters here: learned sinks add a key feature, MLA's keys (nope + rope) are wider than its
values, differential attention's values are twice its queries' width. On the CPU, SDPA's fused
kernel wants one width for all three; otherwise it takes a path several times slower, so those
kinds pad the narrower side with zeros (no score or output feature changes). Each row is the best
of --repeats runs of causal attention with gradients; the ratio is to the 32/32 row.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time

import torch
import torch.nn.functional as F

# (query/key width, value width): head_dim 32 as the default model; +8 as sinks; 48/32 as MLA's
# defaults (32 + 16 rotary); 32/64 as diff's pair values, and each padded to one width.
WIDTHS = [(32, 32), (40, 32), (40, 40), (48, 32), (48, 48), (32, 64), (64, 64)]


def best_ms(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, repeats: int) -> float:
    def step() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    step()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1000 * min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"# {platform.machine()} CPU, {args.threads} torch thread(s), torch {torch.__version__}, "
        f"{datetime.date.today()}; B {args.batch}, H {args.heads}, T {args.seq_len}, best of {args.repeats}\n"
    )
    print("| q/k width | v width | forward + backward (ms) | vs 32/32 |\n|---:|---:|---:|---:|")
    base = None
    for qk, dv in WIDTHS:
        shape = (args.batch, args.heads, args.seq_len)
        q, k = (torch.randn(*shape, qk, requires_grad=True) for _ in range(2))
        v = torch.randn(*shape, dv, requires_grad=True)
        ms = best_ms(q, k, v, args.repeats)
        base = base or ms
        print(f"| {qk} | {dv} | {ms:.1f} | {ms / base:.2f} |")


if __name__ == "__main__":
    main()
