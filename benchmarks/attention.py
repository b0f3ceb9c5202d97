"""Forward + backward time and peak memory of one attention layer (projections + attention) per kind.

    python benchmarks/attention.py                      # CPU, T = 256 1024 4096, a few minutes
    python benchmarks/attention.py --device cuda --batch 8 --d-model 1024 --n-head 16
    python benchmarks/attention.py --device cuda --dtype bfloat16 --seq-lens 1024 4096 16384 \
        --d-model 1024 --n-head 16 --variants mha mta mta-both mta-triton mta-both-triton

Variants: mha, mqa, gqa (n_head/2 kv heads), local (window 128) chunked, the same window as a
dense T x T boolean mask into SDPA (the baseline local attention must beat), mta (6 x 11
key-query convolution, head mixing, output norm) in query chunks through the torch path, the same
always factorised (mta-fact) and always plain (mta-conv), the released setting with
pre- and post-softmax convolutions (mta-both), mta materialised in one chunk (mta-full, the
memory baseline), and mta and mta-both through the Triton kernels (mta-triton, mta-both-triton:
minitx/attention/mta/triton_launch.py, no T x T map).

Which path mta and mta-both take: on the CPU the default backend (auto: the C loops' chunked
convolution where they are built, else the factorised path above 512 tokens and the plain chunked
convolution below). On CUDA auto now takes the Triton kernels (there is no attention dropout
here), which the triton rows measure; so on CUDA mta and mta-both are pinned to what auto took
there before the kernels, the torch path (factorised above 512 tokens, plain chunked convolution
at and below; no C loops on CUDA). The triton rows are in the default set only on CUDA (with triton
installed): on CPU tensors the kernels run in Triton's interpreter, exact but seconds per step at
T = 30, so there they run only when named with --variants.

Time: median of --repeats runs after a warm-up, of forward and backward of the layer with the
input requiring grad, as in training, by the wall clock and by this thread's CPU time (which leaves
out work on other threads: equal to the wall clock's with --threads 1 on an idle machine, steadier
beside other work). The ratio table divides each MTA row's time (and each triton row's peak
memory) by mha's at the same T, by the wall clock (--cpu-time: by thread CPU time), the other
clock's ratio beside it. The header names the CPU's vector extensions and what MTA's C loops were
built for (MINITX_NATIVE_ARCH=x86-64-v3 in front times the AVX2 build on an AVX-512 machine).
Memory, CUDA: torch.cuda.max_memory_allocated during the step, less what was allocated before.
Memory, CPU (no allocator statistics there): the peak sum of bytes of the tensor storages the step
creates, tracked op by op with a dispatch mode that sees every operator (backward included); it
misses scratch space an operator allocates and frees inside itself (e.g. a convolution's
workspace), so it is a lower bound. "saved" is what autograd keeps between forward and backward.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time

import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from minitx import AttentionConfig, ModelConfig, functional
from minitx.allocator import keep_freed_memory
from minitx.attention import build
from minitx.attention.local import LocalAttention
from minitx.attention.mta import native
from minitx.attention.mta import triton_launch as mta_triton
from minitx.attention.mta.options import FACTORISED_FROM
from minitx.files.configs import merged
from minitx.rope import RotaryEmbedding

MiB = 2**20


class DenseMaskedLocal(LocalAttention):
    """The baseline: the window as a T x T boolean mask into SDPA, which still does T^2 work."""

    def attend(self, q, k, v):
        positions = torch.arange(q.shape[2], device=q.device)
        mask = functional.allowed_mask(positions, positions, window=self.window, n_global=self.n_global)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


# A benchmark-only mta_backend that make_layer resolves per T: what `auto` took on CUDA before the
# Triton kernels (no C loops there), the factorised path above FACTORISED_FROM tokens and the plain
# chunked convolution at and below. On CUDA it keeps mta and mta-both on the torch path.
TORCH_AUTO = "torch-auto"
TRITON_VARIANTS = ("mta-triton", "mta-both-triton")


def variants(args) -> dict[str, dict]:
    window = dict(kind="local", options={"local": {"window": args.window, "backend": "chunked"}})

    def mta(**options) -> dict:  # layer 0 of 1: the module with the convolution
        return dict(kind="mta", options={"mta": {"conv_layers": [0], **options}})

    # CPU: the default backend (auto). CUDA: auto would take the Triton kernels (the triton rows).
    torch_path = dict(backend=TORCH_AUTO) if args.device == "cuda" else {}
    return {
        "mha": dict(kind="mha"),
        "mqa": dict(kind="mqa"),
        "gqa": dict(kind="gqa", n_kv_head=max(1, args.n_head // 2)),
        "local": window,
        "local-dense": window,  # same config, DenseMaskedLocal module
        "mta": mta(**torch_path),  # pre-softmax 6 x 11 convolution, the torch path
        "mta-fact": mta(backend="factorised"),  # the same, always the factorised path
        "mta-conv": mta(backend="conv"),  # the same, always the plain chunked convolution
        # as released: pre- and post-softmax convolutions
        "mta-both": mta(conv_placement="both", **torch_path),
        "mta-full": mta(backend="conv", query_chunk=max(args.seq_lens)),  # one chunk: (B, H, T, T) at once
        "mta-triton": mta(backend="triton"),  # mta through the Triton kernels
        # the released layer through the Triton kernels
        "mta-both-triton": mta(conv_placement="both", backend="triton"),
    }


def default_variants(args, all_variants: dict) -> list[str]:
    """Every variant, less the triton rows where they would not run compiled (CPU: the interpreter)."""
    compiled_triton = args.device == "cuda" and mta_triton.available()
    return [name for name in all_variants if compiled_triton or name not in TRITON_VARIANTS]


def resolved(attention: dict, T: int) -> dict:
    """The attention section with TORCH_AUTO replaced by the backend it stands for at T."""
    if (attention.get("options") or {}).get("mta", {}).get("backend") != TORCH_AUTO:
        return attention
    return merged(attention, options={"mta": {"backend": "factorised" if T > FACTORISED_FROM else "conv"}})


def make_layer(name: str, attention: dict, T: int, args):
    config = ModelConfig(
        block_size=T,
        n_layer=1,
        n_head=args.n_head,
        d_model=args.d_model,
        attention=AttentionConfig(**resolved(attention, T)),
    )
    layer = DenseMaskedLocal(config, 0) if name == "local-dense" else build(config, 0)
    dtype = getattr(torch, args.dtype)
    layer = layer.to(args.device, dtype)
    rope = tuple(t.to(args.device) for t in RotaryEmbedding(config.head_dim, T).to(args.device)(0, T))
    x = torch.randn(args.batch, T, args.d_model, device=args.device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)
    return layer, x, rope, grad


def step(layer, x, rope, grad) -> None:
    x.grad = None
    layer.zero_grad(set_to_none=True)
    layer(x, rope).backward(grad)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_times_ms(layers: dict, args) -> dict[str, dict[str, float]]:
    """Median step time per variant by each clock: {"wall": ..., "cpu": this thread's CPU time}.
    Variants take turns, so a burst of other work on the machine slows all of them alike instead
    of one."""
    for _ in range(args.warmup):
        for layer, x, rope, grad in layers.values():
            step(layer, x, rope, grad)
    times = {name: {"wall": [], "cpu": []} for name in layers}
    for _ in range(args.repeats):
        for name, (layer, x, rope, grad) in layers.items():
            sync(args.device)
            wall, cpu = time.perf_counter(), time.thread_time()
            step(layer, x, rope, grad)
            sync(args.device)
            times[name]["cpu"].append(time.thread_time() - cpu)
            times[name]["wall"].append(time.perf_counter() - wall)
    return {
        name: {clock: 1000 * statistics.median(values) for clock, values in clocks.items()}
        for name, clocks in times.items()
    }


def median_ms(layers: dict, args) -> dict[str, float]:
    """Median step time per variant by the clock --cpu-time chooses."""
    clock = "cpu" if args.cpu_time else "wall"
    return {name: times[clock] for name, times in median_times_ms(layers, args).items()}


class LiveTensorPeak(TorchDispatchMode):
    """Peak bytes of live tensor storages created by the operators run under it."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.current = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for key, (ref, nbytes) in list(self.live.items()):  # storages freed since the last operator
            if ref.expired():
                del self.live[key]
                self.current -= nbytes
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key not in self.live:
                    self.live[key] = (StorageWeakRef(storage), storage.nbytes())
                    self.current += storage.nbytes()
        self.peak = max(self.peak, self.current)
        return out


def memory_mib(layer, x, rope, grad, args) -> tuple[float, float]:
    """(peak MiB during forward + backward, MiB saved for backward)."""
    saved: dict[int, int] = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    def forward_saving_then_backward() -> None:
        # Only the forward's saves count: a backward that recomputes saves again, for a moment.
        x.grad = None
        layer.zero_grad(set_to_none=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = layer(x, rope)
        out.backward(grad)

    step(layer, x, rope, grad)  # grads exist before and after: only the step's own memory counts
    if args.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        forward_saving_then_backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        with LiveTensorPeak() as tracker:
            forward_saving_then_backward()
        peak = tracker.peak
    return peak / MiB, sum(saved.values()) / MiB


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's choice)")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time steps by this thread's CPU time (time.thread_time), not the wall clock: steadier "
        "beside other work; with --threads 1 and --device cpu, where all of a step's work runs on this thread",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        help="a subset of: mha mqa gqa local local-dense mta mta-fact mta-conv mta-both mta-full "
        "mta-triton mta-both-triton (default: all; the triton ones only with --device cuda)",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible; use --device cpu")
    torch.manual_seed(0)
    keep_freed_memory()  # as minitx's commands do: freed maps stay in the process, no page faults
    if args.threads:
        torch.set_num_threads(args.threads)

    all_variants = variants(args)
    names = args.variants or default_variants(args, all_variants)
    unknown = sorted(set(names) - set(all_variants))
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(all_variants)}")

    machine = (
        torch.cuda.get_device_name()
        if args.device == "cuda"
        else f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"
    )
    print(
        f"# {machine}, torch {torch.__version__}, {datetime.date.today()}, B={args.batch} d_model={args.d_model} "
        f"n_head={args.n_head} window={args.window} {args.dtype}, median of {args.repeats}, "
        f"ratios by {'thread CPU time' if args.cpu_time else 'the wall clock'}"
    )
    print(f"# vector extensions: {' '.join(native.vector_extensions()) or 'unknown (no /proc/cpuinfo)'}")
    print(f"# MTA's C loops: {native.build_target()}\n")
    if args.device == "cuda":
        print(
            f"mta, mta-both: the torch path (factorised above {FACTORISED_FROM} tokens, plain chunked "
            "convolution at and below), as auto took on CUDA before the Triton kernels; "
            "mta-triton, mta-both-triton: the Triton kernels (what auto takes on CUDA now)\n"
        )
    memory_kind = (
        "torch.cuda.max_memory_allocated" if args.device == "cuda" else "peak live tensor bytes (lower bound)"
    )
    print(
        f"| variant | T | fwd+bwd ms | fwd+bwd ms, thread CPU time | peak MiB ({memory_kind}) | saved for backward MiB |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    clock, other = ("cpu", "wall") if args.cpu_time else ("wall", "cpu")
    ms, other_ms, peak = {}, {}, {}
    for T in args.seq_lens:
        layers = {name: make_layer(name, all_variants[name], T, args) for name in names}
        for name, median in median_times_ms(layers, args).items():
            ms[name, T], other_ms[name, T] = median[clock], median[other]
        for name in names:
            peak[name, T], saved = memory_mib(*layers[name], args)
            wall, cpu = (
                (other_ms[name, T], ms[name, T]) if args.cpu_time else (ms[name, T], other_ms[name, T])
            )
            print(
                f"| {name} | {T} | {wall:.1f} | {cpu:.1f} | {peak[name, T]:.1f} | {saved:.1f} |", flush=True
            )
        del layers

    other_words = "the wall clock" if args.cpu_time else "thread CPU time"
    print(f"\n| ratio | value | by {other_words} | target |\n|---|---:|---:|---|")
    long = max(args.seq_lens)

    def row(label: str, table: dict, top: tuple, bottom: tuple, target: str) -> None:
        def ratio(values: dict) -> str:
            return f"{values[top] / values[bottom]:.2f}" if top in values and bottom in values else "not run"

        beside = ratio(other_ms) if table is ms else ""
        print(f"| {label} | {ratio(table)} | {beside} | {target} |")

    row(
        f"dense-mask local / chunked local time, T={long}", ms, ("local-dense", long), ("local", long), ">= 5"
    )
    if 1024 in args.seq_lens and long > 1024:
        row(
            f"local time, T={long} / T=1024",
            ms,
            ("local", long),
            ("local", 1024),
            f"<= 5 (linear: {long / 1024:.0f})",
        )
    for T in args.seq_lens:
        for name in ("mqa", "gqa"):
            row(f"{name} / mha time, T={T}", ms, (name, T), ("mha", T), "<= 1")
    for T in args.seq_lens:
        for name in ("mta", "mta-fact", "mta-conv", "mta-both"):
            goal = (
                ""
                if name != "mta"
                else "<= 1.8 (one CPU thread; 2.5 without AVX-512)"
                if T >= 4096
                else "<= 2"
            )
            row(f"{name} / mha time, T={T}", ms, (name, T), ("mha", T), goal)
    for T in args.seq_lens:
        row(
            f"mta chunked / materialised peak memory, T={T}",
            peak,
            ("mta", T),
            ("mta-full", T),
            "< 1 once T > chunk (256)",
        )
    # The Triton rows (run by default on CUDA only): the goal is the released layer
    # (mta-both-triton) within 2x of SDPA MHA's time at T = 4096 and 16384 on an H100 in bf16, its
    # memory linear in T.
    ran_triton = [name for name in TRITON_VARIANTS if name in names]
    for T in args.seq_lens:
        for name in ran_triton:
            row(f"{name} / mha time, T={T}", ms, (name, T), ("mha", T), "<= 2 (H100 bf16, T >= 4096)")
            row(f"{name} / mha peak memory, T={T}", peak, (name, T), ("mha", T), "")
    short = min(args.seq_lens)
    if long > short:
        for name in ran_triton:
            row(
                f"{name} peak memory, T={long} / T={short}",
                peak,
                (name, long),
                (name, short),
                f"<= {long / short:.0f} (linear in T)",
            )


if __name__ == "__main__":
    main()
