"""Each arm's learning rate in a designed sweep (minitx/ablation/plan/rates.py): the choice from a
fit over several runs, the sweep growing past its edges, refusal at the limit, the confirmation at
the largest size, divergence and spikes; and what a designed sweep refuses because it sets it.
Outcomes are planted (no test here trains); tests/ablation/test_ladder_runs.py trains one."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from test_ladder import ARMS, BASE, LADDER, ROOT, plant, plant_all, write

from minitx import ablation
from minitx.ablation.plan import rates
from minitx.ablation.plan.ladder import make_plan
from minitx.ablation.plan.sweep import load_sweep
from minitx.ablation.runs.results import RunResults
from minitx.errors import UserError

GRID = [0.25, 0.5, 1, 2, 4, 8, 16]


def bowl(best: float, curvature: float = 0.05, floor: float = 2.0):
    return lambda m: floor + curvature * (math.log2(m) - math.log2(best)) ** 2


# -- the choice ----------------------------------------------------------------------------------
def test_the_fit_outvotes_one_lucky_run():
    """True best x2; one noisy run makes x4 the lowest. The parabola through five runs finds x2."""
    outcomes = {m: bowl(2)(m) for m in GRID}
    outcomes[2] += 0.03
    outcomes[4] -= 0.03
    assert min(outcomes, key=outcomes.get) == 4
    choice = rates.choose(outcomes, extended=0)
    assert choice.multiplier == 2 and choice.how.startswith("fit over 5 runs")


def test_three_points_choose_the_lowest_and_a_flat_sweep_falls_back_to_it():
    assert rates.choose({0.5: 2.1, 1: 2.0, 2: 2.0001}, extended=0).multiplier == 1
    flat = rates.choose({0.5: 2.0, 1: 1.99, 2: 2.0, 4: 2.0, 8: 2.0}, extended=0)  # no curvature to fit
    assert flat.multiplier == 1


def test_a_best_at_an_edge_runs_one_more_multiplier_that_way():
    top = {m: bowl(32)(m) for m in GRID}
    assert rates.choose(top, extended=0).next == 32
    bottom = {m: bowl(0.05)(m) for m in GRID}
    assert rates.choose(bottom, extended=1).next == 0.125
    # the run past the edge is not finished: nothing is decided yet
    waiting = rates.choose({**top, 32: None}, extended=1)
    assert waiting.pending and waiting.multiplier is None and waiting.next is None


def test_past_the_limit_the_arm_is_refused_in_one_line():
    top = {m: bowl(100)(m) for m in [*GRID, 32, 64]}
    refused = rates.choose(top, extended=2, extend=2)
    assert refused.multiplier is None and refused.next is None
    assert "still the largest swept (x64) after 2 multiplier(s)" in refused.refused
    assert "lr_sweep.extend" in refused.refused and "\n" not in refused.refused
    assert rates.choose(top, extended=2, extend=3).next == 128


def test_a_diverged_edge_closes_the_sweep_and_all_diverged_is_refused():
    outcomes = {0.5: 2.2, 1: 2.1, 2: 2.05, 4: math.inf}  # x4 diverged: x2 is inside
    assert rates.choose(outcomes, extended=0).multiplier == 2
    assert "every multiplier swept diverged" in rates.choose({1: math.inf, 2: math.inf}, extended=0).refused


# -- the confirmation ----------------------------------------------------------------------------
def test_confirmation_takes_the_best_of_three_that_trained_soundly():
    assert rates.neighbours(GRID, 2) == [1, 2, 4]
    outcomes = {1: (2.01, ""), 2: (2.03, ""), 4: (2.05, "")}
    assert rates.best_confirmed(outcomes, "d64").multiplier == 1
    spiked = {1: (1.99, "spiked: ..."), 2: (2.03, ""), 4: (math.inf, "diverged: ...")}
    assert rates.best_confirmed(spiked, "d64").multiplier == 2
    assert rates.best_confirmed({1: (None, ""), 2: (2.0, ""), 4: (2.1, "")}, "d64").pending
    bad = rates.best_confirmed(
        {1: (1.9, "spiked: x"), 2: (math.inf, "diverged: y"), 4: (None, "failed: z")}, "d64"
    )
    assert bad.refused == "every rate tried at d64 (x1, x2, x4) diverged, spiked or failed"


def test_sizes_between_take_the_rate_on_the_power_law_through_the_two_measured():
    assert rates.interpolated(4, 1, 1e4, 1e6, 1e4) == 4 and rates.interpolated(4, 1, 1e4, 1e6, 1e6) == 1
    assert rates.interpolated(4, 1, 1e4, 1e6, 1e5) == 2  # halfway in log N: halfway in log lr
    assert rates.interpolated(2, 2, 1e4, 1e6, 3e5) == 2


# -- instability ---------------------------------------------------------------------------------
def curve_of(n=40, noise=0.04, seed=3):
    import numpy as np

    rng = np.random.default_rng(seed)
    steps = list(range(0, 50 * n, 50))
    return steps, [float(2.0 + 2.0 * math.exp(-i / 8) + rng.normal(0, noise)) for i in range(n)]


def test_a_healthy_noisy_curve_is_not_flagged_and_a_spike_or_a_nan_is():
    steps, losses = curve_of()
    assert rates.instability(steps, losses) == ""
    spiked = losses[:25] + [v + 1.0 for v in losses[25:29]] + losses[29:]
    found = rates.instability(steps, spiked)
    assert (
        found.startswith("spiked:") and "at step 1250" in found
    )  # the first mean of 3 to hold a raised loss
    assert rates.instability(steps, losses[:10] + [math.nan]).startswith(
        "diverged: training loss nan at step 500"
    )
    assert rates.instability([], []) == ""
    # a small batch's loss is noisier: the same noise that a fixed margin would call a spike is not
    steps, noisy = curve_of(noise=0.15, seed=5)
    assert rates.instability(steps, noisy, margin=0.3) == ""
    assert rates.instability(steps, noisy, margin=0.3) == rates.instability(steps, noisy, margin=0.05)


# -- the plan ------------------------------------------------------------------------------------
def write_log(point, losses):
    """The CSV log a run writes (logs/version_0/metrics.csv), with this training loss every 10 steps."""
    folder = point.run.directory / "logs" / "version_0"
    folder.mkdir(parents=True, exist_ok=True)
    rows = ["epoch,lr,step,train_loss,val_loss"] + [f"0,0.1,{10 * i},{v}," for i, v in enumerate(losses)]
    (folder / "metrics.csv").write_text("\n".join(rows) + "\n")


def test_the_plan_extends_confirms_and_never_reuses_a_choosing_run(tmp_path):
    """mha's best is inside the sweep; twin's lies past its top edge (x4, reached in one more run);
    handicap's lies beyond the limit (refused, out of the ladder and the fits). At the largest size
    mha's neighbour x2 is best, but its run there spikes: x1 stays."""
    sweep = load_sweep(
        write(
            tmp_path,
            BASE
            + LADDER.replace("{multipliers: [0.5, 1, 2]}", "{multipliers: [0.5, 1, 2], extend: 1}")
            + ARMS,
        )
    )
    plan = make_plan(sweep, tmp_path / "out")
    best = {"mha": 1.0, "twin": 2.5, "handicap": 64.0}

    def loss(p):
        if (p.arm, p.role, p.multiplier) == ("mha", "confirm", 2):  # the lowest loss, after a spike
            write_log(p, [4.0, 3.6, 3.3, 3.1, 3.0, 2.95, 2.92, 2.9, 2.9, 2.88, 4.5, 4.6, 3.7, 3.2, 3.0])
            return 2.9
        return 3.0 + 0.05 * math.log2(p.multiplier / best[p.arm]) ** 2

    plant_all(plan, loss)
    trained = RunResults()
    found = plan.rates(trained)
    mha, twin, handicap = found["mha"], found["twin"], found["handicap"]
    assert mha.choice.multiplier == 1 and sorted(mha.confirm) == [0.5, 1, 2]
    assert trained(mha.confirm[2]).trouble.startswith("spiked:") and mha.confirmed.multiplier == 1
    assert twin.extended == [4] and twin.choice.multiplier == 2  # the vertex x2.5 rounds to x2
    assert handicap.extended == [4] and "lr_sweep.extend" in handicap.refused
    first, second, third = plan.all_points(RunResults())
    assert {p.arm for p in second} == {"mha", "twin"} and {p.arm for p in third} == {"mha", "twin"}
    assert not {p.run.directory for p in first} & {p.run.directory for p in second}
    assert {p.seed for p in second if p.role == "ladder"} == {2, 3, 4} and {p.seed for p in first} == {1}


