"""Tests of minitx.training and minitx.files.checkpoint: the train command end to end, on tiny models.

Runs go through `minitx.cli.train_main(argv)` in-process (the real command-line path, exit codes
included), except DDP, which needs real processes and runs `python train.py` in a subprocess.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import metrics

from minitx.cli import train_main
from minitx.config import AttentionConfig, ModelConfig
from minitx.files.atomic import TMP_PREFIX, write_atomically
from minitx.files.configs import DEFAULT_CONFIG
from minitx.training import (
    MinitxLM,
    ThroughputMeter,
    lr_at,
    optimizer_groups,
    peak_flops,
)
from minitx.training.optim import Optimisation

REPO = Path(__file__).resolve().parents[2]
WORDS = "the quick brown fox jumps over a lazy dog while seven kings sing of old stars".split()


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    # One token cache for the whole file: the Shakespeare corpus is tokenised once.
    return tmp_path_factory.mktemp("token-cache")


def tiny_config(path: Path, cache_dir: Path, **data) -> Path:
    """A YAML config for a one-layer model that trains in a few seconds on a CPU."""
    config = {
        "seed_everything": 7,
        "model": {
            "n_layer": 1,
            "n_head": 2,
            "d_model": 32,
            "block_size": 32,
            "lr": 1e-2,
            "min_lr": 1e-3,
            "warmup_steps": 5,
        },
        "data": {
            "source": "shakespeare",
            "batch_size": 8,
            "val_batches": 2,
            "cache_dir": str(cache_dir),
            **data,
        },
        "trainer": {
            "max_steps": 30,
            "val_check_interval": 10,
            "log_every_n_steps": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
        },
        "run": {"name": "tiny", "root": str(path.parent / "runs"), "sample_tokens": 20},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def train(*args) -> int:
    return train_main([str(a) for a in args])


def run_dir(config: Path) -> Path:
    return config.parent / "runs" / "tiny"


def assert_learns_and_checkpoints(run: Path, steps: int = 30) -> dict:
    train_loss, val_loss = metrics(run)
    assert sorted(train_loss) == list(range(steps))
    first = sum(train_loss[s] for s in range(5)) / 5
    last = sum(train_loss[s] for s in range(steps - 5, steps)) / 5
    assert last < first - 0.5, (first, last)
    vals = [val_loss[s] for s in sorted(val_loss)]
    assert len(vals) == steps // 10 and vals[-1] < vals[0], vals

    for name in ("last.ckpt", "best.ckpt"):
        assert (run / "checkpoints" / name).is_file()
    assert not list((run / "checkpoints").glob(f"{TMP_PREFIX}*"))
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)  # the contract
    assert ckpt["global_step"] == steps
    assert ckpt["minitx"]["format"] == 1
    assert ModelConfig.from_dict(ckpt["minitx"]["model_config"]).n_layer == 1
    assert set(ckpt["minitx"]["tokenizer"]) >= {"kind"}
    assert ckpt["state_dict"] and all(k.startswith("model.") for k in ckpt["state_dict"])
    assert isinstance(ckpt["hyper_parameters"]["attention"], dict)
    best = torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)
    best_state = best["callbacks"]["RunCheckpoints"]
    assert best_state["best_score"] == pytest.approx(min(vals), rel=1e-5)
    # The run directory holds the resolved config, which starts the same run again.
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"]["n_layer"] == 1 and saved["ckpt_path"] is None
    return ckpt


# ------------------------------------------------------------------------------- end to end


def test_shakespeare_run_learns_checkpoints_resumes_and_samples(tmp_path, cache_dir, capfd):
    config = tiny_config(tmp_path / "tiny.yaml", cache_dir)
    assert train("--config", config) == 0
    out, err = capfd.readouterr()
    run = run_dir(config)
    assert_learns_and_checkpoints(run)
    assert "final val loss" in out and "sample:" in out
    assert "MFU against the measured float32 matmul peak of this cpu" in out + err  # no datasheet figure
    logged = (run / "logs" / "version_0" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "tokens_per_sec" in logged and "mfu" in logged

    # Generation loads the checkpoint with nothing but the file.
    trained = pytest.importorskip("minitx.trained_model")
    model, tokenizer, _ = trained.load_checkpoint(str(run / "checkpoints" / "last.ckpt"))
    assert model.config.vocab_size == tokenizer.vocab_size

    # A fresh start into a run directory with checkpoints is refused ...
    assert train("--config", config) == 2
    assert "--ckpt_path last" in capfd.readouterr().err
    # ... and --ckpt_path last continues from step 30 to a higher max_steps.
    assert (
        train("--config", config, "--ckpt_path", "last", "--trainer.max_steps", 40, "--run.sample_tokens", 0)
        == 0
    )
    resumed, _ = metrics(run, version=1)
    assert sorted(resumed) == list(range(30, 40))
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 40


def test_local_text_files_run(tmp_path, cache_dir):
    rng = random.Random(0)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, lines in (("a.txt", 400), ("b.txt", 400), ("val.txt", 100)):
        text = "".join(" ".join(rng.choices(WORDS, k=rng.randint(3, 9))) + ".\n" for _ in range(lines))
        (corpus / name).write_text(text)
    config = tiny_config(
        tmp_path / "tiny.yaml",
        cache_dir,
        source="files",
        train_files=str(corpus / "[ab].txt"),
        val_files=str(corpus / "val.txt"),
    )
    assert train("--config", config, "--run.sample_tokens", 0) == 0
    ckpt = assert_learns_and_checkpoints(run_dir(config))
    assert set(ckpt["minitx"]["tokenizer"]["chars"]) == set("".join(WORDS) + " .\n")


def test_hf_text_builder_run_offline(tmp_path, cache_dir, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    rng = random.Random(1)
    text = "".join(" ".join(rng.choices(WORDS, k=rng.randint(3, 9))) + ".\n" for _ in range(800))
    (tmp_path / "train.txt").write_text(text)
    config = tiny_config(
        tmp_path / "tiny.yaml",
        cache_dir,
        source="hf",
        hf_name="text",
        hf_data_files={"train": str(tmp_path / "train.txt")},
        val_fraction=0.2,
    )
    assert train("--config", config, "--run.sample_tokens", 0) == 0
    assert_learns_and_checkpoints(run_dir(config))


def test_resumed_run_matches_uninterrupted_run_exactly(tmp_path, cache_dir, monkeypatch):
    """Crash at step 13, resume from the step-10 checkpoint: per-step losses equal bit for bit.

    Dropout is on, so this also checks that the resumed run draws the same masks.
    """
    config = tiny_config(tmp_path / "tiny.yaml", cache_dir)
    common = [
        "--config",
        config,
        "--model.dropout",
        0.2,
        "--trainer.max_steps",
        20,
        "--run.checkpoint_every_n_steps",
        5,
        "--trainer.val_check_interval",
        8,
        "--run.sample_tokens",
        0,
    ]
    assert train(*common, "--run.name", "whole") == 0
    whole, whole_val = metrics(config.parent / "runs" / "whole")

    original_step = MinitxLM.training_step

    def crash_at_13(self, batch, batch_idx):
        if self.global_step == 13:
            raise RuntimeError("simulated crash")
        return original_step(self, batch, batch_idx)

    monkeypatch.setattr(MinitxLM, "training_step", crash_at_13)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(*common, "--run.name", "crashed")
    monkeypatch.setattr(MinitxLM, "training_step", original_step)
    assert (
        torch.load(config.parent / "runs" / "crashed" / "checkpoints" / "last.ckpt", weights_only=True)[
            "global_step"
        ]
        == 10
    )

    assert train(*common, "--run.name", "crashed", "--ckpt_path", "last") == 0
    resumed, resumed_val = metrics(config.parent / "runs" / "crashed", version=1)
    assert sorted(resumed) == list(range(10, 20))
    assert {s: whole[s] for s in resumed} == resumed  # exact equality, not approx
    assert resumed_val == {s: v for s, v in whole_val.items() if s >= 10}


def test_non_finite_loss_stops_the_run_and_keeps_the_last_checkpoint(tmp_path, cache_dir, monkeypatch, capfd):
    config = tiny_config(tmp_path / "tiny.yaml", cache_dir)
    original_loss = MinitxLM.loss

    def nan_at_7(self, x, y):
        loss = original_loss(self, x, y)
        return loss * float("nan") if self.global_step == 7 else loss

    monkeypatch.setattr(MinitxLM, "loss", nan_at_7)
    assert train("--config", config, "--run.checkpoint_every_n_steps", 5) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert "step 7" in err[-1] and "nan" in err[-1]
    ckpt = torch.load(run_dir(config) / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 5
    assert all(torch.isfinite(t).all() for t in ckpt["state_dict"].values())


# ------------------------------------------------------------------------------- configuration


def test_dotted_overrides_reach_the_model_and_the_saved_config(tmp_path, cache_dir):
    from minitx.training import TrainCLI

    config = tiny_config(tmp_path / "tiny.yaml", cache_dir)
    cli = TrainCLI(
        [
            "--config",
            str(config),
            "--model.n_head",
            "4",
            "--model.attention.kind",
            "gqa",
            "--model.attention.n_kv_head",
            "2",
            "--model.block_size",
            "48",
            "--trainer.max_steps",
            "17",
        ]
    )
    model = cli.model
    assert model.config.attention.kind == "gqa" and model.config.n_kv_head_at(0) == 2
    assert model.config.vocab_size == cli.datamodule.vocab_size  # linked from the tokenizer
    assert cli.datamodule.block_size == 48  # linked from model.block_size
    assert model.hparams.max_steps == 17 == cli.trainer.max_steps  # linked from trainer.max_steps
    assert model.model.blocks[0].attn.n_kv_head == 2


def test_a_saved_config_starts_its_run_again_after_a_flag_changed_the_kind(tmp_path, cache_dir):
    """The config a run writes is the one it ran: a flag that changed the attention kind leaves
    no options of the config file's kind behind, which the saved config would then be refused for."""
    config = tiny_config(tmp_path / "tiny.yaml", cache_dir)
    assert train("--config", config, "--model.attention.kind", "local", "--trainer.max_steps", 2) == 0
    saved_path = run_dir(config) / "config.yaml"
    saved = yaml.safe_load(saved_path.read_text())
    assert saved["model"]["attention"]["kind"] == "local"
    assert set(saved["model"]["attention"]["options"]) <= {"local"}  # mha's, filled in by the parse, is gone
    assert train("--config", saved_path, "--run.name", "again") == 0
    again = yaml.safe_load((config.parent / "runs" / "again" / "config.yaml").read_text())
    assert again["model"] == saved["model"]


