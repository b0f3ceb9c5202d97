"""Bad input to the commands: every input mistake (and each integer option at 0 and -1) ends the
command with exit 2, one line naming the option or file and the fix, no traceback, and nothing
written: no run directory, no token cache, no output directory.

All in-process (train_main, generate_main, ablate_main), with the helpers of runs.py and the
fixtures of conftest.py beside this file. The checks of train's config run right after parsing, so a refused
start has not even tokenised its data: the test gives each start its own cache directory and
checks that it was never created.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from runs import (
    flags,
    one_line_error,
    tiny_config,
    write_config,
    write_sweep,
)

from minitx.cli import generate_main, train_main

# (flags, fragments of the one line); each also runs through ablate's pre-check as a variant.
BAD_TRAIN_FLAGS = {
    "val_check_interval 0": (
        {"trainer.val_check_interval": 0},
        ["trainer.val_check_interval", "is 0", "1 or more"],
    ),
    "val_check_interval -1": ({"trainer.val_check_interval": -1}, ["trainer.val_check_interval", "is -1"]),
    "accumulate_grad_batches 0": (
        {"trainer.accumulate_grad_batches": 0},
        ["trainer.accumulate_grad_batches", "is 0", "1 or more"],
    ),
    "accumulate_grad_batches -1": (
        {"trainer.accumulate_grad_batches": -1},
        ["trainer.accumulate_grad_batches", "is -1"],
    ),
    "limit_val_batches 0": (
        {"trainer.limit_val_batches": 0},
        ["trainer.limit_val_batches", "is 0", "data.val_batches"],
    ),
    "limit_val_batches 0.0": ({"trainer.limit_val_batches": 0.0}, ["trainer.limit_val_batches", "is 0.0"]),
    "limit_train_batches 0": ({"trainer.limit_train_batches": 0}, ["trainer.limit_train_batches", "is 0"]),
    "log_every_n_steps 0": (
        {"trainer.log_every_n_steps": 0},
        ["trainer.log_every_n_steps", "is 0", "1 or more"],
    ),
    "log_every_n_steps -1": ({"trainer.log_every_n_steps": -1}, ["trainer.log_every_n_steps", "is -1"]),
    "num_sanity_val_steps -2": (
        {"trainer.num_sanity_val_steps": -2},
        ["trainer.num_sanity_val_steps", "-1 or more"],
    ),
    "max_epochs 0": ({"trainer.max_epochs": 0}, ["trainer.max_epochs", "is 0"]),
    "strategy unknown": ({"trainer.strategy": "fsdp3"}, ["trainer.strategy", "is 'fsdp3'", "fsdp2"]),
    "max_steps 0": ({"trainer.max_steps": 0}, ["trainer.max_steps", "must be set"]),
    "max_steps -1": ({"trainer.max_steps": -1}, ["trainer.max_steps", "must be set"]),
    "gradient_clip_val -1": ({"trainer.gradient_clip_val": -1}, ["trainer.gradient_clip_val", "0 or more"]),
    "model.eps -1": ({"model.eps": -1}, ["model.eps", "is -1.0", "positive"]),
    "model.eps 0": ({"model.eps": 0}, ["model.eps", "positive"]),
    "seed -1": ({"seed_everything": -1}, ["seed_everything", "is -1", "0 to 4294967295"]),
    "seed 2**32": ({"seed_everything": 2**32}, ["seed_everything", "is 4294967296"]),
    "seed 10**23": ({"seed_everything": 10**23}, ["seed_everything", "0 to 4294967295"]),
    "sample_temperature -1": (
        {"run.sample_temperature": -1},
        ["run.sample_temperature", "is -1.0", "0 (greedy) or more"],
    ),
    "sample_temperature nan": (
        {"run.sample_temperature": "nan"},
        ["run.sample_temperature", "'nan'", "give a number"],
    ),
    "sample_tokens -1": ({"run.sample_tokens": -1}, ["run.sample_tokens", "is -1", "0 or more"]),
    "checkpoint_every_n_steps -1": (
        {"run.checkpoint_every_n_steps": -1},
        ["run.checkpoint_every_n_steps", "is -1", "0 or more"],
    ),
    "run.name ../../x": (
        {"run.name": "../../x"},
        ["run.name", "'../../x'", "not a plain directory name", "run.root"],
    ),
    "run.name absolute": ({"run.name": "/tmp/elsewhere"}, ["run.name", "'/tmp/elsewhere'", "leading '/'"]),
    "run.name with a slash": ({"run.name": "a/b"}, ["run.name", "'a/b'"]),
    "run.name ..": ({"run.name": ".."}, ["run.name", "'..'"]),
    "d_model 1048576": (
        {"model.d_model": 1048576, "model.n_head": 2},
        ["model:", "d_model=1048576", "GB", "lower model.d_model or model.n_layer"],
    ),
    "n_layer 0": ({"model.n_layer": 0}, ["model.n_layer", "is 0"]),
    "n_layer -1": ({"model.n_layer": -1}, ["model.n_layer", "is -1"]),
    "d_model 0": ({"model.d_model": 0}, ["model.d_model"]),
    "n_head 0": ({"model.n_head": 0}, ["model.n_head"]),
    "warmup_steps -1": ({"model.warmup_steps": -1}, ["model.warmup_steps", "is -1", "0 or more"]),
    "lr 0": ({"model.lr": 0}, ["model.lr", "positive"]),
    "class_path of another module": (
        {"trainer.callbacks": [{"class_path": "antigravity.Fly"}]},
        ["trainer.callbacks", "'antigravity.Fly'", "MINITX_CLASS_PATHS=antigravity"],
    ),
}

# Options the data module checks (after parsing, before reading any text).
BAD_DATA_FLAGS = {
    "batch_size 0": ({"data.batch_size": 0}, ["data.batch_size", "at least 1"]),
    "batch_size -1": ({"data.batch_size": -1}, ["data.batch_size", "at least 1"]),
    "val_batches 0": ({"data.val_batches": 0}, ["data.val_batches", "at least 1"]),
    "val_batches -1": ({"data.val_batches": -1}, ["data.val_batches", "at least 1"]),
    "num_workers -1": ({"data.num_workers": -1}, ["data.num_workers", "0 or more"]),
    "block_size 0": ({"model.block_size": 0}, ["block_size"]),
    "block_size -1": ({"model.block_size": -1}, ["block_size"]),
}


def start(tmp_path: Path, corpus: dict, *args: str, **sections) -> int:
    """train_main on the tiny config with its own (not yet existing) cache and run root."""
    config = tiny_config(corpus, tmp_path / "runs", **sections)
    config["data"]["cache_dir"] = str(tmp_path / "cache")
    return train_main(["--config", str(write_config(tmp_path / "tiny.yaml", config)), *args])


def assert_nothing_written(tmp_path: Path) -> None:
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.yaml"], list(tmp_path.iterdir())


@pytest.mark.parametrize("case", [*BAD_TRAIN_FLAGS, *BAD_DATA_FLAGS])
def test_bad_train_option(case, tmp_path, corpus, capfd):
    overrides, fragments = {**BAD_TRAIN_FLAGS, **BAD_DATA_FLAGS}[case]
    assert start(tmp_path, corpus, *flags(overrides)) == 2
    one_line_error(capfd, "train", *fragments)
    assert_nothing_written(tmp_path)


def test_n_layer_of_10_to_the_20_in_yaml_is_refused_up_front(tmp_path, corpus, capfd):
    """It once hung while memory grew: refused from the parameter count, in well under a second of work."""
    assert start(tmp_path, corpus, model={"n_layer": 10**20}) == 2
    one_line_error(
        capfd, "train", "model:", "n_layer=100000000000000000000", "lower model.d_model or model.n_layer"
    )
    assert_nothing_written(tmp_path)


def test_a_class_path_in_yaml_is_not_imported(tmp_path, corpus, capfd, monkeypatch):
    """The module would create a marker file when imported: it never is."""
    modules = tmp_path / "modules"
    modules.mkdir()
    marker = tmp_path / "imported"
    (modules / "sideeffect.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Cb: pass\n")
    monkeypatch.syspath_prepend(str(modules))
    callbacks = [{"class_path": "sideeffect.Cb"}]
    assert start(tmp_path, corpus, trainer={"callbacks": callbacks}) == 2
    one_line_error(capfd, "train", "trainer.callbacks", "'sideeffect.Cb'", "MINITX_CLASS_PATHS=sideeffect")
    assert start(tmp_path, corpus, "--trainer.callbacks+=sideeffect.Cb") == 2  # the short form of a flag
    one_line_error(capfd, "train", "trainer.callbacks", "'sideeffect.Cb'")
    assert not marker.exists() and "sideeffect" not in sys.modules
    (modules / "sideeffect.py").unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["modules", "tiny.yaml"]


def test_a_config_file_that_is_not_utf8_text_or_is_a_directory(tmp_path, corpus, capfd):
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00model: {n_layer: 1}\n")
    assert train_main(["--config", str(tmp_path / "binary.yaml")]) == 2
    one_line_error(capfd, "train", "--config", "binary.yaml", "not UTF-8")
    assert train_main(["--config", str(tmp_path)]) == 2
    one_line_error(capfd, "train", "--config", "is a directory", "give a YAML file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["binary.yaml"]


def test_run_root_that_is_a_file(tmp_path, corpus, capfd):
    (tmp_path / "file").write_text("")
    assert start(tmp_path, corpus, "--run.root", str(tmp_path / "file" / "runs")) == 2
    one_line_error(capfd, "train", "run.root", "is a file", "give a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "tiny.yaml"]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into any directory")
def test_run_root_that_is_not_writable(tmp_path, corpus, capfd):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert start(tmp_path, corpus, "--run.root", str(locked / "runs")) == 2
    finally:
        locked.chmod(0o755)
    one_line_error(capfd, "train", "run.root", "not writable")
    assert not any(locked.iterdir())


BAD_GENERATE_OPTIONS = {
    "temperature nan": (["--temperature", "nan"], ["--temperature", "is nan", "use 0 for greedy"]),
    "temperature inf": (["--temperature", "inf"], ["--temperature", "is inf"]),
    "temperature 1e-45": (["--temperature", "1e-45"], ["--temperature", "at least 0.0001"]),
    "seed 10**23": (
        ["--seed", str(10**23)],
        ["--seed", "is 100000000000000000000000", "0 to 18446744073709551615"],
    ),
    "seed -1": (["--seed", "-1"], ["--seed", "is -1"]),
    "device meta": (["--device", "meta"], ["--device meta", "use --device cpu"]),
    "max_new_tokens 10**12": (
        ["--max-new-tokens", str(10**12)],
        ["--max-new-tokens", "GB for their ids", "ask for fewer"],
    ),
    "prompt file /dev/zero": (
        ["--prompt-file", "/dev/zero"],
        ["--prompt-file /dev/zero", "not a regular file"],
    ),
    "num_samples 0": (["--num-samples", "0"], ["--num-samples", "is 0", "1 or more"]),
    "num_samples -1": (["--num-samples", "-1"], ["--num-samples", "is -1"]),
}


@pytest.mark.parametrize("case", list(BAD_GENERATE_OPTIONS))
def test_bad_generate_option(case, checkpoints, capfd):
    options, fragments = BAD_GENERATE_OPTIONS[case]
    args = ["--ckpt", str(checkpoints["good"]), *options]
    if "--prompt-file" not in options:
        args += ["--prompt", "the"]
    assert generate_main(args) == 2
    one_line_error(capfd, "generate", *fragments)


def ablate_case(tmp_path: Path, corpus: dict, case: str) -> tuple[list[str], list[str]]:
    """(ablate arguments, fragments of the line) for one case; the sweep file is written first."""

    base = tiny_config(corpus, tmp_path / "unused")
    sweep = write_sweep(
        tmp_path / "sweep.yaml",
        base,
        [{"name": "a", "overrides": {}}, {"name": "b", "overrides": {"model.lr": 0.02}}],
    )
    output = str(tmp_path / "out")
    if case == "config is a directory":
        return ["--config", str(tmp_path), "--output", output], ["--config", "is a directory"]
    if case == "config is binary":
        (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00\x01")
        return ["--config", str(tmp_path / "binary.yaml"), "--output", output], ["--config", "not UTF-8"]
    if case == "output is a file":
        (tmp_path / "out").write_text("")
        return ["--config", str(sweep), "--output", output], ["--output", "is a file"]
    if case == "sweep seed out of range":
        write_sweep(sweep, base, [{"name": "a", "overrides": {}}], seed=2**40)
        return ["--config", str(sweep), "--output", output], ["seed_everything", "is 1099511627776"]
    if case == "only a comma":
        return ["--config", str(sweep), "--output", output, "--only", ","], ["--only", "names no variant"]
    assert case == "report-only on an empty output"
    return ["--config", str(sweep), "--output", output, "--report-only"], ["--report-only", "no finished run"]


ABLATE_CASES = [
    "config is a directory",
    "config is binary",
    "output is a file",
    "sweep seed out of range",
    "only a comma",
    "report-only on an empty output",
]


@pytest.mark.parametrize("case", ABLATE_CASES)
def test_bad_ablate_input(case, tmp_path, corpus, capfd):
    from minitx.cli import ablate_main

    args, fragments = ablate_case(tmp_path, corpus, case)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert ablate_main(args) == 2
    one_line_error(capfd, "ablate", *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no output directory, nothing else


def test_ablate_dry_run_writes_nothing(tmp_path, corpus, capfd):
    from minitx.cli import ablate_main

    args, _ = ablate_case(tmp_path, corpus, "only a comma")
    assert ablate_main(args[:4] + ["--dry-run"]) == 0
    assert "train_main" in capfd.readouterr().out  # the commands were printed
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", [c for c in BAD_TRAIN_FLAGS if c != "class_path of another module"])
def test_bad_train_option_in_an_ablate_variant(case, tmp_path, corpus, capfd):
    """ablate checks every variant before any run: as train would, or earlier by the sweep's own rules
    (a variant may not change the seed, the budget or run.name alone): one line naming the variant and the key."""

    from minitx.cli import ablate_main

    overrides, fragments = BAD_TRAIN_FLAGS[case]
    sweep = write_sweep(
        tmp_path / "sweep.yaml",
        tiny_config(corpus, tmp_path / "unused"),
        [{"name": "fine", "overrides": {}}, {"name": "bad", "overrides": overrides}],
    )
    assert ablate_main(["--config", str(sweep), "--output", str(tmp_path / "out")]) == 2
    one_line_error(capfd, "ablate", "bad", fragments[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.yaml"]


def test_resume_with_another_batch_size_seed_and_lr_says_what_changed(tmp_path, corpus, uninterrupted, capfd):
    """Chosen behaviour: allowed (a longer max_steps is the usual reason to resume), named in one line."""
    import shutil

    shutil.copytree(uninterrupted, tmp_path / "runs" / "tiny")
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    same = ["--config", str(config), "--ckpt_path", "last"]
    assert train_main(same) == 0
    assert "differ from its run" not in capfd.readouterr().err
    assert train_main([*same, "--data.batch_size", "16", "--seed_everything", "8", "--model.lr", "0.02"]) == 0
    lines = [line for line in capfd.readouterr().err.splitlines() if "differ from its run" in line]
    assert len(lines) == 1, lines
    for change in ("data.batch_size 8 -> 16", "seed_everything 7 -> 8", "model.lr 0.01 -> 0.02"):
        assert change in lines[0], lines[0]
