"""The train command's front: --help and every mistake in a command line's keys and values,
answered before Lightning is imported.

LightningCLI builds its parser from the Trainer's signature, so it imports Lightning (and with
it torchmetrics, torch._dynamo and, where installed, transformers): seconds before a user who
asked for --help or mistyped a key hears anything. So `train` first parses its command line with
a parser of the same library (jsonargparse) built from the settings' own declarations:

    model.*     ModelConfig's fields and Optimisation's (training/optim/settings.py), and MinitxLM's switches
    data.*      DataConfig (data/config.py)
    run.*       RunSettings (training/runsection.py)
    trainer.*   the names of the Trainer's arguments, read from Lightning's source, not imported

It then makes the value checks of the model, data and run sections (inputs.check_settings: a
layer count of 0, a width its heads do not divide, an unknown attention kind, a negative batch
size, an optimiser setting out of range), the calls LightningCLI's parse would make first; the
CommandLine (files/configs.py), read once and handed on, says they are made, so that parse leaves
them out. A command line it refuses is refused here, with the line LightningCLI's parse would
give (messages.py); one it accepts is parsed again, from the start, by LightningCLI, which alone
decides what a run is. So this parser may refuse only what LightningCLI refuses: it takes the trainer's
values as they come (Lightning's types are Lightning's), and steps aside for what only
LightningCLI knows (a `.help` of a class, --print_shtab). tests/training/test_precheck.py holds
its keys and LightningCLI's equal.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import json
import re
import sys
import textwrap
import types
import typing
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, Literal, Optional, Union

from ..config import ModelConfig
from ..data.config import DataConfig
from ..errors import UserError
from ..files.configs import CommandLine
from .classpaths import check_command_line
from .inputs import check_settings
from .messages import LINKED, LINKED_AT_PARSE, parse_error_message
from .optim import Optimisation
from .runsection import RunSettings

HELP_TRAINER = "--help-trainer"  # LightningCLI's own --help: every trainer option, typed and described


@dataclass
class TrainingSwitches:
    """MinitxLM's arguments besides Optimisation's and ModelConfig's (module.py; LightningCLI reads
    them from its signature).

    compile: torch.compile the Transformer for training and validation steps
    activation_checkpointing: recompute each block's activations in backward: less memory, about
        one more forward
    init_from: a minitx checkpoint (.ckpt) or a local transformers directory the run starts from
    allow_noncausal_kinds: train a kind from outside minitx that lets a future token change an
        earlier output (one meant to see the whole sequence); recorded in the run's config
    """

    max_steps: int = -1  # filled in from trainer.max_steps (messages.LINKED): not in --help
    compile: bool = False
    activation_checkpointing: bool = False
    init_from: str | None = None
    allow_noncausal_kinds: bool = False


# Whole command lines left to LightningCLI: a class's help, a shell completion script.
ONLY_LIGHTNING = (".help", "print_shtab")


@functools.cache
def trainer_argument_names() -> tuple[str, ...] | None:
    """The Trainer's keyword arguments, from lightning/pytorch/trainer/trainer.py's source (None
    where that file is not found or has no Trainer.__init__: trainer keys are then not checked)."""
    spec = importlib.util.find_spec("lightning")  # finds, does not import
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(spec.submodule_search_locations[0]) / "pytorch" / "trainer" / "trainer.py"
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    trainer = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer"), None)
    init = next(
        (n for n in getattr(trainer, "body", ()) if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
        None,
    )
    if init is None:
        return None
    args = init.args
    return tuple(a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg != "self")


def declared(cls: type) -> list[tuple[str, Any, Any]]:
    """(name, type, field) of each field of a dataclass, as make_dataclass takes them."""
    hints = typing.get_type_hints(cls)
    return [
        (f.name, hints[f.name], dataclasses.field(default=f.default, default_factory=f.default_factory))
        for f in fields(cls)
    ]


def model_arguments() -> type:
    """MinitxLM's arguments as one dataclass: Optimisation's fields, max_steps and the switches,
    then ModelConfig's (LightningCLI reads the same from MinitxLM's signature and its **model)."""
    arguments = [*declared(Optimisation), *declared(TrainingSwitches), *declared(ModelConfig)]
    return dataclasses.make_dataclass("MinitxLMArguments", arguments)


def light_parser() -> Any:
    """A parser of the train command's keys, LightningCLI's in all but the trainer's types."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    # allow_abbrev=False: a key is taken only in full, as LightningCLI's parser is told (command.py).
    parser = ArgumentParser(prog="train.py", exit_on_error=False, allow_abbrev=False)
    parser.add_argument("-c", "--config", action=ActionConfigFile)
    parser.add_argument("--seed_everything", type=Union[bool, int], default=1337)  # noqa: UP007
    # The Trainer's arguments by name, any value: their types are Lightning's, judged by LightningCLI.
    trainer = [(name, Any, dataclasses.field(default=None)) for name in trainer_argument_names() or ()]
    parser.add_class_arguments(dataclasses.make_dataclass("TrainerArguments", trainer), "trainer")
    parser.add_class_arguments(model_arguments(), "model")
    parser.add_class_arguments(DataConfig, "data")
    parser.add_class_arguments(RunSettings, "run")
    parser.add_argument("--base", type=Optional[str], default=None)  # noqa: UP045
    parser.add_argument("--ckpt_path", type=Optional[str], default=None)  # noqa: UP045
    return parser