def test_the_report_and_log_say_which_rate_was_chosen_confirmed_refused_and_unstable(tmp_path, capsys):
    path = write(tmp_path, BASE + LADDER + ARMS)
    plan = make_plan(load_sweep(path), tmp_path / "out")
    best = {"mha": 1.0, "twin": 1.0, "handicap": 64.0}
    plant_all(
        plan,
        lambda p: 3.0 - 0.01 * math.log2(p.params) + 0.05 * math.log2(p.multiplier / best[p.arm]) ** 2,
        failed=lambda p: (p.arm, p.role, p.multiplier) == ("twin", "confirm", 0.5),
    )
    (plan.output / "runs" / "twin-d32-lr0.5-seed1" / "run.json").write_text(
        json.dumps({"status": "failed", "error": "step 9: the training loss is nan (not finite); ..."})
    )
    ablation.main(["--config", str(path), "--output", str(plan.output), "--report-only"])
    log = capsys.readouterr().out
    text = (plan.output / "results.md").read_text()
    assert "| mha | x0.5 " in text and "**x1 " in text.split("| mha | x0.5 ")[1].splitlines()[0]
    twin_row = text.split("| twin | x0.5 ")[1].splitlines()[0]
    assert twin_row.startswith("diverged, **x1 ")
    assert "- twin x0.5 at d32 (seed 1): diverged: step 9" in text
    assert "- handicap: refused, left out of the fits: its best rate is still the largest swept (x8)" in text
    ladder = text.split("## The ladder")[1].split("## Seeds")[0]
    handicap_row = next(line for line in ladder.splitlines() if line.startswith("| handicap | 0 (0) |"))
    assert "| refused: its best rate" in handicap_row
    assert "ablate: refused handicap: its best rate is still the largest swept (x8)" in log
    assert "ablate: unstable twin-d32-lr0.5-seed1 (x0.5 at d32): diverged" in log


