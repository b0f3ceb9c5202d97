"""Command-line entry points: train, generate, ablate.

Each command's work lives beside what it drives (training.py, generation.py, ablation.py); this
file only turns a user's mistake into one clear line on stderr and exit status 2, with no
traceback, so every command fails the same way.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional, Sequence

from .errors import UserError


def run_command(main: Callable[[Optional[Sequence[str]]], object], argv: Optional[Sequence[str]] = None, prog: str = "minitx") -> int:
    try:
        main(argv)
    except UserError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return 0


def train_main(argv: Optional[Sequence[str]] = None) -> int:
    from .training import main

    return run_command(main, argv, "train")


def generate_main(argv: Optional[Sequence[str]] = None) -> int:
    from .generation import main

    return run_command(main, argv, "generate")


def ablate_main(argv: Optional[Sequence[str]] = None) -> int:
    from .ablation import main

    return run_command(main, argv, "ablate")


def eval_main(argv: Optional[Sequence[str]] = None) -> int:
    from .evaluation.command import main

    return run_command(main, argv, "evaluate")
