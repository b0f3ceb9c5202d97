"""The `run` section of a config: where a run writes (<run.root>/<run.name>/, laid out as
minitx/files/checkpoint.py shows) and what it does besides training.

Plain settings, apart from how a run saves (run.py, which imports Lightning): the train command
reads them before Lightning is imported (precheck.py), and --help describes them from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..files.configs import DEFAULT_CONFIG, FILE, CommandLine

DEFAULT_ROOT = "runs"


@dataclass
class RunSettings:
    """Where a run writes and what it does besides training.

    name: the run directory is <root>/<name>; --ckpt_path last resumes from it. Unset: the name
        of the (last) config file, e.g. "gqa" for --config configs/gqa.yaml.
    root: parent directory of run directories (--trainer.default_root_dir sets it too).
    checkpoint_every_n_steps: also refresh last.ckpt every N optimiser steps (0: only at
        validations and at the end).
    keep_every_n_steps: keep each timed checkpoint as step-<N>.ckpt instead of only refreshing last.ckpt.
    keep_steps: also keep a checkpoint as step-<N>.ckpt at each of these optimiser steps (the
        ablation ladder branches a learning-rate decay from each, see minitx/ablation/plan/ladder.py).
    tensorboard: also write TensorBoard event files, beside the CSV logs in <run dir>/logs
        (`tensorboard --logdir <run dir>/logs`).
    wandb: also log to Weights & Biases (WANDB_MODE=offline works without an account).
    wandb_project: the W&B project.
    wandb_group: the W&B run group (the ablation command puts one sweep in one group).
    sample_tokens: tokens sampled from the trained model at the end (0: none).
    sample_prompt: text the sample starts from.
    sample_temperature: softmax temperature of that sample.
    """

    name: str | None = None
    root: str = DEFAULT_ROOT
    checkpoint_every_n_steps: int = 0
    keep_every_n_steps: bool = False
    keep_steps: list[int] | None = None
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "minitx"
    wandb_group: str | None = None
    sample_tokens: int = 200
    sample_prompt: str = "\n"
    sample_temperature: float = 0.8

    @property
    def dir(self) -> Path:
        return Path(self.root).expanduser() / (self.name or "default")

    @property
    def checkpoint_dir(self) -> Path:
        return self.dir / "checkpoints"


def settle_run_section(
    run: Any, line: CommandLine, default_root_dir: str | None, attention: Any = None
) -> None:
    """Fill in what the `run` section leaves to others, in place (a parsed section: item access):
    an unset run.name (default_run_name). trainer.default_root_dir, Lightning's place for a run's
    files, is honoured as the parent of run directories (run.root), since a run directory holds
    what Lightning would put there; given together with a different run.root it is refused, as
    one of the two would be ignored."""
    if run["name"] is None:
        run["name"] = default_run_name(line, attention)
    if default_root_dir is None or str(default_root_dir) == str(run["root"]):
        return
    if str(run["root"]) != DEFAULT_ROOT:
        raise UserError(
            f"trainer.default_root_dir: {str(default_root_dir)!r} and run.root {str(run['root'])!r} both say where runs go; "
            "give only one (runs are written to <run.root>/<run.name>)"
        )
    run["root"] = str(default_root_dir)


def default_run_name(line: CommandLine, attention: Any = None) -> str:
    """The run name when none is given: the last config file's stem; for configs/default.yaml
    with an attention other than its own, the kind or the per-layer kinds ("local", "local-mta"),
    as configs/<kind>.yaml would be named, so that it does not collide with the default run."""
    files = [layer for layer in line.layers if layer.key == FILE]
    if not files:
        return "default"
    last = Path(str(files[-1].value))
    if attention is None or not (
        last.is_file() and DEFAULT_CONFIG.is_file() and last.samefile(DEFAULT_CONFIG)
    ):
        return last.stem
    model = files[-1].data.get("model") if isinstance(files[-1].data, dict) else None
    default = (model.get("attention") if isinstance(model, dict) else None) or {}
    layers, kind = attention.get("layers"), attention.get("kind")
    if layers and layers != default.get("layers"):
        return "-".join(dict.fromkeys(str(layer) for layer in layers))
    if kind and kind != default.get("kind", kind) and not layers:
        return str(kind)
    return last.stem