def test_model_config_is_the_one_source_of_model_keys(tmp_path, cache_dir, monkeypatch):
    """Every ModelConfig field is a model.* key with ModelConfig's default, and a field added to
    ModelConfig reaches the model from the command line with no edit in minitx/training."""
    import dataclasses

    import minitx.training.module as module
    from minitx.config import AttentionConfig as Attention
    from minitx.training import TrainCLI

    config = tiny_config(tmp_path / "tiny.yaml", cache_dir)
    cli = TrainCLI(["--config", str(config)])
    keys = cli.parser.get_defaults()
    for field in dataclasses.fields(ModelConfig):
        # vocab_size and document_token are linked from the data's tokenizer (data.documents)
        if field.name not in ("attention", "vocab_size", "document_token"):
            assert keys[f"model.{field.name}"] == getattr(ModelConfig(), field.name), field.name
    for field in dataclasses.fields(Attention):
        assert keys[f"model.attention.{field.name}"] == getattr(Attention(), field.name), field.name

    @dataclasses.dataclass
    class WiderConfig(ModelConfig):
        extra_field: int = 3

    monkeypatch.setattr(module, "ModelConfig", WiderConfig)
    cli = TrainCLI(["--config", str(config), "--model.extra_field", "5"])
    assert cli.model.config.extra_field == 5 and cli.model.hparams["extra_field"] == 5


