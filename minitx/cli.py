"""Command-line entry points: train, generate, ablate, evaluate, export.

The top layer: each command's work lives beside what it drives (minitx/training/command.py,
generation.py, ablation/, evaluation/, hf/); this file only turns a user's mistake into one clear line
on stderr and exit status 2, with no traceback, so every command fails the same way. Nothing in
minitx imports this module.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional, Sequence

from .ablation import main as ablate
from .errors import UserError
from .evaluation.command import main as evaluate
from .generation import main as generate
from .hf.command import main as export
from .training import main as train


def run_command(main: Callable[[Optional[Sequence[str]]], object], argv: Optional[Sequence[str]] = None, prog: str = "minitx") -> int:
    try:
        main(argv)
    except UserError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:  # Ctrl-C; a message, if any, says what was kept
        print(f"{prog}: interrupted" + (f" {interrupt}" if str(interrupt) else ""), file=sys.stderr)
        return 130
    return 0


def train_main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command(train, argv, "train")


def generate_main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command(generate, argv, "generate")


def ablate_main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command(ablate, argv, "ablate")


def eval_main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command(evaluate, argv, "evaluate")


def export_main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command(export, argv, "export")
