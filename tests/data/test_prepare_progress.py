"""prepare's progress: a tqdm bar on a terminal, plain lines every 15 s elsewhere."""

from __future__ import annotations

import io
import sys

from minitx.data.prepare import writing


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_off_a_terminal_plain_lines_every_15_seconds(monkeypatch, capsys):
    clock = Clock()
    monkeypatch.setattr(writing.time, "monotonic", clock)
    progress = writing._Progress(total_bytes=30_000_000, total_tokens=None, enabled=True)
    for _ in range(10):  # 3 MB every 5 s: a line at 15, 30 and 45 s, then the last one
        clock.now += 5.0
        progress.update(3_000_000, 3_000_000)
    progress.update(0, 0, final=True)
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.splitlines() == [
        "prepare: 9.0 MB of 30.0 (30%), 0.6 MB/s, 9,000,000 tokens, ETA 0:35",
        "prepare: 18.0 MB of 30.0 (60%), 0.6 MB/s, 18,000,000 tokens, ETA 0:20",
        "prepare: 27.0 MB of 30.0 (90%), 0.6 MB/s, 27,000,000 tokens, ETA 0:05",
        "prepare: 30.0 MB of 30.0 (100%), 0.6 MB/s, 30,000,000 tokens in 50.0 s",
    ]


def test_off_a_terminal_a_short_prepare_or_a_disabled_one_prints_nothing(monkeypatch, capsys):
    clock = Clock()
    monkeypatch.setattr(writing.time, "monotonic", clock)
    for enabled, seconds in ((True, 1.0), (False, 60.0)):
        progress = writing._Progress(total_bytes=None, total_tokens=None, enabled=enabled)
        clock.now += seconds
        progress.update(1000, 1000)
        progress.update(0, 0, final=True)
    assert capsys.readouterr().err == ""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_a_bar(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    progress = writing._Progress(total_bytes=4_000_000, total_tokens=None, enabled=True)
    progress.bar.delay = 0  # shown at once
    progress.update(2_000_000, 1_000)
    progress.update(2_000_000, 1_000)
    progress.update(0, 0, final=True)
    out = terminal.getvalue()
    assert "prepare: 100%" in out and "4.00M/4.00M" in out and "2,000 tokens" in out