def test_default_root_dir_sets_the_run_root_or_is_refused(tmp_path, cache_dir, monkeypatch, capfd):
    from minitx.training import TrainCLI

    monkeypatch.chdir(tmp_path)
    config = tiny_config(tmp_path / "tiny.yaml", cache_dir)
    # run.root left at its default: --trainer.default_root_dir is where runs go.
    cli = TrainCLI(
        [
            "--config",
            str(config),
            "--run.root",
            "runs",
            "--trainer.default_root_dir",
            str(tmp_path / "elsewhere"),
        ]
    )
    assert cli.trainer.default_root_dir == str(tmp_path / "elsewhere" / "tiny")
    assert cli.config_init["run"].root == str(tmp_path / "elsewhere")
    assert cli.trainer.loggers[0].log_dir.startswith(str(tmp_path / "elsewhere" / "tiny"))
    # Both given and different: one line, exit 2, nothing written.
    assert train("--config", config, "--trainer.default_root_dir", tmp_path / "elsewhere") == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert err[-1].startswith("train: error: trainer.default_root_dir:") and "run.root" in err[-1]
    assert not (tmp_path / "elsewhere").exists() and not run_dir(config).exists()


def test_print_config_shows_the_resolved_config(tmp_path, cache_dir, capsys):
    config = tiny_config(tmp_path / "tiny.yaml", cache_dir)
    with pytest.raises(SystemExit) as exit_info:
        train("--config", config, "--model.attention.kind", "mqa", "--print_config")
    assert exit_info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["attention"]["kind"] == "mqa"
    assert printed["model"]["n_layer"] == 1 and printed["trainer"]["max_steps"] == 30


