"""Libra's design choice (scheduler/design.py): every peer's layout family and its own, ranked by
predicted progress per second at the lag each allows."""

import dataclasses
import random

import pytest

from scheduler.costmodel import get_cost_model
from scheduler.design import DesignSpace, cap_prior, finish_order_sample, rank_designs
from scheduler.layout import VALID_TP
from scheduler.layout_model import Scales
from scheduler.layout_search import LayoutSearch
from scheduler.layout import BucketsConfig
from scheduler.layout_model import Workload

A800_14B = get_cost_model("a800", "qwen3-14b")
BUCKETS = BucketsConfig(max_tokens=(4096, 12288)).buckets()


def _workload(lengths, *, train_factor: float = 1.0, tool_s_per_token: float = 0.0) -> Workload:
    return Workload(trajectory_tokens=tuple(lengths), num_trajectories=len(lengths),
                    train_tokens=sum(lengths) * train_factor, tool_s_per_token=tool_s_per_token, decode_frac=0.8,
                    signal_tokens=tuple(min(x, 2048) for x in lengths))


def _long_tail(n: int = 128, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    return _workload([int(2000 * rng.lognormvariate(0, 1.0)) + 200 for _ in range(n)], tool_s_per_token=2e-4)


def _space(**kw) -> DesignSpace:
    return DesignSpace(world_size=16, buckets=BUCKETS, **kw)


def test_every_candidate_validates_and_stays_within_the_lag_bounds():
    for bounds in ((0, 1, 2, 4), (0, 1), (1,), (0,)):
        ranked = rank_designs(A800_14B, _space(lag_bounds=bounds), _long_tail(), 20)
        assert ranked and all(d.lag in bounds for d in ranked)
        for d in ranked:
            d.role_map.validate()
            assert d.role_map.colocated == (d.system in ("colocate", "libra-hybrid"))
            assert d.step_s > 0
        assert [d.time_for(20) for d in ranked] == sorted(d.time_for(20) for d in ranked)


def test_without_a_lag_price_the_rate_is_the_inverse_step_time():
    for d in rank_designs(A800_14B, _space(gamma=1.0), _long_tail(), 20):
        assert d.rate == pytest.approx(1 / d.step_s)


def test_a_dear_lag_makes_the_on_policy_design_first():
    ranked = rank_designs(A800_14B, _space(gamma=0.05), _long_tail(), 20)
    assert ranked[0].lag == 0 and ranked[0].system == "colocate"


def test_cheaper_staleness_never_ranks_a_laggier_design_lower():
    wl = _long_tail()
    order = {}
    for gamma in (0.5, 0.7, 0.88, 1.0):
        ranked = rank_designs(A800_14B, _space(gamma=gamma), wl, 20)
        order[gamma] = {(d.system, d.lag, d.label): i for i, d in enumerate(ranked)}
    for lo, hi in ((0.5, 0.7), (0.7, 0.88), (0.88, 1.0)):
        for a in order[lo]:
            for b in order[lo]:
                # a above b although a lags more: raising gamma keeps it above
                if a[1] > b[1] and order[lo][a] < order[lo][b]:
                    assert order[hi][a] < order[hi][b], (a, b, lo, hi)


def test_a_finish_order_batch_waits_for_a_shorter_sample_the_more_lag_it_allows():
    wl = _long_tail()
    caps = [max(finish_order_sample(wl, lag, 8).trajectory_tokens) for lag in (1, 2, 4)]
    lens = sorted(wl.trajectory_tokens)
    # at lag 1 the newest step's groups started a step late: they overtake nothing, the batch waits for the tail
    assert caps[0] == lens[-1] and caps[0] > caps[1] >= caps[2]
    assert caps[1] == lens[int(0.5 ** (1 / 8) * len(lens))]  # lag 2: the median group of two steps' slowest sample: ~p92
    assert max(finish_order_sample(wl, 2, 1).trajectory_tokens) == lens[len(lens) // 2]  # groups of one: the median


def test_the_pipeline_fill_counts_once_and_less_the_longer_the_run():
    d = rank_designs(A800_14B, _space(), _long_tail(), 20)[0]
    assert d.time_for(1) == pytest.approx(d.fill_s + max(0.0, 1 / d.gamma ** d.lag - 1) * d.step_s)
    assert d.time_for(10, filled=True) == pytest.approx(10 / d.gamma ** d.lag * d.step_s)
    short, long_ = d.time_for(2) / 2, d.time_for(200) / 200
    assert (short > long_) == (d.fill_s > d.step_s / d.gamma ** d.lag)


def test_a_long_tail_pays_for_dropping_the_batch_barrier():
    """The tail holds a step-batched split's batch; finish-order batches (once two steps' groups can overtake it)
    or a time-shared hybrid don't wait for it. At lag 1 finish-order batches wait as step batches do. Their trained
    lag is bounded at the largest lag allowed (4), so they run below it only."""
    ranked = rank_designs(A800_14B, _space(lag_bounds=(0, 1, 2, 4)), _long_tail(seed=1), 20)
    assert {d.lag for d in ranked if d.system == "libra-partial"} == {1, 2}
    assert all(d.max_staleness == 4 for d in ranked if d.system == "libra-partial")
    # bounded at admission only (as AReaL): up to the largest lag, each at its own
    admission = rank_designs(A800_14B, _space(lag_bounds=(0, 1, 2, 4), bound_trained_lag=False), _long_tail(seed=1), 20)
    assert {(d.lag, d.max_staleness) for d in admission if d.system == "libra-partial"} == {(1, 1), (2, 2), (4, 4)}
    assert ranked[0].system in ("libra-partial", "libra-hybrid")
    by = {(d.system, d.lag): d for d in ranked}
    assert by["libra-partial", 2].step_s < by["libra", 2].step_s
    assert by["libra-partial", 1].step_s <= by["libra", 1].step_s


def test_without_a_tail_and_with_heavy_training_every_rank_should_do_both():
    """Identical short trajectories and four trainer passes: any split idles one side, colocated ranks do not."""
    wl = _workload([1500] * 128, train_factor=4.0)
    ranked = rank_designs(A800_14B, _space(lag_bounds=(0, 1)), wl, 20)
    assert ranked[0].role_map.colocated, [d.label for d in ranked[:4]]


def test_no_design_fits_gives_the_bounds_and_the_fix():
    with pytest.raises(ValueError, match="lag_bounds=\\(0,\\).*allowed_tp=\\(4,\\).*6 ranks"):
        rank_designs(A800_14B, dataclasses.replace(_space(lag_bounds=(0,), allowed_tp=(4,)), world_size=6), _long_tail(), 20)
    with pytest.raises(ValueError, match="gamma=1.5 must be in"):
        _space(gamma=1.5)


def test_a_prior_at_the_caps_bounds_every_trajectory_by_its_turns_tool_outputs_and_total():
    caps = dict(max_turns=3, max_new_tokens_per_turn=100, max_tool_tokens=50, max_total_tokens=1000, trajectories_per_step=8)
    wl = cap_prior([200, 900], **caps)
    assert wl.trajectory_tokens == (200 + 300 + 100, 1000)  # three turns and two tool outputs; the second hits the total
    assert wl.signal_tokens == (300, 1000)  # the first tool output comes after the first turn
    assert wl.train_tokens == pytest.approx(800 * 8) and wl.num_trajectories == 8
    assert wl.decode_frac == pytest.approx((300 + 100) / 1600)  # the long prompt leaves room for 100 decoded tokens
    one_turn = cap_prior([20, 30], **{**caps, "max_turns": 1, "max_new_tokens_per_turn": 8})
    assert one_turn.trajectory_tokens == (28, 38) and one_turn.signal_tokens == (28, 38)  # no tool: no signal before the end
    with pytest.raises(ValueError, match="no prompt lengths"):
        cap_prior([], **caps)


def test_where_the_caps_bound_the_lengths_the_first_design_is_the_one_measured_lengths_choose():
    # the digit task: prompts of ~20 tokens, one turn of at most 8; the first check on measured lengths keeps it
    cm = get_cost_model("cpu", "tiny")
    cm.shared_cores = 0
    space = DesignSpace(world_size=4, buckets=BucketsConfig().buckets(), allowed_tp=(1,), group_size=8, lag_bounds=(0, 1))
    prior = cap_prior([18, 20, 22, 24], max_turns=1, max_new_tokens_per_turn=8, max_tool_tokens=2048,
                      max_total_tokens=4096, trajectories_per_step=32)
    measured = Workload(trajectory_tokens=tuple(range(21, 33)) * 2, num_trajectories=32, train_tokens=32 * 27)
    first, then = rank_designs(cm, space, prior, 40)[0], rank_designs(cm, space, measured, 39)[0]
    assert (first.system, first.lag, first.role_map.describe()) == (then.system, then.lag, then.role_map.describe())


def test_the_planners_lag_cap_overrides_the_runs_staleness_bound_where_set():
    from scheduler.design import design_space
    from scheduler.planner import PlannerConfig

    def bounds(planner, max_staleness):
        return design_space(world_size=16, buckets=BUCKETS, planner=planner, max_staleness=max_staleness,
                            group_size=8).lag_bounds

    assert bounds(PlannerConfig(), 1) == (0, 1)  # the run's bound, the user's
    assert bounds(PlannerConfig(max_lag=4), 1) == (0, 1, 2, 4)  # a comparison's range for libra's own choice
    assert bounds(PlannerConfig(max_lag=0), 4) == (0,)
    with pytest.raises(ValueError, match="max_lag=-1"):
        PlannerConfig(max_lag=-1)


def test_finish_order_designs_bound_the_trained_lag_at_the_runs_cap_and_admit_below_it():
    from scheduler.design import design_space
    from scheduler.planner import PlannerConfig

    def finish_order(cap):
        space = design_space(world_size=16, buckets=BUCKETS, planner=PlannerConfig(max_lag=cap), max_staleness=1,
                             group_size=8)
        return {(d.lag, d.max_staleness) for d in rank_designs(A800_14B, space, _long_tail(), 20)
                if d.batch_by_finish}

    assert finish_order(4) == {(1, 4), (2, 4)}  # lag 4 would make every batch wait for the whole step the bound reaches
    assert finish_order(8) == {(1, 8), (2, 8), (4, 8)}  # the user's bound, not the largest lag below it
    assert finish_order(3) == {(1, 3), (2, 3)}


def test_a_pipelined_split_is_never_priced_below_its_rollout_throughput():
    """At lookahead L the pipelined formula spreads a batch's rollout over L + 1 steps; batches in flight share the
    instances, so the step is at least their throughput time for one step's work. Searched without that floor,
    a deep pipeline starves the rollout (more trainer devices, a step that the instances cannot sustain)."""
    wl = _long_tail(seed=2)
    for lag in (1, 2, 4):
        search = LayoutSearch(A800_14B, 16, BUCKETS, allowed_tp=VALID_TP, max_batch=256, min_tp=1, min_train=1, lookahead=lag)
        floored = search.best(wl, Scales(), current=None, floor=(wl, 1))
        rm = search.build(floored, None)
        assert floored.step_s >= search.throughput_s(rm, wl) * (1 - 1e-9)
        plain = search.best(wl, Scales(), current=None)
        priced_plain = max(plain.step_s, search.throughput_s(search.build(plain, None), wl))
        assert floored.step_s <= priced_plain * (1 + 1e-9), (lag, floored.step_s, priced_plain)


def test_a_deeper_pipeline_fills_slower_on_saturated_instances():
    """At the start L + 1 steps are admitted at once and share the rollout: the first batch waits for at least
    L + 1 steps' work at full throughput, so the fill grows with the lag where the instances are the bottleneck."""
    from scheduler.design import pipeline_fill_s
    from scheduler.layout_search import Choice

    c = Choice(step_s=100.0, rollout_s=150.0, train_s=80.0, sync_s=2.0, num_rollout=4, active=(0,), tps=(4,))
    assert pipeline_fill_s(c, 60.0, 1) == 150.0 + 82.0  # its own makespan is longer than 2 x 60
    assert pipeline_fill_s(c, 60.0, 2) == 180.0 + 82.0
    assert pipeline_fill_s(c, 60.0, 4) == 300.0 + 82.0
