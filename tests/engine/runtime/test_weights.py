"""Weight transfer trainer -> 3 rollout ranks: bit-exact, versioned, atomic, manifest-checked."""

import threading

import pytest
import torch
import torch.distributed as dist

from engine.devices import DeviceInfo
from engine.runtime.launch import WorkerFailed, spawn
from engine.runtime.weights import VersionedWeights, WeightReceiver, WeightSender, manifest, plan_buckets, TensorSpec

CPU = DeviceInfo("cpu", 2)


def _params(version: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1000 + version)
    return {
        "embed.weight": torch.randn(300, 64, generator=g),
        "layer.0.w": torch.randn(64, 64, generator=g),
        "layer.0.b": torch.randn(64, generator=g).to(torch.bfloat16),
        "norm.weight": torch.randn(64, generator=g),
        "head.weight": torch.randn(300, 64, generator=g),
    }


def _transfer(ctx, num_versions):
    group = dist.new_group(list(range(ctx.world_size)))
    if ctx.rank == 0:
        sender = WeightSender(group, 0, bucket_size_mb=0.05, device=torch.device("cpu"))
        for v in range(1, num_versions + 1):
            sender.send(_params(v), v)
        return None
    recv = WeightReceiver(group, 0, manifest(_params(0)), bucket_size_mb=0.05, device=torch.device("cpu"))
    mixed, stop = [], threading.Event()

    def reader():  # hammers the published weights while versions arrive (buffers get recycled)
        while not stop.is_set():
            with recv.weights.pinned() as (version, tensors):
                if version > 0 and any(not torch.equal(t, _params(version)[k]) for k, t in tensors.items()):
                    mixed.append(version)

    t = threading.Thread(target=reader)
    t.start()
    seen = []
    for _ in range(num_versions):
        stats = recv.recv()
        version, tensors = recv.weights.read()
        assert version == stats.version
        exact = all(torch.equal(tensors[k], v) and tensors[k].dtype == v.dtype for k, v in _params(version).items())
        seen.append((version, exact))
    stop.set()
    t.join()
    return seen, mixed


def test_weights_arrive_bit_exact_with_version_on_three_receivers():
    out = spawn(_transfer, 4, (8,), device_info=CPU, timeout_s=60)
    for rank, (seen, mixed) in enumerate(out[1:], start=1):
        assert seen == [(v, True) for v in range(1, 9)], f"rank {rank}: {seen}"
        assert mixed == [], f"rank {rank} observed a half-applied version {mixed}"


def _mismatch(ctx):
    group = dist.new_group([0, 1])
    if ctx.rank == 0:
        WeightSender(group, 0, bucket_size_mb=1, device=torch.device("cpu")).send(_params(1), 1)
    else:
        wrong = dict(_params(0))
        wrong["extra"] = torch.zeros(3)
        WeightReceiver(group, 0, manifest(wrong), bucket_size_mb=1, device=torch.device("cpu")).recv()


def test_manifest_mismatch_is_named():
    with pytest.raises(WorkerFailed, match=r"rank 1 .*weight manifest mismatch"):
        spawn(_mismatch, 2, device_info=CPU, timeout_s=30)


def test_buckets_respect_size_and_dtype():
    specs = [TensorSpec("a", (10,), torch.float32), TensorSpec("b", (10,), torch.float32),
             TensorSpec("c", (100,), torch.float32), TensorSpec("d", (4,), torch.bfloat16)]
    assert [[s.name for s in b] for b in plan_buckets(specs, 80)] == [["a", "b"], ["c"], ["d"]]


def test_spare_buffers_are_recycled_only_when_unpinned():
    w = VersionedWeights()
    a, b = [torch.zeros(4)], [torch.zeros(4)]
    w.publish(1, {"x": a[0]}, a)
    with w.pinned() as (version, _):
        assert version == 1
        w.publish(2, {"x": b[0]}, b)  # a is spare now, but pinned by this block
        assert w.take_spare([(4, torch.float32)]) is None
    assert w.take_spare([(4, torch.float32)]) is a
    assert w.take_spare([(4, torch.float32)]) is None


def test_versioned_weights_refuse_going_back():
    w = VersionedWeights()
    w.publish(2, {})
    with pytest.raises(AssertionError, match="went back"):
        w.publish(1, {})


def test_bucket_size_must_be_positive():
    with pytest.raises(ValueError, match="bucket_size_mb=0 must be > 0"):
        WeightSender(None, 0, bucket_size_mb=0, device=torch.device("cpu"))