def test_no_config_means_the_default_config(capsys):
    with pytest.raises(SystemExit):
        train("--print_config")
    printed = yaml.safe_load(capsys.readouterr().out)

    def assert_contains(whole: dict, part: dict) -> None:
        for key, value in part.items():
            if isinstance(value, dict):
                assert_contains(whole[key], value)
            else:
                assert whole[key] == value, key

    assert_contains(printed, yaml.safe_load(DEFAULT_CONFIG.read_text()))


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--model.n_layers", "3"], "did you mean 'model.n_layer'"),
        (["--model.attention.kind", "flash"], "model.attention.kind"),
        (["--model.d_model", "30"], "model.d_model"),
        (["--model.attention.kind", "gqa", "--model.attention.n_kv_head", "3"], "model.attention.n_kv_head"),
        (["--model.lr", "-1"], "model.lr"),
        (["--ckpt_path", "last", "--run.name", "never-ran"], "ckpt_path"),
    ],
)
def test_bad_config_is_one_line_and_exit_2(tmp_path, cache_dir, capfd, args, expected):
    config = tiny_config(tmp_path / "tiny.yaml", cache_dir)
    assert train("--config", config, *args) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert err[-1].startswith("train: error: ") and expected in err[-1]
    assert not any("Traceback" in line for line in err)


def test_module_defaults_are_model_config_defaults():
    module = MinitxLM()
    assert module.config == ModelConfig()


# ------------------------------------------------------------------------------- pieces


