"""MTA's Triton kernels build for an H100 (sm_90) on this machine, without a GPU, and fit its shared
memory per block: scripts/build_mta_kernels.py, which compiles them exactly as they are launched.
The interpreter tests (test_mta_triton.py) check their maths; this, that the GPU code exists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # Triton compiles each kernel for a GPU target: 10-30 s a test

pytest.importorskip("triton")

SCRIPT = Path(__file__).parents[2] / "scripts" / "build_mta_kernels.py"


@pytest.mark.parametrize(
    "options",
    [
        [],  # the released setting: 16 heads of 64, 6 x 11 before and after the softmax, both mixes, bf16
        "--n-head 4 --n-kv-head 2 --head-dim 128 --placement pre --head-mix post".split(),
        "--n-head 6 --dtype fp32".split(),  # the GPU suite's float32 check of triton against conv
    ],
    ids=["released", "gqa-d128-pre", "gpu-suite-fp32"],
)
def test_kernels_build_for_an_h100_and_fit_its_shared_memory(options):
    run = subprocess.run([sys.executable, str(SCRIPT), *options], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count(" fits ") == 4, run.stdout
