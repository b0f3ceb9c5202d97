"""MTA's C loops (conv.c), compiled on first use with the machine's C compiler, called by ctypes.

They cover the work MTA does on (rows x keys) maps that torch has no fused kernel for: the
key-query convolution and its two gradients, the pre-softmax head mix + mask + softmax + post-
softmax head mix in one pass and its gradient, the convolution and that pass as one call where
nothing needs a gradient (conv_softmax), head mixing alone, and (for decoding) the output norm
and gate. Used for float32 and float64 on CPU; everything else (CUDA, bfloat16, no compiler) runs
the same maths on torch's operations, equal to rounding (the tests hold both to one oracle).
MINITX_NATIVE=0 turns them off; MINITX_NATIVE_OPENMP=0 builds them without OpenMP (their threads
are then a pool of their own). They are built for the machine's own vector extensions
(-march=native: conv.c sizes its vectors and register tiles to AVX-512 where the machine has it,
else to AVX2); MINITX_NATIVE_ARCH=<gcc -march value> builds them for another target, e.g.
x86-64-v3 (AVX2 + FMA) to time on an AVX-512 machine what a machine without it runs.

The library is built once per source and machine into ~/.cache/minitx (or $MINITX_CACHE) under a
name that includes the source's hash, written under a temporary name and renamed into place, so
that processes starting together (DDP ranks, parallel ablation runs) never load a half-written file.
Work is split over maps or rows between torch's CPU threads, on the threads of torch's own OpenMP
team where the compiler has OpenMP (the library then shares torch's runtime; ctypes releases the
GIL). The gradients of the kernels and of the small mixing matrices are left in a slot per unit of
work (a band of rows, a row), then added up in the units' order (conv.c's add_slots): the same
bits on any number of threads, those one thread gave when it summed them as it went.

Not the same bits on every CPU: conv.c's vectors are the target's (64 bytes with AVX-512, else 32),
and the softmax's and the gradients' sums add their lanes in another grouping on each, as the
compiler's tuning for the CPU decides where multiply-adds are fused; torch's own kernels (oneDNN,
its vectorised reductions) differ between AVX2 and AVX-512 alike. A training run's loss on another
CPU is therefore reproduced within a spread, measured for MTA in docs/results/README.md (ablation/).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import cache, lru_cache
from pathlib import Path

import torch
from torch import Tensor

from ...compiling import constant_result

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("conv.c")
FLAGS = ["-O3", "-ffp-contract=fast", "-shared", "-fPIC"]
OPENMP = ["-fopenmp"]
WORKER_TASK = ctypes.CFUNCTYPE(None, ctypes.c_int64)
SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


def cache_dir() -> Path:
    return Path(os.environ.get("MINITX_CACHE") or Path.home() / ".cache" / "minitx")


@cache
def library() -> ctypes.CDLL | None:
    """The compiled library, or None (turned off, no compiler, or the build failed: logged once)."""
    if os.environ.get("MINITX_NATIVE", "1") == "0":
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.info("no C compiler found: MTA runs on torch's operations (slower on CPU)")
        return None
    source, error = SOURCE.read_bytes(), None
    # With OpenMP where the compiler has it: the loops then run on the threads of torch's own
    # OpenMP team (the library shares its runtime), not on a pool of their own, which shared two
    # cores with that team's threads still spinning after each matrix product (measured: the C
    # calls of a T = 4096 step took as long on two threads as on one).
    with_openmp = os.environ.get("MINITX_NATIVE_OPENMP", "1") != "0"
    target = [f"-march={build_arch()}"]
    for flags in [FLAGS + target + OPENMP] * with_openmp + [FLAGS + target]:
        try:
            lib = ctypes.CDLL(str(built(compiler, flags, source)))
            break
        except (OSError, subprocess.SubprocessError) as failure:
            error = failure
    else:
        detail = getattr(error, "stderr", b"") or b""
        log.warning(
            "MTA's C loops could not be built (%s%s); using torch's operations",
            error,
            detail.decode(errors="replace")[:500],
        )
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for suffix in SUFFIX.values():
        for documents in ("", "_documents"):  # the same arguments, intervals per batch row (B, R)
            getattr(lib, f"conv{documents}_{suffix}").argtypes = [ptr, ptr, ptr] + [i64] * 9 + [ptr] * 4
        getattr(lib, f"mixed_softmax_{suffix}").argtypes = [ptr] * 5 + [i64] * 7 + [ptr] * 2 + [i64]
        getattr(lib, f"mixed_softmax_grad_{suffix}").argtypes = [ptr] * 8 + [i64] * 7 + [ptr] * 2 + [i64]
        getattr(lib, f"kernel_grad_{suffix}").argtypes = [ptr, ptr, ptr] + [i64] * 7 + [ptr] * 4
        getattr(lib, f"kernel_grad_documents_{suffix}").argtypes = [ptr, ptr, ptr] + [i64] * 8 + [ptr] * 4
        getattr(lib, f"conv_softmax_{suffix}").argtypes = [ptr] * 7 + [i64] * 10 + [ptr] * 4
        getattr(lib, f"conv_softmax_grad_{suffix}").argtypes = [ptr] * 12 + [i64] * 10 + [ptr] * 4
        getattr(lib, f"conv_rows_{suffix}").argtypes = [ptr] * 3 + [i64] * 11 + [ptr] * 4
        getattr(lib, f"mix_{suffix}").argtypes = [ptr, ptr, ptr, i64, ptr, ptr] + [i64] * 6
        getattr(lib, f"gated_norm_{suffix}").argtypes = [ptr] * 5 + [ctypes.c_double, i64, i64]
        getattr(lib, f"attend_rows_{suffix}").argtypes = (
            [ptr] * 4 + [i64] * 2 + [ptr] * 6 + [ctypes.c_double] * 2 + [i64] * 11 + [ptr] * 2 + [i64]
        )
    lib.parallel_workers.argtypes = [WORKER_TASK, i64]
    lib.openmp.restype = ctypes.c_int64
    lib.add_slots.argtypes = [ptr, ptr, i64, i64]
    return lib


def build_arch() -> str:
    """The -march the library is built for: the machine's own, unless MINITX_NATIVE_ARCH names another."""
    return os.environ.get("MINITX_NATIVE_ARCH") or "native"


