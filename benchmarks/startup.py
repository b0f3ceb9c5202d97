"""How long a user waits before minitx answers: `import minitx`, every command's --help, and
one-line input errors, each as the difference from `python -c "import torch"` in the same run.

    python benchmarks/startup.py                       # this checkout, 7 rounds
    python benchmarks/startup.py --root /tmp/before    # another checkout (PYTHONPATH points at it)
    python benchmarks/startup.py --root /tmp/before --root .   # both, alternating, one table

Each round runs every case once, one after another in a fresh interpreter, checkouts alternating
within the round, so that the machine's load drifts over all of them alike; a case's figure is the
median over rounds of (its time - that round's `import torch`). Goals (issue 34): `import minitx`
+0.3 s at most; --help and a one-line error +1.0 s at most. Times are wall clock of the whole
process, started from this interpreter.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MISSING = "no-such-file"  # a path that exists nowhere: each command names it in one line

# (label, arguments after `python`, the goal in seconds over `import torch`); scripts relative to the root
CASES = [
    ("import torch", ["-c", "import torch"], None),
    ("import minitx", ["-c", "import minitx"], 0.3),
    *[
        (f"{name} --help", [f"{name}.py", "--help"], 1.0)
        for name in ("train", "generate", "evaluate", "ablate", "prepare", "export")
    ],
    ("generate: no such --ckpt", ["generate.py", "--ckpt", f"{MISSING}.ckpt"], 1.0),
    ("evaluate: no such --ckpt", ["evaluate.py", "--ckpt", f"{MISSING}.ckpt"], 1.0),
    ("export: no such --ckpt", ["export.py", "--ckpt", f"{MISSING}.ckpt", "--out", MISSING], 1.0),
    ("ablate: no such --config", ["ablate.py", "--config", f"{MISSING}.yaml"], 1.0),
    ("prepare: no such --config", ["prepare.py", "--config", f"{MISSING}.yaml"], 1.0),
    ("train: no such --config", ["train.py", "--config", f"{MISSING}.yaml"], 1.0),
    ("train: bad --model.n_layer", ["train.py", "--model.n_layer", "zero"], 1.0),  # its type
    ("train: unknown --model.n_layerz", ["train.py", "--model.n_layerz", "3"], 1.0),
    # Values of the right type that the settings' own checks refuse
    ("train: --model.n_layer 0", ["train.py", "--model.n_layer", "0"], 1.0),
    ("train: --model.d_model 130 (4 heads)", ["train.py", "--model.d_model", "130"], 1.0),
    ("prepare: --data.batch_size 0", ["prepare.py", "--data.batch_size", "0"], 1.0),
]


def run_once(root: Path, arguments: list[str], scratch: Path) -> float:
    """Seconds one start takes; a command must exit 0 (--help) or 2 (a one-line input error)."""
    if arguments[0] != "-c":
        arguments = [str(root / arguments[0]), *arguments[1:]]
    env = dict(os.environ, PYTHONPATH=str(root))
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, *arguments], cwd=scratch, env=env, capture_output=True, text=True, timeout=600
    )
    elapsed = time.perf_counter() - start
    if result.returncode not in (0, 2) or (result.returncode == 2 and len(result.stderr.splitlines()) != 1):
        raise SystemExit(
            f"{root}: python {' '.join(arguments)} failed ({result.returncode}):\n{result.stderr[-2000:]}"
        )
    return elapsed


def measure(roots: list[Path], cases: list, rounds: int, scratch: Path) -> dict:
    """{(root, label): [seconds, one per round]}."""
    times: dict = {}
    for index in range(rounds):
        order = roots if index % 2 == 0 else roots[::-1]
        for label, arguments, _ in cases:
            for root in order:
                times.setdefault((root, label), []).append(run_once(root, arguments, scratch))
        print(f"round {index + 1}/{rounds} done", file=sys.stderr)
    return times


def over_torch(times: dict) -> dict:
    """{(root, label): [seconds over that round's import torch]}."""
    return {
        key: [t - base for t, base in zip(values, times[(key[0], "import torch")])]
        for key, values in times.items()
    }


def table(roots: list[Path], names: list[str], cases: list, differences: dict, absolute: dict) -> str:
    head = ["case", *[f"{name}: s over import torch" for name in names], "goal"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, _, goal in cases:
        cells = []
        for root in roots:
            if label == "import torch":
                cells.append(f"{statistics.median(absolute[(root, label)]):.2f} s (itself)")
            else:
                value = statistics.median(differences[(root, label)])
                cells.append(f"{value:+.2f}" + ("" if goal is None or value <= goal else " (over)"))
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {'' if goal is None else f'+{goal}'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--root",
        action="append",
        type=Path,
        help="a checkout to measure (repeat to compare; default: this one)",
    )
    parser.add_argument("--rounds", type=int, default=7, help="runs of each case (default 7)")
    parser.add_argument("--only", default=None, help="comma-separated labels to run (import torch always)")
    args = parser.parse_args(argv)
    roots = [root.resolve() for root in args.root or [REPO]]
    cases = [c for c in CASES if args.only is None or c[0] == "import torch" or c[0] in args.only.split(",")]
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"minitx-startup-{os.getpid()}"
    scratch.mkdir(parents=True, exist_ok=True)  # where the commands run: nothing of theirs is found there
    times = measure(roots, cases, args.rounds, scratch)
    print(table(roots, [str(root) for root in roots], cases, over_torch(times), times))
    return 0


if __name__ == "__main__":
    sys.exit(main())
