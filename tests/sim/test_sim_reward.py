"""sim/reward.py: the modelled reward rises monotonically with progress, staleness never speeds
convergence, a batch's progress is the mean of its trajectories' own worth, the lag fit recovers
the gamma that generated it, and the default target is reached by an on-policy run at 60% of its steps."""

import pytest

from runlog import LAG_KEY, trajectory_lags
from sim.reward import CURVES, RewardCurve, RewardTracker, curve_for, default_target, fit_lag_efficiency, lag_progress, predicted_steps


@pytest.mark.parametrize("bench", sorted(CURVES))
def test_reward_rises_monotonically_from_r0_towards_r_max(bench):
    c = curve_for(bench, 20)
    values = [c.at(p / 4) for p in range(0, 200)]
    assert values[0] == c.r0 and all(a < b for a, b in zip(values, values[1:])) and values[-1] < c.r_max


def test_staleness_never_speeds_convergence():
    c = curve_for("swe", 12)
    rewards = {}
    for staleness in (0, 1, 3):
        t = RewardTracker(c, lag_gamma=0.9)
        rewards[staleness] = [t.step([staleness] * 8) for _ in range(12)]
    assert all(a >= b >= c_ for a, b, c_ in zip(rewards[0], rewards[1], rewards[3]))
    assert rewards[0][-1] > rewards[3][-1]


def test_the_default_target_is_reached_on_policy_at_60_percent_of_the_steps():
    steps = 20
    c = curve_for("math", steps)
    target = default_target(c, steps)
    t = RewardTracker(c, lag_gamma=0.9)
    reached = next(i for i in range(1, steps + 1) if t.step([0, 0]) >= target)
    assert reached == 12


def test_a_curve_that_cannot_rise_is_refused():
    with pytest.raises(ValueError, match="need 0 <= r0 < r_max <= 1"):
        RewardCurve(r0=0.5, r_max=0.5, tau_steps=10)
    with pytest.raises(ValueError, match="tau_steps=0 must be > 0"):
        RewardCurve(r0=0.1, r_max=0.5, tau_steps=0)


def test_each_trajectory_is_priced_at_its_own_lag_not_the_batch_maximum():
    t = RewardTracker(curve_for("swe", 12), lag_gamma=0.5)
    t.step([0, 0, 0, 4])  # one straggler 4 versions old: (1 + 1 + 1 + 1/16) / 4
    assert t.progress == pytest.approx(3.0625 / 4)
    t.step([])  # a step that trained nothing makes no progress
    assert t.progress == pytest.approx(3.0625 / 4)
    with pytest.raises(ValueError, match=r"lag_gamma=0.0 must lie in \(0, 1\]"):
        RewardTracker(curve_for("swe", 12), lag_gamma=0.0)


def test_rows_carry_each_trajectorys_lag():
    row = {"step": 3, f"{LAG_KEY}0": 2, f"{LAG_KEY}2": 1, "train/tokens_at_lag/0": 40}
    assert trajectory_lags(row) == [0, 0, 2]


@pytest.mark.parametrize("gamma", [0.6, 0.85, 1.0])
def test_the_lag_fit_recovers_the_gamma_that_made_the_steps(gamma):
    # a forced-lag run that trains every batch `lag` versions late (the first ones 0..lag-1)
    assert lag_progress(3, 2, 0.5) == pytest.approx(1 + 0.5 + 0.25)
    steps = {lag: predicted_steps(10.0, lag, gamma) for lag in (0, 1, 2, 4)}
    assert steps[0] == 10.0 and steps[1] >= 10.0
    assert lag_progress(int(steps[4]), 4, gamma) <= 10.0 <= lag_progress(int(steps[4]) + 1, 4, gamma)
    assert fit_lag_efficiency(steps) == pytest.approx(gamma, abs=0.002)
    with pytest.raises(ValueError, match="needs the on-policy"):
        fit_lag_efficiency({1: 12.0})
