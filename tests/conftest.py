"""Fixtures shared by the model, attention and generation tests."""

import os
import random
import shutil
import tempfile
from pathlib import Path

# Lightning gives its loggers a handler on the sys.stderr of the moment it is first imported. Were
# that inside a test that captures output (capsys, capfd), the handler would keep that test's
# stream, closed after it, and every later in-process run would print a logging traceback into
# the next test's output. Imported here, the handler writes to pytest's session-long capture.
import lightning.pytorch  # noqa: F401
import pytest
import torch
from helpers import HIDE_SLURM, SLURM_COMMANDS, path_without

from minitx.verify import probe

_hidden: list[Path] = []  # the folders this process made to hide SLURM's commands


def pytest_configure(config):
    """With MINITX_HIDE_SLURM=1 (.ci/run, for the fast suite) SLURM's commands are not found by
    any test nor by anything it starts, even where the machine has them: a test that assumes them
    fails there, not on a new user's machine without SLURM. Set here, before xdist starts its
    workers, which inherit the PATH (and find nothing more to hide)."""
    if os.environ.get(HIDE_SLURM, "") in ("", "0"):
        return
    scratch = Path(tempfile.mkdtemp(prefix="minitx-no-slurm-"))
    _hidden.append(scratch)
    os.environ["PATH"] = path_without(SLURM_COMMANDS, os.environ.get("PATH", ""), scratch)


def pytest_unconfigure(config):
    for scratch in _hidden:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def seed() -> int:
    """Fresh random inputs each run, reproducible: the seed is printed and can be replayed."""
    value = int(os.environ.get("MINITX_TEST_SEED", random.randrange(2**31)))
    torch.manual_seed(value)
    print(f"seed={value} (replay with MINITX_TEST_SEED={value})")
    return value


@pytest.fixture
def one_thread():
    # Tensors here are tiny: a second thread only adds hand-offs (minitx.verify.probe.one_thread).
    with probe.one_thread():
        yield