def test_report_only_refuses_an_output_of_the_earlier_plan_in_one_line(tmp_path):
    path = write(tmp_path, BASE + LADDER + ARMS)
    plan = make_plan(load_sweep(path), tmp_path / "out")
    plant(plan, plan.all_points(RunResults())[0], lambda p: 3.0)
    (plan.output / "plan.json").unlink()  # what an earlier minitx left: runs, no plan record
    with pytest.raises(UserError) as caught:
        ablation.main(["--config", str(path), "--output", str(plan.output), "--report-only"])
    assert "earlier minitx's designed sweep" in str(caught.value) and "new --output" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_dry_run_gives_the_plans_run_count(tmp_path, capsys):
    path = write(tmp_path, BASE + LADDER + ARMS)
    ablation.main(["--config", str(path), "--output", str(tmp_path / "out"), "--dry-run"])
    out = capsys.readouterr().out
    # 3 arms: 9 sweep, 9 confirmation, 9 ladder, 6 extra seeds, 9 branches; up to 2 x 3 past the edges
    assert (
        "# ablate: the plan: 42 runs (9 learning-rate sweep, 9 confirmation at d32, 9 ladder, 6 extra seeds, "
        "9 branches, and up to 6 past the sweep's edges)" in out
    )
    assert not (tmp_path / "out").exists()


# -- what a designed sweep sets (issue: advice that led to a refusal, a key silently ignored) -----
STEPS = "the steps of every run come from ladder.budgets (tokens_per_param"


@pytest.mark.parametrize(
    "variant, shared",
    [
        ("{trainer.max_steps: 100}", ""),
        ("{trainer.max_steps: 100}, allow_budget_change: true", ""),
        ("{model.attention.kind: mha}", "  trainer.max_steps: 100\n"),
    ],
)
def test_a_ladder_refuses_max_steps_anywhere_saying_what_decides_the_steps(tmp_path, variant, shared):
    text = (
        BASE.replace("overrides:\n", "overrides:\n" + shared)
        + LADDER
        + ARMS.replace("twin, overrides: {model.attention.kind: mha}", f"twin, overrides: {variant}")
    )
    with pytest.raises(UserError) as caught:
        load_sweep(write(tmp_path, text))
    message = str(caught.value)
    assert STEPS in message and "raise the budget" in message and "\n" not in message
    assert (
        "allow_budget_change" not in message and "shared 'overrides'" not in message
    )  # no route refused in turn
    assert ("overrides: trainer.max_steps" in message) == bool(shared)


def test_a_sweep_with_only_lr_sweep_takes_shared_steps_and_says_so(tmp_path, capsys):
    design = "lr_sweep: {multipliers: [0.5, 1, 2]}\n"
    arms = ARMS.replace(
        "twin, overrides: {model.attention.kind: mha}", "twin, overrides: {trainer.max_steps: 100}"
    )
    with pytest.raises(UserError) as caught:
        load_sweep(write(tmp_path, BASE + design + arms))
    assert (
        "variants[1] (twin): sets trainer.max_steps: every arm of a sweep with lr_sweep trains the same steps; "
        "set it once in the shared 'overrides'" == str(caught.value).split(": ", 1)[1]
    )
    shared = BASE.replace(
        "overrides:\n", "overrides:\n  trainer.max_steps: 100\n"
    )  # the route it gives works
    ablation.main(
        [
            "--config",
            str(write(tmp_path, shared + design + ARMS)),
            "--output",
            str(tmp_path / "o"),
            "--dry-run",
        ]
    )
    assert "--trainer.max_steps 100 " in capsys.readouterr().out


def test_the_command_refuses_what_the_design_sets_with_status_2(tmp_path):
    """After `--`, a training argument comes last and would win: refused as the file's keys are."""
    path = write(tmp_path, BASE + LADDER + ARMS)
    for args, said in (
        (["--", "--trainer.max_steps", "100"], "--trainer.max_steps after --: " + STEPS),
        (["--", "--model.lr=0.01"], "--model.lr after --: every run trains at the base config's rates times"),
    ):
        result = subprocess.run(
            [sys.executable, "ablate.py", "--config", str(path), "--output", str(tmp_path / "out"), "--dry-run", *args],
            capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        assert result.returncode == 2 and said in result.stderr and result.stderr.strip().count("\n") == 0
    assert not (tmp_path / "out").exists()
