"""Checks of a parsed train config that need no data, model or trainer: made right after parsing,
before the seed is set or anything is built, read or written (also by ablate's pre-check).
Those that read no trainer setting (check_settings) are made once: by the train command's
precheck, before Lightning is imported, or, on a command line the precheck has not checked, first
of all on LightningCLI's parse.

Lightning and torch find most of these late (a ZeroDivisionError at fit start, a KeyError after
the whole run, an optimiser that refuses eps=-1 after config.yaml is written) or never (a run name
that leaves run.root, a negative sample count read as 0). Each check names the key and the fix.
One check builds something: the layers of an attention kind from outside minitx, probed for
causality on a random generator of their own (verify/probe.py; milliseconds for small models).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from ..config import ModelConfig, check_given_options, used_kinds
from ..data.config import DataConfig, check_given_settings, given_settings
from ..errors import UserError
from ..files.configs import CommandLine
from ..generation.inputs import machine_memory
from ..kinds import import_config_kinds
from ..verify.probe import find_leak
from .optim import Optimisation

SEED_RANGE = (0, 2**32 - 1)  # numpy's seeds, which Lightning's seed_everything also sets
BYTES_PER_TRAINED_PARAMETER = 16  # fp32 weights, gradients and AdamW's two moments


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _at_least(key: str, value: Any, low: int, meaning: str = "") -> None:
    if _is_int(value) and value < low:
        raise UserError(f"{key}: is {value}; use {low} or more{meaning}")


def _count_or_fraction(key: str, value: Any, fix: str) -> None:
    """Lightning's 'batches' options: a whole number of batches >= 1, or a fraction in (0, 1]."""
    if value is None:
        return
    if _is_int(value) and value < 1 or isinstance(value, float) and not 0 < value <= 1:
        raise UserError(f"{key}: is {value}; {fix}")


def check_trainer_section(trainer: Any) -> None:
    max_steps = trainer.get("max_steps")
    if max_steps is None or _is_int(max_steps) and max_steps < 1:
        raise UserError(
            "trainer.max_steps: must be set (e.g. 5000); the training data never runs out, so runs are bounded in steps"
        )
    for key, fix in {
        "val_check_interval": "validate every N optimiser steps with a whole number of 1 or more (e.g. 250)",
        "limit_val_batches": "a run reports and checkpoints by its val loss, so validation cannot be off; make it smaller with data.val_batches",
        "limit_train_batches": "use a whole number of 1 or more, or leave it unset (runs are bounded by trainer.max_steps)",
    }.items():
        _count_or_fraction(f"trainer.{key}", trainer.get(key), fix)
    for key, low, meaning in (
        ("accumulate_grad_batches", 1, " (1: no accumulation)"),
        ("log_every_n_steps", 1, ""),
        ("num_sanity_val_steps", -1, " (-1: the whole validation set)"),
        ("num_nodes", 1, ""),
        ("check_val_every_n_epoch", 1, ""),
    ):
        _at_least(f"trainer.{key}", trainer.get(key), low, meaning)
    max_epochs = trainer.get("max_epochs")
    if _is_int(max_epochs) and (max_epochs == 0 or max_epochs < -1):
        raise UserError(
            f"trainer.max_epochs: is {max_epochs}; leave it unset (runs are bounded by trainer.max_steps) or use -1"
        )
    clip = trainer.get("gradient_clip_val")
    if clip is not None and not (isinstance(clip, (int, float)) and clip >= 0 and math.isfinite(clip)):
        raise UserError(f"trainer.gradient_clip_val: is {clip}; use 0 or more (0 or unset: no clipping)")
    accumulate, interval = trainer.get("accumulate_grad_batches"), trainer.get("val_check_interval")
    if _is_int(interval) and _is_int(accumulate) and interval % accumulate:
        raise UserError(
            f"trainer.val_check_interval: {interval} batches is not a multiple of "
            f"trainer.accumulate_grad_batches={accumulate}; validation must fall between optimiser steps"
        )


def check_run_section(run: Any, default_root_dir: str | None) -> None:
    _at_least("run.sample_tokens", run.get("sample_tokens"), 0, " (0: no sample)")
    every = run.get("checkpoint_every_n_steps")
    _at_least("run.checkpoint_every_n_steps", every, 0, " (0: only at validations and at the end)")
    for step in run.get("keep_steps") or ():
        _at_least("run.keep_steps", step, 1, " (optimiser steps at which to keep a checkpoint)")
    temperature = run.get("sample_temperature")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise UserError(f"run.sample_temperature: is {temperature}; use 0 (greedy) or more, e.g. 0.8")
    check_run_name(run.get("name"))
    for key, root in (("run.root", run.get("root")), ("trainer.default_root_dir", default_root_dir)):
        if root is not None:
            check_root(key, Path(str(root)).expanduser())


def check_run_name(name: str | None) -> None:
    """A run name is one directory inside run.root: no separators, no '..', not absolute."""
    if name is None:
        return
    parts = Path(name).parts
    if (
        not name.strip()
        or "\\" in name
        or Path(name).is_absolute()
        or len(parts) != 1
        or parts[0] in (".", "..")
    ):
        raise UserError(
            f"run.name: {name!r} is not a plain directory name inside run.root; use a name without '/', '..' "
            "or a leading '/', and set run.root to choose where runs go"
        )


