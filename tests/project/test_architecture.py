"""docs/architecture.md's "Where to add" table, held to what it says.

For an attention kind, a known-answer task, a diagnostic and an optimiser, the table names the new
thing's own file and its one registration. The test adds one of each, as the table says, to a copy
of the minitx package: the file at the path the row names, and in the file the row names for its
registration, the import of that file and the one line the row names (a `register` line, an entry
in a registry). Only those two files may differ from minitx's own, and in the registration file
only those lines, added. Then, with the copy first on the path, each new thing is used as a user
uses it: the train command's keys name the kind and its option, the task and its setting, and the
optimiser; the kind's model runs and is causal, the task's samples follow its setting, the
optimiser steps the model and claims its saved state, and the diagnostic's figure is in
run_diagnostics' output and in a sweep's table of diagnostics. A registration that is not enough
(a second list to edit) fails here.

Every path the table names must also exist (a statistic of a sweep, which has no registry, and the
docs in the last column are held to that alone).
"""

from __future__ import annotations

import difflib
import filecmp
import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SORTS = ("an attention kind", "a known-answer task", "a statistic of a sweep", "a diagnostic", "an optimiser")


def where_to_add(text: str) -> dict[str, list[str]]:
    """The table's rows: the sort (its first cell) -> the paths its cells name in backticks (any
    backticked word with a slash, or ending in .py or .md)."""
    return {
        sort: [word for cell in named for word in cell if "/" in word or word.endswith((".py", ".md"))]
        for sort, named in row_cells(text).items()
    }


def row_cells(text: str) -> dict[str, list[list[str]]]:
    """The table's rows: the sort -> for each later cell, the words it names in backticks."""
    section = text.split("## Where to add", 1)[1]
    rows = {}
    for line in section.splitlines():
        found = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(found) < 2 or set(found[0]) <= {"-", " "} or found[0] == "to add":
            continue
        rows[found[0]] = [re.findall(r"`([^`\s]+)`", cell) for cell in found[1:]]
    return rows


def missing_paths(rows: dict[str, list[str]], root: Path = ROOT) -> list[str]:
    missing = []
    for sort, paths in rows.items():
        for path in paths:
            if "<name>" in path:
                folder = root / path.split("<name>")[0]
                suffix = path.split("<name>")[1]
                if not folder.is_dir() or not any(folder.glob(f"*{suffix}")):
                    missing.append(f"{sort}: {path}")
            elif not (root / path).exists():
                missing.append(f"{sort}: {path}")
    return missing


def test_the_table_is_read_and_a_wrong_path_is_found(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "one.py").write_text("")
    text = (
        "# Map\n\n## Where to add\n\n| to add | its file |\n| --- | --- |\n"
        "| a thing | `pkg/<name>.py`, then `pkg/one.py` and `pkg/gone.py` (`run_it`) "
        "| its entry in `THINGS`, `pkg/one.py` (`run_it` reads it) |\n"
    )
    rows = where_to_add(text)
    assert rows == {"a thing": ["pkg/<name>.py", "pkg/one.py", "pkg/gone.py", "pkg/one.py"]}
    assert missing_paths(rows, tmp_path) == ["a thing: pkg/gone.py"]
    assert read_row(row_cells(text)["a thing"]) == Row("pkg/<name>.py", "pkg/one.py", "THINGS")


