"""Checks that a run can resume from a checkpoint, made before the run writes anything, and what
a resumed run changes: the settings of this start that differ from those its checkpoint was
trained with, said in one line on stderr before training continues.

Resuming with another batch size, seed, learning rate or schedule is allowed (extending a run
with a larger trainer.max_steps is the common case), but the run is then no longer the run that
was interrupted: its losses will not equal an uninterrupted run's. So it is named, not refused.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from ..config import ModelConfig
from ..data.config import saved_data_section
from ..data.tokenizer import tokenizer_from_dict
from ..errors import UserError
from ..files.checkpoint import BEST, LAST, existing_checkpoints, read_checkpoint, state_mismatch
from ..files.upgrade import upgrade_checkpoint, upgrade_config
from .optim import ADDED_LATER, DEFAULTS, optimizer_of_state


def resolve_ckpt_path(value: str | None, checkpoint_dir: Path) -> str | None:
    """--ckpt_path as a file: 'last' and 'best' name the files in the run's `checkpoint_dir`."""
    if value is None:
        return None
    if value in ("last", "best"):
        path = checkpoint_dir / (LAST if value == "last" else BEST)
        if not path.is_file():
            raise UserError(
                f"ckpt_path: {value!r} means {str(path)!r}, which does not exist; start the run without --ckpt_path or set run.name/run.root"
            )
        return str(path)
    if Path(value).is_dir():
        raise UserError(
            f"ckpt_path: {value!r} is a directory; give the .ckpt file inside it (a run keeps them in checkpoints/), 'last' or 'best'"
        )
    if not Path(value).is_file():
        nearby = existing_checkpoints(value)
        raise UserError(
            f"ckpt_path: no checkpoint at {value!r}; give a .ckpt file, 'last' or 'best'"
            + (f" ({nearby})" if nearby else "")
        )
    return value


def check_resume_checkpoint(path: str, config: ModelConfig, state_dict: dict, tokenizer: Any) -> str:
    """Refuse a checkpoint that a run of model `config` (with weights shaped as `state_dict`) and
    data `tokenizer` cannot resume from.

    Lightning would find these only inside fit, after the run directory, its config.yaml and a
    new log version were written, and some (weights of other shapes, a weights-only file) only as
    a traceback. Read with weights_only=True like every load; fit reads the file again.
    """
    where = f"ckpt_path: {path!r}"
    checkpoint = read_checkpoint(path, where, "give last.ckpt or best.ckpt of a run")
    saved = checkpoint["minitx"]
    missing = [
        key for key in ("optimizer_states", "lr_schedulers", "loops", "global_step") if key not in checkpoint
    ]
    if missing:
        raise UserError(
            f"{where} holds weights but no training state ({', '.join(missing)} missing), so training cannot resume "
            "from it; give last.ckpt of the run, or start a new run without --ckpt_path"
        )
    if saved.get("tokenizer") != tokenizer.to_dict():
        raise UserError(
            f"data.tokenizer: the checkpoint {path!r} was trained with another tokenizer or vocabulary "
            f"({tokenizer_difference(saved.get('tokenizer'), tokenizer)}); resume with the data settings of the original run"
        )
    check_same_model(saved, config)
    if mismatch := state_mismatch(state_dict, checkpoint["state_dict"]):
        raise UserError(
            f"{where}: its weights do not match its model config ({mismatch}); the file is damaged or was edited"
        )
    # The model.optimizer it was written with, read from its optimiser state (each optimiser in
    # optim.OPTIMIZERS says which states are its own); older checkpoints are AdamW's.
    return optimizer_of_state((checkpoint.get("optimizer_states") or [None])[0])


def check_same_model(saved: dict, config: ModelConfig) -> None:
    """A run resumes only into the model it saved: `saved` is a checkpoint's "minitx" entry."""
    stored = upgrade_checkpoint(saved, "ckpt_path").get("model_config") or {}
    try:  # in today's spelling, fields added since at their defaults
        stored = ModelConfig.from_dict(stored).to_dict()
    except (TypeError, ValueError):
        pass  # compared as it is: the difference names the field
    if diff := dict_diff(stored, config.to_dict()):
        raise UserError(
            f"ckpt_path: the checkpoint's model differs from the configured one ({diff}); resume with the same model settings"
        )


def dict_diff(old: dict, new: dict, prefix: str = "") -> str:
    """The first key (dotted) whose value differs between two nested dicts, in words; '' if none."""
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            if found := dict_diff(a, b, f"{prefix}{key}."):
                return found
        elif a != b:
            return f"{prefix}{key}: checkpoint {a!r}, config {b!r}"
    return ""


def tokenizer_difference(saved: Any, current: Any) -> str:
    """What differs between a checkpoint's tokenizer (its to_dict) and the data's, in a few words."""
    try:
        old = tokenizer_from_dict(saved)
    except Exception:
        return "the checkpoint's tokenizer cannot be rebuilt"
    if getattr(old, "chars", None) is not None and getattr(current, "chars", None) is not None:
        parts = [f"{len(old.chars)} characters then, {len(current.chars)} now"]
        then, now = set(old.chars), set(current.chars)
        for what, chars in (("new", now - then), ("gone", then - now)):
            if chars:
                shown = " ".join(repr(ch) for ch in sorted(chars)[:10])
                parts.append(f"{what}: {shown}" + (" ..." if len(chars) > 10 else ""))
        return ", ".join(parts)
    if old.vocab_size != current.vocab_size:
        return f"vocabulary of {old.vocab_size} tokens then, {current.vocab_size} now"
    return f"same size ({old.vocab_size} tokens), different tokens"


# -- what a resumed run changes ----------------------------------------------------------------

# Where runs go and how they report may change freely; the model is compared by check_same_model.
IGNORED = ("run.", "ckpt_path", "config", "print_config", "model.") + tuple(
    f"trainer.{key}" for key in ("callbacks", "logger", "plugins", "enable_progress_bar", "default_root_dir")
)
# Every optimiser and schedule setting is compared (optim.Optimisation declares them), each
# optimiser's own included (model.optimizer_options.muon.lr, ...).
COMPARED_MODEL_KEYS = tuple(f"model.{key}" for key in DEFAULTS.by_key())

# Settings added after checkpoints were first written: one without them ran with these values.
LATER_DEFAULTS = {f"model.{key}": DEFAULTS.by_key()[key] for key in ADDED_LATER}


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
    old = {**{k: v for k, v in LATER_DEFAULTS.items() if k in new}, **flatten(saved)}
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
