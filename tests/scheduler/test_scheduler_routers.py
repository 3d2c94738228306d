"""Router invariants under random event sequences (hypothesis) and the baselines' policies."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.api import OutcomeState
from scheduler.layout import split_role_map
from scheduler.prefix_tree import PrefixTreeConfig
from scheduler.layout import BucketsConfig
from scheduler.routers import LAMLFQRouter, LeastLoadRouter, LengthAwareRouter, RouterConfig, cpu_router_config
from scheduler.systems import ROUTERS

CFG = RouterConfig(tree=PrefixTreeConfig(window=50, rebuild_every=5, min_samples=2))
BUCKETS = BucketsConfig(max_tokens=(200, 600))
OUTCOMES = [OutcomeState(t, s, x) for t in ("run_tests", "search") for s in ("small", "large") for x in ("success", "failure")]
LAYOUTS = [
    (("short", 1), ("short", 1), ("medium", 2), ("long", 4)),
    (("short", 1), ("long", 2)),
    (("long", 1),),
    (("short", 2), ("medium", 1), ("medium", 1)),
]


def _layout(i: int, version: int):
    spec = LAYOUTS[i]
    return split_role_map(world_size=2 + sum(tp for _, tp in spec), num_trainer=2, rollout_tp=spec,
                          buckets=BUCKETS.buckets(), version=version)


events = st.lists(st.tuples(st.sampled_from(["admit", "tool", "decode", "finish", "cancel", "layout"]),
                            st.integers(0, 11), st.integers(0, 900), st.integers(0, len(OUTCOMES) - 1)),
                  min_size=1, max_size=80)


def _run(kind: str, evs) -> list:
    r = ROUTERS[kind](CFG)
    rm = _layout(0, 0)
    r.set_layout(rm, 0.0)
    live: dict[str, int] = {}
    log = []
    for n, (ev, rid_i, tokens, oi) in enumerate(evs):
        rid, now = f"r{rid_i}", float(n)
        if ev == "layout":
            rm = _layout(rid_i % len(LAYOUTS), rm.version + 1)
            moved = r.set_layout(rm, now)
            log.append(("layout", sorted((k, v.instance_id, v.bucket) for k, v in moved.items())))
            for k, v in moved.items():
                assert rm.instance(v.instance_id).bucket == v.bucket
        elif ev == "admit":
            route = r.admit(rid, f"p{rid_i % 3}", 10 + tokens % 50, now)
            assert rm.instance(route.instance_id).bucket == route.bucket
            live[rid] = 10 + tokens % 50
            log.append(("admit", route))
        elif rid not in live:
            continue
        elif ev in ("tool", "decode"):
            before = rm.bucket_index(r.route_of(rid).bucket)
            tok = live[rid] + tokens
            d = r.on_tool_return(rid, OUTCOMES[oi], tok, now) if ev == "tool" else r.on_decode(rid, tok, now)
            live[rid] = tok
            assert rm.instance(d.instance_id).bucket == d.bucket
            if d.migrate:
                assert rm.bucket_index(d.bucket) > before, d
            else:
                assert rm.bucket_index(d.bucket) == before
            log.append((ev, d))
        else:
            (r.on_finish(rid, live[rid], now) if ev == "finish" else r.on_cancel(rid, now))
            del live[rid]
        assert r.num_in_flight == len(live)
        assert sum(r.load().values()) == sum(live.values())
        assert set(r.load()) == {i.instance_id for i in rm.instances}
    return log


@pytest.mark.parametrize("kind", sorted(ROUTERS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(evs=events)
def test_router_invariants_and_determinism(kind, evs):
    assert _run(kind, evs) == _run(kind, evs)


def _three_bucket_router(cls):
    r = cls(CFG)
    r.set_layout(_layout(0, 0), 0.0)
    return r


@pytest.mark.parametrize("kind", sorted(ROUTERS))
def test_every_router_implements_the_whole_protocol(kind):
    """Callers never probe a router for extras: every method of `Router` is there, learned state included."""
    import inspect

    from scheduler.api import Router

    wanted = {n for n, _ in inspect.getmembers(Router, inspect.isfunction) if not n.startswith("_")}
    assert wanted >= {"admit", "tree_json", "load_tree_json"}
    r = _three_bucket_router(ROUTERS[kind])
    assert all(callable(getattr(r, n, None)) for n in wanted)
    learned = r.tree_json()
    if kind != "cmlfq":
        assert learned is None
        r.load_tree_json('{"format": "libra-prefix-tree/1"}')  # ignored: nothing to load
    r.load_tree_json(learned or "")
    assert r.admit("a", "p", 10, 0.0).bucket == "short"


def test_least_load_spreads_over_all_instances_and_never_migrates():
    r = _three_bucket_router(LeastLoadRouter)
    routes = [r.admit(f"r{i}", "p", 100, 0.0) for i in range(4)]
    assert [(x.instance_id, x.bucket) for x in routes] == [(0, "short"), (1, "short"), (2, "medium"), (3, "long")]
    assert not r.on_decode("r0", 5000, 1.0).migrate


def test_length_aware_routes_once_by_prompt_history():
    r = _three_bucket_router(LengthAwareRouter)
    assert r.admit("a", "p", 10, 0.0).bucket == "short"  # no history yet
    r.on_finish("a", 500, 1.0)
    assert r.predict("p") == 500.0
    assert r.admit("b", "p", 10, 2.0).bucket == "medium"
    r.on_finish("b", 1500, 3.0)
    assert r.admit("c", "p", 10, 4.0).bucket == "long"  # mean 1000 > 600
    assert not r.on_decode("c", 10, 5.0).migrate and r.admit("d", "q", 10, 0.0).bucket == "short"


def test_la_mlfq_demotes_on_tokens_only():
    r = _three_bucket_router(LAMLFQRouter)
    r.admit("a", "p", 10, 0.0)
    assert not r.on_tool_return("a", OUTCOMES[1], 200, 1.0).migrate
    d = r.on_tool_return("a", OUTCOMES[1], 201, 2.0)
    assert (d.bucket, d.reason) == ("medium", "demote tokens=201>200")
    d = r.on_decode("a", 700, 3.0)  # jumps straight to the bucket that fits
    assert (d.bucket, d.instance_id) == ("long", 3)
    assert r.num_demotions == 2 and r.num_migrations == 2


def test_buckets_config_and_router_config_errors():
    assert [(b.name, b.max_tokens) for b in BucketsConfig(max_tokens=(512, 1536)).buckets()] == [
        ("short", 512), ("medium", 1536), ("long", None)]
    assert [(b.name, b.max_tokens) for b in BucketsConfig().single()] == [("short", None)]
    assert cpu_router_config().tree.rebuild_every == 4
    with pytest.raises(ValueError, match=r"max_tokens=\(5,\) has 1 limits for 3 buckets; give 2"):
        BucketsConfig(max_tokens=(5,))
    with pytest.raises(ValueError, match=r"max_tokens=\(9, 5\) must be positive and strictly increasing"):
        BucketsConfig(max_tokens=(9, 5))
    with pytest.raises(ValueError, match=r"names=\('a', 'a'\) must be non-empty and unique"):
        BucketsConfig(names=("a", "a"), max_tokens=(5,))
    with pytest.raises(ValueError, match=r"length_history=0 must be >= 1"):
        RouterConfig(length_history=0)
    with pytest.raises(ValueError, match=r"migrate_load_slack=0 must be > 0; use a large value \(e.g. 1e9\)"):
        RouterConfig(migrate_load_slack=0)
