"""Config files as the train command reads them: a default, and overlays on a base.

A config file may name the file it overlays with a top-level `base:` (a path relative to the file):
configs/mta.yaml is `base: default.yaml` plus its attention section, so the five kinds share one
definition of the run and differ only where they differ. `--config configs/mta.yaml` reads
default.yaml first, then mta.yaml over it, exactly as `--config configs/default.yaml --config
configs/mta.yaml` would (LightningCLI merges several --config files in order).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ..errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO_ROOT / "configs" / "default.yaml"
CONFIG_FLAGS = ("-c", "--config")


def with_config_files(args: Sequence[str]) -> list[str]:
    """The train command's arguments, settled: configs/default.yaml when no --config is given
    (flags still override it), then config_arguments."""
    args = list(args)
    if not any(a in CONFIG_FLAGS or a.startswith("--config=") for a in args) and DEFAULT_CONFIG.is_file():
        args = ["--config", str(DEFAULT_CONFIG)] + args
    return config_arguments(args)


def config_arguments(args: Sequence[str]) -> list[str]:
    """Arguments as LightningCLI should read them: every config file's bases before it, and the
    attention options of all files and flags merged option by option.

    LightningCLI merges a mapping-valued setting one level deep: a later file or flag that sets
    `model.attention.options.mta.query_kernel` would replace all of `options.mta`, silently putting
    the kind's other options back to their defaults. So the options sections of the files and the
    `--model.attention.options...` flags are merged here, in the order given, into one last flag.
    """
    args = list(args)
    for i, arg in enumerate(args):  # `--base null` is ours (below); a base is a file's to name
        given = arg.partition("=")[2] if arg.startswith("--base=") else None
        if arg == "--base":
            given = args[i + 1] if i + 1 < len(args) else ""
        if given is not None and given != "null":
            raise UserError(
                "--base: only a config file names its base; give both files: --config BASE --config FILE"
            )
    out, options, touched = _merged_options(args)
    return out + ["--model.attention.options", json.dumps(options)] if touched else out


def given_options(args: Sequence[str]) -> dict:
    """The attention options the user gave, in their config files (bases included) and flags,
    merged option by option: {kind: {option: value}}, without the defaults LightningCLI's parse
    fills in for the kinds it sees (so a kind's section here was written by someone). The same
    from the arguments as given and from config_arguments' (which merges them into one last flag)."""
    return _merged_options(list(args))[1]


def _merged_options(args: list[str]) -> tuple[list[str], dict, bool]:
    """(args without the options flags, every --config followed by its bases first, the options
    of the files and flags merged in order, whether any file or flag had options)."""
    out: list[str] = []
    options: dict = {}
    touched = overlaid = False
    for flag, value in _pairs(args):
        if flag in CONFIG_FLAGS:
            chain = base_chain(value)
            overlaid |= len(chain) > 1
            for file in chain:
                out += ["--config", file]
                found = _attention_options(file)
                touched |= found is not None
                _merge(options, found or {})
        elif flag is not None and flag.startswith(OPTIONS_FLAG):
            path = [part for part in flag[len(OPTIONS_FLAG) :].split(".") if part]
            update: Any = yaml.safe_load(value) if isinstance(value, str) else value
            for part in reversed(path):
                update = {part: update}
            if not isinstance(update, dict):
                raise UserError(
                    f"{flag}: give a mapping of kinds to their options, e.g. '{{local: {{window: 64}}}}'"
                )
            _merge(options, update)
            touched = True
        else:
            out.append(flag)
    if overlaid:  # every base is read now: the resolved config (--print_config) names none
        out += ["--base", "null"]
    return out, options, touched


OPTIONS_FLAG = "--model.attention.options"


def _pairs(args: list[str]):
    """(flag, value) for --config and the options flags ("--x v" or "--x=v"); (word, None) for
    every other word, passed on as it is."""
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, inline = arg.partition("=")
        if arg.startswith("--") and (name in CONFIG_FLAGS or name.startswith(OPTIONS_FLAG)):
            if eq:
                yield name, inline
                i += 1
            else:
                yield name, args[i + 1] if i + 1 < len(args) else None
                i += 2
        elif arg in CONFIG_FLAGS:  # -c FILE
            yield "--config", args[i + 1] if i + 1 < len(args) else None
            i += 2
        else:
            yield arg, None
            i += 1


def _attention_options(path: str) -> dict | None:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # the parser reports it
    attention = ((data or {}).get("model") or {}).get("attention") if isinstance(data, dict) else None
    options = attention.get("options") if isinstance(attention, dict) else None
    return options if isinstance(options, dict) else None


def base_chain(path: str) -> list[str]:
    """[base of base ..., base, path]: the files to read, first to last."""
    chain = [path]
    seen = {Path(path).resolve()}
    while True:
        base = base_of(chain[0])
        if base is None:
            return chain
        resolved = (Path(chain[0]).parent / base).resolve()
        if resolved in seen:
            raise UserError(f"{chain[0]}: base {base!r} leads back to a file already read; remove the loop")
        if not resolved.is_file():
            raise UserError(
                f"{chain[0]}: base {base!r} is not a file (looked for {resolved}); a base is relative to the file naming it"
            )
        seen.add(resolved)
        chain.insert(0, str(Path(chain[0]).parent / base))


def base_of(path: str | Path) -> str | None:
    """The file's `base:`, or None; a file that cannot be read is left for the parser to report."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    base = data.get("base") if isinstance(data, dict) else None
    if base is not None and not isinstance(base, str):
        raise UserError(f"{path}: base is {base!r}; write the path of the config file this one overlays")
    return base


def merged_config(path: str | Path) -> dict:
    """The config a file and its bases make together, as one mapping (sections merged key by key,
    the later file winning), without `base`: what a sweep's runs read as one file."""
    merged: dict = {}
    for file in base_chain(str(path)):
        _merge(merged, yaml.safe_load(Path(file).read_text(encoding="utf-8")) or {})
    merged.pop("base", None)
    return merged


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
