"""The argument parser of the commands that are not LightningCLI (generate, ablate, evaluate, export).

A usage mistake (a missing flag, `--top-k abc`) is a UserError, so it ends the command like every
other mistake: one line, exit status 2, instead of usage text followed by the error.

A flag is taken in either spelling, `--max-new-tokens` or `--max_new_tokens`: train.py's keys are
written with underscores (LightningCLI's), these commands' flags with dashes, and a user who moves
between them should not have to remember which is which. --help shows the one declared.

A flag is taken only in full: argparse's abbreviations (`--max-new-token` for --max-new-tokens)
would make a flag added later change what an old command line means. An unknown or shortened flag
is refused with the flag it is nearest (`closest`), the advice train.py's keys get too
(training/messages.py), and a file given without its `.yaml` gets the name of the one that exists
(`missing_file_advice`).
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .errors import UserError


def _plain(name: str) -> str:
    """A flag or key without its dashes, `-` and `_` alike: what two spellings of one name share."""
    return name.lstrip("-").replace("-", "_")


def closest(given: str, known: Iterable[str]) -> str | None:
    """The one of `known` (flags or dotted keys) that `given` most likely meant, or None.

    In this order: the same name in the other spelling (`--max_new_tokens`); the only name that
    `given` begins (an abbreviation, `--trainer.max_step`); the only key whose last part is
    `given` (`--max_steps` for trainer.max_steps); else the nearest by difflib, if near enough.
    """
    known = list(dict.fromkeys(known))
    plain = {_plain(name): name for name in known}
    word = _plain(given)
    if word in plain:
        return plain[word]
    if word:
        longer = [name for key, name in plain.items() if key.startswith(word)]
        if len(longer) == 1:
            return longer[0]
        leaf = [name for key, name in plain.items() if key.rsplit(".", 1)[-1] == word]
        if len(leaf) == 1:
            return leaf[0]
    near = difflib.get_close_matches(word, list(plain), n=1, cutoff=0.6)
    return plain[near[0]] if near else None


def missing_file_advice(path: str | Path, suffixes: Sequence[str] = (".yaml", ".yml")) -> str:
    """'; did you mean 'configs/gqa.yaml'?' for a path that does not exist where one with a config
    suffix added (`configs/gqa`), or of a near name in the same directory (`configs/ablatoin.yaml`),
    does; '' when there is none. The path is written as it was given."""
    path = Path(path)
    for suffix in suffixes:
        if path.suffix != suffix and path.with_name(path.name + suffix).is_file():
            return f"; did you mean {str(path) + suffix!r}?"
    try:
        names = [p.name for p in path.parent.iterdir() if p.is_file() and p.suffix in suffixes]
    except OSError:
        return ""
    # Names compared without their suffixes, which would make any two look alike.
    stems = {Path(name).stem: name for name in names}
    stem = path.stem if path.suffix in suffixes else path.name
    near = difflib.get_close_matches(stem, list(stems), n=1, cutoff=0.75)
    return f"; did you mean {str(path.parent / stems[near[0]])!r}?" if near else ""


# A word that is a long flag (`--top-k`, `--top-k=3`), not a value that starts with dashes: argparse
# too takes a word with a space for a value.
_FLAG = re.compile(r"--[A-Za-z][\w.-]*(=.*)?", re.DOTALL)


class ArgumentParser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # see the module's docstring
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message}; see --help")

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        words = self.declared_spellings(sys.argv[1:] if args is None else list(args))
        # Before argparse's parse: it names a missing --ckpt first, where the likely mistake is a
        # misspelt flag beside it.
        self.refuse_unknown_flags(words)
        return super().parse_known_args(words, namespace)

    def refuse_unknown_flags(self, words: Sequence[str]) -> None:
        """A UserError for the first long flag in `words` (before `--`) that is not declared: the
        flag and the values after it, as argparse would list them, and the flag it is nearest."""
        declared = [flag for flag in self._option_string_actions if flag.startswith("--")]
        for i, word in enumerate(words):
            if word == "--":
                return
            if not _FLAG.fullmatch(word) or word.partition("=")[0] in self._option_string_actions:
                continue
            given = [word]
            for value in words[i + 1 :]:
                if value.startswith("-") and not _NUMBER.fullmatch(value):
                    break
                given.append(value)
            raise UserError(f"unrecognized arguments: {' '.join(given)}{self.advice(given, declared)}")

    def advice(self, given: Sequence[str], declared: Sequence[str]) -> str:
        """'; did you mean '--x'?' for the declared flag nearest the unknown flag given (given[0],
        with its values after it), or '; see --help'."""
        near = closest(given[0].partition("=")[0], declared)
        return f"; did you mean {near!r}?" if near else "; see --help"

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
            spellings = ("--" + flag[2:].replace("_", "-"), "--" + flag[2:].replace("-", "_"))
            other = next((other for other in spellings if other in declared), None)
            if other is not None:
                out[i] = other + eq + value
        return out


_NUMBER = re.compile(r"-\d+(\.\d*)?([eE][-+]?\d+)?|-\.\d+")


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
