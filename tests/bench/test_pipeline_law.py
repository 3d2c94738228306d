"""bench/pipeline_law.py: the pipelined split's period by Little's law, on the simulator and in the candidate model."""

import random

import pytest

from bench.pipeline_law import QUICK, Case, measure, occupancy_period_s, slowest_of_weights
from scheduler.costmodel import get_cost_model
from scheduler.layout import BucketsConfig, split_role_map
from scheduler.layout_model import LayoutModel, Workload

SINGLE = BucketsConfig().single()
MODEL = LayoutModel(get_cost_model("a800", "qwen3-14b"), SINGLE, max_batch=128)


def _workload(lengths) -> Workload:
    return Workload(trajectory_tokens=tuple(lengths), num_trajectories=256, train_tokens=sum(lengths), decode_frac=0.3,
                    tool_s_per_token=1e-3)


def _layout(num_instances: int, tp: int = 8, world: int = 48):
    return split_role_map(world_size=world, num_trainer=world - num_instances * tp,
                          rollout_tp=((SINGLE[0].name, tp),) * num_instances, buckets=SINGLE)


def _period(rm, wl, **kw) -> float:
    args = dict(lag=2, by_finish=True, group_size=8, train_s=60.0, sync_s=1.0) | kw
    return occupancy_period_s(MODEL, rm, wl, **args)


def test_the_slowest_of_n_draws_is_exact_on_a_small_sample():
    assert slowest_of_weights(2, 2) == pytest.approx([0.25, 0.75])  # max of two draws from {1, 2}: 1 only if both are
    assert slowest_of_weights(4, 1) == pytest.approx([0.25] * 4)
    assert sum(slowest_of_weights(100, 8)) == pytest.approx(1.0)


def test_the_period_follows_the_pipeline():
    rng = random.Random(0)
    wl = _workload([int(6000 * rng.lognormvariate(0, 1.0)) + 500 for _ in range(512)])
    rm = _layout(3)
    by_lag = [_period(rm, wl, lag=lag) for lag in (1, 2, 4)]
    assert all(p >= 61.0 for p in by_lag)  # never below training and sync
    assert by_lag == sorted(by_lag, reverse=True) and by_lag[0] > by_lag[-1]
    assert _period(_layout(5), wl) <= _period(rm, wl)  # more instances: smaller batches, each token sooner
    # a step batch waits for the slowest of the whole step, a finish-order one for a group's
    assert _period(rm, wl, by_finish=False) > _period(rm, wl)
    # the same mean, a heavier tail: the slowest of a group is longer
    mean = sum(wl.trajectory_tokens) / 512
    flat = _workload([int(mean)] * 512)
    assert _period(rm, flat, train_s=1.0, sync_s=0.0) < _period(rm, wl, train_s=1.0, sync_s=0.0)


def test_the_law_holds_on_the_simulator():
    """On the simulated group span, the law gives the simulated period; the planner's sample counts a finish-order
    run's running trajectories at every step they span, so its mean is above the finished ones'."""
    finish = measure(next(c for c in QUICK if c.by_finish))
    assert finish["law_s"] == pytest.approx(finish["period_s"], rel=0.1)
    assert finish["sample_mean"] > finish["finished_mean"]
    with pytest.raises(ValueError, match="no TP8 instance"):
        measure(Case("default", "search", 15, 8, 1, False))
