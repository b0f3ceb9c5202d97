"""Fixtures of the training tests, built once per test process (each is read or copied, never
changed): a small corpus, an uninterrupted run to compare against, and
checkpoints (good and damaged) of it; shared by the failure, interrupt and damaged-file tests."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch
from runs import (
    KILLER,
    WORDS,
    corrupt,
    finish,
    tiny_config,
    train_process,
    write_config,
)

from minitx.files.checkpoint import LAST


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """A small generated text corpus (train.txt, val.txt) and a token cache, built once per process."""
    directory = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    for name, lines in (("train.txt", 500), ("val.txt", 80)):
        text = "".join(" ".join(rng.choices(WORDS, k=rng.randint(3, 9))) + ".\n" for _ in range(lines))
        (directory / name).write_text(text)
    return {
        "train": directory / "train.txt",
        "val": directory / "val.txt",
        "cache": directory / "token-cache",
    }


@pytest.fixture(scope="session")
def killer_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("killer")
    (directory / "killer.py").write_text(KILLER)
    return directory


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory, corpus) -> Path:
    """The reference: the tiny run from start to end without a crash. Returns its run directory."""
    directory = tmp_path_factory.mktemp("uninterrupted")
    config = write_config(directory / "tiny.yaml", tiny_config(corpus, directory / "runs"))
    status, output = finish(train_process(config))
    assert status == 0, output[-3000:]
    return directory / "runs" / "tiny"


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory, uninterrupted) -> dict[str, Path]:
    """A good training checkpoint and bad files made from it (all built once)."""
    directory = tmp_path_factory.mktemp("checkpoints")
    good = directory / "good.ckpt"
    shutil.copy(uninterrupted / "checkpoints" / LAST, good)
    data = good.read_bytes()
    paths = {"good": good}

    def put(name: str, content: bytes) -> None:
        paths[name] = directory / f"{name}.ckpt"
        paths[name].write_bytes(content)

    put("truncated", data[: len(data) * 2 // 3])
    put("corrupted header", corrupt(data, 0))
    put("corrupted pickle", corrupt(data, data.index(b"data.pkl") + 60))  # inside the pickled dict
    put("random bytes", random.Random(1).randbytes(4096))
    put("empty", b"")
    put("text file", b"model:\n  n_layer: 1\n")
    torch.save({"weights": torch.zeros(3)}, directory / "foreign.ckpt")
    paths["foreign"] = directory / "foreign.ckpt"
    paths["a directory"] = directory / "a-directory"
    paths["a directory"].mkdir()
    paths["missing"] = directory / "missing.ckpt"

    checkpoint = torch.load(good, weights_only=True)
    # Generation-only file: weights and the minitx entry, no optimiser or loop state.
    torch.save(
        {"state_dict": checkpoint["state_dict"], "minitx": checkpoint["minitx"]},
        directory / "weights_only.ckpt",
    )
    paths["weights only"] = directory / "weights_only.ckpt"
    other = {
        **checkpoint,
        "minitx": {
            **checkpoint["minitx"],
            "model_config": {**checkpoint["minitx"]["model_config"], "d_model": 64},
        },
    }
    torch.save(other, directory / "other_shape.ckpt")
    paths["other shape"] = directory / "other_shape.ckpt"
    chars = checkpoint["minitx"]["tokenizer"]["chars"]
    bigger = {
        **checkpoint,
        "minitx": {**checkpoint["minitx"], "tokenizer": {"kind": "char", "chars": chars + "XYZ"}},
    }
    torch.save(bigger, directory / "bigger_vocabulary.ckpt")
    paths["bigger vocabulary"] = directory / "bigger_vocabulary.ckpt"
    return paths
