"""Reliability: a run survives SIGKILL at any moment, bad input ends every command with one line and
exit status 2, and nothing that is loaded can run code.

The kill tests run the real train command in subprocesses. A callback module written to tmp_path
(added with --trainer.callbacks+=, so the product has no test hooks) SIGKILLs its own process
after a step drawn at random, or halfway through writing a checkpoint; the run resumed with
--ckpt_path last must log the per-step losses of an uninterrupted run with the same seed.
Dropout is on, so the resumed run must also draw the same dropout masks. Another callback makes
a loss NaN: the process must stop with status 2, naming the step, its last checkpoint intact.

Bad inputs go through the commands' entry points in-process (train_main, generate_main and
ablate_main return the exit status, as `python train.py` etc. do via sys.exit), and one of each
through a real process, where status 2 and the absence of a traceback are the process's own.
"""

from __future__ import annotations

import ast
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from runs import (
    REPO,
    SAVE_STEPS,
    STEPS,
    RunsCode,
    assert_resumed_losses_equal,
    checkpoint_step,
    files_under,
    finish,
    flags,
    one_line_error,
    tiny_config,
    train_process,
    with_callback,
    write_config,
    write_sweep,
)

from minitx.cli import ablate_main, generate_main, train_main
from minitx.config import ModelConfig
from minitx.data.tokenizer import CharTokenizer
from minitx.files.atomic import TMP_PREFIX
from minitx.files.checkpoint import LAST
from minitx.model import Transformer

# ------------------------------------------------------------------------------------------ setup


# ------------------------------------------------------------------------------- kill and resume


@pytest.mark.slow
def test_sigkill_at_a_random_step_then_resume_gives_the_uninterrupted_losses(
    tmp_path, corpus, killer_dir, uninterrupted, seed
):
    kill_step = random.Random(seed).randint(6, 18)
    print(f"SIGKILL after step {kill_step}")
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    run = tmp_path / "runs" / "tiny"

    status, output = finish(
        train_process(config, with_callback("KillAtStep", kill_step), killer_dir=killer_dir)
    )
    assert status == -signal.SIGKILL, output[-3000:]
    # Left behind: the newest checkpoint written before the kill, complete, and no temporary file.
    saved_before = max(s for s in SAVE_STEPS if s < kill_step)
    assert checkpoint_step(run / "checkpoints" / LAST) == saved_before
    assert not list((run / "checkpoints").glob(f"{TMP_PREFIX}*"))

    status, output = finish(train_process(config, "--ckpt_path", "last"))
    assert status == 0, output[-3000:]
    assert f"resuming from {run / 'checkpoints' / LAST}" in output
    assert checkpoint_step(run / "checkpoints" / LAST) == STEPS
    assert_resumed_losses_equal(uninterrupted, run, saved_before)


@pytest.mark.slow
def test_sigkill_while_a_checkpoint_is_written_keeps_the_previous_one_and_resumes_exactly(
    tmp_path, corpus, killer_dir, uninterrupted, seed
):
    armed_at = random.Random(seed + 1).randint(6, 18)  # the first save at or after this step is killed
    killed_save = min(s for s in SAVE_STEPS if s >= armed_at)
    saved_before = max(s for s in SAVE_STEPS if s < killed_save)
    print(f"SIGKILL halfway through writing the checkpoint of step {killed_save}")
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    checkpoints = tmp_path / "runs" / "tiny" / "checkpoints"

    status, output = finish(
        train_process(config, with_callback("KillDuringSave", armed_at), killer_dir=killer_dir)
    )
    assert status == -signal.SIGKILL, output[-3000:]
    # The half-written file is a temporary beside last.ckpt, which is still the previous
    # checkpoint, whole: it loads (weights_only) and holds the earlier step.
    partial = list(checkpoints.glob(f"{TMP_PREFIX}*"))
    assert len(partial) == 1 and partial[0].stat().st_size > 0
    assert checkpoint_step(checkpoints / LAST) == saved_before
    for path in checkpoints.glob("*.ckpt"):
        if not path.name.startswith(TMP_PREFIX):
            torch.load(path, weights_only=True)  # every file under a checkpoint's name is whole

    status, output = finish(train_process(config, "--ckpt_path", "last"))
    assert status == 0, output[-3000:]
    assert not list(checkpoints.glob(f"{TMP_PREFIX}*"))  # the stale temporary was cleaned up
    assert checkpoint_step(checkpoints / LAST) == STEPS
    assert_resumed_losses_equal(uninterrupted, checkpoints.parent, saved_before)


