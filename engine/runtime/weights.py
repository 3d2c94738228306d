"""Trainer -> rollout weight transfer over the sync group, versioned and applied atomically.

Algorithm:
  1. Both sides derive the same manifest (parameter names, shapes, dtypes, in state-dict order)
     from their own model and cut it into buckets of at most `bucket_size_mb`, one dtype each.
  2. The sender broadcasts a header (policy version, manifest hash, bytes), then each bucket as
     one flat tensor (one `broadcast` per bucket instead of one per parameter).
  3. A receiver fills staging buffers that no reader holds (recycled from two versions back, or
     new) and only then publishes the whole version at once through `VersionedWeights` (a
     lock-guarded swap), so a reader sees version v or v+1, never a mix. The rollout engine
     applies the published dict between decode iterations.

The receiver takes a `shard_fn(name, full_tensor) -> tensor` hook: identity for full replicas,
the TP slice for tensor-parallel receivers (the seam for sharded receivers).

The sender may cast floating tensors to the receiver's dtype bucket by bucket (`dtype=`): the
trainer's fp32 master weights go to a bf16 rollout model without a full-size bf16 copy.

Invariants (tests/engine/runtime/test_weights.py, tests/engine/test_precision.py): received tensors are bit-exact
(after the cast, when one is asked for) and carry the sender's version; a reader never
observes a half-applied version; a manifest mismatch (another model) raises naming both hashes.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def manifest(named: dict[str, torch.Tensor], cast: torch.dtype | None = None) -> list[TensorSpec]:
    """Specs in state-dict order; `cast` replaces the dtype of floating tensors (what a cast send moves)."""
    return [TensorSpec(k, tuple(v.shape), cast if cast is not None and v.is_floating_point() else v.dtype)
            for k, v in named.items()]


def manifest_hash(specs: list[TensorSpec]) -> int:
    text = ";".join(f"{s.name}:{s.shape}:{s.dtype}" for s in specs)
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:7], "big")  # fits an int64


def plan_buckets(specs: list[TensorSpec], bucket_bytes: int) -> list[list[TensorSpec]]:
    """Consecutive specs of one dtype, each bucket at most `bucket_bytes` (a bigger tensor is alone)."""
    buckets: list[list[TensorSpec]] = []
    cur: list[TensorSpec] = []
    cur_bytes = 0
    for s in specs:
        nbytes = s.numel * s.dtype.itemsize
        if cur and (s.dtype != cur[0].dtype or cur_bytes + nbytes > bucket_bytes):
            buckets.append(cur)
            cur, cur_bytes = [], 0
        cur.append(s)
        cur_bytes += nbytes
    if cur:
        buckets.append(cur)
    return buckets


class VersionedWeights:
    """The latest complete version a receiver holds; swapped whole under a lock.

    Receive buffers are recycled (a fresh buffer per version costs page faults that halve the
    transfer rate on CPU: bench.groups): a version's buffers become spare when the next version
    is published and are reused for a later one only while nobody holds them `pinned()`. A
    consumer that keeps tensors after `read()` without a pin must be done with them before the
    version after next arrives (the rollout engine applies each version at its next step).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._version = -1
        self._tensors: dict[str, torch.Tensor] = {}
        self._buffers: list[torch.Tensor] | None = None
        self._spare: list[list[torch.Tensor]] = []
        self._pins: dict[int, int] = {}

    def publish(self, version: int, tensors: dict[str, torch.Tensor], buffers: list[torch.Tensor] | None = None) -> None:
        with self._lock:
            assert version > self._version, f"policy version went back: {self._version} -> {version}"
            if self._buffers is not None:
                self._spare.append(self._buffers)
            self._version, self._tensors, self._buffers = version, tensors, buffers

    def read(self) -> tuple[int, dict[str, torch.Tensor]]:
        with self._lock:
            return self._version, self._tensors

    @contextlib.contextmanager
    def pinned(self):
        """(version, tensors) that no later receive may overwrite until the block ends."""
        with self._lock:
            key = id(self._buffers)
            self._pins[key] = self._pins.get(key, 0) + 1
            version, tensors = self._version, self._tensors
        try:
            yield version, tensors
        finally:
            with self._lock:
                self._pins[key] -= 1

    def take_spare(self, layout: list[tuple[int, torch.dtype]]) -> list[torch.Tensor] | None:
        """A spare buffer set of this (numel, dtype) layout that nobody pins, or None."""
        with self._lock:
            for i, bufs in enumerate(self._spare):
                fits = [(b.numel(), b.dtype) for b in bufs] == layout
                if fits and not self._pins.get(id(bufs)):
                    return self._spare.pop(i)
        return None


