"""Checks of generate's options that argparse and the decode loop leave open, made before the
checkpoint is read: each a one-line UserError naming the option and the fix.

Without them: a NaN or a denormal temperature makes every probability NaN (a RuntimeError mid-way),
a seed beyond 64 bits overflows inside torch, `--device meta` builds a model with no weights,
`--max-new-tokens 10**12` asks for terabytes for the ids, and `--prompt-file /dev/zero` reads forever.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from ..errors import UserError

MIN_TEMPERATURE = 1e-4  # below it sampling is greedy in all but name, and logits / T overflow near 1e-38
SEED_RANGE = (0, 2**64 - 1)  # what torch.Generator.manual_seed takes
BYTES_PER_ID = 8  # the generated ids are int64


def machine_memory() -> int | None:
    """Bytes of physical memory, or None where the platform does not tell."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_generate_args(args: Any) -> None:
    t = args.temperature
    if not math.isfinite(t) or 0 < t < MIN_TEMPERATURE:
        raise UserError(
            f"--temperature: is {t}; use 0 for greedy decoding or a finite value of at least {MIN_TEMPERATURE}"
        )
    if args.seed is not None and not SEED_RANGE[0] <= args.seed <= SEED_RANGE[1]:
        raise UserError(f"--seed: is {args.seed}; use a whole number from {SEED_RANGE[0]} to {SEED_RANGE[1]}")
    if _parses(args.device) and torch.device(args.device).type == "meta":
        raise UserError(
            "--device meta: a meta device holds no weights and cannot generate; use --device cpu or cuda"
        )
    memory = machine_memory()
    if memory and args.max_new_tokens * BYTES_PER_ID > memory:
        raise UserError(
            f"--max-new-tokens: {args.max_new_tokens} tokens need {args.max_new_tokens * BYTES_PER_ID / 1e9:,.0f} GB for their ids "
            f"alone, more than this machine's {memory / 1e9:,.0f} GB; ask for fewer"
        )
    path = args.prompt_file
    if path is not None and os.path.exists(path) and not os.path.isfile(path):
        raise UserError(
            f"--prompt-file {path}: not a regular file (a directory or a device); give a text file"
        )


def _parses(name: str) -> bool:
    try:
        torch.device(name)
        return True
    except (RuntimeError, ValueError):
        return False  # generate's own device check reports it
