"""Training progress: plain lines off a terminal, a bar in steps out of max_steps on one."""

from __future__ import annotations

import io
import re
from pathlib import Path
from types import SimpleNamespace

import torch
from runs import tiny_config, write_config

from minitx.cli import train_main
from minitx.training import progress
from minitx.wording import duration


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
    steps = [line for line in out.splitlines() if line.startswith("minitx: step ")]
    lines = [line for line in steps if "val loss" not in line]
    assert [re.match(r"minitx: step (\d+)/12 ", line).group(1) for line in lines] == ["4", "8", "12"]
    # Each validation of the fit (val_check_interval 6) has its line; the sanity check has none.
    validations = [line for line in steps if "val loss" in line]
    assert [re.match(r"minitx: step (\d+)/12 ", line).group(1) for line in validations] == ["6", "12"]
    assert re.fullmatch(
        r"minitx: step 6/12 \(50%\), val loss \d+\.\d{4} \(perplexity \d+\.\d\d\)", validations[0]
    )
    final = re.search(r"final val loss (\d+\.\d{4})", out).group(1)
    assert f"val loss {final} " in validations[-1]  # the last step's validation is the final one
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
    assert "Epoch" not in out and "v_num" not in out
    # No step lines beside the bar; each validation's line is written above it.
    steps = [line for line in out.splitlines() if line.startswith("minitx: step ")]
    assert [re.match(r"minitx: step (\d+)/12 \(\d+%\), val loss ", line).group(1) for line in steps] == [
        "6",
        "12",
    ]


class FakeTrainer(SimpleNamespace):
    """What the progress lines read of a Trainer, stepped by hand."""

    def __init__(self, max_steps: int, val_check_interval: int):
        super().__init__(
            global_step=0,
            max_steps=max_steps,
            val_check_interval=val_check_interval,
            limit_val_batches=1.0,
            accumulate_grad_batches=1,
            log_every_n_steps=10,
            is_global_zero=True,
            sanity_checking=False,
            state=SimpleNamespace(fn="fit"),
            callback_metrics={},
            progress_bar_metrics={},
        )


def seconds(eta: str) -> int:
    """'6m40s' -> 400, '1h02m' -> 3720, '45s' -> 45: wording.duration read back."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", eta)
    hours, minutes, secs = (int(part or 0) for part in parts.groups())
    return 3600 * hours + 60 * minutes + secs


def test_the_eta_follows_the_recent_pace_and_counts_the_validations_ahead(monkeypatch):
    """A fake clock: 100 steps at 1 s, then the machine slows to 10 s a step. The ETA takes the
    new pace within a few lines (the mean since the start would say less than half the time
    left); a validation's time is counted once per validation ahead, not spread over the steps;
    the first step (compile, first batches) is left out."""
    monkeypatch.setattr(progress, "MIN_SECONDS_BETWEEN_LINES", 0.0)
    clock = [0.0]
    out = io.StringIO()
    lines = progress.StepProgressLines(stream=out, clock=lambda: clock[0])
    trainer = FakeTrainer(max_steps=300, val_check_interval=100)

    def run(steps: int, seconds_each: float) -> None:
        for _ in range(steps):
            clock[0] += seconds_each
            trainer.global_step += 1
            lines.on_train_batch_end(trainer, None, None, None, 0)

    def validate(took: float, loss: float) -> None:
        lines.on_validation_start(trainer, None)
        clock[0] += took
        trainer.callback_metrics["val_loss"] = torch.tensor(loss)
        lines.on_validation_end(trainer, None)

    def last_eta() -> int:
        return seconds(re.search(r"ETA (\S+)$", out.getvalue().splitlines()[-1]).group(1))

    lines.on_train_start(trainer, None)
    run(1, 60.0)  # the first step: a minute of compiling, which no later step repeats
    run(49, 1.0)
    assert last_eta() == 250 + 3 * 0  # 250 steps at 1 s; no validation timed yet
    run(50, 1.0)
    validate(took=40.0, loss=2.0)
    assert out.getvalue().splitlines()[-1] == "minitx: step 100/300 (33%), val loss 2.0000 (perplexity 7.39)"
    run(10, 1.0)
    assert last_eta() == 190 + 2 * 40  # the validations at 200 and 300 ahead, the pause not in the pace
    run(40, 10.0)  # the machine slows down at step 110
    eta, truth = last_eta(), 150 * 10 + 2 * 40
    mean_since_start = (clock[0] - 40.0) / 150 * 150 + 2 * 40
    assert 0.9 * truth <= eta <= 1.02 * truth, (eta, truth)
    assert mean_since_start < 0.6 * truth  # what the ETA said before: a third of the time left


def test_durations_read_as_a_clock():
    assert [duration(s, compact=True) for s in (4.4, 65, 3725)] == ["4s", "1m05s", "1h02m"]
