"""A checkpoint runs no code of its own: the modules that register its attention kinds (its
config's attention.kind_modules) are imported only with the user's consent.

Each checkpoint here names a module that writes a marker file when imported and registers a kind
no other module knows, as a file path and as a module name. Every command that loads checkpoints,
load_checkpoint and the evaluation of a sweep's runs refuse it in one line, and the marker never
appears; with consent (--trust-kind-modules, trust_kind_modules=, the sweep's own modules) it
loads, the marker appears, and it generates the text it generates with its kind registered.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from minitx import AttentionConfig, ModelConfig, Transformer
from minitx.ablation import EvalSettings, Sweep, Variant, load_sweep, plan_runs
from minitx.ablation.runs import eval_runs
from minitx.ablation.summary import SUMMARY_FILE
from minitx.cli import eval_main, export_main, generate_main
from minitx.data.tokenizer import CharTokenizer
from minitx.errors import UserError
from minitx.files.configs import REPO_ROOT
from minitx.kinds import register, registry, unregister
from minitx.trained_model import UntrustedKindError, load_checkpoint

TEXT = "to be or not to be, that is the question: whether 'tis nobler in the mind to suffer\n" * 4
PROMPT = ["--prompt", "to be", "--temperature", "0", "--max-new-tokens", "12"]
KIND_MODULE = '''"""Registers kind {kind} (grouped-query attention by another name), and writes a marker."""
from dataclasses import replace
from pathlib import Path

from minitx.kinds import register, registry

Path({marker!r}).write_text("this module ran")
register(replace(registry["gqa"], name={kind!r}))
'''
_numbers = itertools.count()


@dataclasses.dataclass
class Foreign:
    checkpoint: Path
    module: str  # as the checkpoint names it in attention.kind_modules
    kind: str
    marker: Path  # written when the module is imported


@pytest.fixture(params=["file", "module name"])
def foreign(request, tmp_path, monkeypatch) -> Foreign:
    number = next(_numbers)
    kind, marker = f"marked{number}", tmp_path / "MARKER"
    source = KIND_MODULE.format(kind=kind, marker=str(marker))
    if request.param == "file":
        path = tmp_path / "downloaded" / "attention_kind.py"  # a file that came with the checkpoint
        module = str(path)
    else:  # any importable module with side effects
        path = tmp_path / "site" / f"consent_kind_{number}.py"
        module = path.stem
        monkeypatch.syspath_prepend(str(path.parent))
    path.parent.mkdir()
    path.write_text(source)
    tokenizer = CharTokenizer(TEXT)
    (tmp_path / "corpus.txt").write_text(TEXT)
    register(dataclasses.replace(registry["gqa"], name=kind))  # to build the model being saved
    try:
        torch.manual_seed(number)
        attention = AttentionConfig(kind=kind, n_kv_head=1, kind_modules=[module])
        config = ModelConfig(
            vocab_size=tokenizer.vocab_size,
            block_size=16,
            n_layer=2,
            n_head=2,
            d_model=16,
            attention=attention,
        )
        model = Transformer(config)
        checkpoint = tmp_path / "foreign.ckpt"
        data = {"source": "files", "train_files": str(tmp_path / "corpus.txt"), "val_fraction": 0.25}
        torch.save(
            {
                "state_dict": {f"model.{key}": value for key, value in model.state_dict().items()},
                "minitx": {
                    "format": 1,
                    "model_config": config.to_dict(),
                    "tokenizer": tokenizer.to_dict(),
                    "train_config": {"data": data},
                },
            },
            checkpoint,
        )
    finally:
        unregister(kind)
    assert not marker.exists()
    yield Foreign(checkpoint, module, kind, marker)
    unregister(kind)
    for name in [
        name for name in sys.modules if name == module or name.startswith(f"minitx_kinds_{path.stem}_")
    ]:
        del sys.modules[name]  # a file is imported as minitx_kinds_<stem>_<hash of its path>


def refused_in_one_line(foreign: Foreign, message: str) -> None:
    assert "\n" not in message.strip(), message
    assert f"attention kind {foreign.kind} is defined outside minitx" in message, message
    assert f"would import and run {foreign.module} (attention.kind_modules)" in message, message
    assert "--trust-kind-modules" in message and "trust_kind_modules=True" in message, message
    assert not foreign.marker.exists() and foreign.kind not in registry


def refused_by_load_checkpoint(foreign: Foreign, **consent) -> str:
    with pytest.raises(UntrustedKindError) as refusal:
        load_checkpoint(str(foreign.checkpoint), **consent)
    refused_in_one_line(foreign, str(refusal.value))
    return str(refusal.value)


# -- from Python -----------------------------------------------------------------------------------


def test_load_checkpoint_refuses_without_consent(foreign):
    assert issubclass(UntrustedKindError, UserError)  # one line from the commands, exit status 2
    assert refused_by_load_checkpoint(foreign).startswith(f"checkpoint {foreign.checkpoint}: ")
    refused_by_load_checkpoint(foreign, trust_kind_modules=False)
    # Consent to other modules is no consent to these.
    refused_by_load_checkpoint(foreign, trust_kind_modules=["elsewhere.py", "some.module"])


@pytest.mark.parametrize("consent", ["true", "its modules"])
def test_load_checkpoint_with_consent_imports_the_module_and_loads(foreign, consent):
    refused_by_load_checkpoint(foreign)
    trust = True if consent == "true" else [foreign.module]
    model, tokenizer, _ = load_checkpoint(str(foreign.checkpoint), trust_kind_modules=trust)
    assert foreign.marker.exists() and foreign.kind in registry
    assert model.config.layer_kinds == [foreign.kind, foreign.kind]
    # Once registered in this process, the kind loads without consent, importing nothing more.
    foreign.marker.unlink()
    load_checkpoint(str(foreign.checkpoint))
    assert not foreign.marker.exists()


def test_a_kind_registered_by_the_user_loads_without_consent_and_imports_nothing(foreign):
    refused_by_load_checkpoint(foreign)
    register(dataclasses.replace(registry["gqa"], name=foreign.kind))  # as if imported by the user
    model, _, _ = load_checkpoint(str(foreign.checkpoint))
    assert model.config.attention.kind == foreign.kind and not foreign.marker.exists()


def test_building_a_config_imports_nothing(foreign):
    saved = torch.load(foreign.checkpoint, weights_only=True)["minitx"]["model_config"]
    with pytest.raises(UserError, match=rf"kind '{foreign.kind}' is not registered.* is not imported"):
        ModelConfig.from_dict(saved)
    assert not foreign.marker.exists()


# -- the commands ----------------------------------------------------------------------------------


def lm_eval_args(foreign: Foreign) -> list[str]:
    pytest.importorskip("lm_eval", reason="the eval extra is not installed: pip install -e '.[eval]'")
    return ["--lm-eval-tasks", "hellaswag"]


COMMANDS = {
    "generate": lambda foreign: (generate_main, PROMPT),
    "evaluate": lambda foreign: (eval_main, ["--no-progress", "--max-tokens", "40"]),
    "evaluate --lm-eval-tasks": lambda foreign: (eval_main, lm_eval_args(foreign)),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_refuses_without_consent(foreign, command, capsys):
    main, arguments = COMMANDS[command](foreign)
    capsys.readouterr()
    assert main(["--ckpt", str(foreign.checkpoint), *arguments]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"{command.split()[0]}: error: --ckpt {foreign.checkpoint}: ")
    refused_in_one_line(foreign, err)


def test_generate_with_consent_prints_the_same_text(foreign, capsys):
    capsys.readouterr()
    assert generate_main(["--ckpt", str(foreign.checkpoint), *PROMPT]) == 2
    refused_in_one_line(foreign, capsys.readouterr().err)
    register(dataclasses.replace(registry["gqa"], name=foreign.kind))  # as if imported by the user
    assert generate_main(["--ckpt", str(foreign.checkpoint), *PROMPT]) == 0  # no consent needed
    text = capsys.readouterr().out
    assert len(text) > 12 and not foreign.marker.exists()
    unregister(foreign.kind)
    assert generate_main(["--ckpt", str(foreign.checkpoint), *PROMPT, "--trust-kind-modules"]) == 0
    assert capsys.readouterr().out == text and foreign.marker.exists()


def test_evaluate_with_consent_scores_the_run(foreign, tmp_path, capsys):
    report = tmp_path / "evaluation.json"
    arguments = [
        "--ckpt",
        str(foreign.checkpoint),
        "--no-progress",
        "--json",
        str(report),
        "--lengths",
        "8",
        "16",
    ]
    capsys.readouterr()
    assert eval_main(arguments) == 2 and not report.exists()
    refused_in_one_line(foreign, capsys.readouterr().err)
    assert eval_main([*arguments, "--trust-kind-modules"]) == 0
    assert math.isfinite(json.loads(report.read_text())["loss"]) and foreign.marker.exists()


def test_the_lm_eval_adapter_asks_for_consent_too(foreign):
    pytest.importorskip("lm_eval", reason="the eval extra is not installed: pip install -e '.[eval]'")
    from minitx.hf.lm_eval_adapter import MinitxLM

    with pytest.raises(UntrustedKindError) as refusal:  # lm_eval --model minitx --model_args ckpt=...
        MinitxLM.create_from_arg_string(f"ckpt={foreign.checkpoint}")
    refused_in_one_line(foreign, str(refusal.value))
    lm = MinitxLM.create_from_arg_string(f"ckpt={foreign.checkpoint},trust_kind_modules=true")
    assert foreign.marker.exists() and lm.model.config.attention.kind == foreign.kind
    context, target = lm.encode_pair("to be or", " not")
    assert math.isfinite(lm.score(context, target)[0])


def test_export_refuses_a_foreign_kind_without_importing_it(foreign, tmp_path, capsys):
    pytest.importorskip("transformers", reason="the hf extra is not installed")
    pytest.importorskip("safetensors", reason="the hf extra is not installed")
    capsys.readouterr()
    assert export_main(["--ckpt", str(foreign.checkpoint), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "\n" not in err.strip() and f"uses attention kind {foreign.kind}, defined outside minitx" in err
    assert not foreign.marker.exists() and not (tmp_path / "hf").exists()


# -- a sweep's evaluation of its runs --------------------------------------------------------------


def finished_run(tmp_path: Path, foreign: Foreign):
    """A run of a sweep that looks finished, whose best checkpoint is the foreign one."""
    sweep = Sweep(base_text="model: {}\n", overrides={}, variants=[Variant("foreign", {})])
    [run] = plan_runs(sweep, tmp_path / "sweep", seeds=1)
    (run.directory / "checkpoints").mkdir(parents=True)
    (run.directory / "checkpoints" / "best.ckpt").write_bytes(foreign.checkpoint.read_bytes())
    (run.directory / SUMMARY_FILE).write_text(json.dumps({"block_size": 16, "best_val_loss": 2.0}))
    return run


def test_a_sweeps_evaluation_imports_only_the_modules_the_sweep_names(foreign, tmp_path):
    run, settings = finished_run(tmp_path, foreign), EvalSettings(lengths=[8], max_tokens=40)
    record = eval_runs.evaluate_run(run, settings, log=lambda line: None)  # a sweep of built-in kinds
    assert "result" not in record and not foreign.marker.exists() and foreign.kind not in registry
    assert f"attention kind {foreign.kind} is defined outside minitx" in record["error"]  # the row's note
    other = Sweep(
        base_text="model: {attention: {kind_modules: [other.py]}}\n", overrides={}, variants=[run.variant]
    )
    trust = eval_runs.sweep_kind_modules(other)
    assert trust == ["other.py"]
    record = eval_runs.evaluate_run(run, settings, log=lambda line: None, trust_kind_modules=trust)
    assert "result" not in record and not foreign.marker.exists() and foreign.kind not in registry
    assert f"attention kind {foreign.kind} is defined outside minitx" in record["error"]  # the row's note
    # The sweep's own config named the module: that consent goes with the sweep to its evaluation.
    own = Sweep(base_text="model: {}\n", overrides={}, variants=[Variant("foreign", {})])
    own.overrides["model.attention.kind_modules"] = [foreign.module]
    trust = eval_runs.sweep_kind_modules(own)
    assert trust == [foreign.module]
    record = eval_runs.evaluate_run(run, settings, log=lambda line: None, trust_kind_modules=trust)
    assert math.isfinite(record["result"]["loss"]) and foreign.marker.exists()


def test_a_sweeps_modules_are_those_its_configs_name(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    sweep = load_sweep("examples/custom_attention_ablation.yaml")  # kind_modules in its base config
    assert eval_runs.sweep_kind_modules(sweep) == ["examples/custom_attention.py"]
    extra = ["--model.attention.kind_modules", '["mine.py"]']
    assert eval_runs.sweep_kind_modules(sweep, extra) == ["mine.py"]
    assert eval_runs.sweep_kind_modules(load_sweep("configs/ablation.yaml")) == []


# -- the docs show the flag ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "page", ["docs/custom-attention.md", "examples/custom_attention.yaml", "examples/custom_attention.py"]
)
def test_the_walkthrough_loads_its_checkpoints_with_the_flag(page):
    lines = (REPO_ROOT / page).read_text(encoding="utf-8").splitlines()
    loading = [
        line for line in lines if "--ckpt" in line and ("generate.py" in line or "evaluate.py" in line)
    ]
    assert loading, page
    assert all("--trust-kind-modules" in line for line in loading), loading
