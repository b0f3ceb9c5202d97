"""What a start costs: `import minitx` loads torch and minitx's own code, and the commands answer
--help without Lightning or the compiler. Each of the modules in HEAVY costs from a few tenths of a
second to several seconds to import; they load where they are used (compiling, the Triton path,
training, export, data preparation, plots). benchmarks/startup.py measures the times themselves.

Each check runs in a fresh interpreter: this test process has imported everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from minitx.compiling import CONSTANT_RESULT, constant_result

ROOT = Path(__file__).resolve().parents[2]
HEAVY = (
    "torch._dynamo",
    "torch._inductor",
    "triton",
    "sympy",
    "lightning",
    "torchmetrics",
    "transformers",
    "datasets",
    "matplotlib",
    "scipy",
)
LIGHT_HELP = ("train", "generate", "evaluate", "ablate", "prepare", "export")
# Mistakes train answers before it imports Lightning (minitx/training/precheck.py): a flag, a
# value's type, a key in a config file, a missing config file, a value out of range.
TRAIN_MISTAKES = {
    "bad flag": ["--model.n_layerz", "3"],
    "bad value": ["--model.n_layer", "zero"],
    "bad key in a file": ["--config", "{tmp}/unknown.yaml"],
    "missing file": ["--config", "{tmp}/missing.yaml"],
    "bad trainer key": ["--trainer.max_stepz", "3"],
    # Values the settings' own checks refuse (inputs.check_settings)
    "no layers": ["--model.n_layer", "0"],
    "heads not dividing the width": ["--model.d_model", "130", "--model.n_head", "4"],
    "unknown attention kind": ["--model.attention.kind", "nosuch"],
    "bad kind option": ["--config", "configs/local.yaml", "--model.attention.options.local.window", "0"],
    "dropout over 1": ["--model.dropout", "1.5"],
    "bad optimiser value": ["--model.optimizer_options.muon.momentum", "1"],
    "negative batch size": ["--data.batch_size", "-1"],
    "bad task setting": ["--data.source", "mqar", "--data.task.mqar.pairs", "0"],
    "bad values in a file": ["--config", "{tmp}/values.yaml"],
}


def loaded_after(code: str) -> dict:
    """{label: heavy modules loaded} printed by `code` run in a fresh interpreter, which calls
    report(label) where it wants the heavy modules counted."""
    prelude = (
        "import contextlib, io, json, sys\n"
        f"HEAVY = {HEAVY!r}\n"
        "found = {}\n"
        "def report(label):\n"
        "    found[label] = sorted(m for m in HEAVY if m in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", prelude + code + "\nprint(json.dumps(found))"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_import_minitx_and_the_commands_help_load_nothing_heavy():
    code = "import minitx\nreport('import minitx')\nfrom minitx.cli import run_command\n"
    for command in LIGHT_HELP:
        code += (
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            f"    run_command({command!r}, ['--help'])\n"
            f"report('{command} --help')\n"
        )
    found = loaded_after(code)
    assert found == {label: [] for label in found}
    assert list(found) == ["import minitx", *(f"{c} --help" for c in LIGHT_HELP)]


def test_train_and_ablate_mistakes_and_train_help_load_nothing_heavy(tmp_path):
    (tmp_path / "unknown.yaml").write_text("model:\n  n_layerz: 2\n")
    (tmp_path / "values.yaml").write_text("model:\n  dropout: 1.5\ndata:\n  batch_size: 0\n")
    code = "from minitx.cli import run_command\n"
    for label, args in TRAIN_MISTAKES.items():
        args = [arg.format(tmp=tmp_path) for arg in args]
        code += (
            "with contextlib.redirect_stderr(io.StringIO()) as err:\n"
            f"    assert run_command('train', {args!r}) == 2\n"
            "assert len(err.getvalue().splitlines()) == 1, err.getvalue()\n"
            f"report({label!r})\n"
        )
    # A sweep's variant with a mistyped key: ablate checks it with train's precheck.
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        f"base: {ROOT / 'configs' / 'default.yaml'}\nvariants:\n  - name: bad\n    overrides: {{model.n_layerz: 2}}\n"
    )
    code += (
        "with contextlib.redirect_stderr(io.StringIO()) as err:\n"
        f"    assert run_command('ablate', ['--config', {str(sweep)!r}, '--output', {str(tmp_path / 'out')!r}]) == 2\n"
        "assert 'n_layerz' in err.getvalue(), err.getvalue()\n"
        "report('ablate: bad key in a variant')\n"
    )
    # prepare checks its command line with train's precheck, values included.
    code += (
        "with contextlib.redirect_stderr(io.StringIO()) as err:\n"
        "    assert run_command('prepare', ['--data.batch_size', '-1']) == 2\n"
        "assert err.getvalue() == 'prepare: error: data.batch_size: must be at least 1, got -1\\n', err.getvalue()\n"
        "report('prepare: negative batch size')\n"
    )
    code += (
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    assert run_command('train', ['--help']) == 0\n"
        "for key in ('--model.d_model', '--model.attention.kind', '--model.lr', '--data.batch_size', "
        "'--run.name', '--trainer.max_steps'):\n"
        "    assert key in out.getvalue(), key\n"
        "report('train --help')\n"
    )
    found = loaded_after(code)
    assert found == {
        label: []
        for label in [
            *TRAIN_MISTAKES,
            "ablate: bad key in a variant",
            "prepare: negative batch size",
            "train --help",
        ]
    }


def test_a_model_infers_without_the_compiler():
    """Building a model of every kind, a forward pass and decoding (MTA's C loops included) import no
    compiler: torch.compile's hints are set without importing it (minitx/compiling.py). (MTA's
    gradients go through its torch.library operators, which torch itself runs under
    torch._dynamo.disable, importing dynamo at the first call: training imports it anyway.)"""
    code = (
        "import torch\n"
        "from minitx import AttentionConfig, ModelConfig, Transformer\n"
        "for kind in ('mha', 'gqa', 'local', 'mta', 'mla', 'diff'):\n"
        "    config = ModelConfig(n_layer=1, n_head=4, d_model=32, vocab_size=11, block_size=16,\n"
        "                         attention=AttentionConfig(kind=kind, n_kv_head=2 if kind == 'gqa' else None))\n"
        "    model = Transformer(config)\n"
        "    with torch.no_grad():\n"
        "        model(torch.randint(0, 11, (1, 9)))\n"
        "    model.generate(torch.zeros(1, 1, dtype=torch.long), max_new_tokens=3)\n"
        "report('eager')\n"
    )
    assert loaded_after(code) == {"eager": []}


def test_constant_result_marks_functions_as_torch_compiler_does():
    """minitx marks functions for dynamo itself (importing dynamo to do it costs a second at every
    start): the mark must stay the one torch's own decorator sets, and nothing else."""

    def ours():
        return True

    def torchs():
        return True

    constant_result(ours)
    torch.compiler.assume_constant_result(torchs)
    assert vars(torchs) == vars(ours) == {CONSTANT_RESULT: True}
