"""Options of a registered thing, in plain Python: an attention kind's
(`attention.options.<kind>`), a known-answer task's (`data.task.<name>`), an optimiser's
(`model.optimizer_options.<name>`).

Each is a dataclass with a default for every field, declared beside the code that reads it. Its
annotations are its type checks (int, float, bool, str, Literal choices, lists, None) and its
`__post_init__` checks the rest, raising OptionError(option, problem, fix). `build_options` turns
the plain values a config holds into that object, and every mistake into one line that names
the option in full; the registries (minitx/kinds.py, minitx/data/task.py,
minitx/training/optim/settings.py) call it and `check_options_class` and nothing else of their own.
`build_sections` reads a section of such sections, one per registered thing (`data.task`,
`model.optimizer_options`).

This file imports nothing heavy, so a config can validate against it.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import MISSING, asdict, fields, is_dataclass
from typing import Any

from .errors import UserError


def fail(field_name: str, problem: str, fix: str) -> None:
    # UserError is a ValueError: Python callers catch ValueError, the command lines print one line.
    raise UserError(f"{field_name}: {problem}; {fix}")


def nearest(name: str, names) -> str:
    """' (did you mean X?)' for the closest of names, or '' when none is close."""
    close = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


class OptionError(ValueError):
    """An option is wrong: raised by an options dataclass (`__post_init__`) with the option's own
    name; build_options names it in full (`attention.options.<kind>.<option>`)."""

    def __init__(self, option: str, problem: str, fix: str):
        super().__init__(option, problem, fix)
        self.option, self.problem, self.fix = option, problem, fix


def check_options_class(owner: str, options: type) -> None:
    """At registration: options must be a dataclass whose every field has a default (a config
    sets only what it changes). `owner` names the registered thing, e.g. "kind local"."""
    if not is_dataclass(options):
        raise TypeError(f"{owner}: options must be a dataclass, got {options!r}")
    for f in fields(options):
        if f.default is MISSING and f.default_factory is MISSING:
            raise TypeError(f"{owner}: option {f.name} needs a default")


def _as_mapping(given: Any) -> Any:
    """What a config holds as a mapping: None as {}, a dataclass or a jsonargparse Namespace (as a
    parse hands a section on) as a dict; anything else as it is."""
    if given is None:
        return {}
    if is_dataclass(given) and not isinstance(given, type):
        return asdict(given)
    return given.as_dict() if hasattr(given, "as_dict") else given


def build_options(where: str, owner: str, options: type, given: Any) -> Any:
    """The `options` object from what a config holds at `where` (e.g. "attention.options.local"):
    a mapping of the options set (the rest take their defaults), None, or such an object (checked
    again). `owner` names the thing in errors ("kind local has no such option")."""
    given = _as_mapping(given)
    if not isinstance(given, Mapping):
        fail(where, f"is {given!r}, not a mapping of option names to values", "write option: value pairs")
    known = [f.name for f in fields(options)]
    for name in given:
        if name not in known:
            fail(
                f"{where}.{name}",
                f"{owner} has no such option{nearest(str(name), known)}",
                f"its options are {', '.join(known)}",
            )
    hints = typing.get_type_hints(options)
    values = {name: check_type(f"{where}.{name}", value, hints[name]) for name, value in given.items()}
    try:
        return options(**values)
    except OptionError as err:
        fail(f"{where}.{err.option}", err.problem, err.fix)


def build_sections(
    where: str, noun: str, names: Collection[str], given: Any, build: Callable[[str, Any], Any], example: str
) -> dict[str, Any]:
    """Each named thing's options object from a section of sections, as a config holds them at
    `where` ("data.task": a section per task): a mapping of names to what build_options takes, a
    jsonargparse Namespace or a dataclass with a field per name. `names` are the registered
    things, called `noun` in errors; `build(name, section)` makes one's options; `example` is a
    section written right ("task: {zoology: {pairs: 16}}")."""
    given = _as_mapping(given)
    if not isinstance(given, Mapping):
        fail(where, f"is {given!r}, not a mapping of {noun} names to their settings", f"write e.g. {example}")
    for name in given:
        if name not in names:
            fail(
                f"{where}.{name}",
                f"there is no {noun} {name!r}{nearest(str(name), names)}",
                f"the {noun}s are {', '.join(names)}",
            )
    return {name: build(name, section) for name, section in given.items()}


# A plain type: what a value of it may be (a bool is none of the others), and its words.
_PLAIN_TYPES = {
    bool: (bool, "true or false"),
    int: (int, "a whole number"),
    float: ((int, float), "a number"),
    str: (str, "text"),
}


def check_type(name: str, value: Any, hint: Any) -> Any:
    """value checked against a type annotation: the annotation is the one statement of a choice."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        if value not in args:
            fail(name, f"unknown value {value!r}", f"choose one of {', '.join(map(str, args))}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        problems = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return check_type(name, value, arg)
            except UserError as err:
                problems.append(str(err))
        raise UserError(problems[0])
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            fail(name, f"is {value!r}, not a list", "write a list, e.g. [0, 1]")
        if not args:
            return list(value)
        return [check_type(f"{name}[{i}]", item, args[0]) for i, item in enumerate(value)]
    if hint in _PLAIN_TYPES:
        accepted, words = _PLAIN_TYPES[hint]
        if not isinstance(value, accepted) or (isinstance(value, bool) and hint is not bool):
            fail(name, f"is {value!r}, not {words}", f"write {words}")
        return float(value) if hint is float else value
    return value  # an annotation this checker does not know: the dataclass checks it itself
