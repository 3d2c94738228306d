"""C-MLFQ and its causal prefix tree, driven by hand (as vLLM's scheduler tests drive theirs)."""

import dataclasses

import pytest

from scheduler.api import OutcomeState
from scheduler.cmlfq import CMLFQRouter
from scheduler.layout import BucketsConfig, split_role_map
from scheduler.prefix_tree import CausalPrefixTree, PrefixTreeConfig, TrajectoryRecord
from scheduler.routers import RouterConfig

FAIL = OutcomeState("run_tests", "medium", "failure")
OK = OutcomeState("run_tests", "small", "success")
SEARCH = OutcomeState("search", "large", "success")
CFG = RouterConfig(tree=PrefixTreeConfig(window=100, rebuild_every=10, min_samples=3))
BUCKETS = BucketsConfig(max_tokens=(1000, 3000))


def _layout(version=0):
    return split_role_map(world_size=6, num_trainer=2, rollout_tp=(("short", 1), ("short", 1), ("long", 2)),
                          buckets=BUCKETS.buckets(), version=version)


def _trained_router() -> CMLFQRouter:
    """20 trajectories: after a test failure 4000 more tokens follow, after a success 100."""
    r = CMLFQRouter(CFG)
    r.set_layout(_layout(), 0.0)
    for i in range(20):
        rid = f"train{i}"
        r.admit(rid, "p0", 100, 0.0)
        r.on_tool_return(rid, FAIL if i % 2 else OK, 300, 1.0)
        r.on_finish(rid, 4300 if i % 2 else 400, 2.0)
    assert r.tree.generation == 2 and r.num_in_flight == 0
    assert r.load() == {0: 0, 1: 0, 2: 0}
    return r


def test_failure_migrates_and_success_stays():
    r = _trained_router()
    before = r.num_causal_migrations  # training requests 11..19 with a failure already migrated
    assert before == 5
    assert r.admit("a", "p0", 100, 3.0).bucket == "short"
    d = r.on_tool_return("a", FAIL, 300, 4.0)
    assert (d.action, d.bucket, d.instance_id) == ("migrate", "long", 2)
    assert d.reason == "cmlfq[prompt] mean=4300 p=4300 n=10"
    r.admit("b", "p0", 100, 3.0)
    d = r.on_tool_return("b", OK, 300, 4.0)
    assert (d.action, d.bucket) == ("stay", "short")
    # An unseen prompt falls back to the global tree.
    r.admit("c", "new-prompt", 100, 3.0)
    d = r.on_tool_return("c", FAIL, 300, 4.0)
    assert d.migrate and d.reason.startswith("cmlfq[global]")
    assert r.num_causal_migrations == before + 2


def test_unseen_sequence_uses_last_outcome_table():
    r = _trained_router()
    r.admit("a", "p0", 100, 0.0)
    assert not r.on_tool_return("a", SEARCH, 200, 1.0).migrate  # no evidence about SEARCH: stay
    d = r.on_tool_return("a", FAIL, 300, 2.0)  # (SEARCH, FAIL) is unseen; FAIL alone is known
    assert d.migrate and d.reason.startswith("cmlfq[last]")


def test_no_tree_no_migration_until_limit_then_demotion():
    r = CMLFQRouter(CFG)
    r.set_layout(_layout(), 0.0)
    r.admit("a", "p", 100, 0.0)
    assert r.on_tool_return("a", FAIL, 900, 1.0).action == "stay"
    assert r.on_decode("a", 1000, 1.5).action == "stay"
    d = r.on_decode("a", 1001, 2.0)
    assert (d.action, d.bucket, d.reason) == ("migrate", "long", "demote tokens=1001>1000")
    # Already in the longest bucket: nothing longer to go to.
    assert r.on_decode("a", 50_000, 3.0).action == "stay"
    assert r.num_demotions == 1


def test_demotion_can_be_switched_off():
    r = CMLFQRouter(RouterConfig(demote=False))
    r.set_layout(_layout(), 0.0)
    r.admit("a", "p", 100, 0.0)
    assert r.on_decode("a", 5000, 1.0).action == "stay"


