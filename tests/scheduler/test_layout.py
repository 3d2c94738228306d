"""RoleMap: validation of every constraint, exact round trip, derived views."""

import json

import pytest

from scheduler.layout import VALID_TP, Bucket, RoleMap, RolloutInstance, colocated_role_map, split_role_map

B3 = (Bucket(name="short", max_tokens=4096), Bucket(name="medium", max_tokens=12288), Bucket(name="long", max_tokens=None))


def _map(**kw) -> RoleMap:
    base = dict(version=1, world_size=4, trainer_ranks=(0, 1),
                instances=(RolloutInstance(instance_id=0, bucket="short", ranks=(2,)),
                           RolloutInstance(instance_id=1, bucket="long", ranks=(3,))),
                buckets=B3)
    base.update(kw)
    return RoleMap(**base)


def test_valid_map_views():
    rm = _map().validate()
    assert rm.rollout_ranks == (2, 3)
    assert rm.bucket_index("long") == 2
    assert rm.instance(1).ranks == (3,)
    assert rm.instance_of(2).instance_id == 0 and rm.instance_of(0) is None
    assert rm.roles_of(0) == ("trainer",) and rm.roles_of(3) == ("rollout",)
    assert rm.summary() == {"trainer": 2, "rollout": 2, "bucket/short": 1, "bucket/medium": 0, "bucket/long": 1}
    assert rm.describe() == "v1 train=2 | short:TP1x1 long:TP1x1"
    with pytest.raises(KeyError, match="bucket 'x' is not in"):
        rm.bucket_index("x")
    with pytest.raises(KeyError, match="instance 7 is not in role map v1"):
        rm.instance(7)


def test_round_trip_through_json_is_exact():
    rm = split_role_map(world_size=8, num_trainer=2, rollout_tp=(("short", 1), ("short", 1), ("medium", 2), ("long", 2)),
                        buckets=B3, version=5)
    back = RoleMap.from_dict(json.loads(json.dumps(rm.to_dict())))
    assert back == rm
    assert back.with_version(6).version == 6 and back.with_version(6).instances == rm.instances


@pytest.mark.parametrize("kw, msg", [
    (dict(world_size=0), r"world_size=0 must be >= 1"),
    (dict(trainer_ranks=()), r"no trainer ranks; give training >= 1 rank"),
    (dict(instances=()), r"no rollout instances; give rollout >= 1 rank"),
    (dict(trainer_ranks=(0, 0, 1)), r"trainer ranks \(0, 0, 1\) repeat a rank"),
    (dict(instances=(RolloutInstance(instance_id=0, bucket="short", ranks=(2, 2)),
                     RolloutInstance(instance_id=1, bucket="long", ranks=(3,)))), r"rollout ranks \[2, 2, 3\] repeat a rank"),
    (dict(trainer_ranks=(0, 9)), r"ranks \[9\] are outside 0..3"),
    (dict(instances=(RolloutInstance(instance_id=0, bucket="short", ranks=(2,)),
                     RolloutInstance(instance_id=0, bucket="long", ranks=(3,)))), r"instance ids \[0, 0\] repeat"),
    (dict(world_size=5, trainer_ranks=(0, 1), instances=(RolloutInstance(instance_id=0, bucket="short", ranks=(2, 3, 4)),)),
     r"instance 0 has TP=3; TP must be one of \(1, 2, 4, 8\)"),
    (dict(buckets=(Bucket(name="a", max_tokens=5), Bucket(name="a", max_tokens=None))), r"bucket names \['a', 'a'\] must be"),
    (dict(buckets=(Bucket(name="short", max_tokens=None), Bucket(name="long", max_tokens=None))),
     r"only the last bucket is unbounded"),
    (dict(buckets=(Bucket(name="short", max_tokens=9), Bucket(name="medium", max_tokens=5),
                   Bucket(name="long", max_tokens=None))), r"bucket limits \[9, 5, None\] must increase"),
    (dict(buckets=(Bucket(name="short", max_tokens=None),)), r"instances name unknown buckets \['long'\]"),
    (dict(trainer_ranks=(0, 1, 2)), r"ranks \[2\] are both trainer and rollout; set colocated=True"),
    (dict(trainer_ranks=(0,)), r"ranks \[1\] have no role; 4 ranks must all be placed"),
])
def test_validate_rejects(kw, msg):
    with pytest.raises(ValueError, match=msg):
        _map(**kw).validate()


def test_split_role_map_places_consecutive_ranks():
    rm = split_role_map(world_size=7, num_trainer=3, rollout_tp=(("short", 1), ("short", 1), ("long", 2)), buckets=B3)
    assert rm.trainer_ranks == (0, 1, 2)
    assert [(i.instance_id, i.bucket, i.ranks) for i in rm.instances] == [(0, "short", (3,)), (1, "short", (4,)), (2, "long", (5, 6))]
    with pytest.raises(ValueError, match=r"use 3 ranks but 7 - 3 trainer = 4 are left for rollout; make the TP degrees add up to 4"):
        split_role_map(world_size=7, num_trainer=3, rollout_tp=(("short", 1), ("long", 2)), buckets=B3)


def test_colocated_map():
    rm = colocated_role_map(world_size=4, tp=2)
    assert rm.colocated and rm.trainer_ranks == (0, 1, 2, 3)
    assert [i.ranks for i in rm.instances] == [(0, 1), (2, 3)]
    assert rm.roles_of(1) == ("trainer", "rollout")
    assert rm.describe() == "v0 train=4 colocated | short:TP2x2"
    with pytest.raises(ValueError, match=r"colocate: TP=4 does not divide world_size=6; pick a TP that divides it"):
        colocated_role_map(world_size=6, tp=4)


def test_every_tp_default_is_the_one_valid_tp():
    """The TP degrees are defined once (`VALID_TP`); the planner, the first layout and the cost model use it."""
    import inspect

    from scheduler.costmodel import get_cost_model
    from scheduler.planner import PlannerConfig
    from scheduler.systems import initial_role_map

    assert VALID_TP == (1, 2, 4, 8)
    assert PlannerConfig().allowed_tp is VALID_TP
    assert inspect.signature(initial_role_map).parameters["allowed_tp"].default is VALID_TP
    assert get_cost_model("h100", "qwen3-14b").valid_tp() == VALID_TP