@pytest.mark.slow  # 9-24 s of real runs: the fast suite within its minutes (issue 62)
def test_nan_loss_stops_the_process_with_exit_2_naming_the_step_and_keeps_the_last_checkpoint(
    tmp_path, corpus, killer_dir
):
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    checkpoints = tmp_path / "runs" / "tiny" / "checkpoints"
    status, output = finish(train_process(config, with_callback("PoisonAtStep", 12), killer_dir=killer_dir))
    assert status == 2, output[-3000:]
    assert "Traceback" not in output
    last_line = output.strip().splitlines()[-1]
    assert (
        last_line.startswith("train: error: step 12: the training loss is nan")
        and "--ckpt_path last" in last_line
    )
    checkpoint = torch.load(checkpoints / LAST, weights_only=True)
    assert checkpoint["global_step"] == 10  # the last save before the NaN, untouched
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())
    assert not list(checkpoints.glob(f"{TMP_PREFIX}*"))


# ------------------------------------------------------------------------------- one-line errors


# Config mistakes: (dotted overrides, fragments the one line must hold). Each goes through train
# (as flags) and through ablate (as a variant's overrides).
BAD_CONFIGS = {
    "unknown attention kind": ({"model.attention.kind": "flash"}, ["model.attention.kind", "flash"]),
    "n_head not divisible by n_kv_head": (
        {"model.n_head": 4, "model.attention.kind": "gqa", "model.attention.n_kv_head": 3},
        ["model.attention.n_kv_head", "n_head=4 is not divisible by n_kv_head=3"],
    ),
    "d_model not divisible by n_head": (
        {"model.d_model": 30, "model.n_head": 4},
        ["model.d_model", "not divisible by n_head=4"],
    ),
    "window below 1": (
        {"model.attention.kind": "local", "model.attention.options.local.window": 0},
        ["model.attention.options.local.window", "is 0"],
    ),
    "even MTA key kernel": (
        {"model.attention.kind": "mta", "model.attention.options.mta.key_kernel": 4},
        ["model.attention.options.mta.key_kernel", "odd"],
    ),
    "MTA layer out of range": (
        {"model.attention.kind": "mta", "model.attention.options.mta.conv_layers": [3]},
        ["model.attention.options.mta.conv_layers", "layer 3 is out of range for n_layer=1"],
    ),
    "unknown key": ({"model.n_layers": 2}, ["model.n_layers", "did you mean 'model.n_layer'"]),
    "wrong type": ({"model.n_layer": "two"}, ["model.n_layer", "two"]),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_config_mistake_through_train(case, tmp_path, corpus, capfd):
    overrides, fragments = BAD_CONFIGS[case]
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    assert train_main(["--config", str(config), *flags(overrides)]) == 2
    one_line_error(capfd, "train", *fragments)
    assert not (tmp_path / "runs").exists()  # nothing written


def test_config_mistakes_inside_the_config_file_through_train(tmp_path, corpus, capfd):
    """The same mistakes written in the YAML file rather than given as flags."""
    unknown = tiny_config(corpus, tmp_path / "runs", model={"n_layers": 2})
    assert train_main(["--config", str(write_config(tmp_path / "unknown.yaml", unknown))]) == 2
    one_line_error(capfd, "train", "n_layers", "did you mean 'model.n_layer'")
    wrong_type = tiny_config(corpus, tmp_path / "runs", trainer={"max_steps": "many"})
    assert train_main(["--config", str(write_config(tmp_path / "wrong_type.yaml", wrong_type))]) == 2
    one_line_error(capfd, "train", "trainer.max_steps", "many")
    attention = tiny_config(corpus, tmp_path / "runs", model={"attention": {"kind": "gqa", "n_kv_head": 3}})
    assert train_main(["--config", str(write_config(tmp_path / "attention.yaml", attention))]) == 2
    one_line_error(capfd, "train", "model.attention.n_kv_head")
    (tmp_path / "syntax.yaml").write_text("model:\n  n_layer: [1\n")
    assert train_main(["--config", str(tmp_path / "syntax.yaml")]) == 2
    one_line_error(capfd, "train", "syntax.yaml", "line 2", "fix the YAML")
    (tmp_path / "list.yaml").write_text("- model\n- data\n")
    assert train_main(["--config", str(tmp_path / "list.yaml")]) == 2
    one_line_error(capfd, "train", "list.yaml", "not a mapping")
    assert train_main(["--config", str(tmp_path / "missing.yaml")]) == 2
    one_line_error(capfd, "train", "missing.yaml", "does not exist")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_config_mistake_through_ablate_in_a_variant(case, tmp_path, corpus, capfd):
    overrides, fragments = BAD_CONFIGS[case]
    base = tiny_config(corpus, tmp_path / "unused")
    sweep = write_sweep(
        tmp_path / "sweep.yaml",
        base,
        [{"name": "fine", "overrides": {}}, {"name": "bad", "overrides": overrides}],
    )
    output = tmp_path / "out"
    assert ablate_main(["--config", str(sweep), "--output", str(output)]) == 2
    one_line_error(capfd, "ablate", str(sweep), "variant 'bad'", *fragments)
    assert not output.exists()  # refused before any run: not even the good variant trained


@pytest.mark.parametrize("case", ["unknown attention kind", "unknown key"])
def test_config_mistake_through_ablate_in_the_base(case, tmp_path, corpus, capfd):
    overrides, fragments = BAD_CONFIGS[case]
    base = tiny_config(corpus, tmp_path / "unused")
    for key, value in overrides.items():  # "model.attention.kind" -> base["model"]["attention"]["kind"]
        section, *path = key.split(".")
        target = base[section]
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = value
    sweep = write_sweep(tmp_path / "sweep.yaml", base, [{"name": "v", "overrides": {"model.lr": 0.01}}])
    output = tmp_path / "out"
    assert ablate_main(["--config", str(sweep), "--output", str(output)]) == 2
    # In a YAML file the unknown key is reported as "Group 'model' does not accept option 'n_layers'".
    one_line_error(
        capfd,
        "ablate",
        str(sweep),
        "base config",
        *[f.replace("model.n_layers", "n_layers") for f in fragments],
    )
    assert not output.exists()


def data_config(tmp_path: Path, corpus: dict[str, Path], **data) -> Path:
    return write_config(
        tmp_path / "tiny.yaml",
        tiny_config(corpus, tmp_path / "runs", data={"cache_dir": str(tmp_path / "cache"), **data}),
    )


def assert_nothing_half_written(tmp_path: Path) -> None:
    assert not (tmp_path / "runs").exists()
    cache = tmp_path / "cache"
    assert not cache.exists() or not list(cache.glob(f"{TMP_PREFIX}*"))


def test_missing_data_file(tmp_path, corpus, capfd):
    assert (
        train_main(
            ["--config", str(data_config(tmp_path, corpus, train_files=str(tmp_path / "nowhere" / "*.txt")))]
        )
        == 2
    )
    one_line_error(capfd, "train", "data.train_files", "no file matches", "nowhere")
    assert_nothing_half_written(tmp_path)


def test_empty_data_file(tmp_path, corpus, capfd):
    (tmp_path / "empty.txt").write_text("  \n")
    assert (
        train_main(["--config", str(data_config(tmp_path, corpus, val_files=str(tmp_path / "empty.txt")))])
        == 2
    )
    one_line_error(capfd, "train", "data.val_files", "empty.txt", "is empty")
    assert_nothing_half_written(tmp_path)


def test_unreadable_data_file(tmp_path, corpus, capfd):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1") * 50)
    assert (
        train_main(["--config", str(data_config(tmp_path, corpus, train_files=str(tmp_path / "latin1.txt")))])
        == 2
    )
    one_line_error(capfd, "train", "data.train_files", "latin1.txt", "not UTF-8", "convert it to UTF-8")
    assert_nothing_half_written(tmp_path)


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads a file whatever its permissions"
)
def test_data_file_without_read_permission(tmp_path, corpus, capfd):
    locked = tmp_path / "locked.txt"
    shutil.copy(corpus["train"], locked)
    locked.chmod(0)
    try:
        assert train_main(["--config", str(data_config(tmp_path, corpus, train_files=str(locked)))]) == 2
    finally:
        locked.chmod(0o600)
    one_line_error(capfd, "train", "data.train_files", "locked.txt", "cannot read")
    assert_nothing_half_written(tmp_path)


