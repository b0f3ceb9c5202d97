"""What minitx checks of a kind from outside it: the causality probe a command makes when it builds
a model (minitx/verify/probe.py), the check command `python -m minitx.verify` and the one line an
error raised in a kind's own code ends in.

The kinds are copies of examples/custom_attention.py, each with one change: its causal mask left
out (attend given an all-true mask), that mask behind a parameter that starts at zero, or a shape
mistake in attend.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import metrics

from minitx import AttentionConfig, ModelConfig, import_kind_modules
from minitx.cli import generate_main, train_main
from minitx.errors import TRACEBACK_VARIABLE
from minitx.files.configs import REPO_ROOT
from minitx.kinds import unregister
from minitx.training import check_train_args, checked_train_config
from minitx.training.command import checked_config
from minitx.verify import probe
from minitx.verify.__main__ import main as verify_main

EXAMPLE = REPO_ROOT / "examples" / "custom_attention.py"
CAUSAL = "q, k, v, dropout_p=self.dropout_p, is_causal=True, enable_gqa=True"
ALL_KEYS = "q, k, v, attn_mask=torch.ones(q.shape[2], k.shape[2], dtype=torch.bool), enable_gqa=True"
SCALING = "        q = self.scaled(q, self.causal_counts(q.shape[2], q.device))\n        return F.scaled"
LEAKS = {CAUSAL: ALL_KEYS}
# The leak multiplied by a parameter that starts at zero: invisible in an untrained model.
HIDDEN_LEAKS = {
    CAUSAL: ALL_KEYS,
    "        return F.scaled_dot_product_attention(\n            q, k, v, attn_mask": "        return self.closed * F.scaled_dot_product_attention(\n            q, k, v, attn_mask",
    "        self.scale_init = options.scale_init\n": "        self.scale_init = options.scale_init\n        self.closed = nn.Parameter(torch.zeros(()))\n",
}
SHAPE_MISTAKE = {
    SCALING: SCALING.replace("q.device))", "q.device)) @ torch.ones(q.shape[-1] + 1, q.shape[-1])")
}


@pytest.fixture
def kind_file(tmp_path, monkeypatch):
    """kind_file(name, changes): a copy of the example registering kind `name`, each of `changes`'
    texts replaced; its path. The kinds are unregistered after the test."""
    monkeypatch.chdir(REPO_ROOT)
    names = []

    def write(name: str, changes: dict[str, str]) -> Path:
        source = EXAMPLE.read_text(encoding="utf-8").replace('KindSpec("ssmax"', f'KindSpec("{name}"')
        for old, new in changes.items():
            assert source.count(old) == 1, old
            source = source.replace(old, new)
        path = tmp_path / f"{name}.py"
        path.write_text(source, encoding="utf-8")
        names.append(name)
        return path

    yield write
    for name in names:
        unregister(name)
    for module in [m for m in sys.modules if m.startswith("minitx_kinds_")]:
        if any(module.startswith(f"minitx_kinds_{name}_") for name in names):
            del sys.modules[module]


def config(kind_path: Path, layers: list[str], block_size: int = 32) -> ModelConfig:
    import_kind_modules([str(kind_path)])
    attention = AttentionConfig(layers=layers, kind_modules=[str(kind_path)])
    return ModelConfig(
        vocab_size=50, block_size=block_size, n_layer=len(layers), n_head=4, d_model=32, attention=attention
    )


def test_the_probe_names_the_first_layer_that_sees_the_future(kind_file):
    leaky = kind_file("leaky", LEAKS)
    leak = probe.find_leak(config(leaky, ["mha", "leaky", "leaky"]))
    assert (leak.kind, leak.layer, leak.position) == ("leaky", 1, 0) and leak.change > 1e-2
    assert leak.file == str(leaky)  # outside the working directory: in full
    assert "kind leaky" in leak.words() and "future token" in leak.words()
    # A block size shorter than the probe's lengths: they are cut to it.
    assert probe.find_leak(config(leaky, ["leaky"], block_size=2)).position == 0


def test_a_leak_behind_a_part_that_starts_closed_is_found(kind_file, monkeypatch):
    hidden = config(kind_file("hidden", HIDDEN_LEAKS), ["hidden"])
    assert probe.find_leak(hidden).layer == 0
    # Because the probe moves the kind's parameters from where they start: left there, no leak shows.
    monkeypatch.setattr(probe, "perturbed", lambda modules: None)
    assert probe.find_leak(hidden) is None


def test_built_in_and_causal_kinds_pass_without_touching_the_random_state(kind_file):
    import_kind_modules(["examples/custom_attention.py"])
    causal = ModelConfig(
        vocab_size=50,
        block_size=80,
        n_layer=3,
        n_head=4,
        d_model=32,
        attention=AttentionConfig(layers=["ssmax", "local", "mta"]),
    )
    torch.manual_seed(1)
    state = torch.random.get_rng_state()
    assert probe.find_leak(causal) is None
    # The run's seed is set before the probe in train, after it in others: it draws nothing of theirs.
    assert torch.equal(torch.random.get_rng_state(), state)
    assert probe.outside_layers(causal) == [0]
    assert probe.outside_layers(ModelConfig(attention=AttentionConfig(layers=["mha", "mta"]))) == []


TINY = [
    "--trainer.max_steps", "4", "--trainer.val_check_interval", "2", "--data.val_batches", "1",
    "--data.batch_size", "2", "--model.block_size", "32", "--model.n_layer", "2", "--model.d_model", "32",
    "--run.sample_tokens", "0", "--trainer.accelerator", "cpu",
]  # fmt: skip


def train_args(path: Path, kind: str, root: Path) -> list[str]:
    return [
        "--model.attention.kind_modules",
        f"[{path}]",
        "--model.attention.kind",
        kind,
        "--run.root",
        str(root),
        *TINY,
    ]


def test_train_refuses_a_kind_that_sees_the_future_in_one_line(kind_file, tmp_path, capsys):
    leaky = kind_file("leaky", LEAKS)
    assert train_main(train_args(leaky, "leaky", tmp_path / "runs")) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and line.startswith("train: error: model.attention: kind leaky")
    assert f"({leaky}) is not causal: in layer 0 a future token changes the output at position 0 by" in line
    assert "train with --model.allow_noncausal_kinds true" in line
    assert not (tmp_path / "runs").exists()  # nothing written


def test_the_flag_lets_it_train_and_is_a_setting_of_the_runs_config(kind_file, tmp_path):
    leaky = kind_file("leaky", LEAKS)
    parsed = checked_config(
        [*train_args(leaky, "leaky", tmp_path / "runs"), "--model.allow_noncausal_kinds", "true"]
    )
    assert parsed["model"]["allow_noncausal_kinds"] is True  # the resolved config, which config.yaml is


def test_a_command_line_is_probed_once_as_train_and_ablate_check_it(kind_file, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr("minitx.training.inputs.find_leak", lambda config: calls.append(config))
    args = train_args(kind_file("fixed", {}), "fixed", tmp_path / "runs")
    # The precheck probes; the parse after it, handed its command line, does not again.
    checked_train_config(args)
    check_train_args(args)
    assert len(calls) == 2


def test_an_error_in_the_kinds_code_names_its_file_and_line(kind_file, tmp_path, capsys, monkeypatch):
    broken = kind_file("broken", SHAPE_MISTAKE)
    line_number = next(
        n for n, text in enumerate(broken.read_text().splitlines(), 1) if "q.shape[-1] + 1" in text
    )
    args = train_args(broken, "broken", tmp_path / "runs")
    assert train_main(args) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and line.startswith(f"train: error: {broken}:{line_number}: RuntimeError: ")
    assert f"{TRACEBACK_VARIABLE}=1 shows the whole traceback" in line
    assert not (tmp_path / "runs").exists()
    monkeypatch.setenv(TRACEBACK_VARIABLE, "1")
    with pytest.raises(RuntimeError):
        train_main(args)


def test_an_error_of_minitx_itself_keeps_its_traceback(kind_file, monkeypatch):
    import_kind_modules([str(kind_file("leaky", LEAKS))])  # a kind from outside is registered

    def bug(argv):
        raise RuntimeError("a bug of minitx's")

    monkeypatch.setattr("minitx.generation.command.main", bug)
    with pytest.raises(RuntimeError, match="a bug of minitx's"):
        generate_main([])


def verify(args: list[str], capsys) -> tuple[int, list[str]]:
    code = verify_main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, (captured.out + captured.err).strip().splitlines()


CHECKS = ["options", "causality", "reference", "cached decode", "generation", "gradient step"]


def test_the_check_command_passes_the_example(capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    code, lines = verify(["examples/custom_attention.py"], capsys)
    assert code == 0, lines
    assert lines[0] == "kind ssmax (examples/custom_attention.py)"
    assert [line.split(":")[0].strip() for line in lines[1:]] == CHECKS
    assert all(line.split(": ")[1] == "ok" for line in lines[1:]), lines


def test_the_check_command_says_what_is_wrong_with_a_kind(kind_file, capsys):
    code, lines = verify([kind_file("leaky", LEAKS)], capsys)
    assert code == 1
    results = {line.split(":")[0].strip(): line for line in lines[1:]}
    assert list(results) == CHECKS
    assert (
        "causality: FAILED: in layer 0 a future token changes the output at position 0"
        in results["causality"]
    )
    assert "FAILED" in results["reference"] and "FAILED" in results["cached decode"]
    assert results["gradient step"].endswith("get a gradient") and ": ok:" in results["gradient step"]

    broken = kind_file("broken", SHAPE_MISTAKE)
    code, lines = verify([broken, "--kind", "broken"], capsys)
    assert code == 1 and all(f"FAILED: {broken}:" in line for line in lines[2:]), lines


# Causal on the whole sequence, wrong in the cache once it holds more than 8 keys: only the
# cached checks can see it, and not at the first cached position.
LATE_CACHE_MISTAKE = {
    "        keys, values, mask = cache.update(k, v)": "        keys, values, mask = cache.update(k, v)\n"
    "        q = q * 1.5 if keys.shape[2] > 8 else q"
}


def test_the_check_command_finds_a_cache_that_goes_wrong_late(kind_file, capsys):
    code, lines = verify([kind_file("late", LATE_CACHE_MISTAKE)], capsys)
    results = {line.split(":")[0].strip(): line for line in lines[1:]}
    assert code == 1 and list(results) == CHECKS, lines
    for check in ("options", "causality", "reference", "gradient step"):
        assert ": ok:" in results[check], results[check]
    assert "FAILED" in results["cached decode"] and "FAILED" in results["generation"], lines


def test_the_check_command_refuses_what_it_cannot_check(kind_file, tmp_path, capsys):
    leaky = kind_file("leaky", LEAKS)
    plain = tmp_path / "plain.py"
    plain.write_text("x = 1\n")
    for args, expected in [
        ([tmp_path / "absent.py"], "absent.py: no such file"),
        ([plain], "plain.py: registers no attention kind"),
        ([leaky, "--kind", "other"], "--kind: "),
        ([leaky, "--options", "scale_init"], "--options: scale_init is not KEY=VALUE"),
        (
            [leaky, "--options", "scale_init=-1"],
            "attention.options.leaky.scale_init: is -1.0; use a positive",
        ),
    ]:
        code, lines = verify(args, capsys)
        assert code == 2 and len(lines) == 1 and expected in lines[0], (args, lines)


@pytest.mark.slow  # four short training runs: about 30 s of CPU
def test_the_flag_trains_a_kind_that_sees_the_future_and_the_fixed_kind_trains_as_before(
    kind_file, tmp_path, monkeypatch
):
    leaky = kind_file("leaky", LEAKS)
    root = tmp_path / "runs"
    assert train_main([*train_args(leaky, "leaky", root), "--model.allow_noncausal_kinds", "true"]) == 0
    run = root / "leaky"
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["allow_noncausal_kinds"] is True
    checkpoint = run / "checkpoints" / "last.ckpt"
    saved = torch.load(checkpoint, weights_only=True)["minitx"]["train_config"]
    assert saved["model"]["allow_noncausal_kinds"] is True
    # The checkpoint says so: loading it skips the probe.
    assert generate_main(["--ckpt", str(checkpoint), "--max-new-tokens", "4"]) == 0

    # The same kind with its mask in attend (the example's) trains; its losses are those of a run
    # without the probe, which draws none of the run's random numbers.
    fixed = kind_file("fixed", {})
    losses = []
    for name, find_leak in [("probed", probe.find_leak), ("unprobed", lambda config: None)]:
        monkeypatch.setattr("minitx.training.inputs.find_leak", find_leak)
        assert train_main([*train_args(fixed, "fixed", root), "--run.name", name]) == 0
        losses.append(metrics(root / name)[0])
    assert losses[0] == losses[1] and len(losses[0]) >= 1