def test_every_file_the_where_to_add_table_names_exists():
    rows = where_to_add((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert tuple(rows) == SORTS
    assert all(rows[sort] for sort in SORTS), rows
    missing = missing_paths(rows)
    assert not missing, "docs/architecture.md's 'Where to add' names what is not there: " + "; ".join(missing)


# ------------------------------------------------------------------ one of each sort, added as told


@dataclass(frozen=True)
class Row:
    """What a row of the table says a new thing touches."""

    own_file: str  # its file, with <name> (the first such path of the "its file" cell)
    registration_file: str  # the file of its registration (the path of the registration cell)
    registry: str  # what the registration is: `register` (a line calling it), or a registry's name


def read_row(named: list[list[str]]) -> Row:
    own, registration = named[0], named[1]
    return Row(
        own_file=next(path for path in own if "<name>" in path),
        registration_file=next(path for path in registration if path.endswith(".py")),
        registry=next(word for word in registration if "/" not in word and not word.endswith(".py")),
    )


@dataclass(frozen=True)
class Addition:
    """A new thing of one sort: its name (the row's <name>), its file, and in the registration
    file the import of that file and its registration line."""

    name: str
    source: str
    imported: str
    registration: str


ADDITIONS = {
    "an attention kind": Addition(
        "tempered",
        '''
        """Softmax attention at a temperature: the scores divided by it."""

        from dataclasses import dataclass

        import torch.nn.functional as F

        from .. import functional
        from ..kinds import KindSpec
        from .softmax import Attention, SoftmaxOptions


        @dataclass
        class TemperedOptions(SoftmaxOptions):
            temperature: float = 1.0


        class TemperedAttention(Attention):
            def __init__(self, config, layer):
                super().__init__(config, layer)
                self.temperature = config.options_at(layer).temperature

            def attend(self, q, k, v):
                return F.scaled_dot_product_attention(q / self.temperature, k, v, is_causal=True, enable_gqa=True)

            def reference(self, q, k, v):
                return functional.attention(q / self.temperature, k, v, causal=True, return_weights=True)


        TEMPERED = KindSpec("tempered", TemperedAttention, options=TemperedOptions)
        ''',
        "from . import tempered",
        "register(tempered.TEMPERED)",
    ),
    "a known-answer task": Addition(
        "echo",
        '''
        """Echo: random digits, '=', the same digits again; the loss is on the echo."""

        import random
        from dataclasses import dataclass

        from minitx.data.task import Task, TaskSpec
        from minitx.data.tokenizer import CharTokenizer
        from minitx.errors import require


        @dataclass(frozen=True)
        class EchoSample:
            ids: list
            loss_mask: list


        @dataclass(frozen=True)
        class Echo(Task):
            digits: int = 4

            def __post_init__(self):
                require(self.digits >= 1, f"data.task.echo.digits: use 1 or more, got {self.digits}")

            def sample(self, seed, index):
                rng = random.Random(seed * 1_000_003 + index)
                shown = "".join(rng.choice("0123456789") for _ in range(self.digits))
                ids = self.tokenizer().encode(f"{shown}={shown}")
                return EchoSample(ids, [False] * (self.digits + 1) + [True] * self.digits)

            def max_length(self):
                return 2 * self.digits + 1

            def tokenizer(self):
                return CharTokenizer("0123456789=")

            @property
            def pad_id(self):
                return 10


        ECHO = TaskSpec("echo", Echo, length_option="digits")
        ''',
        "from minitx.data import echo",
        "register(echo.ECHO)",
    ),
    "a diagnostic": Addition(
        "logit_peak",
        '''
        """The largest |logit| on the held-out text."""


        class LogitPeak:
            reported = {"logit_peak": "largest |logit|"}

            def __init__(self):
                self.peak = 0.0

            def add(self, batch):
                self.peak = max(self.peak, float(batch.logits.abs().max()))

            def result(self):
                return {"logit_peak": self.peak}
        ''',
        "from .logit_peak import LogitPeak",
        "    LogitPeak,",
    ),
    # An optimiser with no settings of its own: it reads the shared ones (lr).
    "an optimiser": Addition(
        "plain_sgd",
        '''
        """SGD with momentum on every parameter."""

        import torch


        def build_plain_sgd(settings, params):
            return torch.optim.SGD([p for _, p in params.named], lr=settings.lr, momentum=0.9)


        def is_plain_sgd_state(state):
            return any("nesterov" in group for group in state.get("param_groups", ()))
        ''',
        "from .plain_sgd import build_plain_sgd, is_plain_sgd_state",
        '    "plain_sgd": OptimiserSpec(build_plain_sgd, is_plain_sgd_state),',
    ),
}

# Each new thing used as a user uses it, in the copy (argv[1]): one process for all four.
USE = """
import sys
from dataclasses import fields
from pathlib import Path

import pytest

import torch

import minitx
from minitx import ModelConfig, Transformer
from minitx.ablation.analysis.table import DIAGNOSTIC_COLUMNS
from minitx.data.config import DataConfig
from minitx.evaluation.diagnostics import run_diagnostics
from minitx.files.configs import CommandLine
from minitx.training.optim.groups import Parameters
from minitx.training.optim.registry import optimizer_of_state
from minitx.training.optim.settings import Optimisation
from minitx.training.precheck import check_arguments, light_parser
from minitx.verify import causality_violation

assert Path(minitx.__file__).resolve().is_relative_to(Path(sys.argv[1]).resolve()), minitx.__file__

# The train command's keys: the kind and its option, the task and its setting, the optimiser.
line = CommandLine.read(
    "--model.attention.kind tempered --model.attention.options.tempered.temperature 2.0 "
    "--data.source echo --data.task.echo.digits 3 --model.optimizer plain_sgd "
    "--model.n_layer 1 --model.n_head 2 --model.d_model 16 --model.block_size 16".split()
)
check_arguments(line)  # every check train.py makes before Lightning
assert line.checked
config = light_parser().parse_args(line.args).as_dict()

# The kind: a model of it runs a forward, causally, at the temperature the key set.
torch.manual_seed(0)
model = Transformer(ModelConfig(**{f.name: config["model"][f.name] for f in fields(ModelConfig)}))
layer = model.blocks[0].attn
assert type(layer).__name__ == "TemperedAttention" and layer.temperature == 2.0, layer
tokens = torch.randint(0, model.config.vocab_size, (2, 16))
assert model(tokens).shape == (2, 16, model.config.vocab_size)
assert max(causality_violation(model, 8)) < 1e-6

# The task: data.source names it, its samples have the length its setting gave.
task = DataConfig(**config["data"]).synthetic_task()
assert type(task).__name__ == "Echo" and len(task.sample(0, 0).ids) == 7, task

# The optimiser: model.optimizer chooses it, it steps the model and claims its saved state.
optimizer = Optimisation.of(config["model"]).configure(Parameters.of(model), 10)["optimizer"]
assert type(optimizer) is torch.optim.SGD, optimizer
before = [p.detach().clone() for p in model.parameters()]
model(tokens).logsumexp(-1).mean().backward()
optimizer.step()
assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
assert optimizer_of_state(optimizer.state_dict()) == "plain_sgd"

# The diagnostic: its figure in run_diagnostics' output and its column in a sweep's tables.
figures = run_diagnostics(model, tokens)
model.eval()
with torch.no_grad():
    assert abs(figures["logit_peak"] - float(model(tokens).abs().max())) < 1e-4, figures
assert ("logit_peak", "largest |logit|") in [column[:2] for column in DIAGNOSTIC_COLUMNS], DIAGNOSTIC_COLUMNS
"""


def add(root: Path, row: Row, addition: Addition) -> tuple[Path, Path]:
    """Adds `addition` to the package copy under `root` as `row` says: its file, and in the
    registration file its import (after the last import at the top) and its registration line (after
    the last `register(` line, or after the line that opens the registry the row names)."""
    own = root / row.own_file.replace("<name>", addition.name)
    assert not own.exists(), f"{own} is minitx's already: give the test's new thing another name"
    own.write_text(textwrap.dedent(addition.source).lstrip(), encoding="utf-8")
    registration = root / row.registration_file
    lines = registration.read_text(encoding="utf-8").splitlines()
    imports = [i for i, text in enumerate(lines) if text.startswith(("from ", "import "))]
    if row.registry == "register":
        assert addition.registration.startswith("register("), addition
        opens = [i for i, text in enumerate(lines) if text.startswith("register(")]
    else:
        opens = [
            i for i, text in enumerate(lines) if text.startswith(row.registry) and text.endswith(("{", "("))
        ]
    assert imports and opens, f"{row.registration_file} has no imports or no {row.registry} to add to"
    lines.insert(opens[-1] + 1, addition.registration)
    lines.insert(imports[-1] + 1, addition.imported)
    registration.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return own, registration


def differing(a: Path, b: Path) -> list[str]:
    """The files (relative paths) that differ between two trees, or are in one only."""

    def files(root: Path) -> set[str]:
        return {
            str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
        }

    in_a, in_b = files(a), files(b)
    both = in_a & in_b
    return sorted((in_a ^ in_b) | {f for f in both if not filecmp.cmp(a / f, b / f, shallow=False)})


def added_as_the_table_says(tmp_path: Path) -> tuple[list[str], list[str]]:
    """A copy of minitx in tmp_path (which goes on PYTHONPATH) with one new thing of each sort
    added as the table's rows say, each checked to have added only its two lines to its
    registration file; returns the files that differ from minitx's, and the files added to."""
    rows = row_cells((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    copy = tmp_path / "minitx"
    shutil.copytree(ROOT / "minitx", copy, ignore=shutil.ignore_patterns("__pycache__"))
    expected = []
    for sort, addition in ADDITIONS.items():
        row = read_row(rows[sort])
        original = (ROOT / row.registration_file).read_text(encoding="utf-8").splitlines()
        own, registration = add(tmp_path, row, addition)
        expected += [str(own.relative_to(copy)), str(registration.relative_to(copy))]
        after = registration.read_text(encoding="utf-8").splitlines()
        changes = sorted(line for line in difflib.ndiff(original, after) if line.startswith(("+ ", "- ")))
        assert changes == sorted([f"+ {addition.imported}", f"+ {addition.registration}"]), (
            f"{sort}: {row.registration_file} changed by more than its registration: {changes}"
        )
    return differing(ROOT / "minitx", copy), sorted(expected)


def test_each_sort_is_its_file_and_one_registration_where_the_table_says(tmp_path):
    changed, added_to = added_as_the_table_says(tmp_path)
    assert changed == added_to and len(set(changed)) == 2 * len(ADDITIONS), changed


@pytest.mark.slow  # a process that imports torch, jsonargparse and torch's compiler (any optimiser)
def test_what_each_registration_adds_is_used(tmp_path):
    changed, added_to = added_as_the_table_says(tmp_path)
    assert changed == added_to
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "PYTHONDONTWRITEBYTECODE": "1",
        "MINITX_HIDE_SLURM": "1",
    }
    used = subprocess.run(
        [sys.executable, "-c", USE, str(tmp_path)], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert used.returncode == 0, used.stderr[-3000:]
