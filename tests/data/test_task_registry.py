"""The known-answer tasks as a registry (minitx/data/task.py): `data.task.<name>.<setting>`, each
task's settings checked beside its generator, the typed evaluation hooks; the flat keys of older
minitx (`data.zoology_pairs`) read from saved runs and refused, in one line naming the new
spelling, where a user writes them; and the settings of a data source the run does not read
refused in one line naming --data.source.

tests/fixtures/legacy/tasks/ holds a Zoology run saved by minitx before the registry (make.sh
there says how): its checkpoint evaluates to the same figures and resumes without a change named.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
import torch
import yaml

from minitx.cli import eval_main, train_main
from minitx.data.config import (
    TASKS,
    DataConfig,
    TaskSettings,
    check_given_settings,
    given_settings,
    saved_data_section,
)
from minitx.data.task import Task
from minitx.errors import UserError
from minitx.files.configs import CommandLine
from minitx.files.upgrade import DATA_TASK_FIELDS, renamed_key, upgrade_config
from minitx.training import precheck_train_args

REPO = Path(__file__).resolve().parents[2]
OLD = REPO / "tests" / "fixtures" / "legacy" / "tasks"


# ------------------------------------------------------------------------------------ the registry


def test_every_task_has_its_section_its_options_beside_its_code_and_a_task():
    assert [f.name for f in dataclasses.fields(TaskSettings)] == list(TASKS)
    for name, spec in TASKS.items():
        assert spec.options.__module__ == f"minitx.data.{name}"  # defined beside the generator
        assert isinstance(spec.task(spec.options()), Task)
        assert DataConfig(source=name).synthetic_task() == spec.task(spec.options())


def test_the_evaluation_asks_the_task_not_its_attributes():
    """The evaluation hooks are Task's (minitx/data/task.py): no hasattr, no task named."""
    source = (REPO / "minitx" / "evaluation" / "tasks.py").read_text()
    calls = [
        node.func.id
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    ]
    assert "hasattr" not in calls and "getattr" not in calls
    assert '== "needle"' not in source and "== 'needle'" not in source


def test_a_task_setting_is_checked_by_its_type_and_named_in_full():
    with pytest.raises(UserError, match=r"^data\.task\.zoology\.pairs: is '4', not a whole number"):
        DataConfig(source="zoology", task={"zoology": {"pairs": "4"}})
    with pytest.raises(UserError, match=r"^data\.task\.zoology\.pair: .*\(did you mean pairs\?\)"):
        DataConfig(source="zoology", task={"zoology": {"pair": 4}})
    with pytest.raises(
        UserError, match=r"^data\.task\.zoolgy: there is no task 'zoolgy' \(did you mean zoology\?\)"
    ):
        DataConfig(source="zoology", task={"zoolgy": {"pairs": 4}})
    config = DataConfig(source="zoology", task={"zoology": {"pairs": 4, "seq_len": 64}})
    assert (config.synthetic_task().pairs, config.synthetic_task().seq_len) == (4, 64)


def test_nested_settings_merge_setting_by_setting_across_files_and_flags(tmp_path):
    """As LightningCLI's parse reads them (the precheck's parser is the same library's, with the
    same declarations: tests/training/test_precheck.py holds the two equal)."""
    from minitx.training.precheck import light_parser

    base, over = tmp_path / "base.yaml", tmp_path / "over.yaml"
    base.write_text("data:\n  source: zoology\n  task:\n    zoology: {vocab: 8192, pairs: 8, seq_len: 128}\n")
    over.write_text("data:\n  task:\n    zoology:\n      pairs: 4\n")
    parsed = light_parser().parse_args(
        [
            *("--config", str(base)),
            *("--config", str(over), "--data.task.zoology.random_non_queries", "true"),
            *("--model.block_size", "64", "--data.task.zoology.seq_len", "64"),
        ]
    )
    config = {"data": parsed["data"].as_dict()}
    assert config["data"]["task"]["zoology"] == {
        "vocab": 8192,  # the first file's, kept: a later file or flag changes only what it names
        "pairs": 4,
        "seq_len": 64,
        "power_a": 0.01,
        "random_non_queries": True,
    }


# ------------------------------------------------------------------------------ older spellings


