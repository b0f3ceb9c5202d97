"""Paths that outlive the code: every module path, name and class path written into runs, sweeps,
checkpoints and installed scripts resolves at the home it has today.

The paths below are written out as minitx wrote them, not taken from the code; the checkpoints and
configs in tests/fixtures are searched too.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"

# Dotted paths that minitx wrote into what it saved, as it wrote them (module.Name or module:name).
RECORDED = {
    # every run of a sweep: its command line, run.json and config.yaml (--trainer.callbacks+=...)
    "minitx.ablation.summary.RunSummary",
    # a SLURM sweep's jobs, pickled by submitit into <output>/slurm/ and unpickled on a requeue
    "minitx.ablation.runs.slurm.RunJob",
    "minitx.ablation.plan.commands.Run",
    # a callback a run's config may name (tests/training/test_progress_lines.py)
    "minitx.training.progress.StepProgressBar",
    # lm-eval finds the adapter by module path
    "minitx.hf.lm_eval_adapter",
}

# Keys of a checkpoint that name a class by its name alone (Lightning's state_key): key -> the class.
STATE_KEYS = {
    "TextDataModule": "minitx.data.datamodule.TextDataModule",  # the datamodule's data position
    "RunCheckpoints": "minitx.training.run.RunCheckpoints",  # checkpoint["callbacks"]: best score
}
LIGHTNING_KEYS = {
    "epoch",
    "global_step",
    "pytorch-lightning_version",
    "state_dict",
    "loops",
    "callbacks",
    "optimizer_states",
    "lr_schedulers",
    "hparams_name",
    "hyper_parameters",
    "datamodule_hparams_name",
    "datamodule_hyper_parameters",
    "minitx",
}
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?$")


def resolve(path: str):
    """The object a recorded path names: `module:attr`, `package.module.Name` or a module."""
    if ":" in path:
        module, _, attr = path.partition(":")
        return getattr(importlib.import_module(module), attr)
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError:
        module, _, attr = path.rpartition(".")
        return getattr(importlib.import_module(module), attr)


def checkpoint_fixtures() -> list[Path]:
    return sorted(FIXTURES.rglob("*.ckpt"))


def class_paths_in(value, key: str = "") -> list[str]:
    """The strings of a saved structure that name code: a class_path, Lightning's _instantiator,
    a kind's modules, a callback given by name."""
    found = []
    if isinstance(value, dict):
        for name, item in value.items():
            if name in ("class_path", "_instantiator") and isinstance(item, str):
                found.append(item)
            elif name == "kind_modules" and isinstance(item, list):
                found.extend(m for m in item if isinstance(m, str))
            else:
                found.extend(class_paths_in(item, str(name)))
    elif isinstance(value, list):
        for item in value:
            found.extend(class_paths_in(item, key))
    elif isinstance(value, str) and key == "callbacks" and DOTTED.match(value):
        found.append(value)
    return found


@pytest.mark.parametrize("path", sorted(RECORDED))
def test_a_recorded_path_resolves(path):
    assert resolve(path) is not None


def test_the_installed_scripts_resolve():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[project.scripts]\n", 1)[1].split("\n[", 1)[0]
    scripts = re.findall(r'^[\w-]+ = "([\w.:]+)"', section, re.MULTILINE)
    assert scripts
    for target in scripts:
        assert callable(resolve(target)), target


def test_every_command_module_resolves():
    """minitx.cli imports each command's module by name when it runs."""
    from minitx.cli import COMMANDS

    for module in COMMANDS.values():
        assert callable(resolve(f"{module}:main")), module


@pytest.mark.parametrize("path", checkpoint_fixtures(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_what_an_old_checkpoint_names_resolves(path):
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    for key in checkpoint:
        assert key in LIGHTNING_KEYS or key in STATE_KEYS, f"{path.name}: unknown key {key!r}"
    for key in [*checkpoint, *checkpoint.get("callbacks", {})]:
        if key in STATE_KEYS:
            cls = resolve(STATE_KEYS[key])
            assert cls.__qualname__ == key  # Lightning finds a state by this name
    saved = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
    for class_path in class_paths_in(saved):
        assert resolve(class_path) is not None, f"{path.name}: {class_path}"


def test_what_an_old_config_names_resolves():
    """The run configs saved by older versions (tests/fixtures) and the config files shipped, which
    users' own configs copy: every class_path and callback named in them."""
    paths = sorted([*FIXTURES.rglob("*.yaml"), *(ROOT / "configs").rglob("*.yaml")])
    assert paths
    for path in paths:
        for class_path in class_paths_in(yaml.safe_load(path.read_text(encoding="utf-8")) or {}):
            assert resolve(class_path) is not None, f"{path}: {class_path}"
