"""Training throughput: tokens per second and model FLOPs utilisation (MFU): the model FLOPs per
token of minitx/flops.py's convention (Transformer.flops_per_token), not what the code executes.

One measurement for every consumer (the logged tokens_per_sec and mfu, and anything else that
wants a run's speed, such as a sweep's summary): `ThroughputMeter`, fed by MinitxLM and read
through `MinitxLM.throughput`. Time runs between optimiser steps, from the end of the first step
of a run (which pays allocation and compilation), with validation left out.

The peak is the datasheet's dense bf16 figure where one exists (the GPUs below); elsewhere (a
CPU, an unlisted GPU) it is measured: the best of a few dense matmuls, float32 on a CPU and bf16 on
a GPU, once per process, at the first MFU asked for (benchmarks/mfu.py measures it the same way).
A CPU has no datasheet figure that its cores, threads and memory would reach, and MFU "unknown"
told a CPU user nothing about where the time goes.

Why a peak table of our own rather than lightning.fabric.utilities.throughput.get_available_flops:
on Lightning 2.6 that finds no figure for "NVIDIA H200" (the name torch reports for the SXM part),
reads an L40S as an L4, and quotes H100 NVL and H200 with sparsity (twice the dense rate), so MFU
would be unknown, 3x too high or half of what it is on exactly the GPUs people train on.
"""

from __future__ import annotations

import time
from functools import cache

import torch

# Dense (no sparsity) bf16 tensor-core peak FLOP/s, from the vendors' datasheets, matched against
# torch.cuda.get_device_name(). The most specific names come first. MFU is always quoted against
# this bf16 peak, as nanoGPT and PaLM do, whatever precision the run uses.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200 NVL", 835e12),
    ("H200", 989e12),
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
)


# The measured peak: matrices of this side (2048: the size at which a CPU's float32 matmul
# settles, and large enough to fill a GPU's bf16 tensor cores for the GPUs without a figure).
MATMUL_SIZE = 2048


def datasheet_peak(device: torch.device) -> float | None:
    """The datasheet's dense bf16 FLOP/s of one `device`, or None (CPUs, unlisted GPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS if key in name), None)


def matmul_dtype(device: torch.device) -> torch.dtype:
    # bf16 where tensor cores run it; float32 on a CPU, where most have no bf16 arithmetic.
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_flops(device: torch.device, size: int = MATMUL_SIZE, repeats: int = 3) -> float:
    """FLOP/s of the fastest of `repeats` dense size x size matmuls on `device` (2 size^3 FLOPs
    each), after one untimed: the best, since a peak is what the machine reaches, not its mean."""
    a, b = (torch.randn(size, size, device=device).to(matmul_dtype(device)) for _ in range(2))
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


@cache
def _measured_peak(device: str) -> float:
    with torch.no_grad():
        return matmul_flops(torch.device(device))


def peak_source(device: torch.device) -> str | None:
    """Where `device`'s peak comes from: "datasheet bf16", "measured <dtype> matmul", or None."""
    if datasheet_peak(device) is not None:
        return "datasheet bf16"
    if device.type in ("cpu", "cuda"):
        return f"measured {str(matmul_dtype(device)).removeprefix('torch.')} matmul"
    return None


def peak_flops(device: torch.device) -> float | None:
    """Peak FLOP/s of one `device`: the datasheet's, else measured once per process (CPUs,
    unlisted GPUs); None for other devices."""
    peak = datasheet_peak(device)
    if peak is None and device.type in ("cpu", "cuda"):
        peak = _measured_peak(str(device))
    return peak


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


class ThroughputMeter:
    """Tokens per second of training, in windows between optimiser steps, validation left out.

    `add(tokens)` after every micro-batch (tokens of all ranks); `lap()` at an optimiser step
    closes the window and returns its tokens/s (None for the first lap, which only starts the
    clock); `pause()` / `resume()` around validation. `tokens_seen` counts every token trained
    on since this process started the run; `mean_tokens_per_sec` is over all closed windows.
    """

    def __init__(self, device: torch.device, flops_per_token: float | None = None, world_size: int = 1):
        self.device = device
        self._peak: float | None = None
        self.flops_per_token = flops_per_token
        self.world_size = world_size
        self.tokens_seen = 0
        self.timed_tokens = 0
        self.timed_seconds = 0.0
        self._window_tokens = 0
        self._window_start: float | None = None
        self._paused_at: float | None = None

    def _now(self) -> float:
        _sync(self.device)  # only at laps and pauses: steps stay asynchronous
        return time.perf_counter()

    def add(self, tokens: int) -> None:
        self.tokens_seen += tokens
        self._window_tokens += tokens

    def started(self) -> bool:
        return self._window_start is not None

    def lap(self) -> float | None:
        now = self._now()
        start, tokens = self._window_start, self._window_tokens
        self._window_start, self._window_tokens = now, 0
        if start is None:
            return None
        seconds = max(now - start, 1e-9)
        self.timed_tokens += tokens
        self.timed_seconds += seconds
        return tokens / seconds

    def pause(self) -> None:
        if self._window_start is not None and self._paused_at is None:
            self._paused_at = self._now()

    def resume(self) -> None:
        if self._paused_at is not None and self._window_start is not None:
            self._window_start += time.perf_counter() - self._paused_at
        self._paused_at = None

    @property
    def mean_tokens_per_sec(self) -> float | None:
        return self.timed_tokens / self.timed_seconds if self.timed_seconds > 0 else None

    @property
    def peak(self) -> float | None:
        # Asked for at the first logged MFU, not at the start: a measured peak takes a second,
        # which a run too short to log throughput need not pay.
        if self._peak is None:
            self._peak = peak_flops(self.device)
        return self._peak

    def mfu(self, tokens_per_sec: float) -> float | None:
        """Model FLOPs utilisation: achieved training FLOP/s over the devices' peak, or None."""
        if self.flops_per_token is None or self.peak is None:
            return None
        return self.flops_per_token * tokens_per_sec / (self.peak * self.world_size)
