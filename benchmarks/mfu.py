"""MFU of the default run on this machine, against this machine's own measured matmul peak.

Three measurements, printed with the machine and versions:

1. the peak: the best of several dense N x N matmuls (float32 on a CPU, bf16 on a GPU), as
   minitx.training.throughput measures it for the logged `mfu` where no datasheet figure exists;
2. the default run's training FLOP/s: Transformer.flops_per_token (forward + backward, the model
   FLOPs of minitx/flops.py's convention) times the tokens/s of real training steps of
   configs/default.yaml's model (MinitxLM in a Lightning Trainer: its optimiser, clipping and
   logging), the first steps left untimed; their ratio is the MFU. Beside it, a second figure
   under its own name: the executed FLOPs (Transformer.executed_flops_per_token: what the code
   paths run on this device, the whole T x T map of a causal SDPA call, local's padded blocks),
   whose ratio to the peak is the hardware FLOPs utilisation (HFU);
3. where the rest goes: one training step (forward, backward, optimiser) under torch.profiler,
   operators by self CPU time, grouped into the dense matmuls that the FLOP count counts and
   everything else.

    python benchmarks/mfu.py                    # configs/default.yaml, 40 steps, 2048 x 2048 peak
    python benchmarks/mfu.py --steps 20 --size 1024 --config configs/gqa.yaml
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_throughput import build, lightning_tokens_per_sec  # noqa: E402

from minitx.allocator import keep_freed_memory  # noqa: E402
from minitx.files.configs import DEFAULT_CONFIG, merged_config  # noqa: E402
from minitx.training import lm_loss  # noqa: E402
from minitx.training.throughput import MATMUL_SIZE, matmul_dtype, matmul_flops  # noqa: E402

# Operators that are the dense matmuls the FLOP count is made of (linear layers, attention's
# products inside SDPA are counted apart): what runs at the matmul peak at best.
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")
ATTENTION = ("scaled_dot_product", "flash_attention", "efficient_attention")


def device_of() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def machine() -> str:
    device = device_of()
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        where = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    return f"{where}; torch {torch.__version__}; {datetime.date.today().isoformat()}"


PHASES = ("forward", "backward", "optimiser")


def profile_steps(config: dict, steps: int) -> tuple[list[tuple[str, float, int]], dict[str, float]]:
    """`steps` training steps of the config's model (after two untimed ones) under torch.profiler:
    (operator, self CPU seconds per step, calls per step) by self time, and each phase's CPU
    seconds per step (forward, backward, optimiser: Muon's Newton-Schulz matmuls are there)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    module, data = build(config, steps=10)
    device = device_of()
    module = module.to(device).train()
    optimiser = module.configure_optimizers()["optimizer"]
    batches = iter(data.train_dataloader())

    def step() -> None:
        x, y = (t.to(device) for t in next(batches))
        with record_function("forward"):
            loss = lm_loss(module.model(x), y)
        with record_function("backward"):
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
        with record_function("optimiser"):
            torch.nn.utils.clip_grad_norm_(module.model.parameters(), 1.0)
            optimiser.step()
        loss.item()

    step(), step()  # allocation and first-call costs stay out of the profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
    events = prof.key_averages()
    phases = {e.key: e.cpu_time_total / 1e6 / steps for e in events if e.key in PHASES}
    rows = [
        (e.key, e.self_cpu_time_total / 1e6 / steps, e.count // steps) for e in events if e.key not in PHASES
    ]
    rows.sort(key=lambda row: -row[1])
    return rows, phases


def group_of(name: str) -> str:
    if name in MATMULS:
        return "dense matmuls"
    if any(part in name for part in ATTENTION):
        return "attention (SDPA)"
    if name.startswith("Optimizer.") or "foreach" in name or "_fused_adamw" in name:
        return "optimiser's own ops"
    return "other (elementwise, norms, copies, autograd)"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", default=str(DEFAULT_CONFIG), help="training config whose model is measured"
    )
    parser.add_argument("--steps", type=int, default=40, help="optimiser steps of the timed run")
    parser.add_argument("--skip", type=int, default=5, help="first steps left untimed")
    parser.add_argument("--size", type=int, default=MATMUL_SIZE, help="side of the peak's square matmuls")
    parser.add_argument(
        "--repeats", type=int, default=10, help="matmuls timed for the peak (the best counts)"
    )
    parser.add_argument("--top", type=int, default=15, help="operators listed from the profile")
    parser.add_argument(
        "--profile-steps", type=int, default=3, help="training steps profiled (per-step means)"
    )
    args = parser.parse_args()

    # As the train command does (minitx/cli.py): freed activations stay in the process, so the
    # training measured is the training `python train.py` runs.
    keep_freed_memory()
    device = device_of()
    config = merged_config(args.config)
    dtype = str(matmul_dtype(device)).removeprefix("torch.")
    print(f"machine: {machine()}; config {args.config}")

    with torch.no_grad():
        peak = matmul_flops(device, size=args.size, repeats=args.repeats)
    print(
        f"peak: {peak / 1e9:.1f} GFLOP/s ({dtype} {args.size} x {args.size} matmul, best of {args.repeats})"
    )

    module, data = build(config, args.steps)
    flops_per_token = module.model.flops_per_token(data.block_size)
    clip = float(config.get("trainer", {}).get("gradient_clip_val") or 1.0)
    with tempfile.TemporaryDirectory() as workdir:
        tokens_per_sec = lightning_tokens_per_sec(config, args.steps, args.skip, clip, workdir)
    achieved = flops_per_token * tokens_per_sec
    print(
        f"training: {tokens_per_sec:,.0f} tokens/s x {flops_per_token / 1e6:.2f} MFLOP/token = "
        f"{achieved / 1e9:.1f} GFLOP/s ({args.steps - args.skip} steps timed, "
        f"optimizer {module.hparams.optimizer})"
    )
    print(f"MFU: {100 * achieved / peak:.1f}% of the measured {dtype} matmul peak")
    executed = module.model.executed_flops_per_token(data.block_size, device) * tokens_per_sec
    print(
        f"executed FLOPs (what the code paths run on {device.type}, not the model FLOPs above): "
        f"{executed / tokens_per_sec / 1e6:.2f} MFLOP/token, {executed / 1e9:.1f} GFLOP/s; "
        f"HFU: {100 * executed / peak:.1f}% of the peak"
    )

    rows, phases = profile_steps(config, args.profile_steps)
    total = sum(seconds for _, seconds, _ in rows)
    groups: dict[str, float] = {}
    for name, seconds, _ in rows:
        groups[group_of(name)] = groups.get(group_of(name), 0.0) + seconds
    print(f"\none training step under the profiler (mean of {args.profile_steps}), by phase:")
    for phase in PHASES:
        print(
            f"  {100 * phases.get(phase, 0.0) / total:5.1f}%  {1e3 * phases.get(phase, 0.0):8.1f} ms  {phase}"
        )
    print(f"by operator group, {1e3 * total:.1f} ms of operator self CPU time:")
    for group, seconds in sorted(groups.items(), key=lambda item: -item[1]):
        print(f"  {100 * seconds / total:5.1f}%  {1e3 * seconds:8.1f} ms  {group}")
    print(f"\ntop {args.top} operators by self CPU time:")
    for name, seconds, calls in rows[: args.top]:
        print(f"  {100 * seconds / total:5.1f}%  {1e3 * seconds:8.1f} ms  {calls:5d} calls  {name}")


if __name__ == "__main__":
    main()
