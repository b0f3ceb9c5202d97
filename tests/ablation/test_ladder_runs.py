"""A designed sweep that really trains: a tiny ladder of MHA against itself on another random path
(A/A), its learning rates (past the sweep's edge, confirmed at the largest size), its branched
decays, a stop and a rerun that resumes, and --report-only. Slow: about thirty training runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_ladder import BASE, ROOT, write

from minitx import ablation
from minitx.ablation.plan import rates
from minitx.ablation.plan.ladder import make_plan
from minitx.ablation.plan.sweep import load_sweep
from minitx.ablation.runs.results import RunResults

pytestmark = pytest.mark.slow

LADDER = """lr_sweep: {multipliers: [8, 16]}  # this short a run wants a high rate: x16 wins, x32 past the edge does not
ladder:
  sizes:
    - {name: d8, overrides: {model.d_model: 8}}
    - {name: d12, overrides: {model.d_model: 12}}
    - {name: d16, overrides: {model.d_model: 16}}
  budgets: {tokens_per_param: [1, 2]}
seeds_at: {size: d12, budget: 2}
variants:
  - {name: mha, overrides: {model.attention.kind: mha}}
  - {name: twin, overrides: {model.attention.kind: mha, model.dropout: 0.0001}}
"""


def test_a_tiny_ladder_trains_branches_resumes_and_reports(tmp_path, capsys):
    path = write(tmp_path, BASE.replace("seeds: 3", "seeds: 2") + LADDER)
    output = tmp_path / "out"
    ablation.main(["--config", str(path), "--output", str(output), "--parallel", "2"])
    log = capsys.readouterr().out
    plan = make_plan(load_sweep(path), output)
    trained = RunResults()
    first, second, third, _ = plan.all_points(trained)
    points = {p.run.directory: p for p in [*first, *second, *third]}
    assert all(trained(p).loss is not None for p in points.values()), [
        p.run.directory.name for p in points.values()
    ]
    assert len(third) == 2 * 3  # one smaller budget per arm and size, each a branch

    # The learning rates: a sweep of two always has its best at an edge, so it ran past it; the
    # choice was confirmed at d16 with its neighbours; the ladder trained every size afresh.
    assert (
        "ablate: the plan: 24 runs (4 learning-rate sweep, 6 confirmation at d16, 6 ladder, 2 extra seeds, "
        "6 branches, and up to 4 past the sweep's edges)" in log
    )
    assert "(2 past the sweep's edge)" in log and "(6 confirmation at d16)" in log
    found = plan.rates(trained)
    for rate in found.values():
        assert rate.extended and rate.choice.multiplier in rate.sweep and not rate.refused
        assert sorted(rate.confirm) == rates.neighbours(list(rate.sweep), rate.choice.multiplier)
        assert rate.by_size["d16"] == rate.confirmed.multiplier
    assert not {p.run.directory for p in first} & {p.run.directory for p in second}
    text = (output / "results.md").read_text()
    mha = found["mha"]
    confirmed = next(line for line in text.splitlines() if line.startswith("| mha | x"))
    assert f"**x{mha.confirmed.multiplier:g} " in confirmed
    assert confirmed.endswith(f"| {', '.join(f'x{mha.by_size[s]:g}' for s in ('d8', 'd12', 'd16'))} |")
    lr_row = next(
        line for line in text.split("## Learning rate")[1].splitlines() if line.startswith("| mha ")
    )
    assert f"| x{mha.choice.multiplier:g} (" in lr_row

    # A/A: the twin is MHA on another random path (a 1e-4 dropout draws other random numbers):
    # its compute multiplier's interval holds 1. Models of 800-3,000 parameters at 1-2 tokens per
    # parameter barely gain from compute (alpha near 0.01), so one side of the interval may be
    # unbounded here; finite intervals of the A/A arm are held by the simulated ladders of
    # test_ladder.py, at the showcase's noise.
    text = (output / "results.md").read_text()
    ladder = text.split("## The ladder")[1].split("## Seeds")[0]
    twin = next(line for line in ladder.splitlines() if line.startswith("| twin "))
    cell = next(c for c in twin.split("|") if "[" in c)  # the multiplier and its interval
    value, rest = cell.split("[")
    low, high = (float(v.strip().replace("unbounded", "inf")) for v in rest.split("]")[0].split(","))
    assert low <= 1 <= high and "†" not in twin and float(value.split()[0]) > 0
    seeds = text.split("## Seeds")[1].split("##")[0]
    assert "**" not in next(line for line in seeds.splitlines() if line.startswith("| twin "))
    diagnostics = json.loads((first[0].run.directory / "diagnostics.json").read_text())
    assert 0 <= diagnostics["result"]["first_token_share"] <= 1

    # A branch is the run its budget alone would have trained: the same loss as training it directly.
    branch = third[0]
    command = branch.run.command
    at = command.index("--ckpt_path")
    direct = [*command[:at], *command[at + 2 :]]
    direct[direct.index("--run.name") + 1] = "direct"
    subprocess.run(direct, check=True, capture_output=True)
    direct_summary = json.loads((branch.run.directory.parent / "direct" / "summary.json").read_text())
    assert direct_summary["steps"] == trained(branch).summary["steps"] == branch.steps
    assert direct_summary["final_val_loss"] == pytest.approx(trained(branch).loss, abs=1e-4)

    # Stopped part-way: a rerun trains only what is missing, branches included.
    (branch.run.directory / "summary.json").unlink()
    lr_run = first[-1].run.directory  # a confirmation: the ladder after it waits for it again
    (lr_run / "summary.json").unlink()
    capsys.readouterr()
    ablation.main(["--config", str(path), "--output", str(output)])
    log = capsys.readouterr().out
    started = [line for line in log.splitlines() if line.startswith("ablate: start")]
    assert sorted(line.split()[-1] for line in started) == sorted([branch.run.directory.name, lr_run.name])
    assert "skip" in log

    # --report-only rebuilds every table, fit and plot without training
    for name in ("results.md", "results.csv", *ablation.DESIGN_PLOTS):
        (output / name).unlink()
    ablation.main(["--config", str(path), "--output", str(output), "--report-only"])
    assert "ablate: start" not in capsys.readouterr().out
    assert all((output / name).is_file() for name in ("results.md", "results.csv", *ablation.DESIGN_PLOTS))


def test_the_ablate_command_refuses_a_bad_ladder_with_status_2(tmp_path):
    path = write(tmp_path, BASE + LADDER.replace("tokens_per_param", "tokens_per_parameter"))
    result = subprocess.run(
        [sys.executable, "ablate.py", "--config", str(path), "--output", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip().count("\n") == 0
        and "ladder.budgets: unknown key(s) tokens_per_parameter" in result.stderr
    )
    assert not (tmp_path / "out").exists()