def test_weight_decay_only_on_matrices():
    config = ModelConfig(
        n_layer=3,
        attention=AttentionConfig(kind="mta", n_kv_head=2, options={"mta": {"conv_layers": [1]}}),
        bias=True,
        norm="layernorm",
    )
    model = MinitxLM(
        **{k: v for k, v in config.to_dict().items() if k != "attention"},
        attention=config.attention,
        max_steps=10,
    ).model
    names = {id(p): n for n, p in model.named_parameters()}
    decay, no_decay = optimizer_groups(list(model.named_parameters()), 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    decayed = {names[id(p)] for p in decay["params"]}
    undecayed = {names[id(p)] for p in no_decay["params"]}
    assert all(p.dim() >= 2 for p in decay["params"])
    assert {n for n, p in model.named_parameters() if p.dim() < 2} <= undecayed  # norms, biases
    assert "tok_emb.weight" in decayed and "blocks.0.attn.qkv_proj.weight" in decayed
    assert {"blocks.1.attn.kq_conv", "blocks.0.attn.mix_pre", "blocks.0.attn.mix_post"} <= undecayed


def test_lr_schedule_warms_up_then_cosine_decays_to_min_lr():
    lr, min_lr, warmup, total = 1e-3, 1e-4, 10, 110
    module = MinitxLM(
        n_layer=1, d_model=32, n_head=2, lr=lr, min_lr=min_lr, warmup_steps=warmup, max_steps=total
    )
    scheduler = module.configure_optimizers()["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(total + 5):
        lrs.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(lr / warmup)
    assert all(a < b for a, b in zip(lrs[: warmup - 1], lrs[1:warmup]))  # linear warmup
    assert lrs[warmup - 1] == pytest.approx(lr)
    assert all(a >= b for a, b in zip(lrs[warmup:total], lrs[warmup + 1 : total + 1]))  # decay
    assert lrs[warmup + (total - warmup) // 2] == pytest.approx((lr + min_lr) / 2)  # cosine midpoint
    assert lrs[total:] == pytest.approx([min_lr] * 5)
    assert lrs == pytest.approx([lr_at(s, lr, min_lr, warmup, total) for s in range(total + 5)])


def test_a_warmup_as_long_as_the_run_is_said_in_one_line_and_the_run_trains(tmp_path, cache_dir, capfd):
    """train warns (a few steps to see that training starts are a run of their own); ablate
    refuses the same (tests/ablation/test_ablation.py), as a designed sweep's budget does."""
    config = tiny_config(tmp_path / "tiny.yaml", cache_dir)
    args = ["--trainer.max_steps", 4, "--trainer.val_check_interval", 4, "--run.sample_tokens", 0]
    assert train("--config", config, *args) == 0
    _, err = capfd.readouterr()
    warned = [line for line in err.splitlines() if "warmup_steps" in line]
    assert warned == [
        "minitx: warning: model.warmup_steps 5 is not less than trainer.max_steps 4: the run is all warmup, its "
        "learning rate ending at 80% of the peak model.lr, never decayed; lower model.warmup_steps or raise "
        "trainer.max_steps"
    ]
    assert (run_dir(config) / "checkpoints" / "last.ckpt").is_file()
    assert Optimisation(warmup_steps=4).all_warmup(5) == Optimisation(warmup_steps=0).all_warmup(1) == ""
    assert Optimisation(warmup_steps=5).all_warmup(5).startswith("model.warmup_steps 5 is not less than")


def test_cpu_mfu_is_against_its_measured_matmul_peak_measured_once(monkeypatch):
    import minitx.training.throughput as throughput

    sizes = []
    monkeypatch.setattr(throughput, "matmul_flops", lambda device: sizes.append(device) or 5e10)
    throughput._measured_peak.cache_clear()
    try:
        cpu = torch.device("cpu")
        assert peak_flops(cpu) == peak_flops(cpu) == 5e10 and len(sizes) == 1  # once per process
        assert throughput.peak_source(cpu) == "measured float32 matmul"
    finally:
        throughput._measured_peak.cache_clear()  # the real peak, for whatever runs next


def test_the_measured_peak_is_a_dense_matmul_rate():
    import minitx.training.throughput as throughput

    flops = throughput.matmul_flops(torch.device("cpu"), size=128, repeats=2)
    assert 1e6 < flops < 1e14  # 2 * 128^3 FLOPs in well under a second, above a FLOP per ns


def test_throughput_meter_times_steps_not_validation(monkeypatch):
    import minitx.training.throughput as throughput

    clock = iter([10.0, 12.0, 13.0, 17.0, 20.0])
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(throughput, "peak_flops", lambda device: 1200.0)  # no matmul timed here
    meter = ThroughputMeter(torch.device("cpu"), flops_per_token=6.0)
    meter.add(100)
    assert meter.lap() is None and meter.tokens_seen == 100  # t=10: the first step only starts the clock
    meter.add(400)
    meter.pause()  # t=12: validation from here ...
    meter.resume()  # ... to t=13 is left out
    meter.add(200)
    assert meter.lap() == pytest.approx(600 / 6.0)  # t=17: 600 tokens in 7 s of which 1 was validation
    meter.add(300)
    assert meter.lap() == pytest.approx(100.0)  # t=20
    assert meter.tokens_seen == 1000 and meter.mean_tokens_per_sec == pytest.approx(900 / 9.0)
    assert meter.mfu(100.0) == pytest.approx(6.0 * 100.0 / 1200.0)  # against the (measured) peak


def test_atomic_write_never_leaves_a_partial_file(tmp_path):
    target = tmp_path / "last.ckpt"
    write_atomically(target, lambda f: torch.save({"step": 1}, f))

    def dies_halfway(file):
        file.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt  # as if the process were stopped mid-save

    with pytest.raises(KeyboardInterrupt):
        write_atomically(target, dies_halfway)
    assert torch.load(target, weights_only=True) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


# ------------------------------------------------------------------------------- other loggers, many devices


def test_wandb_offline_writes_its_run_directory(tmp_path, cache_dir, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wandb-dir").mkdir()
    config = tiny_config(tmp_path / "tiny.yaml", cache_dir)
    assert (
        train("--config", config, "--run.wandb", "true", "--trainer.max_steps", 10, "--run.sample_tokens", 0)
        == 0
    )
    runs = list((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].rglob("*.wandb"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_on_cpu_with_two_processes(tmp_path, cache_dir):
    config = tiny_config(tmp_path / "tiny.yaml", cache_dir)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "--config",
            str(config),
            "--trainer.strategy",
            "ddp",
            "--trainer.accelerator",
            "cpu",
            "--trainer.devices",
            "2",
            "--trainer.max_steps",
            "10",
            "--run.sample_tokens",
            "0",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "final val loss" in result.stdout
    assert result.stdout.count("final val loss") == 1  # printed by rank 0 only
    ckpt = torch.load(run_dir(config) / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 10
    val_loss = metrics(run_dir(config))[1]
    assert len(val_loss) == 1 and math.isfinite(next(iter(val_loss.values())))
