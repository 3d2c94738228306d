"""Reward-vs-steps MODEL for simulated convergence (the simulator trains nothing).

A simulated run has no policy, so its reward is a documented curve of training progress:

    reward(p) = r0 + (r_max - r0) * (1 - exp(-p / tau_steps))

where each step adds progress mean_i gamma^lag_i over the step's trained trajectories, lag_i being
trajectory i's own lag (versions between its oldest token and the policy it trains): a fresh
trajectory is worth a full step's share, one trained k versions late gamma^k of it. Time to reward
= the simulated time of the first step whose reward reaches the target; with the same curve for
every system, time-to-reward ratios are step-time ratios corrected for each trajectory's lag.

gamma is measured, not assumed (`MEASURED_LAG_GAMMA` of scheduler/design.py, with its source; libra's planner prices lag with it): real GRPO with every
batch trained a forced number of versions late (`python -m bench.convergence --lags 0,1,2,4`,
bench/staleness.py) under the trainer's default off-policy objective (decoupled PPO), fitted by
`fit_lag_efficiency` to the mean steps to target per lag. It was measured on small policies and a
toy task, so the simulator's time-to-reward is a model, labelled as one in every output
(`REWARD_NOTE`). Curve parameters per bench are shaped after the paper's training curves (swe
starts low and rises slowly, math starts higher); they are not fitted to data.

Invariants (tests/sim/test_sim_reward.py): reward rises monotonically with progress; staleness never
speeds convergence; a batch's progress is the mean of its trajectories' own worth (not the batch
maximum's); `fit_lag_efficiency` recovers the gamma that generated `predicted_steps`; the default
target is reached by an on-policy run at 60% of its steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scheduler.design import MEASURED_LAG_GAMMA, MEASURED_LAG_SOURCE  # noqa: F401  (re-exported: the one owner is there)

REWARD_NOTE = (
    "reward is a MODEL in simulation: r(p) = r0 + (rmax - r0) * (1 - exp(-p/tau)), progress p grows by the mean over "
    "a step's trajectories of gamma^lag (gamma measured: bench.convergence --lags); time-to-reward = simulated time "
    "when r(p) first reaches the target"
)


@dataclass(frozen=True, kw_only=True)
class RewardCurve:
    r0: float  # reward before training
    r_max: float  # asymptotic reward
    tau_steps: float  # steps to close 63% of the gap

    def __post_init__(self) -> None:
        if not 0.0 <= self.r0 < self.r_max <= 1.0:
            raise ValueError(f"RewardCurve r0={self.r0}, r_max={self.r_max} need 0 <= r0 < r_max <= 1")
        if self.tau_steps <= 0:
            raise ValueError(f"RewardCurve.tau_steps={self.tau_steps} must be > 0 steps")

    def at(self, progress: float) -> float:
        return self.r0 + (self.r_max - self.r0) * (1.0 - math.exp(-max(0.0, progress) / self.tau_steps))


CURVES = {
    "swe": RewardCurve(r0=0.08, r_max=0.42, tau_steps=60.0),
    "search": RewardCurve(r0=0.20, r_max=0.55, tau_steps=40.0),
    "math": RewardCurve(r0=0.35, r_max=0.70, tau_steps=50.0),
}
DEFAULT_CURVE = RewardCurve(r0=0.1, r_max=0.5, tau_steps=50.0)


def curve_for(bench: str, num_steps: int) -> RewardCurve:
    """The bench's curve with tau scaled so that short simulations still show convergence."""
    base = CURVES.get(bench, DEFAULT_CURVE)
    # A 12-step simulation stands for a ~100-step run: keep the curve's shape over the run.
    return RewardCurve(r0=base.r0, r_max=base.r_max, tau_steps=base.tau_steps * num_steps / 100.0)


def default_target(curve: RewardCurve, num_steps: int) -> float:
    """The reward an on-policy run reaches after 60% of its steps."""
    return curve.at(0.6 * num_steps)


def lag_progress(updates: int, lag: int, gamma: float) -> float:
    """Progress after `updates` steps of a pipeline that trains every batch `lag` versions late
    (the first `lag` batches 0..lag-1 versions late): sum over v < updates of gamma^min(v, lag)."""
    return sum(gamma ** min(v, lag) for v in range(updates))


def predicted_steps(steps_on_policy: float, lag: int, gamma: float) -> float:
    """Updates a forced-lag run needs to make the progress an on-policy run makes in `steps_on_policy`
    (fractional: linear within the last update)."""
    progress = 0.0
    for u in range(lag):  # the pipeline's first batches are 0..lag-1 versions late
        worth = gamma ** u
        if progress + worth >= steps_on_policy:
            return u + (steps_on_policy - progress) / worth
        progress += worth
    return lag + (steps_on_policy - progress) / gamma ** lag  # then every update is worth gamma^lag


def fit_lag_efficiency(steps_by_lag: dict[int, float]) -> float:
    """The gamma in (0, 1] whose `predicted_steps` best match the measured mean steps to target per
    lag (least squares of the relative error; lag 0 is the on-policy reference)."""
    if 0 not in steps_by_lag or steps_by_lag[0] <= 0:
        raise ValueError(f"fit_lag_efficiency needs the on-policy (lag 0) steps, > 0; got {steps_by_lag}")
    base = steps_by_lag[0]

    def err(gamma: float) -> float:
        return sum((predicted_steps(base, lag, gamma) / s - 1.0) ** 2 for lag, s in steps_by_lag.items() if lag > 0 and s > 0)

    # staleness never speeds learning in this model: gamma <= 1 (a faster stale run fits gamma 1)
    return min((g / 1000 for g in range(20, 1001)), key=err)


class RewardTracker:
    """Accumulates progress step by step and returns the modelled mean reward."""

    def __init__(self, curve: RewardCurve, lag_gamma: float = MEASURED_LAG_GAMMA):
        if not 0.0 < lag_gamma <= 1.0:
            raise ValueError(f"lag_gamma={lag_gamma} must lie in (0, 1]; it is the worth of a trajectory one version late")
        self.curve = curve
        self.lag_gamma = lag_gamma
        self.progress = 0.0

    def step(self, lags: list[int]) -> float:
        """The modelled reward after a step that trained trajectories of these lags (none: no progress)."""
        if lags:
            self.progress += sum(self.lag_gamma ** lag for lag in lags) / len(lags)
        return self.curve.at(self.progress)
