"""Command-line entry points: train, prepare, generate, ablate, evaluate, export.

The top layer: each command's work lives beside what it drives (minitx/training/command.py,
generation/command.py, ablation/, evaluation/, hf/); this file only turns a user's mistake into one clear line
on stderr and exit status 2, with no traceback, so every command fails the same way: a UserError,
and an exception raised inside the code of an attention kind from outside minitx (a shape mistake
in the user's layer), named by the innermost line of the user's file it passed through. Nothing
in minitx imports this module.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Sequence

from .allocator import keep_freed_memory
from .errors import TRACEBACK_VARIABLE, UserError, raised_in
from .kinds import outside_kind_files

# Each command's module is imported when that command runs, not before: `generate` and `export`
# need no Lightning, and importing Lightning (which imports torchmetrics, which imports
# transformers when it is installed) costs seconds at every start. `train` starts at its
# precheck, which answers --help and input mistakes before it imports Lightning for a run.
COMMANDS = {
    "train": "minitx.training.precheck",
    "generate": "minitx.generation.command",
    "ablate": "minitx.ablation.command",
    "evaluate": "minitx.evaluation.command",
    "export": "minitx.hf.command",
    "prepare": "minitx.training.prepare_command",
}


def run_command(command: str, argv: Sequence[str] | None = None) -> int:
    keep_freed_memory()  # see allocator.py: a third less wall time in evaluation, measured
    try:
        importlib.import_module(COMMANDS[command]).main(argv)
    except UserError as error:
        print(f"{command}: error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # raised in a kind of the user's own: where in their file, one line
        line = raised_in(error, outside_kind_files())
        if line is None:  # minitx's own: its traceback
            raise
        print(
            f"{command}: error: {line} (raised in the code of an attention kind from outside minitx; "
            f"{TRACEBACK_VARIABLE}=1 shows the whole traceback)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt as interrupt:  # Ctrl-C; a message, if any, says what was kept
        print(f"{command}: interrupted" + (f" {interrupt}" if str(interrupt) else ""), file=sys.stderr)
        return 130
    return 0


# The installed scripts (pyproject.toml's [project.scripts]) and the wrappers train.py, ... call
# these with no argument (sys.argv); tests call them with a list and get the exit status.
train_main = functools.partial(run_command, "train")
generate_main = functools.partial(run_command, "generate")
ablate_main = functools.partial(run_command, "ablate")
eval_main = functools.partial(run_command, "evaluate")
export_main = functools.partial(run_command, "export")
prepare_main = functools.partial(run_command, "prepare")
