"""What users saved with an earlier minitx keeps working, read through minitx/files/upgrade.py,
or is refused in one line naming the new spelling.

tests/fixtures/legacy/ holds checkpoints, run configs and config files written by minitx before
attention options moved into per-kind sections (make.sh there says how): every kind, MTA in its
released setting, a three-kind mix with learned positions and a trained BPE tokenizer;
tests/fixtures/legacy/tasks/ a run from before known-answer tasks and optimisers had sections of
their own (`model.muon_lr` flat beside `model.lr`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from minitx import AttentionConfig, ModelConfig
from minitx.cli import eval_main, generate_main, train_main
from minitx.data.prepare import DataSettings
from minitx.errors import UserError
from minitx.files import upgrade
from minitx.files.configs import REPO_ROOT, CommandLine
from minitx.files.upgrade import (
    ATTENTION_FIELDS,
    CHECKPOINT_FORMAT,
    DATA_FIELDS,
    DATA_TASK_FIELDS,
    OPTIMIZER_FIELDS,
    renamed_key,
    upgrade_checkpoint,
    upgrade_config,
    upgrade_results_csv,
)
from minitx.flops import FLOP_CONVENTION, OLDER_CONVENTION
from minitx.trained_model import load_checkpoint
from minitx.training.command import checked_config
from minitx.training.optim import Optimisation

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "legacy"
NAMES = ["mha", "mqa", "gqa", "local", "mta", "mix_bpe"]
PROMPT = "ROMEO: What say"


@pytest.mark.parametrize("name", NAMES)
def test_old_checkpoint_loads_with_the_same_logits_in_todays_spelling(name):
    expected = json.loads((FIXTURES / "expected.json").read_text())[name]
    model, tokenizer, _ = load_checkpoint(str(FIXTURES / f"{name}.ckpt"))
    assert tokenizer.encode(PROMPT) == expected["prompt_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([expected["prompt_ids"]]))[0, -1]
    assert (logits - torch.tensor(expected["last_logits"])).abs().max() < 1e-5
    attention = model.config.to_dict()["attention"]
    assert not set(attention) & set(ATTENTION_FIELDS)  # read into today's per-kind sections
    old = torch.load(FIXTURES / f"{name}.ckpt", weights_only=True)["minitx"]["model_config"]["attention"]
    for field, (kind, option) in ATTENTION_FIELDS.items():
        if kind in model.config.layer_kinds:  # the old value of every option the model reads
            assert attention["options"][kind][option] == old[field], field


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("sampling", ["greedy", "sampled"])
def test_old_checkpoint_generates_the_same_text(name, sampling, capsys):
    settings = ["--temperature", "0"] if sampling == "greedy" else ["--temperature", "1.0", "--seed", "7"]
    generate_main(
        ["--ckpt", str(FIXTURES / f"{name}.ckpt"), "--prompt", PROMPT, "--max-new-tokens", "48", *settings]
    )
    suffix = ".txt" if sampling == "greedy" else ".sampled.txt"
    assert capsys.readouterr().out == (FIXTURES / f"{name}{suffix}").read_text()


def test_old_checkpoint_resumes_training(tmp_path, monkeypatch):
    """A run saved by the older minitx continues from its checkpoint with today's config files."""
    monkeypatch.chdir(REPO_ROOT)
    saved = yaml.safe_load((FIXTURES / "mta.yaml").read_text())
    mta = saved["model"]["attention"]
    run = tmp_path / "runs" / "mta" / "checkpoints"
    run.mkdir(parents=True)
    (run / "last.ckpt").write_bytes((FIXTURES / "mta.ckpt").read_bytes())
    code = train_main(
        ["--config", "configs/mta.yaml", "--run.root", str(tmp_path / "runs"), "--ckpt_path", "last"]
        + ["--model.block_size", "32", "--model.n_layer", "3", "--model.d_model", "16"]
        + ["--data.batch_size", "2", "--data.val_batches", "1", "--trainer.max_steps", "42"]
        + ["--trainer.val_check_interval", "2", "--run.sample_tokens", "0", "--trainer.accelerator", "cpu"]
        + ["--run.checkpoint_every_n_steps", "2"]
        + ["--model.attention.options.mta.query_kernel", str(mta["mta_query_kernel"])]
    )
    assert code == 0
    resumed = torch.load(run / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == 42


def test_an_old_saved_attention_section_upgrades_to_the_same_config():
    old = {"model": {"attention": {"kind": "local", "window": 64, "n_global": 2, "local_backend": "chunked"}}}
    today = {
        "model": {
            "attention": {
                "kind": "local",
                "options": {"local": {"window": 64, "n_global": 2, "backend": "chunked"}},
            }
        }
    }
    assert upgrade_config(old) == today and upgrade_config(today) == today
    assert ModelConfig.from_dict(upgrade_config(old)["model"]) == ModelConfig.from_dict(today["model"])
    # the fields of a kind no layer uses were saved at their defaults: they are dropped
    mixed = {"attention": {"kind": "mha", "window": 64, "mta_query_kernel": 3}}
    assert upgrade_config({"model": mixed})["model"]["attention"] == {"kind": "mha", "options": {}}


def test_an_old_attention_field_given_today_is_refused_naming_the_new_spelling():
    with pytest.raises(UserError) as refused:
        ModelConfig.from_dict({"attention": {"kind": "local", "window": 9}})
    assert str(refused.value) == (
        "attention.window: this setting is now attention.options.local.window; write that instead (the value is the same)"
    )
    with pytest.raises(TypeError, match="window"):  # no keyword of the old spelling in Python
        AttentionConfig(kind="local", window=64)


@pytest.mark.parametrize("name", NAMES)
def test_upgrade_checkpoint_reads_every_old_checkpoint_in_todays_spelling(name):
    entry = torch.load(FIXTURES / f"{name}.ckpt", weights_only=True)["minitx"]
    upgraded = upgrade_checkpoint(entry, "here")
    assert upgraded["format"] == CHECKPOINT_FORMAT
    assert not set(upgraded["model_config"]["attention"]) & set(ATTENTION_FIELDS)
    data = upgraded["train_config"]["data"]
    assert not set(data) & {*DATA_FIELDS, *DATA_TASK_FIELDS}
    assert upgrade_checkpoint(upgraded, "here") == upgraded  # today's spelling passes unchanged
    assert entry == torch.load(FIXTURES / f"{name}.ckpt", weights_only=True)["minitx"]  # a copy
    with pytest.raises(UserError) as refused:
        upgrade_checkpoint({**entry, "format": 2}, "here")
    assert str(refused.value) == (
        "here: checkpoint format 2 is not supported (expected 1); use the minitx version that wrote it"
    )


def test_upgrade_results_csv_reads_a_csv_from_before_flop_convention():
    """A designed sweep's results.csv written before flop_convention (version 1): its FLOPs were
    counted under minitx-flops/1, which --from-csv counts again by today's convention."""
    old = (
        "arm,size,budget,multiplier,seed,role,status,error,steps,tokens,flops,params,final_val_loss,run_dir\n"
    )
    old += "mha,d32,1e+13,1,1337,ladder,ok,,10,100,1e+10,1000,3.5,out/mha-d32\n"
    reader = csv.DictReader(io.StringIO(old))
    columns, rows = upgrade_results_csv(reader.fieldnames, list(reader))
    assert columns[columns.index("flops") + 1] == "flop_convention"
    assert rows[0]["flop_convention"] == OLDER_CONVENTION and rows[0]["flops"] == "1e+10"
    assert upgrade_results_csv(columns, rows) == (columns, rows)  # today's header: unchanged
    assert upgrade.OLDER_FLOP_CONVENTION == OLDER_CONVENTION != FLOP_CONVENTION


def test_from_csv_reads_a_results_csv_from_before_flop_convention(tmp_path):
    """The showcase's results.csv without its flop_convention column, as a designed sweep wrote it
    then: --from-csv reads every row as before, each recorded under the older count."""
    from minitx.ablation.runs.from_csv import read_rows

    today = REPO_ROOT / "docs" / "results" / "ladder" / "results.csv"
    reader = csv.DictReader(io.StringIO(today.read_text(encoding="utf-8"), newline=""))
    columns = [c for c in reader.fieldnames if c != "flop_convention"]
    old = io.StringIO()
    writer = csv.DictWriter(old, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(reader)
    (tmp_path / "results.csv").write_text(old.getvalue(), encoding="utf-8")
    rows, expected = read_rows(tmp_path / "results.csv"), read_rows(today)
    assert {row.convention for row in expected} == {FLOP_CONVENTION}
    assert {row.convention for row in rows} == {OLDER_CONVENTION}
    assert [dataclasses.replace(row, convention=FLOP_CONVENTION) for row in rows] == expected


@pytest.mark.parametrize("key", sorted(ATTENTION_FIELDS))
def test_old_attention_flag_is_refused_naming_the_new_one(key, capsys):
    kind = ATTENTION_FIELDS[key][0]
    assert (
        train_main(["--model.attention.kind", kind, f"--model.attention.{key}", "1", "--print_config"]) == 2
    )
    message = capsys.readouterr().err.strip()
    assert message == (
        f"train: error: model.attention.{key}: this setting is now {renamed_key('model.attention.' + key)}; "
        "write that instead (the value is the same)"
    )


OLD_CONFIGS = sorted((FIXTURES / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", OLD_CONFIGS, ids=[p.name for p in OLD_CONFIGS])
def test_every_old_config_file_works_the_same_or_names_the_new_spelling(path, tmp_path):
    """Each file of configs/ as the older minitx shipped it: today's file of the same name gives the
    same model and data settings, or the old one is refused in one line with today's key."""
    if "variants" in yaml.safe_load(path.read_text()):  # a sweep file: its variants' keys
        text = path.read_text()
        old_keys = [key for key in ATTENTION_FIELDS if f"model.attention.{key}:" in text]
        today = (REPO_ROOT / "configs" / path.name).read_text()
        for key in old_keys:
            assert (
                f"model.attention.{key}:" not in today
                and renamed_key(f"model.attention.{key}") + ":" in today
            )
        # Its base's data section: today's file holds the old flat task keys in their new places.
        old_base, today_base = yaml.safe_load(text).get("base"), yaml.safe_load(today).get("base")
        old_data = (old_base.get("data") or {}) if isinstance(old_base, dict) else {}
        if set(old_data) & set(DATA_TASK_FIELDS):
            today_data = today_base.get("data") or {}
            assert not set(today_data) & set(DATA_TASK_FIELDS)
            assert upgrade_config({"data": old_data})["data"] == today_data
        return
    old = yaml.safe_load(path.read_text())
    old_attention = (old.get("model") or {}).get("attention") or {}
    old_data = old.get("data") or {}
    if set(old_attention) & set(ATTENTION_FIELDS) or set(old_data) & {*DATA_FIELDS, *DATA_TASK_FIELDS}:
        with pytest.raises(UserError) as refused:
            checked_config(CommandLine.read(["--config", str(path)]))
        message = str(refused.value)
        assert "\n" not in message and re.search(
            r"this setting is now (model\.attention\.options|data\.bpe_|data\.task\.)", message
        )
        if set(old_data) & set(DATA_TASK_FIELDS):  # moved as saved runs are read, it is today's file
            moved = tmp_path / path.name
            moved.write_text(yaml.safe_dump(upgrade_config(old)))
            new = checked_config(CommandLine.read(["--config", str(REPO_ROOT / "configs" / path.name)]))
            assert checked_config(CommandLine.read(["--config", str(moved)]))["data"] == new["data"]
        return
    old = checked_config(CommandLine.read(["--config", str(path)]))
    new = checked_config(CommandLine.read(["--config", str(REPO_ROOT / "configs" / path.name)]))
    assert model_config(old) == model_config(new)
    assert old["data"] == new["data"] and old["trainer"] == new["trainer"]


def model_config(parsed: dict) -> ModelConfig:
    fields = set(ModelConfig.__dataclass_fields__)
    return ModelConfig.from_dict({key: value for key, value in parsed["model"].items() if key in fields})


def test_old_data_key_is_refused_naming_the_new_one_and_read_from_saved_runs(tmp_path, capsys):
    assert train_main(["--data.vocab_size", "300", "--print_config"]) == 2
    assert capsys.readouterr().err.strip() == (
        "train: error: data.vocab_size: this setting is now data.bpe_vocab_size; write that instead (the value is the same)"
    )
    saved = yaml.safe_load((FIXTURES / "mix_bpe.yaml").read_text())  # a run's config.yaml, as saved then
    data = upgrade_config(saved)["data"]
    assert (
        "vocab_size" not in data
        and DataSettings.from_config(data).bpe_vocab_size == saved["data"]["vocab_size"] == 300
    )


def test_old_bpe_checkpoint_evaluates_on_its_own_validation_text(tmp_path, monkeypatch):
    """Evaluation rebuilds a run's validation text from the data settings its checkpoint carries:
    saved with the old key for the BPE size, they give the same tokenizer settings as then."""
    monkeypatch.chdir(REPO_ROOT)
    report = tmp_path / "evaluation.json"
    args = [
        "--ckpt",
        str(FIXTURES / "mix_bpe.ckpt"),
        "--max-tokens",
        "300",
        "--json",
        str(report),
        "--no-progress",
    ]
    assert eval_main([*args, "--lengths", "16", "32"]) == 0
    figures = json.loads(report.read_text())
    assert figures["loss"] > 0 and figures["tokens"] > 0


@pytest.mark.parametrize("key", sorted(OPTIMIZER_FIELDS))
def test_old_optimiser_flag_is_refused_naming_the_new_one(key, capsys):
    value = "auto" if key == "muon_precision" else "0.5"
    assert train_main([f"--model.{key}", value, "--print_config"]) == 2
    optimizer, setting = OPTIMIZER_FIELDS[key]
    assert capsys.readouterr().err.strip() == (
        f"train: error: model.{key}: this setting is now model.optimizer_options.{optimizer}.{setting}; "
        "write that instead (the value is the same)"
    )


def test_old_optimiser_key_in_a_config_file_is_refused_naming_the_new_one(tmp_path, capsys):
    (tmp_path / "old.yaml").write_text("model:\n  optimizer: muon\n  muon_lr: 0.03\n")
    assert train_main(["--config", str(tmp_path / "old.yaml"), "--print_config"]) == 2
    assert capsys.readouterr().err.strip() == (
        "train: error: model.muon_lr: this setting is now model.optimizer_options.muon.lr; "
        "write that instead (the value is the same)"
    )


def test_an_old_runs_flat_optimiser_settings_are_read_in_todays_spelling():
    """The Zoology run saved its optimiser settings flat (model.muon_lr, ...), in its config.yaml
    and its checkpoint's train_config: read, they are the same settings under optimizer_options."""
    entry = torch.load(FIXTURES / "tasks" / "zoology.ckpt", weights_only=True)["minitx"]
    saved = entry["train_config"]["model"]
    assert set(OPTIMIZER_FIELDS) <= set(saved)  # written by the old code, not regenerated
    for model in (
        upgrade_checkpoint(entry, "here")["train_config"]["model"],
        upgrade_config(yaml.safe_load((FIXTURES / "tasks" / "zoology.yaml").read_text()))["model"],
    ):
        assert not set(model) & set(OPTIMIZER_FIELDS)
        assert model["optimizer_options"] == {
            "muon": {setting: saved[key] for key, (_, setting) in OPTIMIZER_FIELDS.items()}
        }
        assert upgrade_config({"model": model})["model"] == model  # today's spelling passes unchanged
        settings = Optimisation.of(model)
        assert settings.by_key() == {
            **{key: saved[key] for key in ("lr", "min_lr", "warmup_steps", "optimizer", "schedule")},
            **{key: saved[key] for key in ("weight_decay", "betas", "eps", "decay_fraction", "decay_shape")},
            "decay_steps": None,
            **{
                f"optimizer_options.muon.{setting}": saved[key]
                for key, (_, setting) in OPTIMIZER_FIELDS.items()
            },
        }
    # A value the section already holds in today's spelling wins over a flat one beside it.
    both = {"muon_lr": 0.5, "optimizer_options": {"muon": {"lr": 0.03}}}
    assert upgrade_config({"model": both})["model"] == {"optimizer_options": {"muon": {"lr": 0.03}}}