@pytest.mark.parametrize("old", sorted(DATA_TASK_FIELDS))
def test_an_old_flat_key_is_refused_naming_the_new_one(old):
    task, setting = DATA_TASK_FIELDS[old]
    with pytest.raises(UserError) as refused:
        precheck_train_args(["--data.source", task, f"--data.{old}", "1"])
    assert str(refused.value) == (
        f"data.{old}: this setting is now data.task.{task}.{setting}; write that instead (the value is the same)"
    )
    assert renamed_key(f"data.{old}") == f"data.task.{task}.{setting}"


def test_an_old_flat_key_stops_train_with_one_line_and_exit_2(tmp_path, capfd):
    code = train_main(
        ["--data.source", "zoology", "--data.zoology_pairs", "4", "--run.root", str(tmp_path / "runs")]
    )
    assert code == 2
    assert capfd.readouterr().err.strip() == (
        "train: error: data.zoology_pairs: this setting is now data.task.zoology.pairs; "
        "write that instead (the value is the same)"
    )
    assert not (tmp_path / "runs").exists()


def test_an_old_saved_data_section_reads_as_todays():
    saved = yaml.safe_load((OLD / "zoology.yaml").read_text())["data"]
    assert "zoology_pairs" in saved and "task" not in saved  # as the earlier minitx saved it
    upgraded = upgrade_config({"data": saved})["data"]
    config = DataConfig.from_config(upgraded)
    assert (
        config.synthetic_task()
        == DataConfig(
            source="zoology", task={"zoology": {"vocab": 64, "pairs": 4, "seq_len": 32}}
        ).synthetic_task()
    )
    # every task's old keys land in that task's section: nothing of the old section is lost
    moved = saved_data_section(upgraded)
    old_keys = [key for key in saved if key in DATA_TASK_FIELDS]
    assert len(old_keys) >= 15
    for old in old_keys:
        task, setting = DATA_TASK_FIELDS[old]
        assert moved["task"][task][setting] == saved[old], old


def test_an_old_known_answer_checkpoint_evaluates_to_the_same_figures(tmp_path):
    expected = json.loads((OLD / "zoology_evaluation.json").read_text())
    out = tmp_path / "evaluation.json"
    args = ["--ckpt", str(OLD / "zoology.ckpt"), "--task-samples", "20", "--json", str(out), "--no-progress"]
    assert eval_main(args) == 0
    figures = json.loads(out.read_text())
    assert figures["task"] == expected["task"] and figures["loss"] == expected["loss"]


def test_an_old_known_answer_checkpoint_resumes_in_todays_spelling(tmp_path, capfd):
    """The run, resumed with its config in today's spelling (and more steps): only the steps named
    as changed, no data setting."""
    saved = yaml.safe_load((OLD / "zoology.yaml").read_text())
    saved["model"] = upgrade_config({"model": saved["model"]})["model"]  # Muon's settings, nested
    saved["data"] = {
        key: value
        for key, value in saved["data"].items()
        if key not in DATA_TASK_FIELDS and key != "block_size"  # block_size: linked from the model's
    }
    saved["data"]["task"] = {"zoology": {"vocab": 64, "pairs": 4, "seq_len": 32}}
    saved["run"]["root"] = str(tmp_path / "runs")
    saved["trainer"]["max_steps"] = 6
    checkpoints = tmp_path / "runs" / "zoology_old" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "last.ckpt").write_bytes((OLD / "zoology.ckpt").read_bytes())
    (tmp_path / "today.yaml").write_text(yaml.safe_dump(saved))
    capfd.readouterr()
    assert train_main(["--config", str(tmp_path / "today.yaml"), "--ckpt_path", "last"]) == 0
    changes = [line for line in capfd.readouterr().err.splitlines() if "differ from its run" in line]
    assert len(changes) == 1 and "settings that differ from its run: trainer.max_steps 4 -> 6;" in changes[0]
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == 6


# ---------------------------------------------------------- settings of a source the run does not read


