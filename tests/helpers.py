"""Helpers shared by the test modules that train (test_training.py, test_reliability.py)."""

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
