"""What users saved with an older minitx keeps working, or is refused in one line naming the new spelling.

tests/fixtures/legacy/ holds checkpoints, run configs and config files written by minitx before
attention options moved into per-kind sections (make.sh there says how): every kind, MTA in its
released setting, a three-kind mix with learned positions and a trained BPE tokenizer.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from minitx import AttentionConfig, ModelConfig
from minitx.cli import eval_main, generate_main, train_main
from minitx.data.prepare import DataSettings
from minitx.errors import UserError
from minitx.files import legacy
from minitx.files.configs import REPO_ROOT, with_config_files
from minitx.files.legacy import ATTENTION_FIELDS, DATA_FIELDS, DATA_TASK_FIELDS, renamed_key
from minitx.trained_model import load_checkpoint
from minitx.training.command import checked_config

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


def test_old_attention_keywords_still_build_the_same_config():
    with pytest.warns(DeprecationWarning, match="window is now options.local.window"):
        old = AttentionConfig(kind="local", window=64, n_global=2, local_backend="chunked")
    assert old == AttentionConfig(
        kind="local", options={"local": {"window": 64, "n_global": 2, "backend": "chunked"}}
    )
    with pytest.warns(DeprecationWarning, match="mta_query_kernel is now options.mta.query_kernel"):
        assert AttentionConfig(kind="mta", mta_query_kernel=3).options_of("mta").query_kernel == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the shared setting did not move
        assert AttentionConfig(kind="gqa", n_kv_head=2).n_kv_head == 2
    assert (
        ModelConfig.from_dict({"attention": {"kind": "local", "window": 9}})
        .attention.options_of("local")
        .window
        == 9
    )


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
            assert legacy.data_section(old_data) == today_data
        return
    old = yaml.safe_load(path.read_text())
    old_attention = (old.get("model") or {}).get("attention") or {}
    old_data = old.get("data") or {}
    if set(old_attention) & set(ATTENTION_FIELDS) or set(old_data) & {*DATA_FIELDS, *DATA_TASK_FIELDS}:
        with pytest.raises(UserError) as refused:
            checked_config(with_config_files(["--config", str(path)]))
        message = str(refused.value)
        assert "\n" not in message and re.search(
            r"this setting is now (model\.attention\.options|data\.bpe_|data\.task\.)", message
        )
        if set(old_data) & set(DATA_TASK_FIELDS):  # moved as saved runs are read, it is today's file
            moved = tmp_path / path.name
            moved.write_text(yaml.safe_dump({**old, "data": legacy.data_section(old_data)}))
            new = checked_config(with_config_files(["--config", str(REPO_ROOT / "configs" / path.name)]))
            assert checked_config(with_config_files(["--config", str(moved)]))["data"] == new["data"]
        return
    old = checked_config(with_config_files(["--config", str(path)]))
    new = checked_config(with_config_files(["--config", str(REPO_ROOT / "configs" / path.name)]))
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
    saved = yaml.safe_load((FIXTURES / "mix_bpe.yaml").read_text())[
        "data"
    ]  # a run's config.yaml, as saved then
    assert (
        "vocab_size" in saved and DataSettings.from_config(saved).bpe_vocab_size == saved["vocab_size"] == 300
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


def test_old_data_keyword_in_python_still_works_with_a_warning():
    from minitx.data.datamodule import TextDataModule

    with pytest.warns(DeprecationWarning, match="vocab_size is now bpe_vocab_size"):
        module = TextDataModule(tokenizer="bpe", vocab_size=300)
    assert module.settings.bpe_vocab_size == 300
