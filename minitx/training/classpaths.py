"""What a train command line may make jsonargparse import: checked before parsing, because parsing
itself imports every module a `class_path` names.

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
from collections.abc import Iterator
from typing import Any

from ..errors import UserError
from ..files.configs import FILE, CommandLine

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


def check_command_line(line: CommandLine) -> None:
    """Refuse any class outside the allowed modules that a config file or a flag of `line` names
    (a config file that cannot be read is refused as CommandLine.read reads it)."""
    found: list[tuple[str, str]] = []
    for layer in line.layers:
        if layer.key == FILE:
            found += class_paths(layer.data, "")
        elif layer.value is not None:
            value = layer.data if isinstance(layer.data, (dict, list)) else layer.value
            found += class_paths(value, layer.key)
    for key, class_path in found:
        if not is_allowed(class_path):
            raise UserError(
                f"{key}: {class_path!r} is outside the modules a config may import ({', '.join(allowed_modules())}); "
                f"a config cannot import other code: to allow your own module, run with {ENVIRONMENT}={class_path.split('.')[0]}"
            )