def to_judge(args: Sequence[str], trainer_names: Sequence[str]) -> list[str]:
    """args without what the light parser does not judge, each flag with its value:
    --print_config (LightningCLI's parse prints the config it resolves), and the trainer flags
    of a key inside an argument (`--trainer.logger.init_args.save_dir`) or of an append
    (`--trainer.callbacks+`) whose first name is the Trainer's."""
    out: list[str] = []
    words = list(args)
    i = 0
    while i < len(words):
        word = words[i]
        flag, eq, _ = word.partition("=")
        name = flag[len("--trainer.") :].rstrip("+") if flag.startswith("--trainer.") else ""
        if flag == "--print_config" or (
            ("." in name or flag.endswith("+")) and name.split(".")[0] in trainer_names
        ):
            has_value = not eq and i + 1 < len(words) and not words[i + 1].startswith("--")
            i += 2 if has_value else 1
            continue
        out.append(word)
        i += 1
    return out


def check_arguments(line: CommandLine, own_flags: Sequence[str] = ()) -> None:
    """Raise the UserError LightningCLI's parse would raise for a mistake in `line`, without
    importing Lightning; return where it finds none (`line.checked` then says so), or where the
    command line asks what only LightningCLI answers. own_flags: a command's flags besides the
    keys (prepare's --verify), which a did-you-mean may name too."""
    if any(flag.endswith(ONLY_LIGHTNING) for flag in line.flags):
        return
    check_command_line(line)
    for flag in line.flags:
        if flag in LINKED:  # jsonargparse's words, as LightningCLI's parse says them
            raise UserError(
                parse_error_message(ValueError(f'Linked "{flag}" must be given via "{LINKED[flag]}".'))
            )
    trainer_names = trainer_argument_names()
    if trainer_names is None:
        return  # Lightning's source is not where it was: its parser alone can judge the trainer keys
    from jsonargparse import ArgumentError

    parser = light_parser()
    try:
        config = parser.parse_args(to_judge(line.args, trainer_names))
    except ArgumentError as err:
        raise UserError(parse_error_message(err, parser, line.files, own_flags)) from None
    if "print_config" in line.flags:
        return  # LightningCLI prints the config it parsed and exits before it checks a value
    # The values: the checks LightningCLI's parse makes first (inputs.check_settings), on the
    # sections as it parses them, its links applied: the data's block_size is the model's,
    # whatever a config file holds. (model.max_steps takes trainer.max_steps as given, None where
    # unset, not LightningCLI's default: no check reads it.)
    for key in LINKED_AT_PARSE:
        config[key] = config[LINKED[key]]
    check_settings(config, line)
    line.checked = True


# ------------------------------------------------------------------------------------------------
# --help: every key of minitx's sections with its type, default and description, the trainer's names


def described(dataclass: type) -> dict[str, str]:
    """{field: its description} from the dataclass's docstring, where it has `name: text` entries."""
    found: dict[str, str] = {}
    name = None
    for line in (dataclass.__doc__ or "").splitlines():
        entry = re.fullmatch(r"\s{4,8}(\w+): (.*)", line)
        if entry and entry[1] in dataclass.__dataclass_fields__:
            name = entry[1]
            found[name] = entry[2].strip()
        elif name and line.startswith(" " * 8) and line.strip():
            found[name] += " " + line.strip()
        else:
            name = None
    return found


