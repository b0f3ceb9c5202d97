"""MTA's C loops (minitx/attention/mta/conv.c) against torch's operations on one query chunk's maps.

    python benchmarks/mta_kernels.py                 # 261 rows (256 + 5 history) x 256 / 1024 / 4096 keys, 4 heads

Rows: the key-query convolution (6 x 11) forward, and forward + both gradients, by the C loop
(`NativeKeyQueryConv`) and by oneDNN (`KeyQueryConv`, channels-last depthwise conv2d); the
pre-softmax head mix + mask + softmax + post-softmax head mix forward + backward, by the C loop
(`MixedSoftmax`) and by torch's operations (mix_heads' matmul, masked_fill, softmax); and the
convolution, mixes and softmax as a training chunk of the pre placement runs them, forward + every
gradient, by the C loops' one pass (`torch.ops.minitx.conv_softmax`: native.conv_softmax and its
one-pass gradient) and by oneDNN's convolution then torch's operations. The C
convolution also gets GFLOP/s (66 multiply-adds per output entry). Median of --repeats, the two
sides taking turns, one thread unless --threads; the causal mask of the chunk's last rows.
`--clock cpu` times the process's CPU time instead of the wall clock: on a machine other work
shares, the wall clock counts the waits for a core as well.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time

import torch

from minitx.allocator import keep_freed_memory
from minitx.attention.mta import native
from minitx.attention.mta.torch_math import KeyQueryConv, MixedSoftmax, NativeKeyQueryConv, VisibleKeys


def torch_mixed_softmax(scores, pre, post, hidden):
    def mix(maps, matrix):  # mix_heads' torch path: one matmul per group on the maps as they lie
        B, H, R, T = maps.shape
        return (matrix.transpose(-1, -2) @ maps.reshape(B, matrix.shape[0], matrix.shape[1], R * T)).view(
            B, H, R, T
        )

    return mix(torch.softmax(mix(scores, pre).masked_fill(hidden, float("-inf")), dim=-1), post)


def cases(keys: int, heads: int, rows: int, c_q: int, c_k: int) -> dict:
    """name -> (C loop, torch) callables for one chunk of `rows` query rows ending at key keys - 1."""
    q_pos = torch.cat([torch.full((c_q - 1,), -1), torch.arange(keys - (rows - c_q + 1), keys)])
    visible = VisibleKeys(q_pos, torch.arange(keys), consecutive=True)
    out_rows = visible.from_row(c_q - 1)
    scores = torch.randn(1, heads, rows, keys, requires_grad=True)
    kernel = torch.randn(heads, 1, c_q, c_k, requires_grad=True)
    masked = scores.detach().masked_fill(visible.hidden, 0.0).requires_grad_()
    grad = torch.randn(1, heads, rows - c_q + 1, keys)
    convolved = torch.randn(1, heads, rows - c_q + 1, keys, requires_grad=True)
    pre, post = (
        torch.randn(1, heads, heads, requires_grad=True),
        torch.randn(1, heads, heads, requires_grad=True),
    )

    def c_conv():
        return NativeKeyQueryConv.apply(scores, kernel, visible.lo, visible.hi, out_rows.lo, out_rows.hi)

    def torch_conv():
        return KeyQueryConv.apply(masked, kernel)

    def backward(fn, inputs):
        return lambda: torch.autograd.grad(fn(), inputs, grad)

    def c_softmax():
        return MixedSoftmax.apply(convolved, pre, post, out_rows.lo, out_rows.hi)

    def t_softmax():
        return torch_mixed_softmax(convolved, pre, post, out_rows.hidden)

    def forward(fn):
        return lambda: torch.no_grad()(fn)()

    def c_one_pass():
        rows = (visible.lo, visible.hi, out_rows.lo, out_rows.hi)
        return torch.ops.minitx.conv_softmax(scores, kernel, pre, post, *rows)[0]

    def torch_one_pass():
        return torch_mixed_softmax(KeyQueryConv.apply(masked, kernel), pre, post, out_rows.hidden)

    return {
        "convolution, forward": (forward(c_conv), forward(torch_conv)),
        "convolution, forward + both gradients": (
            backward(c_conv, (scores, kernel)),
            backward(torch_conv, (masked, kernel)),
        ),
        "mix + mask + softmax + mix, forward + gradients": (
            backward(c_softmax, (convolved, pre, post)),
            backward(t_softmax, (convolved, pre, post)),
        ),
        "convolution + mixes + softmax (training's one pass), forward + gradients": (
            backward(c_one_pass, (scores, kernel, pre, post)),
            backward(torch_one_pass, (masked, kernel, pre, post)),
        ),
    }


def median_ms(fns: list, repeats: int, clock=time.perf_counter) -> list[float]:
    for fn in fns:
        fn()  # warm-up
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, spent in zip(fns, times):
            start = clock()
            fn()
            spent.append(clock() - start)
    return [1000 * statistics.median(t) for t in times]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument(
        "--rows", type=int, default=261, help="a chunk's rows, history included (default 256 + 5)"
    )
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall clock (default) or the process's CPU time (a machine shared with other work)",
    )
    args = parser.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if native.library() is None:
        parser.error(
            "the C loops could not be built here (is a C compiler installed? is MINITX_NATIVE=0 set?)"
        )
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    print(
        f"# {platform.processor() or platform.machine()} CPU, {args.threads} threads, torch {torch.__version__}, "
        f"{datetime.date.today()}, {args.heads} heads x {args.rows} rows, 6 x 11 kernel, float32, median of {args.repeats}, "
        f"{args.clock} clock; C loops {native.build_target()}; {' '.join(native.vector_extensions())}\n"
    )
    print("| keys | work | C loops ms | torch ms | torch / C | C GFLOP/s |")
    print("|---:|---|---:|---:|---:|---:|")
    for keys in args.keys:
        for name, (c_fn, torch_fn) in cases(keys, args.heads, args.rows, 6, 11).items():
            c_ms, torch_ms = median_ms([c_fn, torch_fn], args.repeats, clock)
            flops = 2 * 66 * args.heads * (args.rows - 5) * keys if name == "convolution, forward" else None
            rate = f"{flops / c_ms / 1e6:.0f}" if flops else ""
            print(
                f"| {keys} | {name} | {c_ms:.2f} | {torch_ms:.2f} | {torch_ms / c_ms:.1f} | {rate} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
