"""What a train command line may make jsonargparse import, and the config files it reads: checked
before parsing, because parsing itself imports every module a `class_path` names.

A config value is never evaluated as code, and a config file must not be able to import code
either: importing a module runs it. So a class named in a config (a `class_path` anywhere, or a
dotted name given to a trainer option such as `trainer.callbacks` or `trainer.strategy`) must come
from minitx, Lightning or torch. Your own classes are allowed by the person running the command,
not by the config: list their modules in the environment variable MINITX_CLASS_PATHS (comma
separated; a module allows its submodules), e.g. `MINITX_CLASS_PATHS=mycallbacks python train.py ...`.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

import yaml

from ..errors import UserError

ALLOWED_MODULES = ("minitx", "lightning", "pytorch_lightning", "lightning_fabric", "torch")
ENVIRONMENT = "MINITX_CLASS_PATHS"
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def allowed_modules() -> tuple[str, ...]:
    extra = [name.strip() for name in os.environ.get(ENVIRONMENT, "").split(",") if name.strip()]
    return ALLOWED_MODULES + tuple(extra)


def is_allowed(class_path: str) -> bool:
    return any(class_path == m or class_path.startswith(m + ".") for m in allowed_modules())


def _names_a_module(value: str) -> bool:
    """A dotted string whose first part is an importable top-level module (found, not imported)."""
    try:
        return importlib.util.find_spec(value.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def class_paths(value: Any, key: str) -> Iterator[tuple[str, str]]:
    """(key, class path) for every class a parsed config value names."""
    if isinstance(value, dict):
        for name, item in value.items():
            if name == "class_path" and isinstance(item, str):
                yield key, item
            else:
                yield from class_paths(item, f"{key}.{name}" if key else str(name))
    elif isinstance(value, list):
        for item in value:
            yield from class_paths(item, key)
    elif (
        isinstance(value, str)
        and key.startswith("trainer.")
        and _DOTTED.fullmatch(value)
        and _names_a_module(value)
    ):
        yield key, value


def flag_values(args: Sequence[str]) -> Iterator[tuple[str, str]]:
    """(key, value) of each `--key value` and `--key=value` in a command line."""
    for i, arg in enumerate(args):
        if arg == "-c" and i + 1 < len(args):
            yield "config", args[i + 1]
        if not arg.startswith("--"):
            continue
        key, has_value, value = arg[2:].partition("=")
        if has_value:
            yield key.rstrip("+"), value
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            yield key.rstrip("+"), args[i + 1]


def read_config_file(path: str) -> Any:
    """The YAML of a --config file, refusing what is not a readable UTF-8 file (None: not YAML,
    which the parser reports itself)."""
    if os.path.isdir(path):
        raise UserError(f"--config: {path!r} is a directory; give a YAML file such as configs/default.yaml")
    if not os.path.exists(path):
        return None  # the parser says it does not exist
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except UnicodeDecodeError:
        raise UserError(
            f"--config: {path!r} is not UTF-8 text; give a YAML config file (configs/default.yaml is one)"
        ) from None
    except OSError as err:
        raise UserError(f"--config: cannot read {path!r} ({err.strerror}); check its permissions") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def check_command_line(args: Sequence[str]) -> None:
    """Refuse a config file that cannot be read, and any class outside the allowed modules."""
    found: list[tuple[str, str]] = []
    for key, value in flag_values(args):
        if key in ("config", "c"):
            found += class_paths(read_config_file(value), "")
            continue
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = value
        found += class_paths(parsed if isinstance(parsed, (dict, list)) else value, key)
    for key, class_path in found:
        if not is_allowed(class_path):
            raise UserError(
                f"{key}: {class_path!r} is outside the modules a config may import ({', '.join(allowed_modules())}); "
                f"a config cannot import other code: to allow your own module, run with {ENVIRONMENT}={class_path.split('.')[0]}"
            )
