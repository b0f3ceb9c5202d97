"""The ablate command line as one SweepRequest (minitx/ablation/request.py): its choices checked
against one another before the sweep file is read, then read alike by both kinds of sweep."""

from __future__ import annotations

from pathlib import Path

import pytest

from minitx.ablation.command import parse_args
from minitx.ablation.request import make_request
from minitx.errors import UserError


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--force", "--report-only"], "--force: replaces the sweep in --output before it runs again"),
        (["--baseline", "gqa"], "--baseline: only with --report-only"),
        (["--report-only", "--from-csv", "x.csv"], "--from-csv: give --output DIR"),
        (["--seeds", "0"], "--seeds: must be 1 or more, got 0"),
        (["--parallel", "2", "--launcher", "slurm"], "--parallel: runs on this machine at once"),
        (["--slurm-time", "5"], "--slurm-time: only with --launcher slurm"),
        (["--devices-per-run", "2", "--", "--trainer.devices=2"], "--devices-per-run: sets --trainer.devices"),
    ],
)  # fmt: skip
def test_contradictory_choices_are_refused_in_one_line_before_the_sweep_file_is_read(
    tmp_path, monkeypatch, flags, message
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as caught:
        make_request(parse_args(["--config", "no_such_sweep.yaml", *flags]))
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_a_request_holds_what_both_kinds_of_sweep_read():
    request = make_request(
        parse_args(
            ["--config", "configs/ablation.yaml", "--devices-per-run", "2", "--wandb", "--", "--x", "1"]
        )
    )
    assert request.output == Path("runs/ablation/ablation") and request.title == "Ablation: ablation.yaml"
    assert request.extra == ("--x", "1", "--trainer.devices", "2")  # K GPUs a run: K devices in its trainer
    assert request.logging[-2:] == ["--run.wandb_group", "ablation"] and request.trains
