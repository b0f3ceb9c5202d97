"""Every run ends with best.ckpt and last.ckpt, best.ckpt judged against the final weights too,
and a checkpoint path that does not exist is answered with the checkpoints that do."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import metrics
from runs import tiny_config, write_config

from minitx.cli import generate_main, train_main
from minitx.files.checkpoint import existing_checkpoints


def _train(tmp_path: Path, corpus: dict, name: str, steps: int, val_every: int) -> Path:
    config = tiny_config(
        corpus,
        tmp_path / "runs",
        trainer={"max_steps": steps, "val_check_interval": val_every},
        run={"name": name, "checkpoint_every_n_steps": 0},
    )
    assert train_main(["--config", str(write_config(tmp_path / f"{name}.yaml", config))]) == 0
    return tmp_path / "runs" / name


def test_the_last_step_is_validated_and_can_become_best(tmp_path, corpus, capfd):
    # Validation at step 8 and, because the run ends there, at step 12: the tiny model still
    # learns fast, so the final weights are the best ones and best.ckpt must hold them.
    run = _train(tmp_path, corpus, "ends-off-interval", steps=12, val_every=8)
    _, val_loss = metrics(run)
    assert sorted(val_loss) == [7, 11]  # the CSV log counts steps from 0
    assert val_loss[11] < val_loss[7]
    best = torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)
    assert best["global_step"] == 12
    assert best["callbacks"]["RunCheckpoints"]["best_score"] == pytest.approx(val_loss[11], rel=1e-5)
    out = capfd.readouterr().out
    assert f"final val loss {val_loss[11]:.4f}" in out


def test_a_run_shorter_than_the_validation_interval_writes_both_files(tmp_path, corpus):
    run = _train(tmp_path, corpus, "short", steps=4, val_every=250)
    for name in ("last.ckpt", "best.ckpt"):
        assert torch.load(run / "checkpoints" / name, weights_only=True)["global_step"] == 4


def test_a_missing_checkpoint_names_those_that_exist(tmp_path, capfd):
    checkpoints = tmp_path / "runs" / "mqar" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "last.ckpt").write_bytes(b"")
    (checkpoints / "step-0000010.ckpt").write_bytes(b"")

    assert generate_main(["--ckpt", str(checkpoints / "best.ckpt"), "--max-new-tokens", "1"]) == 2
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "best.ckpt: no such file" in err and "holds last.ckpt, step-0000010.ckpt" in err

    # A wrong run name: the checkpoints of the runs that exist under the nearest directory.
    hint = existing_checkpoints(tmp_path / "runs" / "mqr" / "checkpoints" / "best.ckpt")
    assert "exist under" in hint and str(checkpoints / "last.ckpt") in hint
    assert "holds no checkpoint" in existing_checkpoints(tmp_path / "runs" / "mqar" / "best.ckpt")
