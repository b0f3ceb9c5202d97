"""Helpers shared by test modules in several folders (training runs, tokenizers, exports)."""

from __future__ import annotations

import csv
from pathlib import Path


def metrics(run: Path, version: int = 0) -> tuple[dict[int, float], dict[int, float]]:
    """(train loss by step, val loss by step) from a run's CSV log."""
    with open(run / "logs" / f"version_{version}" / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    train_loss = {int(r["step"]): float(r["train_loss"]) for r in rows if r.get("train_loss")}
    val_loss = {int(r["step"]): float(r["val_loss"]) for r in rows if r.get("val_loss")}
    return train_loss, val_loss


def bpe_tokenizer():
    """A small byte-level BPE over accented text: tokens that end inside a character."""
    from minitx.data.tokenizer import train_bpe

    return train_bpe("héllo wörld, ça va? ✓ naïve café " * 20, vocab_size=270)


def export_model(tmp_path: Path, model, tokenizer, name: str = "hf") -> Path:
    """Export a minitx model through a checkpoint in the training format; returns the directory."""
    import torch

    from minitx.hf.export import export_checkpoint

    checkpoint = tmp_path / f"{name}.ckpt"
    torch.save(
        {
            "state_dict": {f"model.{key}": value for key, value in model.state_dict().items()},
            "minitx": {"format": 1, "model_config": model.config.to_dict(), "tokenizer": tokenizer.to_dict()},
        },
        checkpoint,
    )
    export_checkpoint(str(checkpoint), str(tmp_path / name), log=lambda _: None)
    return tmp_path / name


def load_quietly(directory: Path):
    """transformers' model of an exported directory (native classes only), without its chatter."""
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    finally:
        transformers.logging.set_verbosity(level)
        transformers.utils.logging.enable_progress_bar()