def test_corpus_shorter_than_a_block(tmp_path, corpus, capfd):
    (tmp_path / "short.txt").write_text("the quick brown fox.\n")  # 21 characters, block_size 32
    assert (
        train_main(["--config", str(data_config(tmp_path, corpus, train_files=str(tmp_path / "short.txt")))])
        == 2
    )
    one_line_error(capfd, "train", "data.block_size", "21 tokens", "block_size + 1 = 33")
    assert_nothing_half_written(tmp_path)


def test_empty_validation_set(tmp_path, corpus, capfd):
    (tmp_path / "text.txt").write_text(corpus["train"].read_text() + "\n" * 8)  # the tail held out is blank
    config = data_config(
        tmp_path, corpus, train_files=str(tmp_path / "text.txt"), val_files=None, val_fraction=0.0005
    )
    assert train_main(["--config", str(config)]) == 2
    one_line_error(capfd, "train", "data.val_fraction", "validation set is empty")
    assert_nothing_half_written(tmp_path)


# -- checkpoints, through generate --ckpt and train --ckpt_path


# (checkpoint, fragments of generate's line, fragments of train's line)
BAD_CHECKPOINTS = {
    "missing": (["no such file"], ["ckpt_path", "no checkpoint at"]),
    "a directory": (["is a directory"], ["ckpt_path", "is a directory"]),
    "truncated": (
        ["not a readable minitx checkpoint", "central directory"],
        ["ckpt_path", "not a readable minitx checkpoint", "central directory"],
    ),
    "corrupted header": (
        ["not a readable minitx checkpoint"],
        ["ckpt_path", "not a readable minitx checkpoint"],
    ),
    "corrupted pickle": (
        ["not a readable minitx checkpoint"],
        ["ckpt_path", "not a readable minitx checkpoint"],
    ),
    "random bytes": (["not a readable minitx checkpoint"], ["ckpt_path", "not a readable minitx checkpoint"]),
    "empty": (["the file is empty"], ["ckpt_path", "the file is empty"]),
    "text file": (["not a readable minitx checkpoint"], ["ckpt_path", "not a readable minitx checkpoint"]),
    "foreign": (["not a minitx checkpoint"], ["ckpt_path", "not a minitx checkpoint"]),
    "other shape": (
        ["weights do not match its model config", "wrong shape"],
        ["ckpt_path", "model differs", "d_model: checkpoint 64, config 32"],
    ),
    "bigger vocabulary": (
        ["tokenizer has", "tokens but the model only"],
        ["data.tokenizer", "another tokenizer or vocabulary"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_CHECKPOINTS))
def test_bad_checkpoint_through_generate(case, checkpoints, capfd):
    fragments, _ = BAD_CHECKPOINTS[case]
    path = checkpoints[case]
    assert generate_main(["--ckpt", str(path), "--prompt", "the", "--max-new-tokens", "5"]) == 2
    one_line_error(capfd, "generate", "--ckpt", str(path), *fragments)


@pytest.mark.parametrize("case", [*BAD_CHECKPOINTS, "weights only"])
def test_bad_checkpoint_through_train(case, checkpoints, tmp_path, corpus, capfd):
    fragments = BAD_CHECKPOINTS[case][1] if case in BAD_CHECKPOINTS else ["weights but no training state"]
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    assert train_main(["--config", str(config), "--ckpt_path", str(checkpoints[case])]) == 2
    one_line_error(capfd, "train", *fragments)
    assert not (tmp_path / "runs").exists()  # no run directory, config.yaml or log version was started


def test_resume_with_another_model_shape_or_tokenizer_leaves_the_run_as_it_was(
    tmp_path, corpus, uninterrupted, capfd
):
    run = tmp_path / "runs" / "tiny"
    shutil.copytree(uninterrupted, run)
    before = files_under(run)
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))

    assert train_main(["--config", str(config), "--ckpt_path", "last", "--model.d_model", "64"]) == 2
    one_line_error(capfd, "train", "ckpt_path", "model differs", "d_model: checkpoint 32, config 64")
    assert files_under(run) == before

    # The same run resumed on text with characters the checkpoint's vocabulary does not have.
    (tmp_path / "other.txt").write_text(corpus["train"].read_text().upper())
    assert (
        train_main(
            [
                "--config",
                str(config),
                "--ckpt_path",
                "last",
                "--data.train_files",
                str(tmp_path / "other.txt"),
            ]
        )
        == 2
    )
    one_line_error(capfd, "train", "data.tokenizer", "another tokenizer or vocabulary", "new: 'A'")
    assert files_under(run) == before


