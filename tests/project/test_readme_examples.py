"""The README's commands, run as written in the order shown, in a directory that starts like a
fresh clone (no runs/), each cut to a few steps: no example may collide with the one before it
or name a file that nothing made."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # a dozen commands, each a Python start and a short run

# Appended to each kind of command: later flags win, so what the README says stays in force.
TRAIN = [
    "--trainer.max_steps", "4", "--trainer.val_check_interval", "2", "--data.val_batches", "1",
    "--data.batch_size", "4", "--run.sample_tokens", "0", "--trainer.enable_model_summary", "false",
]  # fmt: skip
SMALL = {
    "train.py": TRAIN,
    "scripts/make_speeches.py": ["--plays", "2"],
    "generate.py": ["--max-new-tokens", "5"],
    "evaluate.py": ["--max-tokens", "2000", "--sweep-tokens", "500"],
    "export.py": [],
}


def readme_commands() -> list[list[str]]:
    """The python commands of the README's quickstart and its one-example-per-command block."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    commands = []
    for block in blocks[:2]:  # the quickstart, then one example per command
        for line in block.splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if words[:1] == ["python"] and words[1:2] != ["-m"]:
                    commands.append(words[1:])
    return commands


def small(words: list[str], tmp: Path) -> list[str]:
    script = words[0]
    if script == "ablate.py":
        name = Path(words[words.index("--config") + 1]).stem
        if "ladder" in name:  # a designed sweep of 160 runs: its plan is checked, not trained
            return [*words, "--dry-run", "--output", str(tmp / name)]
        # a sweep refuses a warmup as long as its runs (runner.check_variants): cut it with them
        cut = [*TRAIN[:6], "--model.warmup_steps", "1"]
        return [*words, "--seeds", "1", "--only", "mha,mqa", "--output", str(tmp / name), "--", *cut]
    if script == "evaluate.py" and "--attention-maps" in words:
        return words
    return [*words, *SMALL.get(script, [])]


def test_readme_examples_run_in_order_on_a_fresh_clone(tmp_path):
    work = tmp_path / "clone"
    work.mkdir()
    for name in ("configs", "examples", "scripts", *[p.name for p in ROOT.glob("*.py")]):
        (work / name).symlink_to(ROOT / name)
    commands = readme_commands()
    assert [c[0] for c in commands][:2] == ["train.py", "train.py"] and len(commands) >= 12
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(ROOT)}
    for words in commands:
        offline = words[0] == "prepare.py"  # a 1 GB download: here it must refuse in one line
        result = subprocess.run(
            [sys.executable, *small(words, tmp_path)],
            cwd=work,
            env={**env, "HF_HUB_OFFLINE": "1"} if offline else env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        shown = " ".join(words)
        if offline:
            assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
            continue
        assert result.returncode == 0, f"{shown}\n{result.stdout[-1500:]}\n{result.stderr[-1500:]}"
    assert (work / "runs" / "default" / "checkpoints" / "best.ckpt").is_file()
    assert (work / "runs" / "local" / "maps.png").is_file()
    assert (work / "hf" / "default" / "config.json").is_file()
