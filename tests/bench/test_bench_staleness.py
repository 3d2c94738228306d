"""bench/staleness.py: the forced-lag harness trains every batch exactly min(step, lag) versions late
(its own assertion on the trainer's row, per step) and evaluates each version once, by the batch it sampled."""

import pytest

from bench.staleness import run_forced_lag, to_target


@pytest.mark.parametrize("lag", [0, 2])
def test_forced_lag_trains_each_batch_lag_versions_late(lag):
    run = run_forced_lag(lag=lag, objective="decoupled", seed=0, steps=4, model_name="tiny", lr=2e-2)
    assert len(run["reward_of_version"]) == 4 - lag  # versions 0..3-lag sampled a batch
    assert len(run["trained_s"]) == 4 and run["trained_s"] == sorted(run["trained_s"])
    assert all(0.0 <= r <= 1.0 for r in run["reward_of_version"])
    assert to_target(run, 0.0) == (0, 0.0) and to_target(run, 1.01) == (None, None)