def test_resume_of_a_run_that_never_saved(tmp_path, corpus, capfd):
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    assert train_main(["--config", str(config), "--ckpt_path", "last"]) == 2
    one_line_error(capfd, "train", "ckpt_path", "does not exist")
    assert not (tmp_path / "runs").exists()


# -- prompts and sampling options, through generate


@pytest.fixture(scope="module")
def learned_positions_checkpoint(tmp_path_factory, corpus) -> Path:
    """A checkpoint of a model with learned positions (it cannot slide past block_size 32)."""
    tokenizer = CharTokenizer(corpus["train"].read_text())
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size, block_size=32, n_layer=1, n_head=2, d_model=16, positions="learned"
    )
    model = Transformer(config)
    path = tmp_path_factory.mktemp("learned") / "learned.ckpt"
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "minitx": {"format": 1, "model_config": config.to_dict(), "tokenizer": tokenizer.to_dict()},
        },
        path,
    )
    return path


BAD_GENERATE_OPTIONS = {
    "unknown prompt characters": (
        ["--prompt", "the Quick~fox"],
        ["--prompt", "characters the tokenizer does not know", "'Q', '~'"],
    ),
    "max_new_tokens below 0": (["--max-new-tokens", "-1"], ["--max-new-tokens", "is -1", "use 0 or more"]),
    "temperature below 0": (["--temperature", "-0.5"], ["--temperature", "is -0.5"]),
    "top_p of 0": (["--top-p", "0"], ["--top-p", "is 0.0", "(0, 1]"]),
    "top_p above 1": (["--top-p", "1.5"], ["--top-p", "is 1.5", "(0, 1]"]),
    "top_k below 1": (["--top-k", "0"], ["--top-k", "is 0", "1 or more"]),
}