def type_words(hint: Any) -> str:
    """int, float | None, one of gelu/swiglu, list[int] ...: a type as a reader of --help knows it."""
    if typing.get_origin(hint) is Literal:
        return "one of " + "/".join(str(choice) for choice in typing.get_args(hint))
    if typing.get_origin(hint) in (Union, types.UnionType):
        return " | ".join("null" if a is type(None) else type_words(a) for a in typing.get_args(hint))
    return str(hint).replace("typing.", "") if typing.get_args(hint) else getattr(hint, "__name__", str(hint))


def wrapped(text: str, indent: int) -> str:
    """text in lines of 100 characters, indented; a flag is never cut at its hyphens."""
    margin = " " * indent
    return textwrap.fill(text, 100, initial_indent=margin, subsequent_indent=margin, break_on_hyphens=False)


def key_entries(section: str, dataclass: type) -> list[str]:
    """One entry per settable field of `dataclass` as `section`'s keys; a nested dataclass's too."""
    hints, descriptions = typing.get_type_hints(dataclass), described(dataclass)
    entries = []
    for field in fields(dataclass):
        if f"{section}.{field.name}" in LINKED:
            continue
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):  # a section inside the section: model.attention
            entries += key_entries(f"{section}.{field.name}", hint)
            continue
        # `  --model.lr  float, default 0.001` and its description, if any, wrapped beneath.
        default = field.default if field.default is not MISSING else field.default_factory()
        head = f"  --{section}.{field.name}  {type_words(hint)}, default {json.dumps(default)}"
        description = descriptions.get(field.name)
        entries.append(head + ("\n" + wrapped(description, 6) if description else ""))
    return entries


HELP_HEAD = f"""usage: train.py [-c CONFIG ...] [--KEY VALUE ...] [--print_config] [--ckpt_path PATH]

Train a minitx language model. Every key of a config file is also a flag (`--model.d_model 192`);
flags override the files, a file given later overrides an earlier one, and without --config the
run is configs/default.yaml's. A config file's sections are these keys' first names. The defaults
below are the settings' own; configs/default.yaml changes some (--print_config shows a run's).

  -h, --help              this text
  {HELP_TRAINER}          LightningCLI's full help: every trainer option, typed and described
                          (it imports Lightning: seconds)
  -c, --config CONFIG     a config file (YAML); repeat to overlay one on another
  --print_config          print the resolved config and exit
  --seed_everything SEED  the seed of the run, or true for a random one (int | bool, default 1337)
  --ckpt_path PATH        resume from this checkpoint: a path, or 'last' / 'best' in
                          <run.root>/<run.name>/checkpoints/
  --base FILE             a config file's key, not a flag: the file it overlays, read first
"""


def help_text() -> str:
    """What `python train.py --help` prints: made from the declarations, so it lists every key."""
    sections = {
        "model: the network (ModelConfig), its optimiser and schedule (Optimisation)": [
            *key_entries("model", Optimisation),
            *key_entries("model", TrainingSwitches),
            *key_entries("model", ModelConfig),
        ],
        "data: the text, its tokenizer and the batches (DataConfig)": key_entries("data", DataConfig),
        "run: where the run writes and what it does besides training": key_entries("run", RunSettings),
    }
    out = [HELP_HEAD]
    for title, entries in sections.items():
        out += [title, *entries, ""]
    names = "  ".join(f"--trainer.{name}" for name in trainer_argument_names() or ())
    out.append(
        f"trainer: the arguments of Lightning's Trainer; `python train.py {HELP_TRAINER}` describes them"
    )
    out.append(wrapped(names, 2))
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    """The `train` command: --help and mistakes answered here, a run by command.main."""
    raw = list(sys.argv[1:] if argv is None else argv)
    if HELP_TRAINER in raw:
        line = CommandLine.read(["--help"], default_config=True)
    elif "-h" in raw or "--help" in raw:
        print(help_text(), end="")
        return
    else:
        line = CommandLine.read(raw, default_config=True)
        check_arguments(line)
    from .command import main as train

    train(line)
