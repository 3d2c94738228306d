"""Libra's planner over designs (scheduler/design_planner.py): the design is re-checked on the run's own
lengths, at most twice, and a switch must pay for itself in the steps left."""

import dataclasses
import random
import re

import pytest

from scheduler.api import StepStats
from scheduler.costmodel import get_cost_model
from scheduler.design import DesignSpace, colocated_parts, rank_designs
from scheduler.design_planner import MEASURED_ENDS, DesignPlanner, same_design
from scheduler.layout import BucketsConfig
from scheduler.layout_model import Workload
from scheduler.planner import PlannerConfig
from scheduler.systems import make_planner

A800_14B = get_cost_model("a800", "qwen3-14b")
SPACE = DesignSpace(world_size=16, buckets=BucketsConfig(max_tokens=(4096, 12288)).buckets(), lag_bounds=(0, 1))


def _lengths(n, *, tail: bool, seed=0):
    rng = random.Random(seed)
    return [int(2000 * (rng.lognormvariate(0, 1.2) if tail else 1.0)) + 300 for _ in range(n)]


def _workload(lengths, train_factor=1.0):
    return Workload(trajectory_tokens=tuple(lengths), num_trajectories=len(lengths), train_tokens=sum(lengths) * train_factor,
                    decode_frac=0.8, signal_tokens=tuple(min(x, 1024) for x in lengths))


def _planner(design, steps=20, cfg=None):
    def planner_for(d, remaining):
        return make_planner(d.system, 16, A800_14B, remaining, current=d.role_map, max_staleness=max(1, d.lag))
    return DesignPlanner(A800_14B, SPACE, design, steps, cfg=cfg or PlannerConfig(min_history_trajectories=128),
                         planner_for=planner_for, lookahead=design.lookahead)


def _stats(design, lengths, step, *, step_s, train_factor=1.0, tool_s=1.0):
    wl = _workload(lengths, train_factor)
    return StepStats(step=step, rollout_s=step_s * 0.7, train_s=step_s * 0.3, trajectory_tokens=wl.trajectory_tokens,
                     decode_tokens=tuple(int(x * 0.8) for x in lengths), signal_tokens=wl.signal_tokens,
                     tool_latency_s=(tool_s,), train_tokens=int(wl.train_tokens), role_map=design.role_map)


def _worst_design(wl):
    return rank_designs(A800_14B, SPACE, wl, 20)[-1]


def test_no_switch_before_the_first_length_sample_and_at_most_two_checks():
    tail = _lengths(128, tail=True)
    worst = _worst_design(_workload(tail))
    planner = _planner(worst)
    assert planner.on_step_end(_stats(worst, tail[:64], 0, step_s=500.0), 500.0) is None and planner.checks == 0
    decision = planner.on_step_end(_stats(worst, tail[64:], 1, step_s=500.0), 1000.0)
    assert planner.checks == 1 and decision is not None  # the worst design priced: any better one pays here
    new = planner.design
    assert planner.take_notes()[0].startswith(f"moved to the design {new.label}: ")
    assert not same_design(new, worst) and decision.role_map == new.role_map
    assert (decision.lookahead, decision.max_staleness, decision.batch_by_finish) == (
        new.lookahead, new.max_staleness, new.system == "libra-partial")
    decision.role_map.validate()
    t = 1000.0
    for step in range(2, 2 + 3 * MEASURED_ENDS):  # one more check once the new design has run; then none
        t += 300.0
        planner.on_step_end(_stats(new, tail, step, step_s=300.0), t)
    assert planner.checks == 2


def test_a_switch_that_cannot_pay_in_the_steps_left_is_refused():
    tail = _lengths(128, tail=True)
    worst = _worst_design(_workload(tail))
    planner = _planner(worst, steps=2)  # no step left after the sample
    planner.on_step_end(_stats(worst, tail[:64], 0, step_s=500.0), 500.0)
    assert planner.on_step_end(_stats(worst, tail[64:], 1, step_s=500.0), 1000.0) is None
    assert planner.checks == 1 and same_design(planner.design, worst)
    assert planner.take_notes()[0] == f"kept the design {worst.label}: no step is left for another to pay back in"
    # a switch is charged the hand-off, not the longest tool call seen: a request in a tool call moves at once
    # (engine/runtime/once.py). Day-long tools make every other design slower, not the switch dearer
    switch_s = []
    for tool_s in (1.0, 86400.0):
        p = _planner(worst)
        p.on_step_end(_stats(worst, tail[:64], 0, step_s=500.0, tool_s=tool_s), 500.0)
        p.on_step_end(_stats(worst, tail[64:], 1, step_s=500.0, tool_s=tool_s), 1000.0)
        switch_s += re.findall(r"the switch's (\d+\.\d) s", p.take_notes()[0])
    assert len(switch_s) == 2 and switch_s[0] == switch_s[1], switch_s