def test_admission_least_loaded_by_tokens_not_count():
    r = CMLFQRouter(dataclasses.replace(CFG, migrate_load_slack=1e9))  # within the first bucket: no spill
    r.set_layout(_layout(), 0.0)
    assert r.admit("big", "p", 900, 0.0).instance_id == 0
    assert r.admit("s1", "p", 10, 0.0).instance_id == 1
    assert r.admit("s2", "p", 10, 0.0).instance_id == 1  # 2 requests / 20 tokens < 1 request / 900 tokens
    assert r.load() == {0: 900, 1: 20, 2: 0}
    r.on_decode("s1", 500, 1.0)
    assert r.load()[1] == 510
    r.on_cancel("s1", 2.0)
    r.on_cancel("s1", 2.0)  # idempotent
    assert r.load()[1] == 10 and r.num_in_flight == 2


def test_readmit_after_finish_and_unknown_ids():
    r = CMLFQRouter(CFG)
    r.set_layout(_layout(), 0.0)
    r.admit("x", "p", 10, 0.0)
    r.on_finish("x", 50, 1.0)
    assert r.admit("x", "p", 10, 2.0).bucket == "short"
    r.admit("x", "p", 30, 2.0)  # admitted again while in flight: replaces, no double load
    assert sum(r.load().values()) == 30
    with pytest.raises(KeyError, match="request 'nope' is not in flight"):
        r.on_decode("nope", 5, 0.0)
    with pytest.raises(RuntimeError, match="before set_layout"):
        CMLFQRouter(CFG).admit("a", "p", 1, 0.0)


def test_set_layout_rehomes_requests_of_removed_instances():
    r = CMLFQRouter(CFG)
    r.set_layout(_layout(), 0.0)
    r.admit("a", "p", 100, 0.0)  # instance 0
    r.admit("b", "p", 100, 0.0)  # instance 1
    r.on_decode("b", 2000, 0.5)  # demoted to long (instance 2)
    new = split_role_map(world_size=6, num_trainer=3, rollout_tp=(("short", 1), ("long", 2)),
                         buckets=BUCKETS.buckets(), version=1)
    moved = r.set_layout(new, 1.0)
    assert {k: (v.instance_id, v.bucket) for k, v in moved.items()} == {"b": (1, "long")}
    assert r.route_of("a").instance_id == 0
    assert r.load() == {0: 100, 1: 2000}


def test_prefix_tree_statistics_rebuild_window_and_json():
    tree = CausalPrefixTree(PrefixTreeConfig(window=5, rebuild_every=5, min_samples=1, quantile=0.9))
    rebuilt = [tree.add(TrajectoryRecord(prompt_id="p", prompt_tokens=10, outcomes=(FAIL,), tokens_at=(100,),
                                         total_tokens=100 + 10 * i)) for i in range(1, 6)]
    assert rebuilt == [False, False, False, False, True]
    est = tree.predict("p", [FAIL])
    assert (est.mean, est.tail, est.count, est.source) == (30.0, 50.0, 5, "prompt")
    root = tree.predict("p", [])
    assert (root.mean, root.count) == (120.0, 5)
    assert tree.predict("p", [OK]) is None
    for i in range(5):  # the window drops the first five records at the next rebuild
        tree.add(TrajectoryRecord(prompt_id="q", prompt_tokens=0, outcomes=(OK,), tokens_at=(10,), total_tokens=20))
    assert tree.predict("p", [FAIL]) is None
    assert tree.predict("zz", [OK]) == (10.0, 10.0, 5, "global")
    assert tree.predict("zz", [FAIL]) is None
    back = CausalPrefixTree.from_json(tree.to_json(), tree.cfg)
    assert back.predict("q", [OK]) == tree.predict("q", [OK])
    with pytest.raises(ValueError, match="expected 'libra-prefix-tree/1'"):
        CausalPrefixTree.from_json('{"format": "x"}')


def test_router_warm_start_from_json():
    src = _trained_router()
    r = CMLFQRouter(CFG)
    r.set_layout(_layout(), 0.0)
    r.admit("a", "p0", 100, 0.0)
    r.load_tree_json(src.tree.to_json())
    assert r.on_tool_return("a", FAIL, 300, 1.0).migrate


