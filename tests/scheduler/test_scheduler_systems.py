"""The systems table: names, router kinds, initial layouts for any G, planners only where due."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cmlfq import CMLFQRouter
from scheduler.costmodel import get_cost_model
from scheduler.layout import BucketsConfig
from scheduler.planner import GlobalPlanner, PlannerConfig
from scheduler.routers import LAMLFQRouter, LeastLoadRouter, LengthAwareRouter, RouterConfig
from scheduler.systems import SYSTEMS, SystemSpec, get_system, initial_role_map, lookahead_of, make_planner, make_router

NAMES = ["libra", "colocate", "static", "verl-async", "fully-async", "partial-rollout", "length_aware", "la_mlfq", "oracle", "libra-partial", "libra-hybrid", "libra-no-design",
         "libra-no-planner",
         "libra-no-realloc",
         "libra-no-cmlfq", "libra-homogeneous", "libra-no-elastic"]
CM = get_cost_model("cpu", "tiny")


def test_table_names_and_flags():
    assert list(SYSTEMS) == NAMES
    libra = get_system("libra")
    assert (libra.router, libra.heterogeneous, libra.planner, libra.realloc, libra.async_pipeline, libra.colocated) == (
        "cmlfq", True, True, True, True, False)
    assert get_system("colocate").colocated and not get_system("colocate").async_pipeline
    assert get_system("oracle").sim_only and all(s.description for s in SYSTEMS.values())
    # its ablations keep their design, but for the one that only turns the idle instances' help off
    assert [n for n, s in SYSTEMS.items() if s.chooses_design] == ["libra", "libra-no-elastic"]
    # the planner decides who helps train: every system with one may, libra-no-elastic is libra without it
    assert [n for n, s in SYSTEMS.items() if s.planner and not s.elastic] == ["libra-no-elastic"]
    assert not any(s.elastic for s in SYSTEMS.values() if not s.planner)
    unnamed = {"name": "", "elastic": False, "description": ""}
    assert dataclasses.replace(get_system("libra-no-elastic"), **unnamed) == dataclasses.replace(libra, **unnamed)
    with pytest.raises(ValueError, match=r"unknown system 'verl'; choose one of \['libra', 'colocate'"):
        get_system("verl")
    with pytest.raises(ValueError, match=r"router='x' is not one of"):
        SystemSpec(name="s", router="x", heterogeneous=False, planner=False, realloc=False, async_pipeline=True, colocated=False)
    with pytest.raises(ValueError, match=r"realloc=True needs planner=True"):
        SystemSpec(name="s", router="cmlfq", heterogeneous=False, planner=False, realloc=True, async_pipeline=True, colocated=False)
    with pytest.raises(ValueError, match=r"'s': elastic=True needs planner=True; the planner decides who helps train"):
        SystemSpec(name="s", router="cmlfq", heterogeneous=False, planner=False, realloc=False, async_pipeline=True,
                   colocated=False, elastic=True)


def test_make_router_kinds():
    kinds = {n: type(make_router(n)) for n in NAMES if not SYSTEMS[n].sim_only}
    assert kinds["libra"] is CMLFQRouter and kinds["libra-no-cmlfq"] is LeastLoadRouter
    assert kinds["static"] is LeastLoadRouter and kinds["length_aware"] is LengthAwareRouter
    assert kinds["la_mlfq"] is LAMLFQRouter
    cfg = RouterConfig(migrate_load_slack=3.0)
    assert make_router("libra", cfg).cfg is cfg
    with pytest.raises(ValueError, match=r"system 'oracle' is simulator-only: .* run it with --sim"):
        make_router("oracle")


def test_small_layouts():
    assert initial_role_map("libra", 2).describe() == "v0 train=1 | short:TP1x1"
    assert initial_role_map("libra", 4).describe() == "v0 train=2 | short:TP1x1 long:TP1x1"
    assert initial_role_map("libra", 6).describe() == "v0 train=3 | short:TP1x1 long:TP2x1"
    assert initial_role_map("libra", 16).describe() == "v0 train=8 | short:TP1x2 medium:TP2x1 long:TP4x1"
    assert initial_role_map("static", 8).describe() == "v0 train=4 | short:TP1x4"
    assert initial_role_map("colocate", 4).describe() == "v0 train=4 colocated | short:TP1x4"
    big = get_cost_model("910b3", "qwen3-30b-a3b")  # 61 GB of weights need TP2 on 64 GB devices
    assert initial_role_map("static", 7, cost_model=big).describe() == "v0 train=5 | short:TP2x1"
    smol = get_cost_model("h100", "smollm2-135m")
    assert initial_role_map("libra", 16, cost_model=smol).describe() == "v0 train=8 | short:TP1x7 long:TP1x1"
    with pytest.raises(ValueError, match=r"trainer_frac=1.0 must be in \(0, 1\)"):
        initial_role_map("libra", 4, trainer_frac=1.0)
    with pytest.raises(ValueError, match=r"world_size=1 must be >= 2"):
        initial_role_map("libra", 1)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(NAMES), g=st.integers(2, 1024), frac=st.floats(0.05, 0.95))
def test_initial_role_map_valid_for_any_world_size(name, g, frac):
    rm = initial_role_map(name, g, trainer_frac=frac).validate()
    assert rm.world_size == g
    if not rm.colocated:
        r = len(rm.rollout_ranks)
        assert len(rm.trainer_ranks) + r == g
        if SYSTEMS[name].heterogeneous and r >= 3:
            assert max(i.tp for i in rm.instances) >= 2
        if not SYSTEMS[name].heterogeneous:
            assert len(rm.buckets) == 1


def test_make_planner_only_for_planned_systems():
    for name in NAMES:
        p = make_planner(name, 8, CM, 100, PlannerConfig(), buckets=BucketsConfig(max_tokens=(512, 1536)))
        assert (p is not None) == SYSTEMS[name].planner
        if p is not None:
            assert isinstance(p, GlobalPlanner)
            assert p.cfg.heterogeneous == SYSTEMS[name].heterogeneous and p.cfg.allow_realloc == SYSTEMS[name].realloc


def test_lookahead_is_the_staleness_bound_exactly_when_rollout_overlaps_training():
    for name in NAMES:
        spec = SYSTEMS[name]
        hybrid = spec.colocated and spec.async_pipeline
        assert lookahead_of(name, 3) == (3 if spec.async_pipeline else 0), name
        # only a time-shared system overlaps the stages on a colocated layout (it pauses generation to train)
        assert lookahead_of(name, 3, colocated=True) == (3 if hybrid else 0), name
    assert lookahead_of("colocate", 2) == 0 and lookahead_of("libra", 2) == 2 and lookahead_of("fully-async", 4) == 4
    assert lookahead_of("libra-hybrid", 1) == 1 and SYSTEMS["libra-hybrid"].colocated
    # the planner's step model and the simulator are told the same number
    assert make_planner("libra", 8, CM, 100, PlannerConfig(), max_staleness=2).lookahead == lookahead_of("libra", 2)
