"""The designed sweep (lr_sweep, budget, ladder, seeds_at): its plan, fits, tests and report.

Known answers: a fit recovers a curve's E, A and alpha; two arms drawn from one curve (A/A) give a
multiplier interval around 1 and no significant difference; an arm planted at half its compute
comes out near 0.5 with an interval that excludes 1. The report is built from planted run
summaries (`--report-only`), so no test here trains; tests/ablation/test_ladder_runs.py does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from minitx import ablation
from minitx.ablation.analysis import fit, significance
from minitx.ablation.plan.ladder import make_plan
from minitx.ablation.plan.sweep import load_sweep
from minitx.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def curve(compute, E=1.5, A=2.0, alpha=0.3, C0=1e12):
    return E + A * (np.asarray(compute, dtype=float) / C0) ** (-alpha)


# -- fits --------------------------------------------------------------------------------------
def test_fit_recovers_a_known_curve_from_noisy_points():
    rng = np.random.default_rng(int(np.random.SeedSequence().entropy % 2**32))
    compute = np.geomspace(1e11, 1e14, 16)
    loss = curve(compute) * np.exp(rng.normal(0, 0.002, compute.size))
    found = fit.fit_curve(compute, loss)
    # the same curve written at the fit's C0
    A_at_C0 = 2.0 * (found.C0 / 1e12) ** -0.3
    assert found.E == pytest.approx(1.5, abs=0.1)
    assert found.alpha == pytest.approx(0.3, rel=0.15)
    assert found.A == pytest.approx(A_at_C0, rel=0.15)
    assert found.compute_for(float(curve(1e13))) == pytest.approx(1e13, rel=0.15)


def test_fit_refuses_too_few_points():
    with pytest.raises(UserError, match="5 or more points, got 4"):
        fit.fit_curve([1e12, 2e12, 4e12, 8e12], [3.0, 2.8, 2.7, 2.6])


# A 90% interval misses the truth in about one draw of ten by design, and a test at p < 0.01 in
# one of a hundred: the statistical tests below draw their noise from fixed seeds, so that they
# fail when the code is wrong and not at those rates.
FIXED = 7


def test_a_a_comparison_has_an_interval_around_one():
    rng = np.random.default_rng(FIXED)
    compute = np.repeat(np.geomspace(1e11, 1e14, 8), 2)
    base = curve(compute) * np.exp(rng.normal(0, 0.003, compute.size))
    twin = curve(compute) * np.exp(rng.normal(0, 0.003, compute.size))
    result = fit.compare((compute, base), (compute, twin), resamples=60)
    assert result.low < 1 < result.high
    assert not result.excludes_one
    assert 0.7 < result.multiplier < 1.4


def test_a_planted_handicap_comes_out_near_one_half():
    """An arm whose every point got half the compute it is credited with: its loss at C is the
    baseline's at C / 2, so the baseline needs half the compute for it."""
    rng = np.random.default_rng(int(np.random.SeedSequence().entropy % 2**32))
    compute = np.repeat(np.geomspace(1e11, 1e14, 8), 2)
    base = curve(compute) * np.exp(rng.normal(0, 0.002, compute.size))
    handicapped = curve(compute / 2) * np.exp(rng.normal(0, 0.002, compute.size))
    result = fit.compare((compute, base), (compute, handicapped), resamples=60)
    assert result.multiplier == pytest.approx(0.5, rel=0.15)
    assert result.excludes_one and result.high < 1


def test_interval_survives_unreachable_losses():
    assert fit.interval([0.5, 1.0, math.inf, math.inf], level=0.5)[1] == math.inf
    assert fit.Fit(2.0, 1.0, 0.3, 1.0).compute_for(1.9) == math.inf


