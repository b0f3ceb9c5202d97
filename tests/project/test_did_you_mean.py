"""Every command answers a misspelt or shortened flag, and a config file named without its
`.yaml`, with one line naming what was meant (minitx/arguments.py: `closest`, `missing_file_advice`;
train.py's keys through training/messages.py), exit status 2 and no traceback. A flag is taken only
in full: an abbreviation is refused, its full name suggested, in every command."""

from __future__ import annotations

from pathlib import Path

import pytest

from minitx import cli
from minitx.arguments import ArgumentParser, closest, missing_file_advice
from minitx.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
GQA = str(ROOT / "configs" / "gqa")  # configs/gqa.yaml without its suffix
ABLATION = str(ROOT / "configs" / "ablation")

CASES = [
    # (command, arguments, what the line ends with)
    (
        "generate",
        ["--temprature", "0.5"],
        "unrecognized arguments: --temprature 0.5; did you mean '--temperature'?",
    ),
    ("generate", ["--ckpt", "a.ckpt", "--max-new-token", "20"], "did you mean '--max-new-tokens'?"),
    ("generate", ["--ckpt", "a.ckpt", "--max_new_token=20"], "did you mean '--max-new-tokens'?"),
    ("generate", ["--ckpt", "a.ckpt", "--topk", "3"], "did you mean '--top-k'?"),
    (
        "evaluate",
        ["--lenghts", "64", "128"],
        "unrecognized arguments: --lenghts 64 128; did you mean '--lengths'?",
    ),
    ("evaluate", ["--ckpt", "a.ckpt", "--diag"], "did you mean '--diagnostics'?"),
    ("ablate", ["--paralel", "2"], "unrecognized arguments: --paralel 2; did you mean '--parallel'?"),
    ("ablate", ["--config", "s.yaml", "--dry"], "did you mean '--dry-run'?"),
    (
        "ablate",
        ["--config", ABLATION],
        f"--config: file {ABLATION} not found; did you mean '{ABLATION}.yaml'?",
    ),
    (
        "ablate",
        ["--config", "s.yaml", "--trainer.max_steps", "50"],
        "training settings go after `--`: python ablate.py --config FILE -- --trainer.max_steps 50",
    ),
    (
        "export",
        ["--ckpt", "a.ckpt", "--outt", "d"],
        "unrecognized arguments: --outt d; did you mean '--out'?",
    ),
    ("export", ["--ckpt", "a.ckpt", "--out", "d", "--forc"], "did you mean '--force'?"),
    ("prepare", ["--verfy"], "unrecognized arguments: --verfy; did you mean '--verify'?"),
    ("prepare", ["--data.batch_sze", "4"], "did you mean 'data.batch_size'?"),
    ("prepare", ["--config", GQA], f"--config: {GQA} does not exist; did you mean '{GQA}.yaml'?"),
    (
        "train",
        ["--trainer.max_step", "50"],
        "unrecognized arguments: --trainer.max_step 50; did you mean 'trainer.max_steps'?",
    ),
    ("train", ["--model.d-model", "64"], "did you mean 'model.d_model'?"),
    ("train", ["--config", GQA], f"--config: {GQA} does not exist; did you mean '{GQA}.yaml'?"),
    ("train", ["-c", GQA + ".yml"], f"--config: {GQA}.yml does not exist; did you mean '{GQA}.yaml'?"),
]


@pytest.mark.parametrize("command, args, says", CASES, ids=[f"{c}:{' '.join(a)[:30]}" for c, a, _ in CASES])
def test_a_misspelt_flag_or_file_gets_one_line_naming_the_right_one(command, args, says, capsys):
    assert cli.run_command(command, args) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith(f"{command}: error: ") and err.endswith(says), err
    assert captured.out == ""


def test_closest_prefers_the_other_spelling_then_the_only_longer_name_then_the_leaf():
    keys = ["model.max_steps", "trainer.max_steps", "trainer.max_epochs", "model.n_layer"]
    assert closest("--max-new-tokens", ["--max-new-tokens", "--max-tokens"]) == "--max-new-tokens"
    assert closest("--max_new_tokens", ["--max-new-tokens", "--max-tokens"]) == "--max-new-tokens"
    assert closest("--max-new", ["--max-new-tokens", "--max-tokens"]) == "--max-new-tokens"
    assert closest("trainer.max_s", keys) == "trainer.max_steps"  # the only key it begins
    assert closest("n_layer", keys) == "model.n_layer"  # the only key it ends
    assert closest("model.n_layers", keys) == "model.n_layer"  # near by difflib
    assert closest("--xyzzy", ["--max-new-tokens", "--top-k"]) is None


def test_a_file_without_its_suffix_or_with_a_near_name_is_named(tmp_path):
    (tmp_path / "gqa.yaml").write_text("model: {}\n")
    assert missing_file_advice(tmp_path / "gqa") == f"; did you mean {str(tmp_path / 'gqa.yaml')!r}?"
    assert missing_file_advice(tmp_path / "gqa.yml") == f"; did you mean {str(tmp_path / 'gqa.yaml')!r}?"
    assert missing_file_advice(tmp_path / "gq.yaml") == f"; did you mean {str(tmp_path / 'gqa.yaml')!r}?"
    assert missing_file_advice(tmp_path / "mla") == ""
    assert missing_file_advice(tmp_path / "no" / "such" / "dir") == ""


def test_a_value_that_starts_with_dashes_is_not_taken_for_a_flag():
    parser = ArgumentParser(prog="x")
    parser.add_argument("--prompt")
    parser.add_argument("--seed", type=int)
    assert parser.parse_args(["--prompt", "-- a dash line", "--seed", "-3"]).seed == -3
    assert parser.parse_args(["--prompt=--promt"]).prompt == "--promt"
    with pytest.raises(UserError, match=r"^unrecognized arguments: --sed -3; did you mean '--seed'\?$"):
        parser.parse_args(["--sed", "-3"])


@pytest.mark.parametrize("command", ["generate", "evaluate", "ablate", "export"])
def test_every_usage_line_names_the_script(command, capsys):
    """`usage: ablate.py ...` as `usage: generate.py ...`: the name a user types."""
    with pytest.raises(SystemExit) as exit:  # argparse's --help
        cli.run_command(command, ["--help"])
    assert exit.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {command}.py ")


def test_counts_agree_with_their_nouns():
    from minitx.wording import counted

    assert [counted(n, "run") for n in (0, 1, 2)] == ["0 runs", "1 run", "2 runs"]
    assert counted(1, "GPU") == "1 GPU" and counted(3, "index", "indices") == "3 indices"
