"""Baselines at their best (sim/baselines.py): the tuned configuration is never slower than the
default on the same seed, every candidate is a valid layout, and the continuous-rollout peers
respect their staleness bound at admission."""

import pytest

from bench.presets import get_preset, zero_tail
from scheduler.layout import split_role_map
from scheduler.layout_model import Workload
from sim.baselines import CONTINUOUS, TUNED, candidates, tune
from sim.run import buckets_of, cost_model_of, play_system


@pytest.fixture(scope="module")
def cfg():
    return zero_tail("swe").replace(steps=4)


@pytest.mark.parametrize("system", TUNED)
def test_the_tuned_configuration_is_at_least_as_fast_as_the_default(cfg, system):
    t = tune(cfg, system, top_k=2)
    assert t.best["tokens_per_s"] >= t.default["tokens_per_s"]
    assert t.tried[0][0] == "default" and len(t.tried) > 2
    assert t.best["trajectories"] == t.default["trajectories"]  # the same work, only faster


@pytest.mark.parametrize("system", ("static", "length_aware"))
def test_the_exhaustive_search_simulates_every_candidate_and_no_top_k_search_beats_it(cfg, system):
    full, quick = tune(cfg, system), tune(cfg, system, top_k=1)
    assert all(tps is not None for _, _, tps in full.tried)  # every candidate ran, none only priced
    assert len(full.tried) == len(quick.tried)
    assert full.best["tokens_per_s"] >= quick.best["tokens_per_s"]
    assert full.best["tokens_per_s"] == max(tps for _, _, tps in full.tried)


def test_candidates_are_valid_layouts_of_what_each_system_lets_its_users_set(cfg):
    stats: list = []
    play_system(cfg, "static", stats_out=stats)
    wl = Workload.from_stats(stats)
    cost, buckets = cost_model_of(cfg), buckets_of(cfg)
    for system in TUNED:
        cands = candidates(system, cfg, cost, buckets, wl)
        assert cands, system
        for c in cands:
            c.role_map.validate()
            assert c.role_map.world_size == cfg.num_devices
            assert bool(c.role_map.colocated) == (system == "colocate")
            if system in ("static", "verl-async", *CONTINUOUS):
                assert len({i.tp for i in c.role_map.instances}) == 1  # one TP, one bucket
        if system in CONTINUOUS:
            assert {c.max_staleness for c in cands} == {1, 2, 4}


@pytest.mark.parametrize("system", CONTINUOUS)
def test_continuous_rollout_never_admits_past_its_bound(cfg, system):
    """Admission runs at most `max_staleness` steps ahead of the trainer (where AReaL bounds it)."""
    for eta in (1, 2):
        run = cfg.replace(max_staleness=eta)
        _, rows, admitted, _ = play_system(run, system, record=True)
        assert len(rows) == run.steps
        for req in admitted:  # the policy version at admission is the number of trained batches
            assert req.batch - req.version <= eta, (req.batch, req.version)


def test_fully_async_pays_a_per_sequence_recompute_at_each_update():
    """AReaL's interruption re-prefills each running sequence's own context on the new weights: a
    few percent below partial rollout (which keeps the old KV) on the paper's swe at TP8, not the
    40% a prefill of the batch's tokens taken as one long sequence (quadratic attention) cost."""
    run = get_preset("paper_a800_48", "swe", 0).replace(steps=6, max_staleness=2)
    single = buckets_of(run).single()
    rm = split_role_map(world_size=48, num_trainer=24, rollout_tp=tuple((single[0].name, 8) for _ in range(3)), buckets=single)
    tps = {s: play_system(run, s, layout=rm)[0]["tokens_per_s"] for s in ("partial-rollout", "fully-async")}
    assert 0.8 < tps["fully-async"] / tps["partial-rollout"] < 1.0, tps
