"""How far float32 gradients sit from the float64 model's, per kind: why the compile tests
(tests/model/test_compile.py) hold compiled to eager in float64, where no rounding comes near their
tolerance, and not in float32, where rounding can pass 1e-3 of a gradient's largest entry.

    python benchmarks/float32_rounding.py                    # eager, 40 seeds, every kind: ~20 s
    python benchmarks/float32_rounding.py --compiled --seeds 3 --kinds gdn hybrid   # inductor too

The instances are the compile tests' own (each configs/<kind>.yaml attention section on a tiny
model with every parameter moved off its initial value, 2 x 19 random tokens). For each seed, the
error of a run is its worst parameter's max |float32 gradient - float64 gradient| over that
gradient's largest |entry|; the table gives the median, the 90th percentile and the largest over
the seeds (with the seed: --start replays it), for eager float32 and (--compiled)
torch.compile(fullgraph=True) float32. Both are rounding: neither is the reference, so a compiled
run may sit nearer the float64 result than eager. --compiled also gives the largest error of
compiled float64 against eager float64, the compile tests' own measure.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

# The compile tests' instances, so that this measures what their tolerance stands on.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "model"))
from test_compile import NAMES, VOCAB, loss_and_grads, tiny_model  # noqa: E402

from minitx.attention.mta.native import cpuinfo_line  # noqa: E402


def worst_error(grads: dict[str, torch.Tensor], truth: dict[str, torch.Tensor]) -> float:
    return max(((grads[n].double() - t).abs().max() / t.abs().max()).item() for n, t in truth.items())


def errors(name: str, seed: int, compiled: bool) -> tuple[float, ...]:
    """Eager float32 against float64; with `compiled`, compiled float32 against float64 and what the
    compile tests measure, compiled float64 against eager float64."""
    torch.manual_seed(seed)
    model = tiny_model(name)
    x, y = torch.randint(0, VOCAB, (2, 19)), torch.randint(0, VOCAB, (2, 19))
    twin = copy.deepcopy(model).double()
    _, truth = loss_and_grads(twin, twin, x, y)
    _, eager = loss_and_grads(model, model, x, y)
    if not compiled:
        return (worst_error(eager, truth),)
    found = [worst_error(eager, truth)]
    for net in (model, twin):
        torch._dynamo.reset()
        _, fast = loss_and_grads(net, torch.compile(net, fullgraph=True), x, y)
        found.append(worst_error(fast, truth))
    return tuple(found)


def summary(values: list[float], seeds: range) -> str:
    worst = int(np.argmax(values))
    return f"{np.median(values):.1e} | {np.percentile(values, 90):.1e} | {values[worst]:.1e} (seed {seeds[worst]})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=40, help="how many seeds, from --start")
    parser.add_argument("--start", type=int, default=0, help="the first seed (a worst one to replay)")
    parser.add_argument("--kinds", nargs="+", default=NAMES, choices=NAMES)
    parser.add_argument("--compiled", action="store_true", help="torch.compile each seed too (slow)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cpu = cpuinfo_line(("model name",)).partition(":")[2].strip() or platform.machine()
    print(f"{cpu}; torch {torch.__version__}; {datetime.date.today().isoformat()}; {args.seeds} seeds")
    print("error: a run's worst parameter, max |float32 - float64| over the gradient's largest |entry|\n")
    header = (
        "| kind | eager median | 90% | max |"
        + (" compiled median | 90% | max | compiled float64 vs eager float64, max |" if args.compiled else "")
        + " s |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for name in args.kinds:
        start = time.perf_counter()
        seeds = range(args.start, args.start + args.seeds)
        found = [errors(name, seed, args.compiled) for seed in seeds]
        row = f"| {name} | {summary([f[0] for f in found], seeds)} |"
        if args.compiled:
            float64 = [f[2] for f in found]
            row += f" {summary([f[1] for f in found], seeds)} | {max(float64):.1e} |"
        print(f"{row} {time.perf_counter() - start:.0f} |", flush=True)


if __name__ == "__main__":
    main()
