"""Benchmark: role-map rebuild time on 8 gloo ranks, and weight transfer against a raw broadcast.

    python -m bench.groups [--ranks 8] [--rebuilds 20] [--mb 64] [--repeats 9]

Both measurements run in the same job, on the same ranks, so their ratio is meaningful on a
noisy machine. The transfer sends a model-like state dict (many tensors, ~`--mb` MiB fp32) from
rank 0 to every other rank with `engine.runtime.weights`; the baseline broadcasts the same number of
bytes as one flat tensor with `dist.broadcast`. Last line: `transfer_vs_raw_broadcast: R`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
import torch.distributed as dist

from engine.devices import DeviceInfo
from engine.runtime.groups import GroupManager
from engine.runtime.launch import spawn
from engine.runtime.weights import WeightReceiver, WeightSender, manifest
from scheduler.layout import Bucket, random_role_map

BUCKETS = (Bucket(name="short", max_tokens=4096), Bucket(name="long", max_tokens=None))


def _state(mb: float) -> dict[str, torch.Tensor]:
    """~mb MiB in layer-shaped tensors (a few big matrices, many small vectors), like a checkpoint."""
    g = torch.Generator().manual_seed(0)
    out, left, i = {}, int(mb * 2**20 / 4), 0
    while left > 0:
        rows = min(1024, max(1, left // 1024))
        out[f"layers.{i}.w"] = torch.randn(rows, 1024, generator=g)
        out[f"layers.{i}.norm"] = torch.randn(1024, generator=g)
        left -= rows * 1024 + 1024
        i += 1
    return out


def _bench(ctx, rebuilds: int, mb: float, repeats: int, bucket_mb: float):
    mgr = GroupManager(ctx.store, global_rank=ctx.rank, world_size=ctx.world_size, rank_offset=0, timeout_s=60)
    rng = random.Random(7)
    rebuild_s = []
    for v in range(1, rebuilds + 1):
        dist.barrier()
        t0 = time.perf_counter()
        mgr.apply(random_role_map(rng, ctx.world_size, v, BUCKETS))
        rebuild_s.append(time.perf_counter() - t0)
    mgr.destroy()
    group = dist.new_group(list(range(ctx.world_size)))
    state = _state(mb)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    flat = torch.cat([t.reshape(-1) for t in state.values()]) if ctx.rank == 0 else torch.empty(nbytes // 4)
    raw_s, xfer_s, fresh_s = [], [], []
    sender = WeightSender(group, 0, bucket_size_mb=bucket_mb, device=torch.device("cpu"))
    receiver = WeightReceiver(group, 0, manifest(state), bucket_size_mb=bucket_mb, device=torch.device("cpu"))
    for r in range(repeats):  # alternate the two so drift in machine load hits both alike
        dist.barrier()
        t0 = time.perf_counter()
        dist.broadcast(flat, src=0, group=group)
        dist.barrier()
        raw_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()  # raw again, into a new buffer each time (what atomic staging pays)
        dist.broadcast(flat if ctx.rank == 0 else torch.empty(nbytes // 4), src=0, group=group)
        dist.barrier()
        fresh_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        if ctx.rank == 0:
            sender.send(state, r + 1)
        else:
            receiver.recv()
        dist.barrier()
        xfer_s.append(time.perf_counter() - t0)
    return {"rebuild_s": rebuild_s, "raw_s": raw_s, "xfer_s": xfer_s, "fresh_s": fresh_s, "bytes": nbytes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--rebuilds", type=int, default=20)
    ap.add_argument("--mb", type=float, default=64.0)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--bucket-mb", type=float, default=64.0)
    args = ap.parse_args()
    res = spawn(_bench, args.ranks, (args.rebuilds, args.mb, args.repeats, args.bucket_mb),
                device_info=DeviceInfo("cpu", 2), timeout_s=300)[0]
    gb = res["bytes"] / 1e9
    rebuild_ms = statistics.median(res["rebuild_s"]) * 1e3
    raw = gb / statistics.median(res["raw_s"])
    xfer = gb / statistics.median(res["xfer_s"])
    print(f"{'measure':<36} {'value':>10}")
    print(f"{'role-map rebuild, median of ' + str(args.rebuilds):<36} {rebuild_ms:>8.1f} ms  ({args.ranks} gloo ranks)")
    print(f"{'rebuild p90':<36} {sorted(res['rebuild_s'])[int(0.9 * len(res['rebuild_s'])) - 1] * 1e3:>8.1f} ms")
    print(f"{'raw dist.broadcast':<36} {raw:>8.3f} GB/s  ({res['bytes'] / 2**20:.0f} MiB to {args.ranks - 1} ranks)")
    print(f"{'raw, into a new buffer each time':<36} {gb / statistics.median(res['fresh_s']):>8.3f} GB/s")
    print(f"{'engine.runtime.weights transfer':<36} {xfer:>8.3f} GB/s  (buckets of {args.bucket_mb:g} MiB)")
    print(f"transfer_vs_raw_broadcast: {xfer / raw:.3f}")


if __name__ == "__main__":
    main()
