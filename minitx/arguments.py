"""The argument parser of the commands that are not LightningCLI (generate, ablate, evaluate, export).

A usage mistake (a missing flag, `--top-k abc`) is a UserError, so it ends the command like every
other mistake: one line, exit status 2, instead of usage text followed by the error.

A flag is taken in either spelling, `--max-new-tokens` or `--max_new_tokens`: train.py's keys are
written with underscores (LightningCLI's), these commands' flags with dashes, and a user who moves
between them should not have to remember which is which. --help shows the one declared.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from .errors import UserError


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message}; see --help")

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        words = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(self.declared_spellings(words), namespace)

    def declared_spellings(self, words: Sequence[str]) -> list[str]:
        """words with each flag in its declared spelling: `--max_new_tokens` -> `--max-new-tokens`
        where only the latter is declared (and the other way round); values, flags declared as
        given, unknown flags (argparse refuses them) and everything after `--` are left alone."""
        declared = set(self._option_string_actions)
        out = list(words)
        for i, word in enumerate(words):
            if word == "--":
                break
            if not word.startswith("--"):
                continue
            flag, eq, value = word.partition("=")
            if flag in declared:
                continue
            name = flag[2:]
            for other in ("--" + name.replace("_", "-"), "--" + name.replace("-", "_")):
                if other in declared:
                    out[i] = other + eq + value
                    break
        return out


# The consent to import the modules a checkpoint names for its attention kinds (their code runs):
# a flag of every command that loads checkpoints, passed to load_checkpoint(trust_kind_modules=...).
TRUST_FLAG = "--trust-kind-modules"


def add_trust_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        TRUST_FLAG,
        action="store_true",
        help="load a checkpoint of an attention kind defined outside minitx by importing the modules its "
        "config names (attention.kind_modules): this runs their code, so give it only for files you trust",
    )
