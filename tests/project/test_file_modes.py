"""Files written atomically (minitx/files/atomic.py) get the mode a file written in place would have:
0o666 less the umask (644 under the usual 022), not mkstemp's private 600."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minitx.files.atomic import write_text_atomically

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not hasattr(os, "fchmod"), reason="POSIX file modes")
@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_an_atomic_write_has_the_umasks_mode(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        write_text_atomically(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == mode


@pytest.mark.skipif(not hasattr(os, "fchmod"), reason="POSIX file modes")
def test_make_speeches_says_what_it_wrote_with_the_usual_mode(tmp_path):
    out = tmp_path / "speeches.jsonl"
    done = subprocess.run(
        [sys.executable, "scripts/make_speeches.py", "--plays", "1", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=lambda: os.umask(0o022),
    )
    assert done.returncode == 0, done.stderr
    lines = out.read_text(encoding="utf-8").splitlines()
    assert done.stdout == f"make_speeches: wrote {len(lines):,} speeches of 1 play to {out}\n"
    assert out.stat().st_mode & 0o777 == 0o644
