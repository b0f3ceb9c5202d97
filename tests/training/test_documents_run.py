"""data.documents: a record file of many short documents trains with attention kept inside each
document (the model's document_token is the tokenizer's end-of-text), and data without documents
to mark is refused in one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import yaml

from minitx.cli import train_main
from minitx.data.datamodule import TextDataModule
from minitx.data.tokenizer import tokenizer_from_dict
from minitx.documents import Documents

WORDS = "once there was a small cat who liked the sun and a big dog who did not".split()


@pytest.fixture(scope="module")
def stories(tmp_path_factory) -> Path:
    """Many short documents, TinyStories-like, one per JSON line."""
    path = tmp_path_factory.mktemp("stories") / "stories.jsonl"
    rng = random.Random(0)
    lines = [
        json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randint(4, 20))) + "."}) for _ in range(600)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def module(stories: Path, tmp_path: Path, **overrides) -> TextDataModule:
    settings = dict(
        source="files",
        train_files=str(stories),
        val_fraction=0.1,
        tokenizer="bpe",
        bpe_vocab_size=300,
        block_size=64,
        batch_size=4,
        val_batches=2,
        documents=True,
        cache_dir=str(tmp_path / "cache"),
    )
    return TextDataModule(**{**settings, **overrides})


def test_windows_hold_several_documents_marked_by_end_of_text(stories, tmp_path):
    dm = module(stories, tmp_path)
    dm.setup()
    assert dm.document_token == dm.tokenizer.eos_id is not None
    x, _ = next(iter(dm.train_dataloader()))
    docs = Documents.of(x, dm.document_token)
    # Short stories: every window holds a start, and a token's document begins at its latest start.
    assert all(len(pieces) >= 2 for pieces in docs.pieces())
    for row, starts in zip(x, docs.starts):
        marks = (row == dm.document_token).nonzero().flatten().tolist()
        assert all(starts[i] == max([m for m in marks if m <= i], default=0) for i in range(len(row)))


def test_documents_without_an_end_of_text_token_are_refused(stories, tmp_path):
    with pytest.raises(ValueError, match="data.documents: the char tokenizer has no end-of-text token"):
        module(stories, tmp_path, tokenizer="char").document_token  # noqa: B018
    with pytest.raises(ValueError, match="data.documents: the mqar task puts one sample in each row"):
        TextDataModule(source="mqar", documents=True).document_token  # noqa: B018


def test_train_command_sets_the_models_document_token(stories, tmp_path):
    config = {
        "seed_everything": 3,
        "model": {"n_layer": 1, "n_head": 2, "d_model": 32, "block_size": 64, "warmup_steps": 2},
        "data": {
            "source": "files",
            "train_files": str(stories),
            "val_fraction": 0.1,
            "tokenizer": "bpe",
            "bpe_vocab_size": 300,
            "documents": True,
            "batch_size": 4,
            "val_batches": 2,
            "cache_dir": str(tmp_path / "cache"),
        },
        "trainer": {
            "max_steps": 6,
            "val_check_interval": 3,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
        },
        "run": {"name": "docs", "root": str(tmp_path / "runs"), "sample_tokens": 10},
    }
    path = tmp_path / "docs.yaml"
    path.write_text(yaml.safe_dump(config))
    assert train_main(["--config", str(path)]) == 0
    ckpt = torch.load(tmp_path / "runs" / "docs" / "checkpoints" / "last.ckpt", weights_only=True)
    saved = ckpt["minitx"]
    eos = tokenizer_from_dict(saved["tokenizer"]).eos_id
    assert saved["model_config"]["document_token"] == eos is not None
