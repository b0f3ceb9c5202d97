"""What a resumed run changes: the settings of this start that differ from those its checkpoint
was trained with, said in one line on stderr before training continues.

Resuming with another batch size, seed, learning rate or schedule is allowed (extending a run
with a larger trainer.max_steps is the common case), but the run is then no longer the run that
was interrupted: its losses will not equal an uninterrupted run's. So it is named, not refused.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from ..data.config import saved_data_section
from ..files.upgrade import upgrade_config
from . import optim
from .optim import DEFAULTS

# Where runs go and how they report may change freely; the model is compared by check_same_model.
IGNORED = ("run.", "ckpt_path", "config", "print_config", "model.") + tuple(
    f"trainer.{key}" for key in ("callbacks", "logger", "plugins", "enable_progress_bar", "default_root_dir")
)
# Every optimiser and schedule setting is compared (optim.Optimisation declares them), each
# optimiser's own included (model.optimizer_options.muon.lr, ...).
COMPARED_MODEL_KEYS = tuple(f"model.{key}" for key in DEFAULTS.by_key())

# Settings added after checkpoints were first written: one without them ran with these values.
ADDED_LATER = {f"model.{key}": DEFAULTS.by_key()[key] for key in optim.ADDED_LATER}


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(config, dict):
        return {prefix.rstrip("."): config}
    flat: dict[str, Any] = {}
    for key, value in config.items():
        flat.update(flatten(value, f"{prefix}{key}."))
    return flat


def changed_settings(saved: dict, current: dict) -> list[str]:
    """'key old -> new' for each compared setting that differs."""
    if isinstance(saved.get("data"), dict):  # in today's spelling, settings added since at their defaults
        saved = {**saved, "data": saved_data_section(saved["data"])}
    new = flatten(current)
    old = {**{k: v for k, v in ADDED_LATER.items() if k in new}, **flatten(saved)}
    keys = [k for k in sorted(set(old) | set(new)) if k in COMPARED_MODEL_KEYS or not k.startswith(IGNORED)]
    return [f"{key} {old.get(key)!r} -> {new.get(key)!r}" for key in keys if old.get(key) != new.get(key)]


def report_resume_changes(ckpt_path: str, current: dict) -> None:
    """One line on stderr if this start's settings differ from the checkpoint's run (nothing otherwise)."""
    # mmap: only the small pickled part is read; the CRCs were checked when the checkpoint was.
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
    saved = upgrade_config((checkpoint.get("minitx") or {}).get("train_config") or {})
    changes = changed_settings(saved, current) if saved else []
    if changes:
        print(
            f"minitx: resuming {ckpt_path} with settings that differ from its run: {', '.join(changes)}; "
            "the run continues with the new ones, so its losses will not equal an uninterrupted run's",
            file=sys.stderr,
        )