@pytest.mark.parametrize("case", list(BAD_GENERATE_OPTIONS))
def test_bad_prompt_or_sampling_option_through_generate(case, checkpoints, capfd):
    options, fragments = BAD_GENERATE_OPTIONS[case]
    assert generate_main(["--ckpt", str(checkpoints["good"]), "--prompt", "the", *options]) == 2
    one_line_error(capfd, "generate", *fragments)


def test_prompt_longer_than_the_context_of_a_model_that_cannot_slide(learned_positions_checkpoint, capfd):
    prompt = "the lazy dog " * 3  # 39 characters, block_size 32
    assert (
        generate_main(
            ["--ckpt", str(learned_positions_checkpoint), "--prompt", prompt, "--max-new-tokens", "3"]
        )
        == 2
    )
    one_line_error(capfd, "generate", "prompt has 39 tokens", "block_size=32", "shorten the prompt")


# ------------------------------------------------------------------------------- loading runs no code


def malicious_files(directory: Path, marker: Path) -> dict[str, Path]:
    """Files whose unrestricted unpickling runs os.system: a well-formed minitx checkpoint with a
    payload inside, in torch's zip format and in its legacy format, and bare pickles of the
    protocol torch writes (2) and of a newer one (4)."""
    checkpoint = {
        "state_dict": {"model.x": torch.zeros(2)},
        "minitx": {"format": 1},
        "global_step": 3,
        "payload": RunsCode(marker),
    }
    paths = {"zip": directory / "zip.ckpt", "legacy": directory / "legacy.ckpt"}
    torch.save(checkpoint, paths["zip"])
    torch.save(checkpoint, paths["legacy"], _use_new_zipfile_serialization=False)
    for protocol in (2, 4):
        paths[f"pickle{protocol}"] = directory / f"pickle{protocol}.ckpt"
        paths[f"pickle{protocol}"].write_bytes(
            pickle.dumps({"minitx": {"format": 1}, "payload": RunsCode(marker)}, protocol=protocol)
        )
    return paths


def test_the_malicious_files_would_run_code_if_loaded_unsafely(tmp_path):
    """The attack is real: unrestricted unpickling of these files runs the command."""
    for name, path in malicious_files(tmp_path, tmp_path / "ran").items():
        (tmp_path / "ran").unlink(missing_ok=True)
        pickle.loads(path.read_bytes()) if name.startswith("pickle") else torch.load(path, weights_only=False)
        assert (tmp_path / "ran").exists(), name


# What the line says: the refused import where the unpickler gets that far; with protocol 4 it
# stops earlier, at an instruction it does not take (FRAME), and the file is merely unreadable.
MALICIOUS = {
    "zip": ["refused", "posix.system", "can run code"],
    "legacy": ["refused", "posix.system", "can run code"],
    "pickle2": ["refused", "posix.system", "can run code"],
    "pickle4": ["not a readable minitx checkpoint", "UnpicklingError"],
}


