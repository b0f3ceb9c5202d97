"""One run sharded with FSDP2 (`--trainer.strategy fsdp2`) on the CPU, gloo, 2 processes: the same
losses as one process (AdamW, and Muon with its whole-matrix Newton-Schulz, which a Muon that
orthogonalises each process's rows alone does not reach), two simulated nodes on 127.0.0.1,
exact resumption with every optimiser state entry saved, the tools reading its checkpoint, and
every attention kind's gradients equal to the unsharded model's. All slow: real processes."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from runs import REPO, WORDS, write_config

from minitx.cli import eval_main, export_main, generate_main
from minitx.training.module import MinitxLM
from minitx.training.optim import muon_matrix

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HERE = Path(__file__).parent
ADAMW_TOLERANCE = 1e-5
# Muon with float32 Newton-Schulz matches to about 5e-7; the wrong Muon drifts by about 8e-3.
MUON_TOLERANCE = 1e-4


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run_losses(out: Path, *args: str, **extra_env: str) -> list[float]:
    result = subprocess.run(
        [sys.executable, str(HERE / "sharded_run.py"), "--out", str(out), *args],
        env=env(**extra_env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())["losses"]


def largest_difference(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) == 20
    return max(abs(x - y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict[str, list[float]]:
    """The losses of 20 steps in one process, AdamW and Muon (float32 Newton-Schulz)."""
    directory = tmp_path_factory.mktemp("one")
    return {
        optimizer: run_losses(directory / f"{optimizer}.json", "--optimizer", optimizer)
        for optimizer in ("adamw", "muon")
    }


def test_adamw_sharded_over_two_processes_matches_one_process(tmp_path, one_process):
    two = run_losses(tmp_path / "two.json", "--devices", "2", "--optimizer", "adamw")
    assert largest_difference(two, one_process["adamw"]) < ADAMW_TOLERANCE


def test_muon_sharded_matches_one_process_and_a_muon_of_local_rows_does_not(tmp_path, one_process):
    two = run_losses(tmp_path / "two.json", "--devices", "2", "--optimizer", "muon")
    assert largest_difference(two, one_process["muon"]) < MUON_TOLERANCE
    wrong = run_losses(tmp_path / "wrong.json", "--devices", "2", "--optimizer", "muon", "--local-muon")
    assert largest_difference(wrong, one_process["muon"]) > 10 * MUON_TOLERANCE


def test_two_simulated_nodes_on_loopback_match_one_process(tmp_path, one_process):
    """Two nodes of one device each: two commands, NODE_RANK 0 and 1, meeting on 127.0.0.1."""
    port = free_port()
    nodes = [
        subprocess.Popen(
            [sys.executable, str(HERE / "sharded_run.py"), "--out", str(tmp_path / "nodes.json")]
            + ["--num-nodes", "2", "--optimizer", "muon"],
            env=env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=str(rank)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    saved = json.loads((tmp_path / "nodes.json").read_text())
    assert saved["rank"] == "0"  # written by node 0, the global rank 0
    assert largest_difference(saved["losses"], one_process["muon"]) < MUON_TOLERANCE


def corpus_config(directory: Path, name: str) -> Path:
    rng = random.Random(0)
    for part, lines in (("train.txt", 500), ("val.txt", 80)):
        path = directory / part
        if not path.exists():
            path.write_text(
                "".join(" ".join(rng.choices(WORDS, k=rng.randint(3, 9))) + ".\n" for _ in range(lines))
            )
    config = {
        "seed_everything": 7,
        "model": {"n_layer": 2, "n_head": 2, "d_model": 32, "block_size": 32, "optimizer": "muon"},
        "data": {
            "source": "files",
            "train_files": str(directory / "train.txt"),
            "val_files": str(directory / "val.txt"),
            "batch_size": 8,
            "val_batches": 2,
            "cache_dir": str(directory / "cache"),
        },
        "trainer": {
            "accelerator": "cpu",
            "devices": 2,
            "strategy": "fsdp2",
            "max_steps": 20,
            "val_check_interval": 10,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
        },
        "run": {"root": str(directory / "runs"), "name": name, "sample_tokens": 8, "keep_steps": [10]},
    }
    return write_config(directory / f"{name}.yaml", config)


def train_process(*args: str | Path) -> str:
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *map(str, args)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_train_command_sharded_resumes_exactly_with_every_state_entry(tmp_path):
    """train.py --trainer.strategy fsdp2: last.ckpt is one file with whole tensors; resumed from
    step 10, the run ends with the same weights and optimiser state, bit for bit, as the
    uninterrupted one; the tools read it."""
    out = train_process("--config", corpus_config(tmp_path, "whole"))
    assert out.count("final val loss") == 1 and "sample:" in out  # rank 0 only
    run = tmp_path / "runs" / "whole" / "checkpoints"
    resumed = tmp_path / "runs" / "resumed" / "checkpoints"
    resumed.mkdir(parents=True)
    (resumed / "step-10.ckpt").write_bytes((run / "step-0000010.ckpt").read_bytes())
    train_process("--config", corpus_config(tmp_path, "resumed"), "--ckpt_path", resumed / "step-10.ckpt")

    a = torch.load(run / "last.ckpt", weights_only=True)
    b = torch.load(resumed / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 20

    # The same keys and shapes as a one-process run's module, each weight whole.
    lm = MinitxLM(
        vocab_size=a["hyper_parameters"]["vocab_size"], n_layer=2, n_head=2, d_model=32, block_size=32
    )
    expected = lm.state_dict()
    assert {k: v.shape for k, v in a["state_dict"].items()} == {k: v.shape for k, v in expected.items()}
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key

    # Every optimiser state entry, counted: one per parameter of each part, whole.
    state = a["optimizer_states"][0]
    params = dict(lm.model.named_parameters())  # the tied output layer is the embedding: one entry
    n_muon = sum(muon_matrix(name, p) for name, p in params.items())
    assert len(state["muon"]["state"]) == n_muon == 2 * 4  # 4 matrices a block
    assert len(state["adamw"]["state"]) == len(params) - n_muon
    shapes = sorted(tuple(p.shape) for p in params.values())
    saved_shapes = sorted(
        tuple(entry[key].shape)
        for part, key in (("muon", "momentum_buffer"), ("adamw", "exp_avg"))
        for entry in state[part]["state"].values()
    )
    assert saved_shapes == shapes
    for part in ("adamw", "muon"):
        other = b["optimizer_states"][0][part]["state"]
        for index, entry in state[part]["state"].items():
            for name, value in entry.items():
                assert torch.equal(value, other[index][name]), (part, index, name)

    ckpt = str(run / "last.ckpt")
    assert generate_main(["--ckpt", ckpt, "--max-new-tokens", "4"]) == 0
    assert eval_main(["--ckpt", ckpt, "--files", str(tmp_path / "val.txt")]) == 0
    assert export_main(["--ckpt", ckpt, "--out", str(tmp_path / "exported")]) == 0


def test_every_kind_sharded_has_the_gradients_of_the_whole_model(tmp_path):
    port = free_port()
    ranks = [
        subprocess.Popen(
            [sys.executable, str(HERE / "sharded_kinds.py"), "--out", str(tmp_path / "kinds.json")],
            env=env(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [rank.communicate(timeout=600)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    results = json.loads((tmp_path / "kinds.json").read_text())
    assert len(results) == 12
    for name, result in results.items():
        assert result["missing"] == [], name
        assert result["loss_diff"] < 1e-5, (name, result)
        assert result["grad_diff"] < 1e-5 * max(1.0, result["grad_scale"]), (name, result)
