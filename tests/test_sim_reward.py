"""sim/reward.py: the modelled reward rises monotonically with progress, staleness never speeds
convergence, and the default target is reached by an on-policy run at 60% of its steps."""

import pytest

from sim.reward import CURVES, RewardCurve, RewardTracker, curve_for, default_target


@pytest.mark.parametrize("bench", sorted(CURVES))
def test_reward_rises_monotonically_from_r0_towards_r_max(bench):
    c = curve_for(bench, 20)
    values = [c.at(p / 4) for p in range(0, 200)]
    assert values[0] == c.r0 and all(a < b for a, b in zip(values, values[1:])) and values[-1] < c.r_max


def test_staleness_never_speeds_convergence():
    c = curve_for("swe", 12)
    rewards = {}
    for staleness in (0, 1, 3):
        t = RewardTracker(c, staleness_penalty=0.1)
        rewards[staleness] = [t.step(staleness) for _ in range(12)]
    assert all(a >= b >= c_ for a, b, c_ in zip(rewards[0], rewards[1], rewards[3]))
    assert rewards[0][-1] > rewards[3][-1]


def test_the_default_target_is_reached_on_policy_at_60_percent_of_the_steps():
    steps = 20
    c = curve_for("math", steps)
    target = default_target(c, steps)
    t = RewardTracker(c, staleness_penalty=0.1)
    reached = next(i for i in range(1, steps + 1) if t.step(0) >= target)
    assert reached == 12


def test_a_curve_that_cannot_rise_is_refused():
    with pytest.raises(ValueError, match="need 0 <= r0 < r_max <= 1"):
        RewardCurve(r0=0.5, r_max=0.5, tau_steps=10)
    with pytest.raises(ValueError, match="tau_steps=0 must be > 0"):
        RewardCurve(r0=0.1, r_max=0.5, tau_steps=0)