@dataclass
class TransferStats:
    version: int
    num_bytes: int
    seconds: float


class _Endpoint:
    def __init__(self, group: dist.ProcessGroup, src: int, *, bucket_size_mb: float, device: torch.device):
        if bucket_size_mb <= 0:
            raise ValueError(f"sync bucket_size_mb={bucket_size_mb} must be > 0; 32-256 MB suits most links")
        self.group, self.src, self.device = group, src, device
        self.bucket_bytes = int(bucket_size_mb * 2**20)

    def _header(self, values: list[int]) -> torch.Tensor:
        h = torch.tensor(values, dtype=torch.int64)
        dist.broadcast(h, src=self.src, group=self.group)
        return h


class WeightSender(_Endpoint):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._flat: list[torch.Tensor] = []  # bucket buffers, reused: the broadcast returns only once sent

    def send(self, named: dict[str, torch.Tensor], version: int, *, dtype: torch.dtype | None = None) -> TransferStats:
        """Broadcast `named` as `version`; `dtype` casts floating tensors per bucket (fp32 master -> bf16 rollout)."""
        t0 = time.perf_counter()
        specs = manifest(named, dtype)
        total = sum(s.numel * s.dtype.itemsize for s in specs)
        self._header([version, manifest_hash(specs), total])
        for i, bucket in enumerate(plan_buckets(specs, self.bucket_bytes)):
            flat = self._buffer(i, sum(s.numel for s in bucket), bucket[0].dtype)
            torch.cat([named[s.name].detach().reshape(-1).to(self.device, s.dtype) for s in bucket], out=flat)
            dist.broadcast(flat, src=self.src, group=self.group)
        return TransferStats(version, total, time.perf_counter() - t0)

    def _buffer(self, i: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        if i == len(self._flat):
            self._flat.append(torch.empty(0, dtype=dtype, device=self.device))
        if self._flat[i].numel() != numel or self._flat[i].dtype != dtype:
            self._flat[i] = torch.empty(numel, dtype=dtype, device=self.device)
        return self._flat[i]


class WeightReceiver(_Endpoint):
    def __init__(
        self,
        group: dist.ProcessGroup,
        src: int,
        specs: list[TensorSpec],
        *,
        bucket_size_mb: float,
        device: torch.device,
        shard_fn: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
    ):
        super().__init__(group, src, bucket_size_mb=bucket_size_mb, device=device)
        self.specs = specs
        self.hash = manifest_hash(specs)
        self.shard_fn = shard_fn or (lambda name, t: t)
        self.weights = VersionedWeights()

    def recv(self) -> TransferStats:
        """Receive one version completely, then publish it; returns the transfer stats."""
        t0 = time.perf_counter()
        version, their_hash, total = self._header([0, 0, 0]).tolist()
        if their_hash != self.hash:
            raise RuntimeError(
                f"weight manifest mismatch: the trainer sends manifest {their_hash:x}, this rollout rank "
                f"expects {self.hash:x}; trainer and rollout must load the same model architecture"
            )
        staged: dict[str, torch.Tensor] = {}
        buckets = plan_buckets(self.specs, self.bucket_bytes)
        layout = [(sum(s.numel for s in b), b[0].dtype) for b in buckets]
        buffers = self.weights.take_spare(layout) or [torch.empty(n, dtype=dt, device=self.device) for n, dt in layout]
        for bucket, flat in zip(buckets, buffers):
            dist.broadcast(flat, src=self.src, group=self.group)
            for s, piece in zip(bucket, torch.split(flat, [s.numel for s in bucket])):
                staged[s.name] = self.shard_fn(s.name, piece.view(s.shape))
        self.weights.publish(version, staged, buffers)
        return TransferStats(version, total, time.perf_counter() - t0)