# -- significance ------------------------------------------------------------------------------
def test_welch_matches_a_hand_computed_case():
    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0]
    result = significance.welch(a, b)
    # Welch: se^2 = 1.6667/4 + 4/3, df = se^4 / ((v_a/n_a)^2/3 + (v_b/n_b)^2/2)
    se2 = (5 / 3) / 4 + 4 / 3
    df = se2**2 / (((5 / 3) / 4) ** 2 / 3 + (4 / 3) ** 2 / 2)
    t = (2.5 - 4.0) / math.sqrt(se2)
    from scipy import stats

    assert result.difference == pytest.approx(-1.5)
    assert result.p == pytest.approx(2 * stats.t.sf(abs(t), df))
    half = stats.t.ppf(0.975, df) * math.sqrt(se2)
    assert (result.low, result.high) == pytest.approx((-1.5 - half, -1.5 + half))


def test_holm_steps_down_and_stays_monotone():
    assert significance.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert significance.holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert significance.holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # 2 x 0.8 capped at 1


def test_same_distribution_is_not_significant_and_a_shift_is():
    rng = np.random.default_rng(FIXED)
    base = list(2.0 + rng.normal(0, 0.002, 5))
    samples = {
        "mha": base,
        "twin": list(2.0 + rng.normal(0, 0.002, 5)),
        "worse": list(2.05 + rng.normal(0, 0.002, 5)),
    }
    tests = significance.compare_all(samples, "mha")
    assert not tests["twin"].significant
    assert tests["worse"].significant and tests["worse"].low > 0.03
    assert tests["worse"].p_holm >= tests["worse"].p


# -- the sweep file ----------------------------------------------------------------------------
BASE = f"""base: {ROOT / "configs" / "default.yaml"}
overrides:
  model.optimizer: adamw
  model.n_layer: 1
  model.n_head: 2
  model.block_size: 32
  model.warmup_steps: 2
  data.batch_size: 4
  data.val_batches: 2
  trainer.val_check_interval: 1000
  run.checkpoint_every_n_steps: 0
seed: 1
seeds: 3
eval: false
"""
LADDER = """lr_sweep: {multipliers: [0.5, 1, 2]}
ladder:
  sizes:
    - {name: d16, overrides: {model.d_model: 16}}
    - {name: d24, overrides: {model.d_model: 24}}
    - {name: d32, overrides: {model.d_model: 32}}
  budgets: {tokens_per_param: [1, 2]}
seeds_at: {size: d24, budget: 2}
"""
ARMS = """variants:
  - {name: mha, overrides: {model.attention.kind: mha}}
  - {name: twin, overrides: {model.attention.kind: mha}}
  - {name: handicap, overrides: {model.attention.kind: mha}}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "design, message",
    [
        ("lr_sweep: {multipliers: [1]}\n", "lr_sweep.multipliers: give 2 or more"),
        ("lr_sweep: {multipliers: [0.5, -1]}\n", "lr_sweep.multipliers: must be a list of positive numbers"),
        ("lr_sweep: {multiplier: [1, 2]}\n", "lr_sweep: unknown key(s) multiplier"),
        ("budget: {flops: 0}\n", "budget.flops must be a positive number"),
        (LADDER.replace("d24, overrides: {model.d_model: 24}", "d24, overrides: {data.batch_size: 2}"),
         "is not a model setting"),
        (LADDER.replace("tokens_per_param", "tokens"), "ladder.budgets: unknown key(s) tokens"),
        (LADDER.replace("size: d24", "size: d99"), "seeds_at.size 'd99' is not a ladder size"),
        (LADDER.replace("budget: 2}", "budget: 3}"), "seeds_at.budget 3 is not one of ladder.budgets"),
        ("seeds_at: {size: d16, budget: 1}\n", "seeds_at names a rung of the ladder"),
        ("budget: {flops: 1.0e9}\n" + LADDER, "budget and ladder both set the compute"),
        ("budget: {flops: lots}\n", "budget.flops must be a positive number"),
    ],
)  # fmt: skip
def test_a_bad_design_is_refused_in_one_line_naming_the_key(tmp_path, design, message):
    with pytest.raises(UserError, match=None) as caught:
        load_sweep(write(tmp_path, BASE + design + ARMS))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_too_small_a_budget_is_refused_before_any_run(tmp_path):
    small = LADDER.replace("[1, 2]", "[0.01, 2]")
    with pytest.raises(UserError) as caught:
        ablation.main(
            ["--config", str(write(tmp_path, BASE + small + ARMS)), "--output", str(tmp_path / "out")]
        )
    assert "ladder.budgets: 0.01 gives mha at size d16" in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_a_variant_may_not_set_what_the_design_sets(tmp_path):
    arms = ARMS.replace("kind: mha}}\n  - {name: twin", "kind: mha, model.lr: 0.01}}\n  - {name: twin")
    with pytest.raises(
        UserError, match=r"variants\[0\] \(mha\): sets model.lr: every run trains at"
    ) as caught:
        load_sweep(write(tmp_path, BASE + LADDER + arms))
    assert "shared 'overrides'" in str(caught.value) and "\n" not in str(caught.value)


# -- the plan ----------------------------------------------------------------------------------
def test_equal_compute_gives_each_arm_steps_from_its_own_flops(tmp_path):
    arms = """variants:
  - {name: mha, overrides: {model.attention.kind: mha}}
  - {name: mta, overrides: {model.attention.kind: mta}}
