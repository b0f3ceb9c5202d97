"""A train command line, read once: its config files (each after the file it overlays) and its
flags, in the order given, and the words its parsers read.

A config file may name the file it overlays with a top-level `base:` (a path relative to the file):
configs/mta.yaml is `base: default.yaml` plus its attention section, so the five kinds share one
definition of the run and differ only where they differ. `--config configs/mta.yaml` reads
default.yaml first, then mta.yaml over it, exactly as `--config configs/default.yaml --config
configs/mta.yaml` would (LightningCLI merges several --config files in order).

`CommandLine.read` walks the words once and reads each config file once. The train command's
precheck (training/precheck.py), its did-you-means (training/messages.py), the checks of what a
user gave (training/inputs.py, training/classpaths.py) and LightningCLI (training/command.py)
all read that one CommandLine.
"""

from __future__ import annotations

import copy
import functools
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO_ROOT / "configs" / "default.yaml"
FILE = "config"  # the key of a config file's layer: jsonargparse's name of the --config argument
OPTIONS = "model.attention.options"


@dataclass(frozen=True)
class Layer:
    """One layer of settings on a command line: a config file, or a flag."""

    key: str  # FILE for a config file; a flag's key, "model.attention.kind" (no dashes, no append "+")
    value: str | None  # the file's path; the flag's value as written (None: a flag given none)
    data: Any  # the file's YAML (None: the parser reports it); the flag's value read as YAML


@dataclass
class CommandLine:
    """The layers of settings a command line gives, in order (each config file after its bases,
    each flag where it stands), and `args`: the words as LightningCLI and the precheck's parser
    read them (see `read`).

    `checked`: the precheck has made every check of these settings (precheck.check_arguments);
    LightningCLI's parse of the same CommandLine then makes only the trainer's (inputs.check_config).
    """

    args: list[str]
    layers: list[Layer]
    checked: bool = False

    @classmethod
    def read(cls, words: Sequence[str], default_config: bool = False) -> CommandLine:
        """The command line `words`; with default_config, configs/default.yaml first when no
        --config is given (flags still override it), as the train command runs.

        `args` are the words with every config file preceded by its bases, and the attention
        options of all files and flags merged option by option into one last flag: LightningCLI
        merges a mapping-valued setting one level deep, so a later file or flag that sets
        `model.attention.options.mta.query_kernel` would replace all of `options.mta`, silently
        putting the kind's other options back to their defaults."""
        words = list(words)
        read = functools.cache(read_config_file)  # a file two layers name (a shared base) is read once
        args: list[str] = []
        layers: list[Layer] = []
        named_config = False
        i = 0
        while i < len(words):
            word = words[i]
            name, eq, inline = word.partition("=")
            is_file = word == "-c" or name == "--config"
            if not (is_file or word.startswith("--")):
                args.append(word)
                i += 1
                continue
            # A file's path is the next word, whatever it is; a flag's value, unless it is a flag.
            follows = i + 1 < len(words) and (is_file or not words[i + 1].startswith("--"))
            value = inline if eq else words[i + 1] if follows else None
            step = 1 if eq or value is None else 2
            if is_file:
                named_config = True
                chain = _chain(value, read) if value is not None else []
                args += [w for file in chain for w in ("--config", file.value)] or [word]
                layers += chain
            else:
                layers.append(_flag(name[2:].rstrip("+"), value))
                if value is None or not _inside(layers[-1].key, OPTIONS):  # those become one flag below
                    args += words[i : i + step]
            i += step
        if default_config and not named_config and DEFAULT_CONFIG.is_file():
            default = _chain(str(DEFAULT_CONFIG), read)
            args = [word for file in default for word in ("--config", file.value)] + args
            layers = default + layers
        line = cls(args, layers)
        if any(_base(file.value, file.data) for file in layers if file.key == FILE):
            line.args += ["--base", "null"]  # every base is read now: the resolved config names none
        if line.given(OPTIONS):
            line.args += [f"--{OPTIONS}", json.dumps(line.options)]
        return line

    @property
    def files(self) -> list[str]:
        """The config files, in the order read (a file's bases before it)."""
        return [layer.value for layer in self.layers if layer.key == FILE]

    @property
    def flags(self) -> list[str]:
        """The keys of the flags, in the order given."""
        return [layer.key for layer in self.layers if layer.key != FILE]

    def given(self, section: str) -> list[tuple[bool, dict]]:
        """`section` ("data", "model.attention.options") as each layer that gives it gives it, in
        order: (whether a config file gives it, the mapping). A flag inside the section gives its
        place in it: `--data.task.zoology.pairs 4` gives {"task": {"zoology": {"pairs": 4}}}."""
        out: list[tuple[bool, dict]] = []
        for layer in self.layers:
            if layer.key == FILE:
                found = layer.data
                for part in section.split("."):
                    found = found.get(part) if isinstance(found, dict) else None
            elif layer.value is None or not _inside(layer.key, section):
                continue
            else:
                inside = layer.key[len(section) + 1 :]  # "" for the section itself
                found = layer.data
                for part in reversed(inside.split(".") if inside else []):
                    found = {part: found}
            if isinstance(found, dict):
                out.append((layer.key == FILE, found))
        return out

    @property
    def options(self) -> dict:
        """The attention options the files and flags give, merged option by option in order:
        {kind: {option: value}}, without the defaults a parse fills in for the kinds it sees (so a
        kind's section here was written by someone)."""
        merged_options: dict = {}
        for _, section in self.given(OPTIONS):
            _merge(merged_options, copy.deepcopy(section))
        return merged_options


