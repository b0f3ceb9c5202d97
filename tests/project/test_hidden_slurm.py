"""The fast suite's answer does not depend on the machine having SLURM: .ci/run runs it with
MINITX_HIDE_SLURM=1, under which tests/conftest.py hides SLURM's commands from every test (even on
CI's machine, whose /usr/bin holds them), so a test that assumes sbatch is found fails in CI and
not on a new user's machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import HIDE_SLURM, SLURM_COMMANDS, path_without

ROOT = Path(__file__).resolve().parents[2]
README_TEST = (
    'pip install -c constraints.txt -e ".[dev]" && python -m pytest -q -n 2'  # test_install.py: the README's
)


def tool(folder: Path, name: str, says: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(f"#!/bin/sh\necho {says}\n")
    (folder / name).chmod(0o755)


def test_hiding_slurm_keeps_the_rest_of_the_folders_that_hold_it(tmp_path):
    """A folder that holds sbatch and python alike (CI's /usr/bin) keeps python; one without SLURM
    stays on PATH as it was."""
    shared, other = tmp_path / "usr-bin", tmp_path / "other"
    for name in SLURM_COMMANDS:
        tool(shared, name, "slurm")
    tool(shared, "python-ish", "kept")
    tool(other, "other-tool", "also-kept")
    path = path_without(SLURM_COMMANDS, os.pathsep.join([str(shared), str(other)]), tmp_path / "scratch")
    assert path.split(os.pathsep)[1] == str(other)
    assert [shutil.which(name, path=path) for name in SLURM_COMMANDS] == [None] * len(SLURM_COMMANDS)
    for name, says in (("python-ish", "kept"), ("other-tool", "also-kept")):
        done = subprocess.run([name], capture_output=True, text=True, env={**os.environ, "PATH": path})
        assert done.stdout.strip() == says
    assert all((shared / name).is_file() for name in SLURM_COMMANDS)  # hidden, not removed


@pytest.mark.skipif(
    os.environ.get(HIDE_SLURM, "") in ("", "0"),
    reason=f"{HIDE_SLURM} is not set: SLURM's commands are as this machine has them (.ci/run sets it)",
)
def test_slurm_is_hidden_from_every_test_where_ci_asks():
    """In force for this test and for what it starts, as for every other test of the run."""
    assert {name: shutil.which(name) for name in SLURM_COMMANDS} == dict.fromkeys(SLURM_COMMANDS)
    script = "import shutil, sys; sys.exit(any(shutil.which(n) for n in sys.argv[1:]))"
    assert subprocess.run([sys.executable, "-c", script, *SLURM_COMMANDS]).returncode == 0
    for name in SLURM_COMMANDS:
        assert subprocess.run(["sh", "-c", f"command -v {name}"], capture_output=True).returncode != 0
    assert shutil.which("sh")  # the rest of PATH is still there


def test_ci_runs_the_fast_suite_with_slurm_hidden_and_the_slow_suite_with_it():
    lines = [
        line.strip()
        for line in (ROOT / ".ci/run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    hide, fast = lines.index(f"export {HIDE_SLURM}=1"), lines.index(README_TEST)
    show, install = lines.index(f"unset {HIDE_SLURM}"), lines.index("scripts/local_slurm.sh install")
    slow = next(i for i, line in enumerate(lines) if "-m slow" in line)
    assert hide < fast < show < install < slow
    assert not any(HIDE_SLURM in line for line in lines[show + 1 :])