def build_target() -> str:
    """What the loaded library was built for, in words: "-march=native, 64-byte vectors"."""
    if not loaded():
        return "not built (torch's operations)"
    return f"-march={build_arch()}, {ctypes.c_int64.in_dll(library(), 'vector_bytes').value}-byte vectors"


def vector_extensions() -> list[str]:
    """The CPU's SIMD extensions as /proc/cpuinfo's flags name them (avx2, fma, avx512f, avx512_bf16,
    ...; neon/asimd on ARM); empty where there is no /proc/cpuinfo."""
    flags = cpuinfo_line(("flags", "Features")).partition(":")[2].split()
    wanted = ("avx", "fma", "sse4_2", "f16c", "amx", "asimd", "neon", "sve")
    return sorted(flag for flag in set(flags) if flag.startswith(wanted))


def built(compiler: str, flags: list[str], source: bytes) -> Path:
    """The library compiled from source with these flags, built once per source, flags and
    machine (the name holds their hash)."""
    key = hashlib.sha256(source + " ".join([compiler, *flags, platform.machine(), cpu_model()]).encode())
    target = cache_dir() / f"mta_conv-{key.hexdigest()[:16]}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            scratch_target = Path(scratch) / target.name
            subprocess.run(
                [compiler, *flags, str(SOURCE), "-o", str(scratch_target)],
                check=True,
                capture_output=True,
                timeout=120,
            )
            os.replace(scratch_target, target)
    return target


@cache
def unit_rows(name: str) -> int:
    """conv.c's rows per unit of work: "tile_rows" (conv_softmax's) or "row_block" (conv_softmax_grad's)."""
    return ctypes.c_int64.in_dll(library(), name).value


