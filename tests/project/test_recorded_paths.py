"""Paths that outlive the code: every module path, name and class path written into runs, sweeps,
checkpoints and installed scripts still imports and resolves, at the home it has today.

A module that moved leaves no alias behind (nothing minitx recorded names an old path, which the
tests below hold): its old path is refused in one line by minitx/moved.py, naming the new home,
and the names it had are all at that home. The paths below are written out as the older versions
wrote them, not taken from the code; the checkpoints in tests/fixtures are searched too.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch
import yaml
from test_imports import import_graph

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"

# Old module path -> the modules that hold its names now (the refusal names each).
MOVED_MODULES = {
    "minitx.checkpoint": ["minitx.files.checkpoint", "minitx.trained_model"],
    "minitx.fileio": ["minitx.files.atomic"],
    "minitx.runlock": ["minitx.files.runlock"],
    "minitx.legacy": ["minitx.files.legacy"],
    "minitx.configfiles": ["minitx.files.configs"],
    "minitx.generate_inputs": ["minitx.generation.inputs"],
    "minitx.generation.loop": ["minitx.decoding.loop"],
    "minitx.generation.sampling": ["minitx.decoding.sampling"],
    "minitx.attention.mta.kernels": ["minitx.attention.mta.torch_math"],
    "minitx.ablation.runs.designed": ["minitx.ablation.designed_sweep"],
}

# The public names of each module before it moved (what code written then imports from it).
NAMES_BEFORE = {
    "minitx.checkpoint": [
        "BEST",
        "CHECKPOINT_FORMAT",
        "LAST",
        "TMP_PREFIX",
        "TRUST_KEYWORD",
        "UntrustedKindError",
        "check_crcs",
        "copy_atomically",
        "existing_checkpoints",
        "import_checkpoint_kinds",
        "load_checkpoint",
        "load_error_message",
        "load_file",
        "model_weights",
        "read_checkpoint",
        "remove_stale_temporaries",
        "state_mismatch",
        "write_atomically",
    ],
    "minitx.fileio": [
        "AtomicFile",
        "TMP_PREFIX",
        "copy_atomically",
        "read_json",
        "write_atomically",
        "write_json_atomically",
        "write_text_atomically",
    ],
    "minitx.runlock": ["LOCK_NAME", "RunLock", "launched_by_another_process"],
    "minitx.legacy": [
        "ATTENTION_FIELDS",
        "DATA_FIELDS",
        "attention_section",
        "attention_spelling",
        "data_section",
        "options_with",
        "renamed_key",
    ],
    "minitx.configfiles": [
        "CONFIG_FLAGS",
        "DEFAULT_CONFIG",
        "OPTIONS_FLAG",
        "REPO_ROOT",
        "base_chain",
        "base_of",
        "config_arguments",
        "given_options",
        "merged",
        "merged_config",
        "with_config_files",
    ],
    "minitx.generate_inputs": [
        "BYTES_PER_ID",
        "MIN_TEMPERATURE",
        "SEED_RANGE",
        "check_generate_args",
        "machine_memory",
    ],
    "minitx.generation.loop": [
        "COMPILED_DECODING",
        "CachedSteps",
        "CroppedSteps",
        "check_prompt_fits",
        "compiled_decoding",
        "generate",
    ],
    "minitx.generation.sampling": ["check_options", "pick_next", "top_k_filter", "top_p_filter"],
    "minitx.ablation.runs.designed": [
        "PHASES",
        "PLAN_FILE",
        "PLAN_VERSION",
        "check_plan_version",
        "describe",
        "log_count",
        "report_instability",
        "run_designed",
    ],
    "minitx.attention.mta.kernels": [
        "ChunkedRows",
        "KeyQueryConv",
        "MixedSoftmax",
        "NativeKeyQueryConv",
        "NativeMix",
        "VisibleKeys",
        "band_scores",
        "band_width",
        "convolve",
        "convolved_keys",
        "identity_kernel",
        "identity_mix",
        "mix_heads",
        "product",
        "shifted_queries",
    ],
}

# A module that became a package keeps the names it had: old module -> {name: the module that holds it}.
SPLIT_MODULES = {
    # minitx/decoding.py, split into the generation package's loop and filters and back: the
    # package minitx.decoding holds them again, under the names the module had.
    "minitx.decoding": {
        **dict.fromkeys(
            [
                "COMPILED_DECODING",
                "CachedSteps",
                "CroppedSteps",
                "check_prompt_fits",
                "compiled_decoding",
                "generate",
            ],
            "minitx.decoding.loop",
        ),
        **dict.fromkeys(
            ["check_options", "pick_next", "top_k_filter", "top_p_filter"], "minitx.decoding.sampling"
        ),
    },
    # minitx/generation.py, the generate command's module, which became the package minitx.generation
    # (tests/fixtures/legacy/make.sh: `from minitx.generation import load_checkpoint`).
    "minitx.generation": {
        **dict.fromkeys(["TextStream", "main", "parse_args"], "minitx.generation.command"),
        "load_checkpoint": "minitx.trained_model",
        "check_generate_args": "minitx.generation.inputs",
        **dict.fromkeys(
            ["CachedSteps", "CroppedSteps", "check_prompt_fits", "generate"], "minitx.decoding.loop"
        ),
        **dict.fromkeys(
            ["check_options", "pick_next", "top_k_filter", "top_p_filter"], "minitx.decoding.sampling"
        ),
    },
}

# Dotted paths that minitx wrote into what it saved, as it wrote them (module.Name or module:name).
RECORDED = {
    # every run of a sweep: its command line, run.json and config.yaml (--trainer.callbacks+=...)
    "minitx.ablation.summary.RunSummary",
    # a SLURM sweep's jobs, pickled by submitit into <output>/slurm/ and unpickled on a requeue
    "minitx.ablation.runs.slurm.RunJob",
    "minitx.ablation.runs.runner.Run",
    # a callback a run's config may name (tests/training/test_progress_lines.py)
    "minitx.training.progress.StepProgressBar",
    # the command modules minitx.cli imports by name, as older versions named them
    "minitx.generation:main",
    "minitx.training.precheck:main",
    "minitx.ablation.command:main",
    "minitx.evaluation.command:main",
    "minitx.hf.command:main",
    "minitx.training.prepare_command:main",
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


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_module_path_is_refused_naming_where_its_names_are(old):
    with pytest.raises(ModuleNotFoundError) as refused:
        importlib.import_module(old)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{old} moved: import from ")
    homes = [importlib.import_module(home) for home in MOVED_MODULES[old]]
    for home in MOVED_MODULES[old]:
        assert home in message, f"{old}'s refusal does not name {home}"
    for name in NAMES_BEFORE[old]:
        assert any(hasattr(home, name) for home in homes), f"{old}.{name} is gone"


@pytest.mark.parametrize("old", sorted(SPLIT_MODULES))
def test_a_split_module_gives_the_very_same_objects_as_their_new_homes(old):
    module = importlib.import_module(old)
    for name, home in SPLIT_MODULES[old].items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name), f"{old}.{name}"
    namespace: dict = {}
    exec(f"from {old} import {', '.join(SPLIT_MODULES[old])}", namespace)  # the from-import spelling
    assert all(namespace[name] is getattr(module, name) for name in SPLIT_MODULES[old])


def test_an_old_path_is_only_a_line_of_minitx_moved():
    """No file stands at an old path and nothing in minitx imports one."""
    from minitx import moved

    assert set(MOVED_MODULES) == set(moved.RETIRED)
    for old in MOVED_MODULES:
        path = ROOT / (old.replace(".", "/") + ".py")
        assert not path.exists(), f"{path}: an old path is a line of minitx/moved.py, not a file"
    importers = {
        module: sorted(imported & set(MOVED_MODULES))
        for module, imported in import_graph().items()
        if imported & set(MOVED_MODULES)
    }
    assert not importers, f"modules of minitx that import an old path: {importers}"


def test_an_old_path_is_refused_in_a_fresh_interpreter():
    """`import minitx.checkpoint` as the first import of a process (the finder is installed by
    importing minitx itself, which Python does first): one line, not Python's bare 'No module'."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", "import minitx.checkpoint"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "ModuleNotFoundError: minitx.checkpoint moved: import from minitx.files.checkpoint "
        "(load_checkpoint: minitx.trained_model)"
    )


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