@pytest.mark.parametrize("kind", list(MALICIOUS))
def test_a_checkpoint_crafted_to_run_code_is_refused_by_generate_and_train(kind, tmp_path, corpus, capfd):
    marker = tmp_path / "code-ran"
    path = malicious_files(tmp_path, marker)[kind]
    assert generate_main(["--ckpt", str(path)]) == 2
    assert not marker.exists()
    one_line_error(capfd, "generate", "--ckpt", *MALICIOUS[kind])
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    assert train_main(["--config", str(config), "--ckpt_path", str(path)]) == 2
    assert not marker.exists()
    one_line_error(capfd, "train", "ckpt_path", *MALICIOUS[kind])
    assert not (tmp_path / "runs").exists()


def test_yaml_with_a_python_tag_is_refused_by_train_and_ablate(tmp_path, corpus, capfd):
    marker = tmp_path / "code-ran"
    tagged = f"!!python/object/apply:os.system ['touch {marker}']"
    config = tmp_path / "tagged.yaml"
    config.write_text(yaml.safe_dump(tiny_config(corpus, tmp_path / "runs")) + f"extra: {tagged}\n")
    assert train_main(["--config", str(config)]) == 2
    one_line_error(capfd, "train", "tagged.yaml", "python/object/apply:os.system", "remove the tag")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"base: tagged.yaml\nvariants:\n  - name: a\n    overrides: {{model.lr: {tagged}}}\n")
    assert ablate_main(["--config", str(sweep), "--output", str(tmp_path / "out")]) == 2
    one_line_error(capfd, "ablate", "sweep.yaml", "not valid YAML")
    assert not marker.exists()
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def test_the_source_loads_only_safely():
    """Every torch.load passes weights_only=True; YAML is read only with safe_load; no pickle,
    eval or exec anywhere in the package."""
    problems = []
    for path in sorted((REPO / "minitx").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            owner = (
                func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            )
            where = f"{path.relative_to(REPO)}:{node.lineno}"
            if owner == "torch" and name == "load":
                safe = any(
                    k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                    for k in node.keywords
                )
                if not safe:
                    problems.append(f"{where}: torch.load without weights_only=True")
            if owner == "yaml" and name in (
                "load",
                "load_all",
                "unsafe_load",
                "full_load",
                "unsafe_load_all",
                "full_load_all",
            ):
                problems.append(f"{where}: yaml.{name}")
            if owner in ("pickle", "dill", "marshal") and name.startswith("load"):
                problems.append(f"{where}: {owner}.{name}")
            if isinstance(func, ast.Name) and name in ("eval", "exec"):
                problems.append(f"{where}: {name}()")
    assert not problems, problems


# ------------------------------------------------------------------------------- real processes


def test_real_processes_exit_2_with_one_line(tmp_path, corpus):
    """Status 2 and one line from the processes themselves, for each command."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    config = write_config(tmp_path / "tiny.yaml", tiny_config(corpus, tmp_path / "runs"))
    malicious = malicious_files(tmp_path, tmp_path / "code-ran")["zip"]
    sweep = write_sweep(
        tmp_path / "sweep.yaml",
        tiny_config(corpus, tmp_path / "unused"),
        [{"name": "bad", "overrides": {"model.attention.kind": "gqa", "model.attention.n_kv_head": 3}}],
    )
    commands = {  # command: (arguments, a fragment of its one line)
        "train": (
            [str(REPO / "train.py"), "--config", str(config), "--model.attention.kind", "flash"],
            "model.attention.kind",
        ),
        "generate": ([str(REPO / "generate.py"), "--ckpt", str(malicious)], "refused"),
        "ablate": (
            [str(REPO / "ablate.py"), "--config", str(sweep), "--output", str(tmp_path / "out")],
            "model.attention.n_kv_head",
        ),
    }
    processes = {
        name: subprocess.Popen(
            [sys.executable, *arguments],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (arguments, _) in commands.items()
    }
    for name, process in processes.items():
        out, err = process.communicate(timeout=240)
        lines = [line for line in err.splitlines() if line.strip()]
        assert process.returncode == 2, (name, err[-3000:])
        assert "Traceback" not in out + err, (name, err[-3000:])
        assert lines[-1].startswith(f"{name}: error: ") and commands[name][1] in lines[-1], (name, lines[-1])
        assert sum(line.startswith(f"{name}: error: ") for line in lines) == 1, (name, err[-3000:])
    assert (
        not (tmp_path / "runs").exists()
        and not (tmp_path / "out").exists()
        and not (tmp_path / "code-ran").exists()
    )