def cpuinfo_line(prefixes: tuple[str, ...]) -> str:
    """/proc/cpuinfo's first line that starts with one of prefixes; "" where none does, or there is
    no /proc/cpuinfo."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((line for line in lines if line.startswith(prefixes)), "")


def cpu_model() -> str:
    return cpuinfo_line(("model name", "flags")) or platform.processor()


def available(maps: Tensor) -> bool:
    return maps.device.type == "cpu" and maps.dtype in SUFFIX and loaded()


@constant_result
def loaded() -> bool:
    """Whether the library is there: a constant to torch.compile, which would stop its graph at
    the file checks of a first `library()` call (ops.py's operators call the library itself)."""
    return library() is not None


@lru_cache(maxsize=1)
def pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(workers, thread_name_prefix="minitx-conv")


def workers(n_items: int) -> int:
    return max(1, min(torch.get_num_threads(), n_items))


def ranges(n_items: int) -> list[tuple[int, int]]:
    """The ranges of items `split` hands its workers, one per CPU thread torch may use."""
    n = workers(n_items)
    bounds = [n_items * t // n for t in range(n + 1)]
    return list(zip(bounds, bounds[1:]))


def split(n_items: int, call) -> None:
    """call(first, end, worker) over `ranges(n_items)`, each on its own thread: those of OpenMP's
    team where the library has OpenMP (conv.c's parallel_workers; call makes one C call, which
    releases the GIL), else of a pool."""
    parts = ranges(n_items)
    if len(parts) == 1:
        call(0, n_items, 0)
        return
    if library().openmp():
        errors = []

        def task(worker: int) -> None:
            try:
                call(*parts[worker], worker)
            except BaseException as error:  # raised below, on the calling thread
                errors.append(error)

        library().parallel_workers(WORKER_TASK(task), len(parts))
        if errors:
            raise errors[0]
        return
    for future in [pool(len(parts)).submit(call, a, b, t) for t, (a, b) in enumerate(parts)]:
        future.result()


def slots(n_units: int, matrix: Tensor | tuple[int, ...] | None) -> Tensor | None:
    """Zeros, float64, a slot of matrix's shape per unit of work, where the C loops leave each
    unit's terms of its gradient (None for a matrix that is None)."""
    if matrix is None:
        return None
    shape = tuple(matrix.shape) if isinstance(matrix, Tensor) else matrix
    return torch.zeros(n_units, *shape, dtype=torch.float64)


def added_up(units: Tensor | None) -> Tensor | None:
    """The sum of `slots`' slots, added in their order (conv.c's add_slots): no bit depends on the
    threads (a torch sum over them could group them by thread)."""
    if units is None:
        return None
    out = units.new_empty(units.shape[1:])
    library().add_slots(units.data_ptr(), out.data_ptr(), units.shape[0], out.numel())
    return out


def documents(rows) -> str:
    """The convolution's C functions' name part for row intervals (lo, hi): "" for one interval per
    row shared by the batch, "_documents" for (B, R) intervals per batch row, whose rows hold several
    documents (conv.c: an output row of the convolution then reads only its own document's rows)."""
    return "_documents" if rows is not None and rows[0].dim() == 2 else ""


def interval_pointers(rows) -> list:
    """mixed_softmax's (and its gradient's) last arguments for row intervals (lo, hi): their
    addresses (None, None: every key) and their stride per batch row (0: one interval per row
    shared by the batch; R: (B, R) intervals, a packed batch's documents)."""
    if rows is None:
        return [None, None, 0]
    return [rows[0].data_ptr(), rows[1].data_ptr(), rows[0].shape[-1] if rows[0].dim() == 2 else 0]


def mix_widths(pre: Tensor | None, post: Tensor | None) -> list[int]:
    """The head groups' widths of the pre and post mixes as the C loops take them (1: no mix)."""
    return [1 if m is None else m.shape[-1] for m in (pre, post)]


def contiguous(rows):
    """Row intervals (lo, hi) as the C loops read them (a slice of documents' (B, R) intervals is
    not); bound to a name until the call returns."""
    return None if rows is None else tuple(t.contiguous() for t in rows)


def address(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def as_dtype(t: Tensor | None, dtype) -> Tensor | None:
    """A parameter as the C loops read it: contiguous, in dtype (most often as it is: a decoding step
    makes about 25 of these calls, and a copy or a detached view costs more than the check)."""
    if t is None or (t.dtype == dtype and t.is_contiguous()):
        return t
    return t.detach().to(dtype).contiguous()


def conv(maps: Tensor, kernel: Tensor, offset: int, n_out: int, in_rows, out_rows) -> Tensor:
    """out[..., i, j] = sum_{u,w} kernel[h, u, w] maps~[..., i + offset + u, j + w - c_k // 2] for
    out_rows' lo_i <= j <= hi_i (0 elsewhere), maps~ = maps zero outside in_rows' [lo_r, hi_r].
    maps (B, H, R_in, N); kernel (H, c_q, c_k); rows: (lo, hi) int64 vectors of R_in and n_out, or
    (B, R_in) and (B, n_out) per batch row, lo the first key of the row's document: then row i
    reads only the rows r with in lo_r = out lo_i (see `documents`)."""
    B, H, R_in, N = maps.shape
    maps, in_rows, out_rows = maps.contiguous(), contiguous(in_rows), contiguous(out_rows)
    kernel = as_dtype(kernel, maps.dtype)
    out = maps.new_empty(B, H, n_out, N)
    fn = getattr(library(), f"conv{documents(in_rows)}_{SUFFIX[maps.dtype]}")
    c_q, c_k = kernel.shape[-2:]
    sizes = (H, R_in, n_out, N, c_q, c_k, offset, *[t.data_ptr() for t in (*in_rows, *out_rows)])
    split(B * H, lambda m0, m1, _: fn(maps.data_ptr(), out.data_ptr(), kernel.data_ptr(), m0, m1, *sizes))
    return out


def kernel_grad(maps: Tensor, grad: Tensor, c_q: int, c_k: int, in_rows, out_rows) -> Tensor:
    """(B * H, c_q, c_k) float64: sum over i, j of grad[i, j] * maps~[i + u, j + w - c_k // 2]."""
    B, H, R_in, N = maps.shape
    maps, grad = maps.contiguous(), grad.to(maps.dtype).contiguous()
    in_rows, out_rows = contiguous(in_rows), contiguous(out_rows)
    out = torch.empty(B * H, c_q, c_k, dtype=torch.float64)
    fn = getattr(library(), f"kernel_grad{documents(in_rows)}_{SUFFIX[maps.dtype]}")
    sizes = (R_in, grad.shape[2], N, c_q, c_k, *[t.data_ptr() for t in (*in_rows, *out_rows)])
    if documents(in_rows):
        sizes = (H, *sizes)
    split(B * H, lambda m0, m1, _: fn(maps.data_ptr(), grad.data_ptr(), out.data_ptr(), m0, m1, *sizes))
    return out


def mixed_softmax(scores: Tensor, pre, post, rows, keep_probs: bool):
    """(out, probs): probs = softmax over each row's visible keys lo..hi of the head-mixed scores
    M_h = sum_h' pre[g, h', h] C_h' (pre None: M = C), out = the same mix of probs by post (None:
    out = probs); 0 outside the visible keys and in rows that see nothing. scores (B, H, R, N);
    pre, post (groups, c, c); rows: (lo, hi) of R, or of (B, R) per batch row. probs is None unless
    keep_probs (the gradient needs it)."""
    B, H, R, N = scores.shape
    scores, rows = scores.contiguous(), contiguous(rows)
    pre, post = [as_dtype(m, scores.dtype) for m in (pre, post)]
    out = torch.empty_like(scores)
    probs = torch.empty_like(scores) if keep_probs and post is not None else None
    fn = getattr(library(), f"mixed_softmax_{SUFFIX[scores.dtype]}")
    pointers = [address(t) for t in (scores, out, probs, pre, post)]
    sizes = (H, R, N, *mix_widths(pre, post), *interval_pointers(rows))
    split(B * R, lambda u0, u1, _: fn(*pointers, u0, u1, *sizes))
    return out, (out if post is None else probs) if keep_probs else None


def conv_softmax_call(scores: Tensor, kernel: Tensor, pre, post, in_rows, out_rows) -> tuple:
    """What conv_softmax and conv_softmax_grad pass the C loops besides their maps: (the output's
    rows, the mixes in the maps' dtype, the sizes (H, R_in, R_out, N, c_q, c_k, mix widths), the
    intervals' addresses (in lo, in hi, out lo, out hi), and the intervals themselves, to hold until
    the call returns)."""
    _, H, R_in, N = scores.shape
    in_rows, out_rows = contiguous(in_rows), contiguous(out_rows)
    R_out, (c_q, c_k) = len(out_rows[0]), kernel.shape[-2:]
    sizes = (H, R_in, R_out, N, c_q, c_k, *mix_widths(pre, post))
    pre, post = [as_dtype(m, scores.dtype) for m in (pre, post)]
    bounds = [t.data_ptr() for t in (*in_rows, *out_rows)]
    return R_out, pre, post, sizes, bounds, (in_rows, out_rows)


def conv_softmax(scores, kernel, pre, post, in_rows, out_rows, keep: bool = False):
    """(out, conved, probs): out = mixed_softmax(conv(scores, kernel, 0, n_out, in_rows, out_rows),
    pre, post, out_rows)'s out, a tile of rows of every head at a time (the convolved scores go to
    the softmax in cache). keep: also the convolved scores and the softmax before the post mix (out
    itself where there is no post mix), which conv_softmax_grad reads; else both None."""
    B, H, _, N = scores.shape
    scores, kernel = scores.contiguous(), as_dtype(kernel, scores.dtype)
    R_out, pre, post, sizes, bounds, held = conv_softmax_call(scores, kernel, pre, post, in_rows, out_rows)
    out = scores.new_empty(B, H, R_out, N)
    conved = scores.new_empty(B, H, R_out, N) if keep else None
    probs = scores.new_empty(B, H, R_out, N) if keep and post is not None else None
    pointers = [address(t) for t in (scores, conved, out, probs, kernel, pre, post)]
    fn = getattr(library(), f"conv_softmax_{SUFFIX[scores.dtype]}")
    n_tiles = -(-R_out // unit_rows("tile_rows"))
    split(B * n_tiles, lambda u0, u1, _: fn(*pointers, u0, u1, *sizes, *bounds))
    return out, conved, (out if keep and post is None else probs)


def conv_softmax_grad(scores, conved, probs, grad, kernel, pre, post, in_rows, out_rows):
    """(d scores, d kernel, d pre, d post) of conv_softmax's out for its gradient grad, from the
    maps its forward kept (keep): the gradient of mixed_softmax, then both of the convolution's, in
    one pass over bands of rows of every head (conv.c's ROW_BLOCK). Kernel (H, c_q, c_k); the
    kernel's and the mixes' gradients in float64 (None for a mix that is None), summed over the
    bands and rows in their order whatever the threads."""
    B, H, R_in, N = scores.shape
    c_q, c_k = kernel.shape[-2:]
    scores, grad = scores.contiguous(), grad.to(scores.dtype).contiguous()
    R_out, pre, post, sizes, bounds, held = conv_softmax_call(scores, kernel, pre, post, in_rows, out_rows)
    flipped = kernel.detach().to(scores.dtype).flip(-1, -2).contiguous()
    dconved, grad_scores = torch.empty_like(conved), scores.new_empty(B, H, R_in, N)
    row_block = unit_rows("row_block")
    n_bands = -(-R_out // row_block)
    parts = ranges(B * n_bands)
    # a slot per band for the kernel's gradient, per output row for the mixes' (conv.c)
    grad_kernel = slots(B * n_bands, (H, c_q, c_k))
    grad_pre, grad_post = [slots(B * R_out, m) for m in (pre, post)]
    maps = [address(t) for t in (scores, conved, probs, grad, dconved, grad_scores, flipped, pre, post)]
    sums = [address(g) for g in (grad_kernel, grad_pre, grad_post)]
    fn = getattr(library(), f"conv_softmax_grad_{SUFFIX[scores.dtype]}")
    split(B * n_bands, lambda u0, u1, _: fn(*maps, *sums, u0, u1, *sizes, *bounds))
    # Input-gradient rows that read another worker's rows of d conved (conv.c), now that all are written.
    rows_fn = getattr(library(), f"conv_rows_{SUFFIX[scores.dtype]}")
    rows_maps = (dconved.data_ptr(), grad_scores.data_ptr(), flipped.data_ptr())
    for u0, u1 in parts[1:]:
        b, i0 = divmod(u0, n_bands)
        i0 *= row_block
        if i0 == 0:
            continue
        last_b, last_band = divmod(u1 - 1, n_bands)
        end = R_in if last_b > b or last_band == n_bands - 1 else (last_band + 1) * row_block
        sizes = (b * H, (b + 1) * H, H, R_out, R_in, N, c_q, c_k, -(c_q - 1), i0, min(i0 + c_q - 1, end))
        rows_fn(*rows_maps, *sizes, *bounds[2:], *bounds[:2])
    return grad_scores, *[added_up(g) for g in (grad_kernel, grad_pre, grad_post)]


def mixed_softmax_grad(scores: Tensor, probs: Tensor, grad: Tensor, pre, post, rows):
    """(d scores, d pre, d post) for `mixed_softmax`'s output gradient grad; the mixes' gradients in
    float64 (summed over the rows in their order whatever the threads), None for a mix that is None."""
    B, H, R, N = scores.shape
    grad, rows = grad.to(scores.dtype).contiguous(), contiguous(rows)
    pre_t, post_t = [as_dtype(m, scores.dtype) for m in (pre, post)]
    grad_scores = torch.empty_like(scores)
    grad_pre, grad_post = [slots(B * R, m) for m in (pre, post)]  # a slot per row (conv.c)
    fn = getattr(library(), f"mixed_softmax_grad_{SUFFIX[scores.dtype]}")
    pointers = [address(t) for t in (scores, probs, grad, grad_scores, pre_t, post_t, grad_pre, grad_post)]
    sizes = (H, R, N, *mix_widths(pre, post), *interval_pointers(rows))
    split(B * R, lambda u0, u1, _: fn(*pointers, u0, u1, *sizes))
    return grad_scores, added_up(grad_pre), added_up(grad_post)


def _mixer(maps: Tensor, matrix: Tensor):
    """The C head mix for maps' dtype and shape (B, H, R, N), matrix (groups, c_h, c_h) as the
    loops read it: call(src, dst, transposed, grad, grad_matrix, u0, u1) on rows u0:u1 of B * R,
    pointers or None. It mixes src into dst (transposed: by the matrix's transpose, which is the
    gradient of the mix) and, given grad, adds d matrix (float64) into grad_matrix."""
    _, H, R, N = maps.shape
    weights = as_dtype(matrix, maps.dtype)
    fn = getattr(library(), f"mix_{SUFFIX[maps.dtype]}")

    def call(src, dst, transposed, grad, grad_matrix, u0, u1):
        fn(src, dst, weights.data_ptr(), transposed, grad, grad_matrix, u0, u1, H, R, N, matrix.shape[-1])

    return call


def mix(maps: Tensor, matrix: Tensor) -> Tensor:
    """out_h = sum_k matrix[g, k, h] maps_k within groups of c_h heads; matrix (groups, c_h, c_h)."""
    B, _, R, _ = maps.shape
    maps = maps.contiguous()
    out = torch.empty_like(maps)
    call = _mixer(maps, matrix)
    split(B * R, lambda u0, u1, _: call(maps.data_ptr(), out.data_ptr(), 0, None, None, u0, u1))
    return out


def mix_grad(maps: Tensor, matrix: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
    """(d maps, d matrix in float64, summed over the rows in their order) of `mix(maps, matrix)` for
    the output gradient grad."""
    B, _, R, _ = maps.shape
    maps = maps.contiguous()
    grad = grad.to(maps.dtype).contiguous()
    grad_maps = torch.empty_like(maps)
    grad_matrix = slots(B * R, matrix)  # a slot per row (conv.c)
    call = _mixer(maps, matrix)

    def each(u0, u1, _):
        # d maps is the transposed mix of grad; d matrix needs maps and grad, row by row alike.
        call(grad.data_ptr(), grad_maps.data_ptr(), 1, None, None, u0, u1)
        call(maps.data_ptr(), None, 0, grad.data_ptr(), grad_matrix.data_ptr(), u0, u1)

    split(B * R, each)
    return grad_maps, added_up(grad_matrix)


def gated_norm(x: Tensor, weight: Tensor, gate: Tensor, bias: Tensor, eps: float) -> Tensor:
    """n * sigmoid(n . gate + bias) with n = rms_norm(x) * weight, over x's last dimension (no gradient)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    D = x.shape[-1]
    params = [as_dtype(t, x.dtype) for t in (weight, gate, bias)]
    getattr(library(), f"gated_norm_{SUFFIX[x.dtype]}")(
        x.data_ptr(), out.data_ptr(), *[t.data_ptr() for t in params], eps, x.numel() // D, D
    )
    return out


def attend_rows(
    q, k, v, scale, pre, post, weight, gate, bias, eps, kernel=None, lo=None, hi=None, first_slot=0
):
    """A decoding step of a layer without gradients: post-mix(softmax(pre-mix(C))) V per head, C the
    scores scale q K^T (with `kernel` (H, [1,] c_q, c_k): their pre-softmax convolution, q's first c_q - 1
    rows being its history), then the gated norm if `weight` is given (gate weight, gate bias, eps).
    q (B, H, R, D); k, v (B, G, Tk, D); lo, hi (contiguous): the keys each of q's R rows sees (None:
    every key); key j is k's and v's row (first_slot + j) mod Tk (a wrapped cache ring read in
    position order). Returns (B, H, R - c_q + 1, D). The signature is ops.attend_rows', flat, so
    that a layer hands the same arguments to either."""
    # Plain Python, as little as will do: a decoding step makes one of these calls per layer, and
    # each small step here costs about what a tenth of the C call's arithmetic does.
    B, H, R, D = q.shape
    G, N = k.shape[1], k.shape[2]
    c_q, c_k = (1, 1) if kernel is None else kernel.shape[-2:]
    k_strides, v_strides = k.stride(), v.stride()
    # One batch and head stride for both, rows of D contiguous numbers (a cache's views are so).
    if k_strides != v_strides or k_strides[2:] != (D, 1):
        k, v = k.contiguous(), v.contiguous()
    q = q.contiguous()
    out = q.new_empty(B, H, R - c_q + 1, D)
    params = [as_dtype(t, q.dtype) for t in (kernel, pre, post, weight, gate, bias)]  # alive till the call
    fn = getattr(library(), f"attend_rows_{SUFFIX[q.dtype]}")
    before = [t.data_ptr() for t in (q, k, v, out)] + [k.stride(0), k.stride(1)]
    before += [address(t) for t in params] + [eps, scale]
    after = [H, G, R, N, D, c_q, c_k, *mix_widths(pre, post), address(lo), address(hi), first_slot]
    if B == 1:
        fn(*before, 0, 1, *after)
    else:
        split(B, lambda b0, b1, _: fn(*before, b0, b1, *after))
    return out
