"""run.tensorboard: TensorBoard event files beside the CSV logs, holding the same scalars."""

from __future__ import annotations

import pytest
from helpers import metrics
from runs import tiny_config, write_config
from tensorboard.backend.event_processing import event_accumulator

from minitx.cli import train_main
from minitx.training.run import RunSettings, trainer_arguments


def scalars(directory) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of the TensorBoard event files in directory."""
    events = event_accumulator.EventAccumulator(str(directory), size_guidance={event_accumulator.SCALARS: 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def test_a_run_with_tensorboard_writes_the_csv_logs_scalars(tmp_path, corpus):
    config = tiny_config(corpus, tmp_path / "runs", run={"tensorboard": True})
    config["trainer"].update(max_steps=12, val_check_interval=6)
    assert train_main(["--config", str(write_config(tmp_path / "tiny.yaml", config))]) == 0
    run = tmp_path / "runs" / "tiny"
    logs = run / "logs" / "version_0"
    assert list(logs.glob("events.out.tfevents.*")) and not (run / "logs" / "version_1").exists()

    written = scalars(logs)
    assert {"train_loss", "lr", "val_loss", "val_ppl"} <= set(written)
    train_loss, val_loss = metrics(run)
    assert sorted(written["train_loss"]) == sorted(train_loss) == list(range(12))
    assert sorted(written["lr"]) == list(range(12))
    assert sorted(written["val_loss"]) == sorted(val_loss) == [5, 11]
    for step, value in val_loss.items():
        assert written["val_loss"][step] == pytest.approx(value, rel=1e-6)
    for step, value in train_loss.items():
        assert written["train_loss"][step] == pytest.approx(value, rel=1e-6)


def test_tensorboard_is_off_by_default(tmp_path):
    loggers = trainer_arguments(RunSettings(root=str(tmp_path)), {})["logger"]
    assert [type(logger).__name__ for logger in loggers] == ["CSVLogger"]
    loggers = trainer_arguments(RunSettings(root=str(tmp_path), tensorboard=True), {})["logger"]
    assert [type(logger).__name__ for logger in loggers] == ["CSVLogger", "TensorBoardLogger"]
