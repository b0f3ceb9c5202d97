"""`train --model.init_from CKPT`: a run starts from the weights of a minitx checkpoint
(minitx/training/init_from.py), at the same or a longer context, and a checkpoint of another
shape is refused in one line naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minitx.cli import train_main
from minitx.files.checkpoint import model_weights, read_checkpoint

# The induction task (no files to read), a model that trains 4 steps in a second.
BASE = [
    "--data.source", "induction",
    "--data.task.induction.vocab", "8",
    "--data.task.induction.length", "8",
    "--data.toy_train_size", "1000",
    "--data.toy_val_size", "16",
    "--data.batch_size", "4",
    "--model.n_layer", "1",
    "--model.n_head", "2",
    "--model.d_model", "16",
    "--model.block_size", "8",
    "--model.mlp", "none",
    "--trainer.accelerator", "cpu",
    "--trainer.devices", "1",
    "--trainer.max_steps", "4",
    "--trainer.val_check_interval", "4",
    "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false",
    "--run.sample_tokens", "0",
]  # fmt: skip


def trained(root: Path, positions: str) -> Path:
    """The last checkpoint of a 4-step run with `positions`."""
    status = train_main(
        [*BASE, "--model.positions", positions, "--run.root", str(root), "--run.name", positions]
    )
    assert status == 0
    return root / positions / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("init_from")
    return {positions: trained(root, positions) for positions in ("learned", "rope")}


def built_model(args: list[str]) -> torch.nn.Module:
    """The Transformer a train command line builds, before any step (TrainCLI does not fit)."""
    from minitx.training.command import TrainCLI

    return TrainCLI([*BASE, *args]).model.model


def saved_weights(path: Path) -> dict[str, torch.Tensor]:
    return model_weights(read_checkpoint(path, "test", ""))


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_the_run_starts_from_the_checkpoints_weights(checkpoints, positions):
    model = built_model(["--model.positions", positions, "--model.init_from", str(checkpoints[positions])])
    saved = saved_weights(checkpoints[positions])
    state = model.state_dict()
    assert set(state) == set(saved)
    for name, tensor in state.items():
        assert torch.equal(tensor, saved[name]), name
    # ...and not a fresh model's by chance:
    fresh = built_model(["--model.positions", positions]).state_dict()
    assert not torch.equal(fresh["tok_emb.weight"], saved["tok_emb.weight"])


def test_a_learned_position_table_is_extended_to_a_longer_run(checkpoints):
    longer = [
        "--model.positions",
        "learned",
        "--model.block_size",
        "20",
        "--data.task.induction.length",
        "20",
    ]
    model = built_model([*longer, "--model.init_from", str(checkpoints["learned"])])
    saved = saved_weights(checkpoints["learned"])
    table = model.state_dict()["pos_emb.weight"]
    assert table.shape == (20, 16)
    assert torch.equal(table[:8], saved["pos_emb.weight"])  # the trained rows, where they were
    # The rows past the checkpoint's are the run's own initialisation: a fresh run's, seed alike.
    fresh = built_model(longer).state_dict()["pos_emb.weight"]
    assert torch.equal(table[8:], fresh[8:])
    for name, tensor in model.state_dict().items():
        if name != "pos_emb.weight":
            assert torch.equal(tensor, saved[name]), name


def test_a_rope_run_at_a_longer_context_needs_nothing_and_trains(checkpoints, tmp_path, capsys):
    status = train_main(
        [
            *BASE,
            "--model.positions", "rope",
            "--model.block_size", "24",
            "--data.task.induction.length", "24",
            "--model.init_from", str(checkpoints["rope"]),
            "--run.root", str(tmp_path),
            "--run.name", "longer",
        ]
    )  # fmt: skip
    assert status == 0
    assert "init_from: weights of" in capsys.readouterr().out
    assert (tmp_path / "longer" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model.d_model", "32"], "model.d_model: is 32 but the model in model.init_from"),
        (["--model.positions", "rope"], "model.positions: is 'rope' but"),
        (
            ["--data.task.induction.vocab", "12"],
            "data.tokenizer: gives 12 tokens but the model in model.init_from",
        ),
        (
            ["--model.attention.kind", "mqa"],
            "model.attention: differs from that of the model in model.init_from",
        ),
    ],
)
def test_another_shape_is_refused_in_one_line_naming_the_setting(
    checkpoints, tmp_path, capsys, args, expected
):
    status = train_main(
        [
            *BASE,
            "--model.positions", "learned",
            "--model.init_from", str(checkpoints["learned"]),
            *args,
            "--run.root", str(tmp_path),
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2
    assert expected in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "tiny").exists() and not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("missing.ckpt", "no such file or directory; give a checkpoint written by train.py"),
        ("foreign.ckpt", "not a minitx checkpoint"),
    ],
)
def test_a_bad_source_is_refused_in_one_line(tmp_path, capsys, source, expected):
    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign.ckpt")
    status = train_main(
        [*BASE, "--model.init_from", str(tmp_path / source), "--run.root", str(tmp_path / "runs")]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert "model.init_from" in err and expected in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()
