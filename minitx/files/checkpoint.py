"""Checkpoints of a training run: written atomically, loaded with weights_only=True.

A run directory looks like

    runs/<name>/
      config.yaml            the resolved configuration of the latest start (re-runnable)
      checkpoints/
        last.ckpt            the newest state: every N steps, at each validation, at the end
        best.ckpt            the state with the lowest validation loss so far
      logs/version_<k>/      CSV metrics, one version per start (a resume starts a new one)

A checkpoint is Lightning's dictionary (weights under "state_dict" with keys prefixed "model.",
optimiser, scheduler, loop counters, the datamodule's data position) plus our own plain-data entry

    checkpoint["minitx"] = {"format": 1, "model_config": {...}, "tokenizer": {...}, "train_config": {...}}

which is all that generation needs. Everything in it is tensors and plain Python values, so
`torch.load(path, weights_only=True)` reads it and nothing in a checkpoint can run code.

torch.load does not check the CRC-32 that torch.save records for every entry of the zip archive,
so a checkpoint whose tensors were changed on disk would load: `load_file` checks them first
(about 1 GB/s; figures in benchmarks/RESULTS.md). Files in torch's legacy, pre-zip format carry no
checksums and load unchecked (minitx has never written that format), as do files saved with
torch.serialization.set_crc32_options(False), whose CRCs are all 0.

This file reads and checks checkpoint files and knows their layout; it imports nothing of the model,
so that the model's own modules may import files/. minitx/trained_model.py builds a model from
a checkpoint (`load_checkpoint`, for generation, evaluation and export); minitx/training/run.py
has the Lightning side: when a run saves, and through what.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import UserError, one_line
from .atomic import TMP_PREFIX
from .upgrade import upgrade_checkpoint

LAST = "last.ckpt"
BEST = "best.ckpt"


# What a refusal by torch.load(weights_only=True) is about, in the forms torch 2.6+ words it. The
# rest of its message is the same for every file and advises weights_only=False or allowlisting
# the global: exactly what must not be done with a file that fails here, so it is not shown.
_WEIGHTS_ONLY_DETAIL = (
    re.compile(r"WeightsUnpickler error:\s*(.+?)(?:\.\s*Please use|\n\n|$)", re.S),
    re.compile(r"(Trying to load unsupported GLOBAL[^\n]*)"),
)


def load_error_message(where: str, path: str | os.PathLike, error: BaseException, fix: str) -> str:
    """One line saying why torch.load(path, weights_only=True) failed: `<where>: <reason>; <fix>`."""
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        return f"{where}: the file is empty; {fix}"
    text = str(error)
    details = [
        match.group(1) for pattern in _WEIGHTS_ONLY_DETAIL for match in [pattern.search(text)] if match
    ]
    # torch's zip reader appends a paragraph on what corruption is: the one line keeps the fact.
    text = text.split(" This is an internal miniz error")[0]
    reason = one_line(details[0] if details else text, 200) or type(error).__name__
    if isinstance(error, pickle.UnpicklingError) and "GLOBAL" in reason:
        return (
            f"{where}: refused: it holds Python objects, not only tensors and plain data ({reason}), and loading "
            f"such a file can run code; {fix}"
        )
    if isinstance(error, zipfile.BadZipFile) and "CRC" in reason:
        reason += ": its bytes changed after it was written (a disk, copy or edit damaged it)"
    return f"{where}: not a readable minitx checkpoint ({type(error).__name__}: {reason}); {fix}"


# Files already checked by this process, as they were then: a resume reads its checkpoint twice
# (train checks it against the config, then Lightning loads it), and the second check is skipped.
_CHECKED: set[tuple] = set()


def check_crcs(path: str | os.PathLike) -> None:
    """Read every entry of a zip checkpoint, which makes zipfile compare it with its recorded
    CRC-32: raises zipfile.BadZipFile naming the first entry that changed since it was written.
    A file that is not a zip archive is left to torch.load to accept (legacy format) or refuse;
    one whose CRCs are all 0 was written with torch's CRCs turned off and is not checked."""
    stat = os.stat(path)
    identity = (os.path.realpath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if identity in _CHECKED or not zipfile.is_zipfile(path):
        return
    with zipfile.ZipFile(path) as archive:
        if not any(info.CRC for info in archive.infolist()):
            return  # written with torch.serialization.set_crc32_options(False): nothing to check
        for info in archive.infolist():
            with archive.open(info) as entry:
                while entry.read(1 << 24):  # the check happens when an entry is read to its end
                    pass
    _CHECKED.add(identity)


def existing_checkpoints(path: str | os.PathLike, shown: int = 6) -> str:
    """For a checkpoint path that does not exist, the checkpoints that do, in words ('' when none
    are near): those beside it, else those of the runs under its nearest existing directory
    (runs/<name>/checkpoints/*.ckpt when the run name was wrong)."""
    directory = Path(path).parent

    def listed(found: list[str]) -> str:
        return ", ".join(found[:shown]) + (f" and {len(found) - shown} more" if len(found) > shown else "")

    if directory.is_dir():
        if found := sorted(file.name for file in directory.glob("*.ckpt") if file.is_file()):
            return f"{directory} holds {listed(found)}"
        return f"{directory} holds no checkpoint; a run writes them when it validates and when it ends"
    while not directory.is_dir() and directory != directory.parent:
        directory = directory.parent
    if not directory.is_dir():
        return ""
    patterns = ("*/checkpoints/*.ckpt", "checkpoints/*.ckpt", "*.ckpt")
    found = sorted({str(file) for pattern in patterns for file in directory.glob(pattern) if file.is_file()})
    return f"checkpoints that exist under {directory}: {listed(found)}" if found else ""


def load_file(path: str | os.PathLike, where: str, fix: str, map_location: Any = "cpu") -> Any:
    """What torch.load(path, weights_only=True) reads from `path`; any problem is a one-line
    UserError `<where>: <reason>; <fix>`."""
    if os.path.isdir(path):
        raise UserError(f"{where}: is a directory; give the .ckpt file inside it")
    if not os.path.exists(path):
        raise UserError(f"{where}: no such file; {existing_checkpoints(path) or fix}")
    try:
        check_crcs(path)
        with warnings.catch_warnings():
            # A foreign pickle makes torch warn about its protocol before refusing it: the refusal
            # is the message, the warning would only add lines to it.
            warnings.filterwarnings("ignore", message=r".*pickle protocol")
            # weights_only: tensors and plain data, never code.
            return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # truncated zip, foreign pickle, unsafe types, ...: all unreadable
        raise UserError(load_error_message(where, path, error, fix)) from None


def read_checkpoint(path: str | os.PathLike, where: str, fix: str, map_location: Any = "cpu") -> dict:
    """The dictionary of a checkpoint written by minitx (see the top of this file), after
    `load_file`'s checks and those of its "state_dict" and "minitx" entries, the latter in
    today's spelling (upgrade.py: one written by an earlier minitx reads the same)."""
    checkpoint = load_file(path, where, fix, map_location)
    meta = checkpoint.get("minitx") if isinstance(checkpoint, dict) else None
    if not isinstance(meta, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise UserError(f"{where}: not a minitx checkpoint (no 'minitx' and 'state_dict' entries); {fix}")
    checkpoint["minitx"] = upgrade_checkpoint(meta, where)
    return checkpoint


def model_weights(checkpoint: dict) -> dict[str, Tensor]:
    """The Transformer's state dict inside a checkpoint (the LightningModule prefixes it "model.")."""
    state = checkpoint["state_dict"]
    return {key[len("model.") :]: value for key, value in state.items() if key.startswith("model.")} or state


def state_mismatch(expected: dict, found: dict) -> str:
    """'' when found has exactly the keys and shapes of expected, else a short description."""
    problems = []
    missing = [key for key in expected if key not in found]
    unexpected = [key for key in found if key not in expected]
    shapes = [
        f"{key} {tuple(getattr(found[key], 'shape', ()))} vs {tuple(expected[key].shape)}"
        for key in expected
        if key in found and (not isinstance(found[key], Tensor) or found[key].shape != expected[key].shape)
    ]
    for what, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", shapes)):
        if keys:
            problems.append(f"{what}: {', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}")
    return "; ".join(problems)


def remove_stale_temporaries(directory: Path) -> None:
    """Delete temporary files left by a process killed while writing a checkpoint."""
    for tmp in directory.glob(f"{TMP_PREFIX}*"):
        with contextlib.suppress(OSError):
            tmp.unlink()