def check_root(key: str, root: Path) -> None:
    """root is, or can become, a writable directory (checked on its nearest existing ancestor)."""
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{key}: {str(existing)!r} is a file, not a directory; give a directory for runs")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{key}: {str(existing)!r} is not writable; give a directory you can write to")


def check_model_memory(model: Any, trainer: Any) -> None:
    """Refuse, before anything is allocated, a model whose training state alone exceeds the memory
    of the device it would train on. The count is a lower bound (attention's query and output
    projections and a 4x MLP: 10 d_model^2 per layer, plus the embedding), so no model that fits
    is refused."""
    d_model, n_layer, vocab = model.get("d_model"), model.get("n_layer"), model.get("vocab_size") or 0
    if not (_is_int(d_model) and _is_int(n_layer) and d_model > 0 and n_layer > 0):
        return  # ModelConfig reports these
    params = n_layer * 10 * d_model**2 + vocab * d_model
    needed = params * BYTES_PER_TRAINED_PARAMETER
    available, where = device_memory(trainer.get("accelerator"))
    if available and needed > available:
        raise UserError(
            f"model: n_layer={n_layer} and d_model={d_model} make at least {params:.3g} parameters, whose training state "
            f"(weights, gradients, AdamW moments: {BYTES_PER_TRAINED_PARAMETER} bytes each) needs {needed / 1e9:,.0f} GB, "
            f"more than the {available / 1e9:,.0f} GB of {where}; lower model.d_model or model.n_layer"
        )


def device_memory(accelerator: Any) -> tuple[int | None, str]:
    """(bytes, description) of the memory one training process can use: a GPU's, or the machine's."""
    # None: unset in the precheck, whose trainer keys have no defaults; Lightning's is "auto".
    if (accelerator is None or str(accelerator) in ("gpu", "cuda", "auto")) and torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory, "GPU memory"
    return machine_memory(), "this machine's memory"


def check_config(config: Any, line: CommandLine) -> None:
    """Every check of this module on a parsed train config (jsonargparse Namespace: item access)
    and the command line it was parsed from; check_settings' only where the precheck has not made
    them on that command line."""
    if not line.checked:
        check_settings(config, line)
    check_trainer_section(config["trainer"])


def check_settings(config: Any, line: CommandLine) -> None:
    """The checks of the seed and the model, data and run sections, in the order a mistake is
    reported: they read no trainer setting but trainer.default_root_dir (a path) and
    trainer.accelerator (a name), so the precheck (precheck.py), whose trainer values are untyped,
    makes them too and answers the same line. `config` is a jsonargparse Namespace on both
    paths (the precheck's parse and LightningCLI's), its sections Namespaces too."""
    # The modules of the config's own kinds: the user named them, so importing them (running
    # their code) is what they asked for. The model's checks look their kinds up.
    import_config_kinds(config["model"]["attention"], "model.")
    seed = config.get("seed_everything")
    if _is_int(seed) and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise UserError(
            f"seed_everything: is {seed}; use a whole number from {SEED_RANGE[0]} to {SEED_RANGE[1]}"
        )
    check_run_section(config["run"], config["trainer"].get("default_root_dir"))
    # Before the model's own checks, which list its layers: n_layer 10**20 is refused at once.
    check_model_memory(config["model"], config["trainer"])
    check_model_section(config["model"].as_dict())
    # Options of a kind no layer uses, refused whenever a config file or flag of `line` gives them,
    # at their defaults too (the parsed section cannot tell: its parse fills defaults in).
    attention = config["model"]["attention"]
    with errors_named("model"):
        check_given_options(line.options, used_kinds(attention["kind"], attention["layers"]))
    # After the model's: data.block_size is model.block_size (linked), named as the model's. The
    # data section is built as the data module will build it (DataConfig's checks, a synthetic
    # task's included): before the seed is set, whose log line would come before the error.
    DataConfig.from_config(config["data"].as_dict())
    # Settings of a data source (a text source or a task) that data.source does not read, given
    # by a config file or a flag at other than their defaults, as unused attention options are.
    check_given_settings(given_settings(line.given("data")))


@contextmanager
def errors_named(prefix: str) -> Iterator[None]:
    """A config's error (a ValueError naming the field, e.g. "attention.n_kv_head: ...") as a
    UserError naming the config key ("model.attention.n_kv_head: ...")."""
    try:
        yield
    except (ValueError, TypeError) as err:  # UserError is a ValueError
        raise UserError(f"{prefix}.{err}") from None


def check_model_section(section: dict) -> None:
    """The checks MinitxLM's constructor makes, without building the network (see check_train_args),
    and the causality probe of the kinds from outside minitx, unless model.allow_noncausal_kinds."""
    config_fields = {f.name for f in fields(ModelConfig)}
    with errors_named("model"):
        config = ModelConfig.from_dict({key: value for key, value in section.items() if key in config_fields})
    Optimisation.of(section)
    if not section.get("allow_noncausal_kinds"):
        refuse_noncausal_kinds(config)


def refuse_noncausal_kinds(config: ModelConfig) -> None:
    """A kind from outside minitx that lets a future token change an earlier output is refused
    (verify/probe.py) in one line that names it, its file, the layer and the position."""
    if (leak := find_leak(config)) is not None:
        raise UserError(
            f"model.attention: {leak.words()}; a causal kind hides from each query the keys after it "
            "(is_causal=True in attend, the cache's mask in attend_cached), or, for a kind meant to see "
            "the whole sequence, train with --model.allow_noncausal_kinds true"
        )
