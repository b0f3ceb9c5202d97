"""What the causality probe of a kind from outside minitx costs when a command builds a model.

    python benchmarks/kind_probe.py              # examples/custom_attention.py's kind, 9 calls a shape
    python benchmarks/kind_probe.py --calls 21

The probe (minitx/verify/probe.py) runs before train, each of ablate's variants, generate and
evaluate build their model; the goal is well under a second. For each shape: find_leak's CPU time
and wall clock (min and median of --calls), against building the whole model once, the work the
command does anyway; then the same kind with its causal mask left out, to show the probe finds it
at that cost. One thread, as the probe runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from minitx import AttentionConfig, ModelConfig, Transformer, import_kind_modules, register  # noqa: E402
from minitx.kinds import KindSpec, registry  # noqa: E402
from minitx.verify.probe import find_leak  # noqa: E402

EXAMPLE = REPO / "examples" / "custom_attention.py"

# (label, n_layer, n_head, d_model, block_size): a tiny model, configs/default.yaml's, GPT-2 small's.
SHAPES = [
    ("tiny", 2, 4, 32, 64),
    ("default.yaml", 4, 4, 128, 256),
    ("GPT-2 small", 12, 12, 768, 1024),
]


def leaky_kind() -> str:
    """The example's kind with its causal mask left out: every query sees every key."""
    example = registry["ssmax"].module

    class LeakySSMax(example):
        def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            q = self.scaled(q, self.causal_counts(q.shape[2], q.device))
            return F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=True)

    LeakySSMax.__module__ = "benchmark_leaky_kind"  # a kind from outside minitx, as a user's is
    register(KindSpec("ssmax_leaky", LeakySSMax, options=registry["ssmax"].options))
    return "ssmax_leaky"


def config(kind: str, n_layer: int, n_head: int, d_model: int, block_size: int) -> ModelConfig:
    return ModelConfig(
        vocab_size=65,
        block_size=block_size,
        n_layer=n_layer,
        n_head=n_head,
        d_model=d_model,
        attention=AttentionConfig(kind=kind, kind_modules=[str(EXAMPLE)]),
    )


def timed(fn, calls: int) -> tuple[list[float], list[float], object]:
    cpu, wall, result = [], [], None
    for _ in range(calls):
        c, w = time.process_time(), time.perf_counter()
        result = fn()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return cpu, wall, result


def ms(values: list[float]) -> str:
    return f"{min(values) * 1e3:8.1f} {statistics.median(values) * 1e3:8.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import_kind_modules([str(EXAMPLE)])
    leaky = leaky_kind()
    print(
        f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, 1 thread, {args.calls} calls"
    )
    print(
        f"{'shape':14} {'kind':12} {'probe cpu ms (min, med)':>24} {'wall ms (min, med)':>20} "
        f"{'build model ms':>15} {'found':>22}"
    )
    for label, *shape in SHAPES:
        for kind in ("ssmax", leaky):
            cfg = config(kind, *shape)
            calls = args.calls if shape[2] < 512 else max(3, args.calls // 3)
            cpu, wall, leak = timed(lambda cfg=cfg: find_leak(cfg), calls)
            _, build, _ = timed(lambda cfg=cfg: Transformer(cfg), max(3, calls // 3))
            found = "none" if leak is None else f"layer {leak.layer}, position {leak.position}"
            print(f"{label:14} {kind:12} {ms(cpu):>24} {ms(wall):>20} {min(build) * 1e3:15.1f} {found:>22}")


if __name__ == "__main__":
    main()
