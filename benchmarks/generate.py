"""Decoding speed with and without the KV cache, and cache memory per attention kind.

    python benchmarks/generate.py                  # 512 new tokens, every kind, Markdown tables
    python benchmarks/generate.py --kinds mha --new-tokens 256
    python benchmarks/generate.py --compile        # also cached decoding compiled (torch.compile)
    python benchmarks/generate.py --kinds mha "mta (paper defaults)" --cpu-steps 6   # a step's CPU time only

The model has the shape of configs/default.yaml (vocab 65 = the character vocabulary of the
built-in Shakespeare) with random weights: speed does not depend on what the weights are. Batch 1,
a one-token prompt, sampling at temperature 0.8, one torch thread. Each timing is the best of
--repeats runs, since a shared machine only ever makes a run slower.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import fields
from pathlib import Path

import torch
import yaml

from minitx import AttentionConfig, ModelConfig, Transformer, kv_cache_bytes
from minitx.decoding.loop import generate

REPO = Path(__file__).resolve().parents[1]
FALLBACK = dict(vocab_size=65, block_size=256, n_layer=4, n_head=4, d_model=128)

# Each kind as it is benchmarked; the rest of the shape comes from the default config.
KINDS = {
    "mha": dict(kind="mha"),
    "mqa": dict(kind="mqa"),
    "gqa (2 kv heads)": dict(kind="gqa", n_kv_head=2),
    "local (window 64)": dict(kind="local", options={"local": {"window": 64}}),
    "local (window 64, 4 global)": dict(kind="local", options={"local": {"window": 64, "n_global": 4}}),
    "mta (paper defaults)": dict(kind="mta"),
}


def default_shape() -> tuple[dict, str]:
    """ModelConfig fields of configs/default.yaml (vocab 65 for its char tokenizer), and where they came from."""
    path = REPO / "configs" / "default.yaml"
    if not path.exists():
        return dict(FALLBACK), "fallback shape (configs/default.yaml not found)"
    model = (yaml.safe_load(path.read_text()) or {}).get("model", {})
    known = {f.name for f in fields(ModelConfig)} - {"attention", "dropout"}
    shape = dict(FALLBACK, **{key: value for key, value in model.items() if key in known})
    return shape, "configs/default.yaml (vocab 65: its character tokenizer on Shakespeare)"


def timed_generation(model: Transformer, new_tokens: int, use_cache: bool, seed: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) to generate new_tokens."""
    generator = torch.Generator().manual_seed(seed)
    wall, cpu = time.perf_counter(), time.process_time()
    generate(
        model,
        torch.zeros(1, 1, dtype=torch.long),
        new_tokens,
        temperature=0.8,
        use_cache=use_cache,
        generator=generator,
    )
    return time.perf_counter() - wall, time.process_time() - cpu


def best_times(runs: dict[str, tuple], new_tokens: int, repeats: int) -> dict[str, tuple[float, float]]:
    """Best (wall, CPU) seconds of each named run, (model, use_cache), over `repeats` rounds that
    interleave the runs, so that a busy spell hits them alike."""
    best = {name: (float("inf"), float("inf")) for name in runs}
    for repeat in range(repeats):
        for name, (model, use_cache) in runs.items():
            times = timed_generation(model, new_tokens, use_cache, repeat)
            best[name] = tuple(min(a, b) for a, b in zip(best[name], times))
    return best


def timed_table(header: list[str], rows_to_time: list[tuple[str, dict]], cells) -> str:
    """A Markdown table, printed row by row as it is timed: for each (label, ModelConfig fields), a
    fresh model (seed 0) and `cells(model)`, the row's cells after its label."""
    rows = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    print("\n".join(rows), flush=True)
    for label, config in rows_to_time:
        torch.manual_seed(0)
        rows.append(f"| {label} | {' | '.join(cells(Transformer(ModelConfig(**config)).eval()))} |")
        print(rows[-1], flush=True)
    return "\n".join(rows)


