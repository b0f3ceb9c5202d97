"""benchmarks/data.py: its memory sampler counts a process tree, its corpora, and its --tiny run's tables.

Nothing is timed here: the benchmark's figures come from running it (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MB = 10**6


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("benchmark_data", REPO / "benchmarks" / "data.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table's body rows (not headers, not separators)."""
    lines = text.splitlines()
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line, below in zip(lines, lines[1:] + [""])
        if line.startswith("|") and not line.startswith("|--") and not below.startswith("|--")
    ]


# A child that allocates (and touches) 200 MB, says so, and waits to be told to exit.
ALLOCATE = "import sys; b = bytearray(b'x') * (200 * 10**6); print('ready', flush=True); sys.stdin.read()"


def test_pss_sampler_counts_a_child_process(bench):
    own = bench.tree_pss_bytes(os.getpid())
    assert own > 10 * MB  # a Python process with pytest loaded
    assert bench.pss_bytes(2**22 + 12345) == 0  # no such process: no error, no memory
    child = subprocess.Popen(
        [sys.executable, "-c", ALLOCATE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        assert child.pid in bench.tree_pids(os.getpid())
        with_child = bench.tree_pss_bytes(os.getpid())
        assert with_child - own > 180 * MB, (own, with_child)
        sampler = bench.TreeMemorySampler(child.pid, interval=0.01).start()
        time.sleep(0.1)
        sampler.stop()
        assert sampler.samples and 180 * MB < sampler.peak_bytes < 1000 * MB, sampler.samples
    finally:
        child.communicate(input="", timeout=30)
    assert child.pid not in bench.tree_pids(os.getpid())
    assert bench.pss_bytes(child.pid) == 0  # exited: reads as nothing, never raises


def test_sampler_follows_grandchildren(bench):
    # The benchmark's commands start workers of their own: a grandchild's memory must count too.
    outer = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {ALLOCATE!r}])"
    child = subprocess.Popen(
        [sys.executable, "-c", outer], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        assert len(bench.tree_pids(child.pid)) == 2
        assert bench.tree_pss_bytes(child.pid) > 180 * MB
    finally:
        child.communicate(input="", timeout=30)


def test_run_measured_records_wall_time_memory_and_marker(bench, tmp_path):
    program = "import time; print('hello'); time.sleep(0.3); print('go now'); b = bytearray(b'x') * (50 * 10**6); time.sleep(0.3)"
    result = bench.run_measured("t", [sys.executable, "-c", program], tmp_path / "t.log", marker="go")
    assert result.ok and result.wall_s > 0 and result.marker_s is not None
    assert result.marker_s < result.wall_s
    assert result.peak_mb > 50
    assert "hello" in (tmp_path / "t.log").read_text()
    failed = bench.run_measured("f", [sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "f.log")
    assert failed.returncode == 3 and not failed.ok
    slow = [sys.executable, "-c", "import time; time.sleep(60)"]
    stopped = bench.run_measured("s", slow, tmp_path / "s.log", interrupt_after=0.5)
    assert stopped.interrupted and stopped.returncode != 0
    assert (tmp_path / "s.pss.tsv").read_text().startswith("seconds\tpss_mb")


def test_interrupt_stops_a_command_started_with_sigint_ignored(bench, tmp_path):
    """A test run in the background (nohup python -m pytest &) starts with SIGINT ignored, which
    its children inherit: the benchmark's SIGINT must still stop the command it measures."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        slow = [sys.executable, "-c", "import time; time.sleep(60)"]
        stopped = bench.run_measured("s", slow, tmp_path / "s.log", interrupt_after=0.5)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stopped.interrupted and stopped.returncode == -signal.SIGINT and stopped.wall_s < 30


def test_sizes_and_corpus(bench, tmp_path):
    assert bench.parse_size("100MB") == 100 * MB and bench.parse_size("4GB") == 4 * 10**9
    assert bench.parse_size("1.5mb") == 1_500_000 and bench.parse_size("2048") == 2048
    assert [bench.size_label(s) for s in (100 * MB, 10**9, 4 * 10**9, 1_500_000)] == [
        "100MB",
        "1GB",
        "4GB",
        "1.5MB",
    ]
    lines = [f"line {i} of the text\n" for i in range(100)]
    path = bench.make_corpus(tmp_path / "c.txt", 10_000, lines=lines)
    text = path.read_text()
    assert 10_000 <= len(text) < 10_000 + 30 and text.endswith("\n")
    assert set(text.splitlines(keepends=True)) == set(lines)  # whole lines, all of them
    assert text.splitlines(keepends=True)[:100] != lines  # shuffled
    again = bench.make_corpus(tmp_path / "d.txt", 10_000, lines=lines)
    assert again.read_text() == text  # a fixed seed
    path.write_text("reused")
    assert bench.make_corpus(path, 10_000, lines=lines).read_text() == "reused"


@pytest.mark.slow
def test_tiny_benchmark_prints_every_table(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "data.py"), "--tiny", "--work", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout)
    main = {tuple(row[:3]): row for row in rows if len(row) == 7}
    steps = {key[:2] + (key[2].split(" (")[0],) for key in main}
    expected = {("shakespeare", "char", "prepare"), ("shakespeare", "char", "start")}
    expected |= {("1MB", "char", "prepare"), ("1MB", "char", "start"), ("1MB", "char", "train")}
    expected |= {("1MB", "bpe", "prepare"), ("1MB", "bpe", "start")}
    assert expected <= steps, main.keys()
    for row in main.values():
        assert float(row[3]) > 0  # wall s
        assert 10 < float(row[5]) < 100_000  # peak PSS MB of a Python process tree
        assert row[6] in ("yes", "no")
    assert [row for row in rows if row[0] == "1MB" and len(row) == 8]  # the BPE comparison
    assert [row for row in rows if row[0] == "1MB - shakespeare"]  # the start comparison
    memory = [row for row in rows if row[0] == "1MB" and len(row) == 10]  # memory over a long run
    assert memory and all(float(cell) > 10 for cell in memory[0][4:8])
    assert not (tmp_path / "runs").exists() and not list(tmp_path.glob("cache-*"))  # cleaned up
    assert (tmp_path / "corpus-1MB.txt").stat().st_size >= MB  # kept for the next run
