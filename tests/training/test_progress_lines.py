"""Training progress: plain lines off a terminal, a bar in steps out of max_steps on one."""

from __future__ import annotations

import io
import re
from pathlib import Path

from runs import tiny_config, write_config

from minitx.cli import train_main
from minitx.training import progress


def _config(tmp_path: Path, corpus: dict, name: str, **trainer) -> str:
    config = tiny_config(
        corpus,
        tmp_path / "runs",
        trainer={"max_steps": 12, "val_check_interval": 6, "log_every_n_steps": 4, **trainer},
        run={"name": name, "checkpoint_every_n_steps": 0},
    )
    return str(write_config(tmp_path / f"{name}.yaml", config))


def test_off_a_terminal_training_prints_plain_lines_every_n_steps(tmp_path, corpus, capfd, monkeypatch):
    monkeypatch.setattr(progress, "MIN_SECONDS_BETWEEN_LINES", 0.0)
    config = _config(tmp_path, corpus, "lines", enable_progress_bar=True)
    assert train_main(["--config", config]) == 0
    out = capfd.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("minitx: step ")]
    assert [re.match(r"minitx: step (\d+)/12 ", line).group(1) for line in lines] == ["4", "8", "12"]
    assert re.fullmatch(
        r"minitx: step 8/12 \(66%\), loss \d+\.\d{4}, [\d,]+ tokens/s, elapsed \d+s, ETA \d+s", lines[1]
    )
    assert "ETA" not in lines[-1]  # nothing is left at the last step
    assert "\r" not in out and "v_num" not in out

    # The bar off means no lines either, as it means no Lightning bar.
    assert train_main(["--config", _config(tmp_path, corpus, "quiet", enable_progress_bar=False)]) == 0
    assert "minitx: step" not in capfd.readouterr().out


def test_on_a_terminal_the_bar_counts_steps_out_of_max_steps(tmp_path, corpus, capfd):
    terminal = io.StringIO()
    terminal.isatty = lambda: True
    assert isinstance(progress.progress_callback(terminal), progress.StepProgressBar)
    assert isinstance(progress.progress_callback(io.StringIO()), progress.StepProgressLines)

    config = _config(tmp_path, corpus, "bar", enable_progress_bar=True)
    args = ["--config", config, "--trainer.callbacks+=minitx.training.progress.StepProgressBar"]
    assert train_main(args) == 0
    out = capfd.readouterr().out
    assert re.search(r"train: +100%\|[^|]*\| 12/12 \[\d\d:\d\d<00:00", out), out[-2000:]
    assert "train_loss=" in out
    assert "Epoch" not in out and "v_num" not in out and "minitx: step" not in out


def test_durations_read_as_a_clock():
    assert [progress.duration(s) for s in (4.4, 65, 3725)] == ["4s", "1m05s", "1h02m"]
