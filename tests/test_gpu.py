"""On a CUDA node only (`-m gpu`, run by bench/device_check.sh): device binding, sync backends, precision.

The same decisions are unit-tested on CPU in tests/engine/test_devices.py, tests/engine/runtime/test_groups.py and
tests/engine/test_precision.py; here they meet a real device.
"""

import pytest
import torch

from engine.devices import DeviceInfo
from engine.runtime.groups import GroupManager
from engine.runtime.launch import spawn
from engine.runtime.weights import WeightReceiver, WeightSender, manifest
from scheduler.layout import Bucket, split_role_map

pytestmark = pytest.mark.gpu
BUCKETS = (Bucket(name="short", max_tokens=512), Bucket(name="long", max_tokens=None))


def _where(ctx):
    current = torch.cuda.current_device() if ctx.device.type == "cuda" else None
    return str(ctx.device), current, ctx.device_keys(30)


def test_every_rank_is_bound_before_its_groups_and_the_coordinator_stays_on_cpu():
    n = torch.cuda.device_count()
    out = spawn(_where, 3, device_info=DeviceInfo("cuda", n), timeout_s=120)
    assert [d for d, _, _ in out] == ["cpu", "cuda:0", f"cuda:{1 % n}"]
    assert [c for _, c, _ in out] == [None, 0, 1 % n]
    assert out[0][2] == out[1][2] == out[2][2] and out[0][2][0].endswith("/cpu")


def _sync(ctx, num_gpus):
    mgr = GroupManager(ctx.store, global_rank=ctx.rank, world_size=ctx.world_size, rank_offset=1, timeout_s=60,
                       device_kind="cuda", devices=ctx.device_keys(30))
    rm = split_role_map(world_size=2, num_trainer=1, rollout_tp=(("short", 1),), buckets=BUCKETS, version=1)
    groups = mgr.apply(rm)
    staging = torch.device("cpu") if groups.sync_backend == "gloo" else ctx.device
    master = {"w": torch.arange(4096, dtype=torch.float32, device=ctx.device if ctx.rank else "cpu") / 7}
    result = groups.sync_backend
    if ctx.rank == 1:
        WeightSender(groups.sync, groups.sync_src, bucket_size_mb=1, device=staging).send(master, 1, dtype=torch.bfloat16)
    elif ctx.rank == 2:
        want = {"w": master["w"].to(torch.bfloat16)}
        recv = WeightReceiver(groups.sync, groups.sync_src, manifest(want), bucket_size_mb=1, device=staging)
        recv.recv()
        got = recv.weights.read()[1]["w"]
        result = (result, str(got.device), bool(torch.equal(got.to(ctx.device), want["w"])))
    mgr.destroy()
    return result


def test_two_ranks_on_one_gpu_sync_over_gloo_through_the_host():
    out = spawn(_sync, 3, (1,), device_info=DeviceInfo("cuda", 1), timeout_s=120)
    assert out[2] == ("gloo", "cpu", True)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for an NCCL sync group")
def test_ranks_on_two_gpus_sync_over_nccl_on_the_device():
    out = spawn(_sync, 3, (2,), device_info=DeviceInfo("cuda", 2), timeout_s=120)
    assert out[2] == (None, "cuda:1", True)


def test_rollout_model_is_bf16_on_cuda():
    from engine.models import load_policy
    from engine.precision import precision_for

    model, _ = load_policy("tiny", device="cuda", dtype=precision_for("cuda").rollout_dtype)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16} and next(model.parameters()).is_cuda
