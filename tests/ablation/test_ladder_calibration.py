"""Known answers for the ladder's method on data it does not assume (issue: a test that simulates
the very noise the bootstrap assumes cannot find what real ladders do to it).

Simulated ladders of the showcase's design, 8 arms (six equal to the baseline, one at half its
compute), each scenario breaking one assumption: unlucky trunks, noise larger at small sizes, an
A/A arm whose curve bends. The report's own code answers each ladder (simulation.run_method):
at most 12% of the A/A arms may get a dagger at the nominal 10%, and the planted 0.5 must be found
in at least 80% of the ladders. The method before (the rung's seed noise alone, no size left out)
fails the noise-by-size scenario here, which shows the test can see the flaw it guards against.
The noise is drawn from fixed seeds, so a rate near its bound cannot flicker between runs;
benchmarks/ladder_calibration.py runs more ladders and prints the whole table.
"""

from __future__ import annotations

import numpy as np
import pytest

from minitx.ablation.analysis import robust, simulation

FIXED = 11
LADDERS = 24
BY_NAME = {s.name.split(" (")[0]: s for s in simulation.scenarios()}


def show(rates: simulation.Rates) -> None:
    print(
        f"{rates.scenario}: A/A daggers {rates.daggers:.1%}, fragile {rates.fragile:.1%}, power {rates.power:.0%}, "
        f"coverage {rates.coverage:.1%}, median high/low {rates.width:.2f}, held-out {rates.held_out:.1%}"
    )


@pytest.mark.parametrize(
    "name", ["unlucky trunks", "noise 2x at the smallest size", "an A/A arm whose curve bends"]
)
def test_a_misspecified_ladder_keeps_its_false_daggers_near_the_nominal_rate(name):
    rates = simulation.run_method(BY_NAME[name], LADDERS, FIXED, draws=60)
    show(rates)
    assert rates.daggers <= 0.12
    assert rates.power >= 0.80
    assert rates.width < 2.5  # informative, not passing by huge intervals
    if name.startswith("an A/A arm"):
        assert rates.bent <= 0.2  # the bending arm itself (one per ladder: 24 draws, bound loosened)


def test_the_seed_noise_alone_gives_false_daggers_when_noise_varies_by_size():
    """The method before this one, on the same ladders: the test above would fail it."""
    rates = simulation.run_method(
        BY_NAME["noise 2x at the smallest size"], LADDERS, FIXED, 60, robust_noise=False
    )
    show(rates)
    assert rates.daggers > 0.12


def test_the_held_out_rung_predictions_cover_near_their_level():
    rates = simulation.run_method(BY_NAME["as assumed"], LADDERS, FIXED, draws=60)
    show(rates)
    assert 0.85 <= rates.held_out <= 0.97
    assert 0.85 <= rates.coverage <= 0.96


def test_a_size_that_decides_the_side_makes_the_arm_fragile():
    """An arm equal to the baseline but for one unlucky size: the interval may exclude 1, but
    leaving that size out puts the multiplier back across 1, so it is fragile, named."""
    rng = np.random.default_rng(FIXED)
    scenario = simulation.Scenario("planted", (1.0, 1.0, 1.0))
    sim = simulation.simulate(rng, scenario, 1)
    data, _ = simulation.ladder_data(sim, 3)
    loss = data.loss.copy()
    hit = (data.arm == 1) & (data.size == 0)
    loss[:, hit] *= np.exp(0.06)  # arm 1's smallest size: an unlucky trunk
    tight = robust.LadderData(data.compute, data.arm, data.size, loss, data.seed_sd * 0.5, 40.0, data.shared)
    _, answers = robust.answer(tight, draws=60, seed=FIXED)
    arm = answers[0][0]
    print(arm.comparison, arm.without)
    assert arm.comparison.multiplier < 1
    if arm.comparison.excludes_one:
        assert arm.verdict == "fragile" and arm.fragile_size == 0
    assert arm.without[0] == pytest.approx(1.0, abs=0.15)  # without it, the arm is the baseline again


def test_a_planted_size_noise_is_measured_from_the_replicates():
    """uncertainty.size_noise: per-size sd from the pairs, the rung from its seeds, a pair far
    apart flagged and left out."""
    from minitx.ablation.analysis.uncertainty import size_noise

    rng = np.random.default_rng(FIXED)
    arms = [f"a{k}" for k in range(40)]
    sds = {0: 0.02, 2: 0.01, 3: 0.005}
    rung = {a: list(np.exp(1 + sds[2] * rng.standard_normal(3))) for a in arms}
    pairs = {s: {a: tuple(np.exp(1 + sds[s] * rng.standard_normal(2))) for a in arms} for s in (0, 3)}
    pairs[3]["a0"] = (np.exp(1.0), np.exp(1.2))  # 0.2 apart: 20 rung sds
    found = size_noise(rung, 2, pairs, [1e4, 2e4, 4e4, 1e5])
    assert found.sd[0] == pytest.approx(0.02, rel=0.3)
    assert found.sd[2] == pytest.approx(0.01, rel=0.2)
    assert found.sd[3] == pytest.approx(0.005, rel=0.3)
    assert found.sd[2] < found.sd[1] < found.sd[0]  # interpolated between its neighbours
    assert [(a, s) for a, s, _ in found.unreliable] == [("a0", 3)]


@pytest.mark.slow  # 48 ladders, each fitted, bootstrapped and held out (3 s of two cores)
def test_a_budget_dependent_bias_is_covered_at_every_budget_only_with_the_offsets():
    """Issue 61: at equal compute a short budget ends higher (the showcase's d64 rung at 5
    tokens/param, all five misses above their predictions). One curve over every budget misses the
    held-out rung's short budget; an offset per tokens-per-parameter budget covers each."""
    scenario = BY_NAME["budget bias"]
    now = simulation.run_method(scenario, LADDERS, FIXED, draws=60)
    before = simulation.run_method(scenario, LADDERS, FIXED, draws=60, offsets=False)
    show(now)
    print("by budget, now", now.held_by_budget, "one curve", before.held_by_budget)
    assert all(v >= 0.85 for v in now.held_by_budget)
    assert before.held_by_budget[0] < 0.75  # the test sees the flaw it guards against
    assert now.daggers <= 0.12 and now.power >= 0.8


def test_decision_accuracy_is_scored_for_the_three_predictors():
    """decisions.py on simulated ladders whose arms differ as the showcase's: the fitted curves
    and ranking at one rung both order most pairs right, and the verdicts that take a side hold."""
    found = simulation.decide(simulation.decision_scenarios()[0], 12, FIXED, draws=40)
    print(found)
    assert 0.8 <= found.curves <= 1.0 and 0.8 <= found.one_rung <= 1.0
    assert found.verdicts_right >= 0.85 and found.decided > 0.3
