"""The train command reads its command line and its config files once (files/configs.py's
CommandLine), hands them from the precheck to LightningCLI, and makes the settings' checks once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from minitx.cli import train_main
from minitx.config import ModelConfig
from minitx.files import configs
from minitx.files.configs import CommandLine

# The induction task (nothing to read or prepare) and a one-layer model.
TINY = {
    "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "block_size": 8, "mlp": "none"},
    "data": {
        "source": "induction",
        "task": {"induction": {"vocab": 8, "length": 8}},
        "toy_train_size": 64,
        "toy_val_size": 8,
        "batch_size": 4,
    },
    "trainer": {"accelerator": "cpu", "devices": 1, "max_steps": 2, "enable_progress_bar": False},
    "run": {"sample_tokens": 0},
}


class Built(Exception):
    """Raised where the run would start writing: everything is read, checked and built by then."""


def test_train_reads_its_command_line_and_config_files_once(tmp_path, monkeypatch):
    from minitx.training import command

    base, top = tmp_path / "base.yaml", tmp_path / "top.yaml"
    base.write_text(yaml.safe_dump(TINY))
    top.write_text(
        "base: base.yaml\nmodel: {attention: {kind: local, options: {local: {window: 4, n_global: 1}}}}\n"
    )
    lines, files, models = [], Counter(), []
    read_line, read_file = CommandLine.read.__func__, configs.read_config_file
    post_init = ModelConfig.__post_init__

    def counted_line(cls, *args, **kwargs):
        lines.append(args)
        return read_line(cls, *args, **kwargs)

    def counted_file(path):
        files[Path(path).name] += 1
        return read_file(path)

    def counted_model(config):
        models.append(config)
        post_init(config)

    def built(*_):
        raise Built

    monkeypatch.setattr(CommandLine, "read", classmethod(counted_line))
    monkeypatch.setattr(configs, "read_config_file", counted_file)
    monkeypatch.setattr(ModelConfig, "__post_init__", counted_model)
    monkeypatch.setattr(command, "start_run", built)
    with pytest.raises(Built):
        # base.yaml named twice: on the command line, and as top.yaml's base
        train_main(
            ["--config", str(base), "--config", str(top), "--model.attention.options.local.window", "2"]
            + ["--run.root", str(tmp_path)]
        )
    assert len(lines) == 1
    assert files == {"base.yaml": 1, "top.yaml": 1}
    # One ModelConfig for the precheck's checks (before Lightning is imported), one for the model;
    # LightningCLI's parse does not check the settings again.
    assert len(models) == 2
    # The layers in order: the base, the file over it, then the flag (one option, the other kept).
    assert models[-1].attention.kind == "local" and models[-1].attention.options["local"]["window"] == 2
    assert models[-1].attention.options["local"]["n_global"] == 1 and models[-1].n_layer == 1


def test_a_config_flag_without_a_file_is_one_line(capfd):
    assert train_main(["--config"]) == 2
    assert capfd.readouterr().err.strip() == "train: error: argument -c/--config: expected one argument"