"""
    sweep = load_sweep(write(tmp_path, BASE + "budget: {flops: 2.0e11}\n" + arms))
    plan = make_plan(sweep, tmp_path / "out")
    _, second, _ = plan.all_points()
    first_seed = {p.arm: p for p in second if p.seed == 1}
    for point in first_seed.values():
        per_step = point.flops_per_token * plan.tokens_per_step
        assert abs(point.flops - 2.0e11) <= per_step / 2  # equal to within one step's rounding
        assert f"--trainer.max_steps {point.steps}" in " ".join(point.run.command)
    assert first_seed["mta"].flops_per_token > first_seed["mha"].flops_per_token  # its convolutions
    assert first_seed["mta"].steps < first_seed["mha"].steps


def test_branches_start_where_their_decay_starts(tmp_path):
    sweep = load_sweep(write(tmp_path, BASE + LADDER + ARMS))
    plan = make_plan(sweep, tmp_path / "out")
    first, second, third = plan.all_points()
    assert len(first) == 3 * 3 and not second and not third  # the rest needs phase 1's choices first
    plant_all(plan, lambda p: 3.0 + 0.1 * math.log2(p.multiplier) ** 2)  # best at x1, inside the sweep
    first, second, third = plan.all_points()
    assert {p.role for p in third} == {"branch"} and len(third) == 3 * 3  # 3 arms x 3 sizes x 1 budget
    for branch in third:
        main = branch.branch_of
        command = " ".join(main.run.command)
        start = branch.steps - round(plan.decay_fraction * branch.steps)
        assert f"step-{start:07d}.ckpt" in " ".join(branch.run.command)
        assert f"--run.keep_steps [{start}]" in command
        assert main.steps > branch.steps and branch.budget < main.budget
    # the ladder trains every size afresh with the next seed: no run that chose a rate is a ladder point
    chosen_by = {p.run.directory for p in first}
    assert {p.size for p in second if p.role == "ladder" and p.seed == 2} == {"d16", "d24", "d32"}
    assert not chosen_by & {p.run.directory for p in second} and {p.seed for p in first} == {1}


def plant(plan, points, loss_of, status_failed=(), error="planted failure"):
    """Write the summary each run would have written, with the loss `loss_of(point)` (and the
    record of the plan it belongs to)."""
    plan.output.mkdir(parents=True, exist_ok=True)
    (plan.output / "plan.json").write_text(json.dumps({"version": 2}))
    for p in points:
        p.run.directory.mkdir(parents=True, exist_ok=True)
        failed = p in status_failed
        (p.run.directory / "run.json").write_text(
            json.dumps({"status": "failed" if failed else "ok", "error": error})
        )
        if failed:
            continue
        summary = {"steps": p.steps, "flops_per_token": p.flops_per_token, "final_val_loss": loss_of(p)}
        (p.run.directory / "summary.json").write_text(json.dumps(summary))


def plant_all(plan, loss_of, failed=lambda p: False):
    """Plant every run the plan asks for, phase by phase, as the sweep would run them: the
    learning rates grow past edges and into their confirmation as their runs finish."""
    while True:
        todo = [p for p in sum(plan.all_points(), []) if not (p.run.directory / "run.json").is_file()]
        if not todo:
            return
        plant(plan, todo, loss_of, status_failed=[p for p in todo if failed(p)])


def test_report_of_a_planted_ladder(tmp_path, monkeypatch):
    """Three arms, all MHA underneath: mha, its twin (same curve, other noise) and an arm whose
    losses are those of half its compute. Learning rates planted to be best at x1, x2 and at the
    sweep's edge x2... the report must find each."""
    monkeypatch.setattr(fit, "BOOTSTRAP", 40)  # the intervals' width is not what is tested here
    path = write(tmp_path, BASE + LADDER + ARMS)
    sweep = load_sweep(path)
    output = tmp_path / "out"
    plan = make_plan(sweep, output)
    rng = np.random.default_rng(FIXED)
    best = {"mha": 1.0, "twin": 2.0, "handicap": 2.0}
    scale = {"mha": 1.0, "twin": 1.0, "handicap": 0.5}

    def loss(p):
        lr_penalty = 0.05 * math.log2(p.multiplier / best[p.arm]) ** 2
        return float(curve(p.flops * scale[p.arm], C0=1e9) * math.exp(rng.normal(0, 0.002))) + lr_penalty

    plant_all(plan, loss, failed=lambda p: p.role == "branch" and p.arm == "handicap" and p.size == "d16")
    failed = next(p for p in plan.all_points()[2] if p.arm == "handicap" and p.size == "d16")
    ablation.main(["--config", str(path), "--output", str(output), "--report-only"])
    text = (output / "results.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    lr_rows = [
        line
        for line in text.split("## Learning rate")[1].split("##")[0].splitlines()
        if line.startswith("| ")
    ]
    assert "| x1 (fit over 3 runs" in next(r for r in lr_rows if r.startswith("| mha "))
    twin_lr = next(r for r in lr_rows if r.startswith("| twin ")).split("|")
    assert twin_lr[5].strip() != "" and "x2 (fit over 4 runs" in twin_lr[6]  # x4 run past the edge
    assert "| twin | x1 " in text and "| x2, x2, x2 |" in text.split("| twin | x1 ")[1].splitlines()[0]
    ladder = text.split("## The ladder")[1].split("## Seeds")[0]
    handicap = next(line for line in ladder.splitlines() if line.startswith("| handicap "))
    value = float(handicap.split("|")[6].split("[")[0])
    assert value == pytest.approx(0.5, rel=0.2) and "†" in handicap
    twin = next(line for line in ladder.splitlines() if line.startswith("| twin "))
    low, high = (float(v) for v in twin.split("|")[6].split("[")[1].split("]")[0].split(","))
    assert low < 1 < high
    seeds = text.split("## Seeds")[1].split("##")[0]
    assert "**" in next(line for line in seeds.splitlines() if line.startswith("| handicap "))
    assert "**" not in next(line for line in seeds.splitlines() if line.startswith("| twin "))
    assert failed.run.directory.name in text.split("## Failed runs")[1]
    assert "planted failure" in text
    assert rows  # the tables are there
    csv_rows = (output / "results.csv").read_text().splitlines()
    assert len(csv_rows) == 1 + len({p.run.directory for p in sum(plan.all_points(), [])})
    for name in ablation.DESIGN_PLOTS:
        assert (output / name).stat().st_size > 1000
