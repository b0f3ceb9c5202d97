"""jsonargparse's messages as one line each: the key, the problem in words, a did-you-mean; and
the keys the train command fills in from others (LINKED), one table that the front (precheck.py)
and LightningCLI's parser (command.py, TrainCLI.add_arguments_to_parser) both read."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..arguments import closest, missing_file_advice
from ..errors import UserError
from ..files.upgrade import renamed_key

# {linked key: the key it is filled in from}. A config file may hold a linked key (a run's saved
# config.yaml does), a flag may not.
LINKED = {
    "model.vocab_size": "data.vocab_size",
    "model.max_steps": "trainer.max_steps",
    "data.block_size": "model.block_size",
    "model.document_token": "data.documents",  # the tokenizer's end-of-text, with data.documents
}
# Those LightningCLI fills in as it parses, before its checks; the others are filled in when the
# data module is built.
LINKED_AT_PARSE = ("data.block_size", "model.max_steps")


def parse_error_message(
    err: BaseException, parser: Any = None, config_files: Sequence[str] = (), own_flags: Sequence[str] = ()
) -> str:
    """jsonargparse's (sometimes multi-line) error -> one line, with a did-you-mean for unknown keys
    (among the parser's and `own_flags`, a command's flags besides the parser's: prepare's --verify)
    and the name of the config file where jsonargparse only says "<unicode string>"."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    message = " ".join(lines[:3]) if lines else type(err).__name__
    files = " or ".join(repr(str(f)) for f in config_files) or "the config file"
    if '"<unicode string>"' in message:  # a YAML error inside a config file
        message = message.replace('"<unicode string>"', files)
        if "could not determine a constructor for the tag" in message:
            message += "; config files are read as plain YAML (safe loading): remove the tag"
        else:
            message += "; fix the YAML there"
    elif _MISSING_FILE.match(message):
        missing = _as_given(_MISSING_FILE.match(message)["path"].strip("'\""), config_files)
        advice = missing_file_advice(missing) or "; give a YAML config file such as configs/default.yaml"
        message = f"--config: {missing} does not exist{advice}"
    elif _LINKED.match(message):  # a key the train command sets from another
        key, source = _LINKED.match(message).group("key", "source")
        if source == "data.vocab_size":
            message = f"{key}: is the tokenizer's size (data.tokenizer); leave it out"
        else:
            message = f"{key}: is set from {source}; leave it out and give --{source}"
    elif message.startswith("Unexpected config"):  # the file is YAML, but not a mapping
        message = f"--config: {files} is not a mapping of sections (model:, data:, trainer:, run:); see configs/default.yaml"
    message = _plain_type_error(message)
    unknown = _unknown_key(message)
    if unknown and (renamed := renamed_key(unknown)):  # renamed: say what it is called now, nothing else
        return f"{unknown}: this setting is now {renamed}; write that instead (the value is the same)"
    if unknown and (parser is not None or own_flags):
        near = closest(unknown, [*(_known_keys(parser) if parser is not None else ()), *own_flags])
        if near:
            message += f"; did you mean {near!r}?"
    return message


def _as_given(path: str, given: Sequence[str]) -> str:
    """The path jsonargparse names (absolute) as the user wrote it on the command line, where one
    of the config files given is that path."""
    for file in given:
        try:
            if Path(file).absolute() == Path(path).absolute() or Path(file).resolve() == Path(path).resolve():
                return file
        except (OSError, ValueError):
            continue
    return path


_MISSING_FILE = re.compile(r'^Parser key "config": File does not exist: (?P<path>.*)$')
_LINKED = re.compile(r'^Linked "(?P<key>[\w.]+)" must be given via "(?P<source>[\w.]+)"\.?$')
_WRONG_TYPE = re.compile(
    r'^Parser key "(?P<key>[\w.]+)": Expected a (?P<type>.+?)\. Got value: (?P<value>.*)$'
)
_NO_UNION_TYPE = re.compile(
    r'^Parser key "(?P<key>[\w.]+)": Does not validate against any of the Union subtypes Subtypes: \[(?P<types>.*)\]$'
)
_TYPE_WORDS = {
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "str": "text",
    "NoneType": "null",
    "tuple": "a list",
    "list": "a list",
    "dict": "a mapping",
}


def _type_in_words(type_text: str) -> str:
    """ "<class 'int'>" -> "a whole number", "typing.Literal['a', 'b']" -> "one of a, b", "list[int]" -> "a list"."""
    if literal := re.fullmatch(r"typing\.Literal\[(.*)\]", type_text.strip()):
        return "one of " + ", ".join(choice.strip().strip("'\"") for choice in literal.group(1).split(","))
    if name := re.fullmatch(r"<class '(\w+)'>|(\w+)(\[.*\])?", type_text.strip()):
        return _TYPE_WORDS.get(name.group(1) or name.group(2), type_text.strip())
    return type_text.strip()


def _plain_type_error(message: str) -> str:
    """jsonargparse's type errors ("Expected a <class 'int'>. Got value: two") -> "<key>: <problem>; <fix>"."""
    if wrong := _WRONG_TYPE.match(message):
        expected = _type_in_words(wrong["type"])
        if expected.startswith("one of "):
            return f"{wrong['key']}: unknown value {wrong['value']!r}; choose {expected}"
        return f"{wrong['key']}: {wrong['value']!r} is not {expected}; give {expected}"
    if union := _NO_UNION_TYPE.match(message):
        # Split the subtypes at the commas between them, not those inside Literal[...] or list[...].
        types = [t for t in re.split(r",\s*(?![^\[]*\])", union["types"]) if t.strip()]
        words = [_type_in_words(t) for t in types]
        choices = [
            choice for w in words if w.startswith("one of ") for choice in w[len("one of ") :].split(", ")
        ]
        others = [w for w in words if not w.startswith("one of ")]
        expected = " or ".join(
            dict.fromkeys(([f"one of {', '.join(dict.fromkeys(choices))}"] if choices else []) + others)
        )
        return f"{union['key']}: the value given is not accepted; give {expected}"
    return message


# The key jsonargparse refused, in its three phrasings: a flag, a YAML key, a key inside a group.
_UNKNOWN_KEY = (
    re.compile(r"unrecognized arguments: --([\w.-]+)", re.IGNORECASE),
    re.compile(r"Option '([\w.]+)' is not accepted"),
    re.compile(r"Group '([\w.]+)' does not accept option '([\w.]+)'"),
)


def _unknown_key(message: str) -> str | None:
    found = next((match for pattern in _UNKNOWN_KEY if (match := pattern.search(message))), None)
    return ".".join(found.groups()) if found else None


def _known_keys(parser: Any) -> list[str]:
    """Every key a user may set, nested ones included (model.attention.kind, trainer.max_steps, ...):
    not those the train command fills in from others (LINKED), which a flag may not set, so a
    did-you-mean never leads to a second refusal."""
    try:
        return sorted(key for key in parser.get_defaults().keys() if key not in LINKED)
    except Exception:  # a hint is optional: never let it hide the real error
        return []


def find_user_error(err: BaseException) -> UserError | None:
    """The UserError in `err` or in what caused it (jsonargparse wraps what constructors raise), or None."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, UserError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None
