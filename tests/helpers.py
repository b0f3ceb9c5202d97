"""Helpers shared by test modules in several folders (training runs, tokenizers)."""

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
