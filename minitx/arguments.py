"""The argument parser of the commands that are not LightningCLI (generate, ablate, evaluate, export).

A usage mistake (a missing flag, `--top-k abc`) is a UserError, so it ends the command like every
other mistake: one line, exit status 2, instead of usage text followed by the error.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from .errors import UserError


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message}; see --help")


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
