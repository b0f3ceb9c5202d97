"""Training: the LightningModule and the `train` command, one file per concern.

    module.py      MinitxLM (loss, steps, validation, checkpoint hooks)
    optim/         the optimiser (Muon or AdamW, decay on matrices only) and its schedule
                   (warmup, then cosine or WSD): settings, schedules, the registry, one file each
    throughput.py  tokens/s and MFU (the device peak table), one meter for every consumer
    runsection.py  RunSettings (the `run` section), the run's name and directory
    run.py         how a run saves: the trainer's directory and loggers, atomic CheckpointIO, last/best callback
    resume.py      checks that a checkpoint can be resumed, made before anything is written;
                   what a resumed run changes from its checkpoint's settings, said in one line
    inputs.py      checks of the parsed config that need no data, model or trainer
    classpaths.py  what a command line may make jsonargparse import, checked before parsing
    interrupt.py   Ctrl-C: finish the step, save last.ckpt, exit with status 130
    messages.py    jsonargparse's errors as one line; the keys the train command fills in from others
    precheck.py    train's front: --help and input mistakes answered before Lightning is imported
    command.py     TrainCLI (LightningCLI), `main`, checked_config
    prepare_command.py  the prepare command: the train config's data, ahead of time
    quick.py       a plain loop on a synthetic task, no Lightning (slow tests, reduced diagnostics)

Imports flow down that list's dependencies only: command -> (module, run, resume, messages) ->
(optim, throughput); nothing here imports minitx.cli.
"""

import importlib

# Each name is imported from its module when first read, not with the package: command.py and
# module.py import Lightning (with torchmetrics, torch._dynamo and, where installed, transformers:
# seconds at every start), which `ablate --help`, a sweep's one-line errors and the benchmarks
# that only need optim/ or throughput.py would otherwise pay for.
_HOMES = {
    "TrainCLI": "command",
    "MinitxLM": "module",
    "lm_loss": "module",
    "lr_at": "optim",
    "optimizer_groups": "optim",
    "ThroughputMeter": "throughput",
    "peak_flops": "throughput",
}

__all__ = sorted([*_HOMES, "check_train_args", "checked_train_config", "precheck_train_args"])


def precheck_train_args(args):
    """The UserError `train` raises for a mistake in a key, a value (its type, or one the model's,
    optimiser's, data's or run's checks refuse) or a config file, found without importing
    Lightning (precheck.py); check_train_args makes it first. Returns the command line as read
    (files/configs.py's CommandLine), checked."""
    from ..files.configs import CommandLine
    from .precheck import check_arguments

    line = CommandLine.read(args)
    check_arguments(line)
    return line


def check_train_args(args):
    """Raise the UserError `train` would raise for a mistake in the config, in a second or two
    (command.checked_config): ablate imports this name at start, and its --help and its sweep
    file's errors come before any run is checked. Returns the data section as parsed
    (TextDataModule's arguments), so the caller can prepare it once."""
    return checked_train_config(args)["data"]


def checked_train_config(args):
    """The whole config `train` would run with (every section as plain data), checked."""
    line = precheck_train_args(args)
    from .command import checked_config  # Lightning: seconds

    return checked_config(line)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
