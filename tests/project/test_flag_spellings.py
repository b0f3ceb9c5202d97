"""The commands with their own flags (generate, evaluate, ablate; export's are single words:
minitx/arguments.py) take
each flag in either spelling, `--max-new-tokens` or `--max_new_tokens`, as train.py's keys are
written with underscores; --help shows the one declared."""

from __future__ import annotations

import contextlib
import io

import pytest

from minitx.ablation.command import parse_args as ablate_args
from minitx.arguments import ArgumentParser
from minitx.errors import UserError
from minitx.evaluation.command import parse_args as evaluate_args
from minitx.generation.command import parse_args as generate_args


def underscored(words: list[str]) -> list[str]:
    return ["--" + w[2:].replace("-", "_") if w.startswith("--") else w for w in words]


CASES = {
    "generate": (
        generate_args,
        [
            "--ckpt",
            "a.ckpt",
            "--max-new-tokens",
            "7",
            "--top-k",
            "3",
            "--prompt-file",
            "p.txt",
            "--trust-kind-modules",
        ],
    ),
    "evaluate": (
        evaluate_args,
        [
            "--ckpt",
            "a.ckpt",
            "--max-tokens=900",
            "--sweep-tokens",
            "50",
            "--no-progress",
            "--attention-prompt",
            "hi",
        ],
    ),
    "ablate": (ablate_args, ["--config", "s.yaml", "--dry-run", "--wandb-project", "p"]),
}


@pytest.mark.parametrize("command", list(CASES))
def test_each_flag_in_either_spelling_parses_the_same(command):
    parse, dashed = CASES[command]
    assert underscored(dashed) != dashed
    assert vars(parse(underscored(dashed))) == vars(parse(dashed))


def test_words_that_are_not_own_flags_are_left_alone():
    # After `--` every word is the training command's (underscores, its own spelling); an unknown
    # flag stays unknown in both spellings, and a value is never rewritten.
    args = ablate_args(["--config", "s.yaml", "--", "--trainer.max_steps", "5", "--dry_run"])
    assert args.train_args == ["--trainer.max_steps", "5", "--dry_run"] and not args.dry_run
    for flag in ("--max_new_token", "--max-new_token_s"):
        with pytest.raises(UserError, match=f"unrecognized arguments: {flag}"):
            generate_args(["--ckpt", "a.ckpt", flag, "3"])
    parser = ArgumentParser(prog="x")
    parser.add_argument("--name")
    parser.add_argument("--max-new-tokens")
    assert parser.parse_args(["--name=--max_new_tokens"]).name == "--max_new_tokens"


def test_help_shows_one_spelling():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        generate_args(["--help"])
    assert "--max-new-tokens" in out.getvalue() and "max_new_tokens" not in out.getvalue()