def test_the_learned_tree_is_the_routers_tree_json():
    src = _trained_router()
    assert src.tree_json() == src.tree.to_json()
    r = CMLFQRouter(CFG)
    r.load_tree_json(src.tree_json())
    assert r.tree_json() == src.tree_json()


@pytest.mark.parametrize("kw, msg", [
    (dict(window=0), r"window=0 and rebuild_every=64 must be >= 1"),
    (dict(min_samples=0), r"min_samples=0 must be >= 1"),
    (dict(quantile=1.5), r"quantile=1.5 must be in \(0, 1\]"),
])
def test_prefix_tree_config_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        PrefixTreeConfig(**kw)


def test_admission_spills_to_a_longer_bucket_only_when_the_first_is_crowded():
    r = CMLFQRouter(CFG)  # migrate_load_slack=2: two short TP1 instances, one long TP2 instance
    r.set_layout(_layout(), 0.0)
    # Per device after adding the request: short 1000 vs long 500 -- not 2x less, so short.
    assert [r.admit(f"a{i}", "p", 1000, 0.0).bucket for i in range(2)] == ["short", "short"]
    # short would hold 2000 per device, long 500: spill to long (it never needs a migration)
    assert (r.admit("a2", "p", 1000, 0.0).bucket, r.load()) == ("long", {0: 1000, 1: 1000, 2: 1000})
    # short 2000 vs long (1000 + 1000) / 2 = 1000: exactly 2x, not more -> short again
    assert [r.admit(f"b{i}", "p", 1000, 0.0).instance_id for i in range(2)] == [0, 1]
    assert r.admit("b2", "p", 1000, 0.0).bucket == "long"  # short 3000 vs long 1500: spill


def test_causal_move_held_when_the_target_is_crowded():
    r = _trained_router()
    r.admit("a", "p0", 100, 3.0)
    r.admit("crowd", "other", 100, 3.0)
    r.on_decode("crowd", 5000, 3.5)  # demoted to long: 5000 tokens on 2 devices
    assert r.route_of("crowd").bucket == "long"
    d = r.on_tool_return("a", FAIL, 300, 4.0)  # the tree says long, but long holds 2650/device vs 300 here
    assert (d.action, d.bucket) == ("stay", "short") and r.num_load_holds == 1
    r.on_finish("crowd", 5000, 5.0)
    d = r.on_tool_return("a", FAIL, 320, 6.0)  # the crowd left: same evidence, now it moves
    assert (d.action, d.bucket) == ("migrate", "long")


def test_demotion_held_when_the_target_is_crowded_then_taken():
    r = CMLFQRouter(CFG)
    r.set_layout(_layout(), 0.0)
    r.admit("big", "p", 100, 0.0)
    r.on_decode("big", 8000, 1.0)  # demoted: long holds 4000/device against 8000 here
    assert r.route_of("big").bucket == "long" and r.num_demotions == 1
    r.admit("a", "p", 100, 1.0)
    d = r.on_decode("a", 1001, 2.0)  # over short's limit, but long would hold 4500/device vs 1001 here
    assert (d.action, d.bucket) == ("stay", "short") and (r.num_load_holds, r.num_demotions) == (1, 1)
    r.on_finish("big", 8000, 3.0)
    d = r.on_decode("a", 1100, 4.0)  # the crowd left: the safety net demotes it now
    assert (d.action, d.bucket, d.reason) == ("migrate", "long", "demote tokens=1100>1000")


def test_a_longer_bucket_of_the_same_tp_takes_admissions_by_plain_least_load():
    # CPU layouts are TP1 everywhere: the long bucket's instance is no faster, so no 2x slack
    rm = split_role_map(world_size=4, num_trainer=1, rollout_tp=(("short", 1), ("short", 1), ("long", 1)),
                        buckets=BUCKETS.buckets())
    r = CMLFQRouter(CFG)
    r.set_layout(rm, 0.0)
    assert [r.admit(f"a{i}", "p", 1000, 0.0).bucket for i in range(3)] == ["short", "short", "long"]
    assert r.load() == {0: 1000, 1: 1000, 2: 1000}
