"""Peak memory and time of one training step, with and without activation checkpointing.

    python benchmarks/memory.py                         # default model at T = 4096, batch 1, CPU
    python benchmarks/memory.py --kinds mha mta --batch 4 --seq-len 8192
    python benchmarks/memory.py --device cuda --batch 8
    python benchmarks/memory.py --kinds mha gdn hybrid --seq-lens 1024 2048 4096 8192   # memory vs T

The model is configs/default.yaml's shape (4 layers, 4 heads, width 128, GELU MLP, vocabulary 65)
with block_size = --seq-len and each row's attention kind; random weights and tokens. A step is
forward, cross-entropy and backward from gradients set to None, as a training step (the optimiser's
update is left out: checkpointing changes neither its memory nor its time). Checkpointing is
model.activation_checkpointing, i.e. Transformer.checkpoint_activations.

Each row runs in a process of its own, so that nothing one row allocated is counted in another.
Peak memory is the step's own: what it adds at its highest over what was allocated before it.
- CUDA: torch.cuda.max_memory_allocated during the step, less memory_allocated before it.
- CPU, "tensors": the peak bytes of the live tensor storages the step creates, tracked operator by
  operator (forward, backward and the recomputation) by benchmarks/attention.py's LiveTensorPeak.
  A lower bound: scratch space that an operator allocates and frees inside itself is not seen.
- CPU, "process": the rise of the process's resident set at its highest during the step (Linux
  only: /proc/self/clear_refs resets the high-water mark before the step). glibc is set to hand
  every block of 64 KiB or more back to the kernel when it is freed, so that the resident set
  follows what is live instead of keeping the freed blocks of earlier steps; it includes what
  the tensors miss (operator scratch, the allocator's own overhead).
With --seq-lens, the peak memory of a step without checkpointing at each length instead, per kind,
with the exponent of its growth between consecutive lengths (log peak ratio / log T ratio): 1 is
linear in T, 2 quadratic. Gated DeltaNet's chunked form keeps C x C blocks per chunk, so its
memory should grow as T, not T^2.
Time: the median of --repeats steps after --warmup, in this process with glibc keeping freed
memory as minitx's commands do (minitx/allocator.py); a kind's two models take turns, so that a
busy spell of the machine slows both alike.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import math
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import torch
import torch.nn.functional as F
from attention import LiveTensorPeak  # benchmarks/attention.py, beside this file

from minitx import AttentionConfig, ModelConfig, Transformer
from minitx.allocator import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, keep_freed_memory
from minitx.files.configs import merged_config

REPO = Path(__file__).resolve().parents[1]
VOCAB = 65  # the character vocabulary of the built-in Shakespeare, which default.yaml trains on
MiB = 2**20
KINDS = {
    "mha": {"kind": "mha"},
    "gqa": {"kind": "gqa", "n_kv_head": 2},
    "local": {"kind": "local", "options": {"local": {"window": 256}}},
    # default.yaml's MTA (configs/mta.yaml): the convolutions on layer 2, pre- and post-softmax
    "mta": merged_config(REPO / "configs" / "mta.yaml")["model"]["attention"],
    "gdn": merged_config(REPO / "configs" / "gdn.yaml")["model"]["attention"],
    # configs/hybrid.yaml: layers [gdn, gdn, gdn, mha], the softmax layer with QK-norm and a gate
    "hybrid": merged_config(REPO / "configs" / "hybrid.yaml")["model"]["attention"],
}


def model_config(kind: str, seq_len: int, dropout: float) -> ModelConfig:
    model = merged_config(REPO / "configs" / "default.yaml")["model"]
    shape = {f.name for f in fields(ModelConfig)} - {"attention", "vocab_size", "block_size", "dropout"}
    return ModelConfig(
        **{key: value for key, value in model.items() if key in shape},
        vocab_size=VOCAB,
        block_size=seq_len,
        dropout=dropout,
        attention=AttentionConfig(**KINDS[kind]),
    )


def resident_bytes(field: str) -> int:
    """VmRSS or VmHWM of this process, in bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def release_freed_memory() -> bool:
    """glibc: serve blocks of 64 KiB or more with mmap and give freed memory back, so that the
    resident set follows the live allocations. False where that cannot be set (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, 64 * 2**10) == 1 and mallopt(M_TRIM_THRESHOLD, 64 * 2**10) == 1


def step_of(kind: str, checkpointing: bool, args) -> tuple[Transformer, Callable[[], None]]:
    """(the model, a training step of it from gradients set to None)."""
    torch.manual_seed(0)
    model = Transformer(model_config(kind, args.seq_len, args.dropout)).to(args.device).train()
    model.checkpoint_activations = checkpointing
    tokens = torch.randint(0, VOCAB, (args.batch, args.seq_len + 1), device=args.device)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step() -> None:
        model.zero_grad(set_to_none=True)
        logits = model(x)
        F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1)).backward()

    return model, step


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def peak_memory(kind: str, checkpointing: bool, args) -> dict:
    """One row's peak memory, measured in this process: {"tensors", "process"} in MiB (None: not measured)."""
    model, step = step_of(kind, checkpointing, args)
    row: dict = {"tensors": None, "process": None}
    cpu = args.device == "cpu"
    tracks_process = cpu and sys.platform.startswith("linux") and release_freed_memory()
    for _ in range(max(1, args.warmup)):  # lazy initialisations out of the way
        step()
    model.zero_grad(set_to_none=True)
    if cpu:
        if tracks_process:
            Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts from here
            before = resident_bytes("VmRSS")
            step()
            row["process"] = (resident_bytes("VmHWM") - before) / MiB
            model.zero_grad(set_to_none=True)
        with LiveTensorPeak() as tracker:
            step()
        row["tensors"] = tracker.peak / MiB
    else:
        sync(args.device)
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        sync(args.device)
        row["tensors"] = (torch.cuda.max_memory_allocated() - before) / MiB
    return row


