"""Build MTA's Triton kernels for a CUDA GPU without one, and check they fit its shared memory.

    python scripts/build_mta_kernels.py                         # the released setting, H100 (sm_90)
    python scripts/build_mta_kernels.py --n-head 8 --head-dim 128 --arch 80 --shared-kb 163

Triton compiles to the GPU's machine code on any machine (its wheel brings ptxas). A kernel that
needs more shared memory per block than the GPU has (H100: 227 KB, A100: 163 KB) would fail at its
first launch, where mta_backend auto falls back to the torch path (and triton raises): run this
before a GPU slot to see it here. Prints one line per kernel; exit status 1 if one does not fit.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compiled kernels even without CUDA, before triton is imported
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minitx.attention.mta import triton_launch as mta_triton  # noqa: E402

KERNELS = {"stats": "_stats", "forward": "_forward", "backward_delta": "_backward", "backward": "_backward"}
INTEGERS = {"T", "H", "HK", "G", "E", "OFF", "D", "n_blocks"}
INPUTS = ("qc_ptr", "kc_ptr", "band_ptr", "v_ptr", "dout_ptr")  # in the model's dtype; the rest float32


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-head", type=int, default=16)
    parser.add_argument("--n-kv-head", type=int, help="default: n_head")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--query-kernel", type=int, default=6, help="c_q (1: no convolution)")
    parser.add_argument("--key-kernel", type=int, default=11, help="c_k, odd")
    parser.add_argument("--placement", choices=["pre", "post", "both"], default="both")
    parser.add_argument("--head-mix", choices=["none", "pre", "post", "both"], default="both")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x 10 (H100: 90)")
    parser.add_argument("--shared-kb", type=int, default=227, help="shared memory per block (H100: 227)")
    parser.add_argument("--num-warps", type=int, default=4)
    args = parser.parse_args(argv)
    if not mta_triton.available():
        print(f"triton is not installed: {mta_triton.INSTALL_HINT}", file=sys.stderr)
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    H, D, c_q, c_k = args.n_head, args.head_dim, args.query_kernel, args.key_kernel
    pre = args.placement in ("pre", "both") and c_q * c_k > 1
    post = args.placement in ("post", "both") and c_q * c_k > 1
    E, off = (c_q * D, c_q - 1 + c_k // 2) if pre else (D, 0)
    G = args.n_kv_head or H
    element_bytes = {"bf16": 2, "fp16": 2, "fp32": 4}[args.dtype]
    kernel = (c_q, c_k) if post else (1, 1)
    g = mta_triton.geometry(H, H if pre else G, G, D, E, off, *kernel, element_bytes=element_bytes)
    mixes = (args.head_mix in ("pre", "both"), args.head_mix in ("post", "both"))
    precision = "ieee" if args.dtype == "fp32" else "tf32"
    every = mta_triton.constants(g, post, *mixes, precision)
    print(
        f"H={H} D={D} c_q x c_k={c_q}x{c_k} placement={args.placement} head_mix={args.head_mix} "
        f"{args.dtype} sm_{args.arch}: tiles {g['BM']} rows x {g['BN']} keys, {g['HP']} heads"
    )
    fits = True
    for name, attribute in KERNELS.items():
        kernel = getattr(mta_triton, attribute)
        consts = every[name]
        signature = {
            a: "constexpr"
            if a in consts
            else "i32"
            if a in INTEGERS
            else f"*{args.dtype}"
            if a in INPUTS
            else "*fp32"
            for a in kernel.arg_names
        }
        start = time.perf_counter()
        compiled = triton.compile(
            ASTSource(kernel, signature, constexprs=consts),
            target=GPUTarget("cuda", args.arch, 32),
            options={"num_warps": args.num_warps},
        )
        shared_kb = compiled.metadata.shared / 1024
        ok = shared_kb <= args.shared_kb
        fits &= ok
        print(
            f"  {name:15s} shared {shared_kb:6.0f} KB {'fits' if ok else 'DOES NOT FIT'}  "
            f"(built in {time.perf_counter() - start:.0f} s)"
        )
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