def speed_table(rows_to_time: list[tuple[str, dict]], new_tokens: int, repeats: int) -> str:
    """Tokens/s by the wall clock and per CPU-second of this process (one thread: the same on an
    idle machine, but the CPU clock does not count time spent waiting for a core on a busy one)."""

    def cells(model: Transformer) -> list[str]:
        for use_cache in (True, False):
            timed_generation(model, 8, use_cache, 0)  # warm up allocator and kernels
        best = best_times({"cache": (model, True), "none": (model, False)}, new_tokens, repeats)
        (wall_c, cpu_c), (wall_n, cpu_n) = best["cache"], best["none"]
        return [
            f"{new_tokens / wall_c:,.0f}", f"{new_tokens / wall_n:,.0f}", f"{wall_n / wall_c:.1f}x",
            f"{new_tokens / cpu_c:,.0f}", f"{new_tokens / cpu_n:,.0f}", f"{cpu_n / cpu_c:.1f}x",
        ]  # fmt: skip

    header = ["model", "with cache (tok/s)", "without cache (tok/s)", "speed-up", "with cache (tok/CPU-s)"]
    header += ["without (tok/CPU-s)", "speed-up (CPU)"]
    return timed_table(header, rows_to_time, cells)


def compiled_table(rows_to_time: list[tuple[str, dict]], new_tokens: int, repeats: int) -> str:
    """Cached decoding of torch.compile(model) (inductor) against the eager model: tokens/s by the
    wall clock, best of `repeats` interleaved runs after a first compiled generation of the same
    length (which compiles every graph decoding needs: the prefill, the step, each ring's states),
    whose seconds are shown too."""

    def cells(model: Transformer) -> list[str]:
        torch._dynamo.reset()  # each model its own graphs, far from the recompile limit
        compiled = torch.compile(model)
        first, _ = timed_generation(compiled, new_tokens, True, 0)
        timed_generation(model, 8, True, 0)  # warm up the eager path alike
        best = best_times({"eager": (model, True), "compiled": (compiled, True)}, new_tokens, repeats)
        eager, fast = best["eager"][0], best["compiled"][0]
        return [
            f"{new_tokens / eager:,.0f}",
            f"{new_tokens / fast:,.0f}",
            f"{eager / fast:.2f}x",
            f"{first:.1f}",
        ]

    header = ["model", "eager (tok/s)", "compiled (tok/s)", "speed-up", "first compiled generation (s)"]
    return timed_table(header, rows_to_time, cells)


def step_table(shape: dict, kinds: list[str], repeats: int, steps: int = 300) -> str:
    """Milliseconds of one cached model step (batch 1, 60 tokens in the cache; best of `repeats`
    runs of `steps` steps), under no_grad and under inference_mode, for each kind at the default
    shape and the first kind at d_model 8: the last is almost all fixed per-operation cost, so the
    difference is the arithmetic."""
    rows = ["| model | no_grad (ms) | inference_mode (ms) |", "|---|---:|---:|"]
    models = [
        (f"{kind}, d_model {shape['d_model']}", dict(shape, attention=AttentionConfig(**KINDS[kind])))
        for kind in kinds
    ]
    models.append(
        (f"{kinds[0]}, d_model 8", dict(shape, d_model=8, attention=AttentionConfig(**KINDS[kinds[0]])))
    )
    for label, config in models:
        torch.manual_seed(0)
        model = Transformer(ModelConfig(**config)).eval()
        cells = []
        for mode in (torch.no_grad, torch.inference_mode):
            with mode():
                best = float("inf")
                for _ in range(repeats):
                    cache, token = model.new_cache(1, 60 + steps), torch.zeros(1, 1, dtype=torch.long)
                    for _ in range(60):  # fill the cache; also warms up
                        model(token, cache=cache)
                    start = time.perf_counter()
                    for _ in range(steps):
                        model(token, cache=cache)
                    best = min(best, (time.perf_counter() - start) / steps)
                cells.append(f"{best * 1e3:.3f}")
        rows.append(f"| {label} | {' | '.join(cells)} |")
    return "\n".join(rows)


