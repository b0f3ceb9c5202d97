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
