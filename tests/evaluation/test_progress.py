"""evaluate's progress: a tqdm bar per stage on a terminal, plain lines after a while elsewhere."""

from __future__ import annotations

import io

from minitx.evaluation import progress as progress_module
from minitx.evaluation.progress import QUIET_SECONDS, Progress


def test_off_a_terminal_plain_lines_once_it_has_run_for_a_while(monkeypatch, capsys):
    now = [0.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    progress = Progress(None)  # on a terminal only: capsys's stderr is not one
    progress.stage("loss at context 256")
    for done in range(1, 7):
        now[0] += QUIET_SECONDS / 2
        progress(done, 6)
    progress.stage("length sweep")
    progress(1, 1)  # done, after the quiet start: a line
    progress.close()
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.splitlines() == [
        "loss at context 256: 2/6 windows (33%), 10 s",
        "loss at context 256: 4/6 windows (66%), 20 s",
        "loss at context 256: 6/6 windows (100%), 30 s",
        "length sweep: 1/1 windows (100%), 30 s",
    ]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_a_bar_per_stage_cleared_at_the_end():
    terminal = Terminal()
    progress = Progress(None, stream=terminal)
    for label in ("loss at context 16", "length sweep"):
        progress.stage(label)
        for done in range(1, 4):
            progress(done, 3)
    progress.close()
    out = terminal.getvalue()
    assert "\rloss at context 16:" in out and "\rlength sweep:" in out and "/3 [" in out
    assert out.endswith("\r")  # the last bar is cleared (leave=False)


def test_disabled_prints_nothing():
    progress = Progress(False, stream=Terminal())
    progress.stage("length sweep")(1, 1)
    progress.close()
    assert progress.stream.getvalue() == ""