def step_ms(kind: str, args) -> dict[bool, float]:
    """Median milliseconds of a step without and with checkpointing, the two models in turns."""
    steps = {checkpointing: step_of(kind, checkpointing, args)[1] for checkpointing in (False, True)}
    for _ in range(args.warmup):
        for step in steps.values():
            step()
    times: dict[bool, list[float]] = {checkpointing: [] for checkpointing in steps}
    for _ in range(args.repeats):
        for checkpointing, step in steps.items():
            sync(args.device)
            start = time.perf_counter()
            step()
            sync(args.device)
            times[checkpointing].append(time.perf_counter() - start)
    return {checkpointing: 1000 * statistics.median(t) for checkpointing, t in times.items()}


def in_own_process(kind: str, checkpointing: bool, argv: list[str]) -> dict:
    command = [sys.executable, __file__, *argv, "--row", kind, str(int(checkpointing))]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"memory.py: the row {kind}, checkpointing={checkpointing} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def mib(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def growth(peaks: list[float | None], lengths: list[int]) -> str:
    """The exponent of T between consecutive lengths, e.g. "1.00, 0.98": peak ~ T^exponent."""
    exponents = [
        f"{math.log(b / a) / math.log(m / n):.2f}" if a and b else "-"
        for a, b, n, m in zip(peaks, peaks[1:], lengths, lengths[1:])
    ]
    return ", ".join(exponents)


def memory_by_length(args, argv: list[str]) -> None:
    """Peak memory of a step without checkpointing at each --seq-lens length, each in its own process."""
    lengths = args.seq_lens
    print(
        f"# {platform.processor() or platform.machine()} CPU, torch {torch.__version__}, {datetime.date.today()}; "
        f"configs/default.yaml's shape, batch {args.batch}, dropout {args.dropout}; forward + backward, "
        "no checkpointing; peak MiB over what was allocated before the step\n"
    )
    print("| kind | measure | " + " | ".join(f"T={T}" for T in lengths) + " | growth exponent, T to 2T |")
    print("|---|---|" + "---:|" * len(lengths) + "---|")
    for kind in args.kinds:
        rows = []
        for T in lengths:
            rows.append(in_own_process(kind, False, [*argv, "--seq-len", str(T)]))
            print(f"{kind}, T={T}: {rows[-1]}", file=sys.stderr, flush=True)  # a long run shows progress
        for key, label in (("tensors", "live tensors (lower bound)"), ("process", "process")):
            peaks = [row[key] for row in rows]
            cells = " | ".join(mib(peak) for peak in peaks)
            print(f"| {kind} | {label} | {cells} | {growth(peaks, lengths)} |", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=["mha", "mta"])
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--seq-lens", type=int, nargs="+", help="instead: peak memory at each of these T")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--row", nargs=2, help=argparse.SUPPRESS)  # internal: one row, in this process
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible; use --device cpu")
    if args.row:
        print(json.dumps(peak_memory(args.row[0], args.row[1] == "1", args)))
        return
    if args.seq_lens:
        memory_by_length(args, argv)
        return
    if args.device == "cpu":
        keep_freed_memory()  # time the steps as minitx's commands run

    machine = (
        torch.cuda.get_device_name()
        if args.device == "cuda"
        else f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"
    )
    print(
        f"# {machine}, torch {torch.__version__}, {datetime.date.today()}; configs/default.yaml's shape, "
        f"T={args.seq_len}, batch {args.batch}, dropout {args.dropout}; forward + backward, median of {args.repeats}\n"
    )
    memory = "torch.cuda.max_memory_allocated" if args.device == "cuda" else "live tensors (lower bound)"
    print(f"| kind | checkpointing | step ms | peak MiB, {memory} | peak MiB, process |")
    print("|---|---|---:|---:|---:|")
    rows = {}
    for kind in args.kinds:
        ms = step_ms(kind, args)
        for checkpointing in (False, True):
            row = rows[kind, checkpointing] = in_own_process(kind, checkpointing, argv)
            row["ms"] = ms[checkpointing]
            print(
                f"| {kind} | {'on' if checkpointing else 'off'} | {row['ms']:,.0f} | {mib(row['tensors'])} "
                f"| {mib(row['process'])} |",
                flush=True,
            )
    print("\n| kind | memory, on / off (tensors) | memory, on / off (process) | time, on / off |")
    print("|---|---:|---:|---:|")
    for kind in args.kinds:
        off, on = rows[kind, False], rows[kind, True]
        ratios = [
            f"{on[key] / off[key]:.2f}" if on[key] is not None and off[key] else "-"
            for key in ("tensors", "process", "ms")
        ]
        print(f"| {kind} | {' | '.join(ratios)} |")


if __name__ == "__main__":
    main()