def test_the_best_design_stays():
    flat = _lengths(128, tail=False)
    best = rank_designs(A800_14B, SPACE, _workload(flat, 4.0), 20)[0]
    planner = _planner(best)
    assert planner.forecast_step_s is None  # no step has ended: a forecast is made at the end of the step before
    for step in range(4):
        planner.on_step_end(_stats(best, flat, step, step_s=best.step_s, train_factor=4.0), best.fill_s + step * best.step_s)
    assert same_design(planner.design, best) and planner.checks == 2
    kept = [n for n in planner.take_notes() if n.startswith("kept the design")]
    assert len(kept) == 2 and all(n.startswith(f"kept the design {best.label}: the first to the reward target on the "
                                               "lengths measured (") for n in kept)
    assert planner.forecast_step_s == pytest.approx(best.step_s, rel=0.05)  # rows report it, colocated or not


def test_a_colocated_design_forecasts_its_next_step_from_its_lengths_and_the_next_batchs_head_start():
    flat, longer = _lengths(128, tail=False), [3 * x for x in _lengths(128, tail=False)]  # trajectories triple
    colocated = next(d for d in rank_designs(A800_14B, SPACE, _workload(flat, 4.0), 20) if d.role_map.colocated)
    tp = colocated.role_map.instances[0].tp
    planner, t = _planner(colocated), 0.0

    def run(lengths, *, rollout_x=1.0, ahead_s=0.0, head_s=0.0):  # one step as the model has it, rollout x rollout_x
        nonlocal t
        rollout, _, train, sync = colocated_parts(A800_14B, SPACE, _workload(lengths, 4.0), tp)
        t += train + sync + max(0.0, rollout * rollout_x - head_s)
        stats = dataclasses.replace(_stats(colocated, lengths, 0, step_s=1.0, train_factor=4.0), rollout_s=rollout,
                                    train_s=train, sync_s=sync, ahead_s=ahead_s)
        planner.on_step_end(stats, t)
        return rollout, train + sync

    for _ in range(MEASURED_ENDS):  # both checks
        rollout, train = run(flat)
    assert planner.checks == 2 and same_design(planner.design, colocated)
    assert planner.forecast_step_s == pytest.approx(rollout + train)  # nothing generated ahead
    for _ in range(8):  # a full history of longer trajectories
        rollout3, train3 = run(longer)
    assert rollout3 > 2 * rollout and planner.forecast_step_s == pytest.approx(rollout3 + train3)
    # the next batch has generated a while (a time-shared hybrid): the step is its training and the rest of it
    run(longer, ahead_s=rollout3 / 2)
    assert planner.forecast_step_s == pytest.approx(rollout3 / 2 + train3)
    run(longer, ahead_s=2 * rollout3, head_s=rollout3 / 2)  # done before the training ends
    assert planner.forecast_step_s == pytest.approx(train3)
    run(longer, head_s=2 * rollout3)  # the rollout ended before the training: it measures nothing
    assert planner.forecast_step_s == pytest.approx(rollout3 + train3)
    for _ in range(8):  # rollouts take 1.5x the model's: the forecast learns it (calibrated as a split's planner is)
        run(longer, rollout_x=1.5)
    assert planner.forecast_step_s == pytest.approx(1.5 * rollout3 + train3, rel=0.01)


def test_the_measured_scale_prices_the_measured_steps_on_their_own_lengths():
    """Under growing lengths the history's mean lengths are shorter than those of the steps whose periods were
    measured: steps exactly as the model prices their own lengths measure 1, not the growth."""
    flat = _lengths(128, tail=False)
    colocate = next(d for d in rank_designs(A800_14B, SPACE, _workload(flat, 4.0), 20) if d.system == "colocate")
    tp = colocate.role_map.instances[0].tp
    planner, t = _planner(colocate), 0.0
    for step, x in enumerate((1.0, 1.5, 2.0, 2.5)):
        lengths = [int(x * n) for n in flat]
        rollout, _, train, sync = colocated_parts(A800_14B, SPACE, _workload(lengths, 4.0), tp)
        t += rollout + train + sync
        planner.on_step_end(dataclasses.replace(_stats(colocate, lengths, step, step_s=1.0, train_factor=4.0),
                                                rollout_s=rollout, train_s=train, sync_s=sync), t)
    assert planner.checks == 2 and same_design(planner.design, colocate)
    assert planner.measured_scale(colocate) == pytest.approx(1.0, abs=0.02)


def test_the_split_planner_within_a_finish_order_design_runs_at_its_lookahead_not_its_trained_lag_bound():
    """A finish-order design at lag 2 bounds the trained lag at 4 (the step core's `max_staleness`) but admits 2 steps
    ahead; its split planner prices the pipeline at those 2 (priced at 4, it divided a batch's rollout by 5 where 3
    share it)."""
    space = DesignSpace(world_size=16, buckets=BucketsConfig(max_tokens=(4096, 12288)).buckets(), lag_bounds=(0, 1, 2, 4))
    design = next(d for d in rank_designs(A800_14B, space, _workload(_lengths(256, tail=True)), 20)
                  if d.system == "libra-partial" and d.lag == 2)
    assert (design.lookahead, design.max_staleness) == (2, 4)
    planner = make_planner("libra", 16, A800_14B, 20, PlannerConfig(max_lag=4), current=design.role_map,
                           max_staleness=4, design=design)
    assert planner.lookahead == planner.inner.lookahead == 2