def _inside(key: str, section: str) -> bool:
    return key == section or key.startswith(section + ".")


def _flag(key: str, value: str | None) -> Layer:
    if key == "base" and value != "null":  # `--base null` is ours (CommandLine.read); a base is a file's
        raise UserError(
            "--base: only a config file names its base; give both files: --config BASE --config FILE"
        )
    layer = Layer(key, value, _yaml(value))
    if key == OPTIONS and value is not None and not isinstance(layer.data, dict):
        raise UserError(
            f"--{OPTIONS}: give a mapping of kinds to their options, e.g. '{{local: {{window: 64}}}}'"
        )
    return layer


def _yaml(value: str | None) -> Any:
    if value is None:
        return None
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def read_config_file(path: str) -> Any:
    """The YAML of a --config file, refusing what is not a readable UTF-8 file (None: a file that
    does not exist or is not YAML, which the parser reports itself, naming the file)."""
    if os.path.isdir(path):
        raise UserError(f"--config: {path!r} is a directory; give a YAML file such as configs/default.yaml")
    if not os.path.exists(path):
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
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


def _chain(path: str, read: Callable[[str], Any]) -> list[Layer]:
    """The file `path` and its bases as layers, first to last: [base of base, base, path]."""
    chain = [Layer(FILE, path, read(path))]
    seen = {Path(path).resolve()}
    while (base := _base(chain[0].value, chain[0].data)) is not None:
        here = Path(chain[0].value)
        resolved = (here.parent / base).resolve()
        if resolved in seen:
            raise UserError(f"{here}: base {base!r} leads back to a file already read; remove the loop")
        if not resolved.is_file():
            raise UserError(
                f"{here}: base {base!r} is not a file (looked for {resolved}); a base is relative to the file naming it"
            )
        seen.add(resolved)
        file = str(here.parent / base)
        chain.insert(0, Layer(FILE, file, read(file)))
    return chain


def _base(path: Any, data: Any) -> str | None:
    base = data.get("base") if isinstance(data, dict) else None
    if base is not None and not isinstance(base, str):
        raise UserError(f"{path}: base is {base!r}; write the path of the config file this one overlays")
    return base


def base_of(path: str | Path) -> str | None:
    """The file's `base:`, or None; a file that cannot be read is left for the parser to report."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return _base(path, data)


def merged_config(path: str | Path) -> dict:
    """The config a file and its bases make together, as one mapping (sections merged key by key,
    the later file winning), without `base`: what a sweep's runs read as one file."""
    merged_sections: dict = {}
    for file in _chain(str(path), lambda name: yaml.safe_load(Path(name).read_text(encoding="utf-8"))):
        _merge(merged_sections, file.data or {})
    merged_sections.pop("base", None)
    return merged_sections


def merged(base: dict, **changes: Any) -> dict:
    """A copy of base with changes merged in, mappings key by key: merged(mta, options={"mta":
    {"backend": "conv"}}) keeps mta's other options, where dict(mta, options=...) drops them."""
    out = copy.deepcopy(base)
    _merge(out, copy.deepcopy(changes))
    return out


def _merge(into: dict, update: dict) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