@pytest.mark.parametrize(
    "args, key, owner",
    [
        (["--data.train_files", "missing.txt"], "train_files", "files"),  # the issue's case: Shakespeare
        (["--data.val_fraction", "0.2"], "val_fraction", "files"),  # Shakespeare splits by plays
        (["--data.source", "files", "--data.hf_name", "roneneldan/TinyStories"], "hf_name", "hf"),
        (["--data.task.zoology.pairs", "4"], "task.zoology.pairs", "zoology"),
        (["--data.source", "mqar", "--data.task.zoology.pairs", "4"], "task.zoology.pairs", "zoology"),
        (["--data.source", "zoology", "--data.tokenizer", "bpe"], "tokenizer", "shakespeare"),
        (["--data.toy_train_size", "500"], "toy_train_size", "toy"),
    ],
)
def test_a_setting_the_source_does_not_read_is_refused_naming_data_source(args, key, owner):
    with pytest.raises(UserError) as refused:
        precheck_train_args(args)
    message = str(refused.value)
    assert message.startswith(f"data.{key}: data.source ") and "does not read it" in message
    assert f"set --data.source {owner}, or remove data.{key}" in message and "\n" not in message


def test_the_issue_case_stops_train_with_one_line_and_exit_2(tmp_path, capfd):
    code = train_main(["--data.train_files", "missing.txt", "--run.root", str(tmp_path / "runs")])
    assert code == 2
    assert capfd.readouterr().err.strip() == (
        "train: error: data.train_files: data.source shakespeare does not read it (only data.source files "
        "does); set --data.source files, or remove data.train_files"
    )
    assert not (tmp_path / "runs").exists()


def test_defaults_and_saved_configs_are_not_settings_given(tmp_path):
    """A saved run config writes every setting out, a file may repeat a default: neither is refused."""
    saved = upgrade_config(yaml.safe_load((OLD / "zoology.yaml").read_text()))
    saved["data"] = {**saved_data_section(saved["data"]), "source": "zoology"}
    saved["data"].pop("block_size", None)  # linked from model.block_size
    (tmp_path / "saved.yaml").write_text(yaml.safe_dump(saved))
    args = ["--config", str(tmp_path / "saved.yaml")]
    given = given_settings(CommandLine.read(args).given("data"))
    assert given == {
        key: "zoology"
        for key in (
            "source",
            "toy_train_size",
            "toy_val_size",
            "batch_size",
            "task.zoology.vocab",
            "task.zoology.pairs",
            "task.zoology.seq_len",
        )
    }
    precheck_train_args(args)  # every hf_*, train_files, tokenizer ... at its default: not refused
    precheck_train_args(
        ["--data.source", "zoology", "--data.val_fraction", "0.1", "--data.train_files", "null"]
    )
    precheck_train_args(["--config", str(REPO / "configs" / "default.yaml"), "--data.source", "markov"])


def test_a_later_source_replaces_an_earlier_files_source_and_its_settings(tmp_path):
    """configs/tinystories.yaml's Hub dataset, pointed at a local copy as its header says: the
    file's hf_* settings were meant for the source it set, which the flag replaces."""
    tinystories = str(REPO / "configs" / "tinystories.yaml")
    given = given_settings(
        CommandLine.read(
            ["--config", tinystories, "--data.source", "files", "--data.train_files", "x"]
        ).given("data")
    )
    assert given["hf_name"] == "hf" and given["train_files"] == "files" and given["source"] == "files"
    precheck_train_args(
        ["--config", tinystories, "--data.source", "files", "--data.train_files", "'t/*.parquet'"]
    )
    # A file that sets a source and a setting it does not read is refused, whatever comes after.
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text("data:\n  source: shakespeare\n  train_files: notes.txt\n")
    with pytest.raises(UserError, match=r"^data\.train_files: data\.source shakespeare does not read it"):
        precheck_train_args(["--config", str(mixed), "--data.batch_size", "4"])


def test_the_source_that_reads_a_setting_takes_it(tmp_path):
    from minitx.data.prepare import prepare

    config = DataConfig(source="files", train_files=str(tmp_path / "missing.txt"), cache_dir=str(tmp_path))
    with pytest.raises(UserError, match="no file matches"):
        prepare(config.prepare_settings())


def test_every_config_file_reads_the_settings_it_gives(tmp_path):
    """configs/*.yaml (a sweep's base included) give no setting their data.source ignores; the
    known-answer files are checked as their commands combine them (tests/training/test_precheck.py)."""
    for path in sorted((REPO / "configs").glob("*.yaml")):
        config = yaml.safe_load(path.read_text())
        if "variants" in config:  # a sweep: its base, when written in the file
            base = config.get("base")
            path = tmp_path / path.name
            path.write_text(yaml.safe_dump({"data": base.get("data", {}) if isinstance(base, dict) else {}}))
        check_given_settings(given_settings(CommandLine.read(["--config", str(path)]).given("data")))