def cpu_step_table(shape: dict, kinds: list[str], rounds: int, steps: int = 511) -> str:
    """Median thread-CPU microseconds of one cached model step (inference_mode, a one-token
    prompt, then `steps` steps: past block_size the ring wraps), the kinds taking turns for
    `rounds` rounds in this process (the first a warm-up), and each kind's speed against the
    first's. CPU time leaves out waiting for a core, so on a busy machine this ratio holds where
    tokens per wall-second do not."""
    models = {}
    for kind in kinds:
        torch.manual_seed(0)
        models[kind] = Transformer(ModelConfig(**shape, attention=AttentionConfig(**KINDS[kind]))).eval()
    times: dict[str, list[int]] = {kind: [] for kind in kinds}
    token = torch.zeros(1, 1, dtype=torch.long)
    with torch.inference_mode():
        for n in range(rounds):
            for kind, model in models.items():
                cache = model.new_cache(1, steps + 1)
                model(token, cache=cache)
                for _ in range(steps):
                    start = time.thread_time_ns()
                    model(token, cache=cache)
                    if n:
                        times[kind].append(time.thread_time_ns() - start)
    medians = {kind: sorted(t)[len(t) // 2] / 1e3 for kind, t in times.items()}
    rows = [f"| model | median step (us CPU) | speed against {kinds[0]} |", "|---|---:|---:|"]
    rows += [f"| {kind} | {us:,.0f} | {medians[kinds[0]] / us:.3f} |" for kind, us in medians.items()]
    return "\n".join(rows)


def memory_table(shape: dict, lengths: list[int]) -> str:
    """fp32 cache bytes of a batch of 1, from the config alone (equal to what new_cache allocates)."""
    config_shape = dict(shape, block_size=max(lengths))  # a context long enough to show growth
    header = (
        "| kind | "
        + " | ".join(f"{n} tokens" for n in lengths)
        + " | bytes/token at "
        + str(max(lengths))
        + " | vs mha |"
    )
    rows = [header, "|---|" + "---:|" * (len(lengths) + 2)]
    reference = None
    for name, attention in KINDS.items():
        config = ModelConfig(**config_shape, attention=AttentionConfig(**attention))
        sizes = [kv_cache_bytes(config, n) for n in lengths]
        reference = reference or sizes[-1]
        cells = " | ".join(f"{size / 1024:,.0f} KiB" for size in sizes)
        rows.append(f"| {name} | {cells} | {sizes[-1] / lengths[-1]:,.0f} | {sizes[-1] / reference:.3f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS), metavar="KIND")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--contexts", type=int, nargs="*", default=[128, 512], help="also time mha at these block sizes"
    )
    # One thread by default: batch-1 decoding of a model this small is a chain of tiny ops, where a
    # second thread only adds synchronisation (and on a busy machine, waiting for a core).
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument(
        "--compile", action="store_true", help="also time cached decoding of torch.compile(model)"
    )
    parser.add_argument(
        "--cpu-steps",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="only the CPU time of a step, kinds alternating",
    )
    args = parser.parse_args()
    if args.cpu_steps == 1:  # the first round of each kind warms up and is not timed
        parser.error("--cpu-steps: use 2 or more rounds (the first is a warm-up), or 0 for the full run")
    torch.set_num_threads(args.threads)
    shape, source = default_shape()
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    )
    print(f"model: {shape} from {source}; random weights, batch 1, 1-token prompt, temperature 0.8\n")
    if args.cpu_steps:
        print(
            f"### One cached model step in CPU time ({args.cpu_steps} rounds, load average {os.getloadavg()[0]:.1f})\n"
        )
        print(cpu_step_table(shape, args.kinds, args.cpu_steps))
        print(f"(load average {os.getloadavg()[0]:.1f} at the end)")
        return
    print(
        f"### Decoding speed, {args.new_tokens} new tokens (best of {args.repeats}; load average {os.getloadavg()[0]:.1f} at the start)\n"
    )
    rows = [(name, dict(shape, attention=AttentionConfig(**KINDS[name]))) for name in args.kinds]
    rows += [
        (f"mha, block_size {block_size}", dict(shape, block_size=block_size)) for block_size in args.contexts
    ]
    speed_table(rows, args.new_tokens, args.repeats)
    print(f"(load average {os.getloadavg()[0]:.1f} at the end)")
    if args.compile:
        print(f"\n### Cached decoding compiled, {args.new_tokens} new tokens (best of {args.repeats})\n")
        compiled_table(rows[: len(args.kinds)], args.new_tokens, args.repeats)
    print(f"\n### One cached model step, without the sampling loop (best of {args.repeats})\n")
    print(step_table(shape, args.kinds, args.repeats))
    lengths = [128, 512, 2048, 8192]
    print(
        f"\n### KV cache memory (fp32, batch 1, block_size raised to {max(lengths)} so full attention can grow)\n"
    )
    print(memory_table(shape, lengths))


if __name__ == "__main__":
    main()
