"""Process groups rebuilt from role maps on 8 gloo ranks: sums, disagreement, no leaks; vLLM's leader-only layout."""

import os
import random

import pytest
import torch
import torch.distributed as dist

from engine.devices import DeviceInfo
from engine.runtime.groups import GroupManager
from engine.runtime.launch import WorkerFailed, spawn
from scheduler.layout import Bucket, random_role_map, split_role_map

CPU = DeviceInfo("cpu", 2)
BUCKETS = (Bucket(name="short", max_tokens=512), Bucket(name="long", max_tokens=None))


def _num_threads() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


def _check_sum(pg, members, rank):
    if pg is None:
        assert rank not in members
        return
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t, group=pg)
    assert t.item() == sum(m + 1 for m in members), (rank, members, t.item())


def _rebuild_many(ctx, num_maps):
    mgr = GroupManager(ctx.store, global_rank=ctx.rank, world_size=ctx.world_size, rank_offset=0, timeout_s=30)
    rng = random.Random(1234)  # every rank draws the same sequence
    counts = []
    for version in range(1, num_maps + 1):
        rm = random_role_map(rng, ctx.world_size, version, BUCKETS)
        g = mgr.apply(rm)
        _check_sum(g.trainer, rm.trainer_ranks, ctx.rank)
        for inst in rm.instances:
            if inst.tp > 1:
                _check_sum(g.tp.get(inst.instance_id), inst.ranks, ctx.rank)
        _check_sum(g.sync, sorted({rm.trainer_ranks[0], *rm.rollout_ranks}), ctx.rank)
        counts.append((len(os.listdir("/proc/self/fd")), _num_threads()))
    mgr.destroy()
    return counts


def test_twenty_role_map_changes_on_eight_ranks():
    counts = spawn(_rebuild_many, 8, (20,), device_info=CPU, timeout_s=60)
    for rank, per_rebuild in enumerate(counts):
        fds_2, threads_2 = per_rebuild[1]
        fds_20, threads_20 = per_rebuild[-1]
        assert fds_20 <= fds_2 and threads_20 <= threads_2, f"rank {rank} leaks: {per_rebuild}"


def _disagree(ctx):
    mgr = GroupManager(ctx.store, global_rank=ctx.rank, world_size=ctx.world_size, rank_offset=0, timeout_s=5)
    rm = random_role_map(random.Random(0), ctx.world_size, 1 if ctx.rank else 2, BUCKETS)
    mgr.apply(rm)


def test_version_disagreement_fails_loudly():
    with pytest.raises(WorkerFailed, match="role map disagreement"):
        spawn(_disagree, 3, device_info=CPU, timeout_s=30)


def _missing_rank(ctx):
    mgr = GroupManager(ctx.store, global_rank=ctx.rank, world_size=ctx.world_size, rank_offset=0, timeout_s=3)
    if ctx.rank == 2:  # skips the rebuild: the others must not hang
        import time

        time.sleep(8)
        return
    mgr.apply(random_role_map(random.Random(0), ctx.world_size, 1, BUCKETS))


def test_missing_rank_is_named():
    with pytest.raises(WorkerFailed, match=r"ranks \[2\] did not confirm role map v1"):
        spawn(_missing_rank, 3, device_info=CPU, timeout_s=30)


def _keep_unchanged(ctx):
    mgr = GroupManager(ctx.store, global_rank=ctx.rank, world_size=ctx.world_size, rank_offset=0, timeout_s=30)
    a = split_role_map(world_size=4, num_trainer=1, rollout_tp=(("long", 2), ("short", 1)), buckets=BUCKETS, version=1)
    b = split_role_map(world_size=4, num_trainer=1, rollout_tp=(("long", 2), ("short", 1)), buckets=BUCKETS, version=2)
    c = split_role_map(world_size=4, num_trainer=2, rollout_tp=(("long", 2),), buckets=BUCKETS, version=3)
    g1 = mgr.apply(a).tp.get(0)
    g2 = mgr.apply(b).tp.get(0)
    g3 = mgr.apply(c)  # ranks 2,3 now form the TP group: a new one
    _check_sum(g3.tp.get(0), (2, 3), ctx.rank)
    return g1 is g2, g3.tp.get(0) is g2 and g2 is not None


def test_unchanged_groups_are_kept_and_changed_ones_rebuilt():
    out = spawn(_keep_unchanged, 4, device_info=CPU, timeout_s=30)
    assert [same for same, _ in out] == [True, True, True, True]  # (None is None on non-members)
    assert [rebuilt_same for _, rebuilt_same in out] == [False, False, False, False]


def _leader_engines(ctx):
    """vLLM's layout: an instance's leader hosts the engine over its ranks, so no TP group, and weights go only
    to the trainer's first rank and each instance's leader."""
    mgr = GroupManager(ctx.store, global_rank=ctx.rank, world_size=ctx.world_size, rank_offset=0, timeout_s=30,
                       leader_engines=True)
    rm = split_role_map(world_size=4, num_trainer=1, rollout_tp=(("long", 2), ("short", 1)), buckets=BUCKETS, version=1)
    g = mgr.apply(rm)
    leaders = sorted({rm.trainer_ranks[0], *(i.ranks[0] for i in rm.instances)})
    _check_sum(g.sync, leaders, ctx.rank)
    mgr.destroy()
    return dict(g.tp), leaders


def test_leader_engines_make_no_tp_group_and_sync_only_the_leaders():
    out = spawn(_leader_engines, 4, device_info=CPU, timeout_s=30)
    assert all(tp == {} for tp, _ in out)
    assert out[0][1] == [0, 1, 3]  # trainer 0, TP2 instance on ranks 1-2 (leader 1), TP1 instance on rank 3


# ---- ranks that share a device (what NCCL refuses), decided on gloo with fake device keys --------

def _shared_device(ctx, devices):
    mgr = GroupManager(ctx.store, global_rank=ctx.rank, world_size=ctx.world_size, rank_offset=0, timeout_s=30,
                       device_kind="cuda", devices=devices)
    one_trainer = split_role_map(world_size=3, num_trainer=1, rollout_tp=(("short", 1), ("long", 1)), buckets=BUCKETS, version=1)
    g = mgr.apply(one_trainer)
    _check_sum(g.sync, (0, 1, 2), ctx.rank)  # a gloo-only group still sums over its members
    backend = g.sync_backend
    two_trainers = split_role_map(world_size=3, num_trainer=2, rollout_tp=(("short", 1),), buckets=BUCKETS, version=2)
    try:
        mgr.apply(two_trainers)
    except ValueError as exc:
        return backend, str(exc)
    finally:
        mgr.destroy()
    return backend, None


def test_a_sync_group_over_a_shared_gpu_is_gloo_and_a_shared_trainer_group_is_refused():
    shared = ["node/cuda:0", "node/cuda:0", "node/cuda:1"]
    out = spawn(_shared_device, 3, (shared,), device_info=CPU, timeout_s=60)
    assert [backend for backend, _ in out] == ["gloo"] * 3
    assert all(err and "the trainer group [0, 1] would put 2 ranks on 1 device(s) (node/cuda:0 shared)" in err
               and "--system static" in err for _, err in out), out  # every rank raises alike: nobody hangs


def test_distinct_gpus_keep_the_default_backend():
    out = spawn(_shared_device, 3, (["node/cuda:0", "node/cuda:1", "node/cuda:2"],), device_info=CPU, timeout_s=60)
    assert out == [(None, None)] * 3
