"""Keep freed memory inside the process, so that the commands' loops do not pay the kernel for it.

Every forward pass allocates and frees the same large activation buffers (a batch of 8,192 tokens
x an MLP of 512 is 16 MB). glibc serves blocks of that size with mmap and hands them back to the
kernel with munmap when they are freed, and a heap whose top grows free past a threshold is
trimmed, so the next pass faults every page in again, zero-filled by the kernel. Measured on the
2-core CPU machine: evaluating the default checkpoint on its whole validation text spent 12.5 of
47 CPU-seconds in the kernel and took 26.9 s; with blocks up to 32 MiB from the heap and no
trimming under 1 GiB it spent 0.5 s there and took 18.2 s (benchmarks/RESULTS.md).

Only glibc has these settings; elsewhere (macOS, musl) this does nothing. Either of glibc's own
variables (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) in the environment means the user chose:
nothing is changed then either.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # the largest glibc accepts on 64-bit systems
TRIM_THRESHOLD = 2**30  # free memory at the heap's top kept for reuse, at most


def keep_freed_memory() -> bool:
    """Ask glibc to serve blocks up to 32 MiB from the heap and to keep up to 1 GiB of freed heap.
    True if it was set; False where the C library is not glibc or the user set either variable."""
    chosen = "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ
    if chosen or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # a C library without mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
