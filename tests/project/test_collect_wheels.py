"""scripts/collect_wheels.py: what it keeps from the target's package list and what it collects.

The collection itself needs an index (it was checked by hand: docs/install.md, "Install without internet");
these tests cover the decisions around it, which need none.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "collect_wheels.py"


@pytest.fixture(scope="module")
def collect():
    spec = importlib.util.spec_from_file_location("collect_wheels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_target_list_is_read_by_canonical_name(collect, tmp_path):
    have = tmp_path / "have.txt"
    have.write_text(
        "torch==2.11.0+cu128\nTyping_Extensions==4.12.2\n-e git+https://x/y#egg=z\n# comment\nnumpy==2.1.3\n"
    )
    assert collect.read_have(have) == {
        "torch": "2.11.0+cu128",
        "typing-extensions": "4.12.2",
        "numpy": "2.1.3",
    }


def test_only_packages_the_target_lacks_are_collected(collect):
    report = {
        "install": [
            {"metadata": {"name": "torch", "version": "2.11.0"}},
            {"metadata": {"name": "Lightning", "version": "2.6.0"}},
            {"metadata": {"name": "numpy", "version": "2.2.0"}},
            {"metadata": {"name": "minitx", "version": "0.1.0"}},
        ]
    }
    have = {"torch": "2.11.0", "numpy": "2.1.3"}
    # torch is there at that version; numpy at another one (pip would replace it); minitx is built
    assert collect.wanted(report, have) == [("lightning", "2.6.0"), ("numpy", "2.2.0")]


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--python-version", "312"], "--python-version"),
        (["--have", "missing.txt"], "--have"),
        (["--extras", "gpu"], "--extras"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(tmp_path, args, flag):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "w"), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and flag in done.stderr, done.stderr
    assert not (tmp_path / "w").exists()
