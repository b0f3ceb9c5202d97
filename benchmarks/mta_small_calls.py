"""MTA's C operators on tiny tensors: what a call costs with one thread and with two, cores idle or busy.

    python benchmarks/mta_small_calls.py              # idle cores, then 2 spinning processes beside
    python benchmarks/mta_small_calls.py --busy 0     # idle cores only

At the sizes of the operator tests (tests/attention/test_mta_ops.py: maps 2 x 3 x 7 x 6) a call is
microseconds of work, and gradcheck calls each operator hundreds of times. With two threads each
call hands work to OpenMP's team; when the cores are busy (the other test worker), a thread waits
for a core on every hand-off. Rows: the median wall time of one `torch.ops.minitx.kq_conv` call
(forward), of one forward + backward, and of a float64 gradcheck of the operator, at 1 and at 2
threads, with --busy spinning processes beside (0 = idle cores).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minitx.attention.mta import native  # noqa: E402
from minitx.attention.mta.torch_math import VisibleKeys  # noqa: E402


def spin() -> None:
    while True:
        pass


def inputs(dtype: torch.dtype):
    B, H, R, N, c_q, c_k = 2, 3, 7, 6, 2, 3
    q_pos = torch.cat([torch.full((2,), -1), torch.arange(N - (R - 2), N)])
    visible = VisibleKeys(q_pos, torch.arange(N), 1, consecutive=True)
    lo, hi = visible.lo, visible.hi
    maps = torch.randn(B, H, R, N, dtype=dtype, requires_grad=True)
    kernel = torch.randn(H, 1, c_q, c_k, dtype=dtype, requires_grad=True)
    return maps, kernel, (lo, hi, lo[c_q - 1 :], hi[c_q - 1 :])


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def rows(threads: int, repeats: int) -> list[tuple[str, float]]:
    torch.set_num_threads(threads)
    maps, kernel, rows_ = inputs(torch.float64)
    op = torch.ops.minitx.kq_conv

    def forward():
        with torch.no_grad():
            op(maps, kernel, *rows_)

    def step():
        op(maps, kernel, *rows_).sum().backward()

    def gradcheck():
        torch.autograd.gradcheck(lambda m, k: op(m, k, *rows_), (maps, kernel))

    return [
        ("forward, ms a call", median_ms(forward, repeats * 20)),
        ("forward + backward, ms", median_ms(step, repeats * 20)),
        ("gradcheck (float64), ms", median_ms(gradcheck, max(3, repeats // 3))),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 2], help="spinning processes beside")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    if native.library() is None:
        raise SystemExit("mta_small_calls: the C loops could not be built here")
    print(
        f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {multiprocessing.cpu_count()} cores"
    )
    print(f"{'what':26} {'busy':>4} {'1 thread':>10} {'2 threads':>10} {'ratio':>7}")
    for busy in args.busy:
        spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(busy)]
        for process in spinners:
            process.start()
        try:
            one, two = rows(1, args.repeats), rows(2, args.repeats)
        finally:
            for process in spinners:
                process.terminate()
        for (what, a), (_, b) in zip(one, two):
            print(f"{what:26} {busy:>4} {a:10.3f} {b:10.3f} {b / a:7.1f}")


if __name__ == "__main__":
    main()
