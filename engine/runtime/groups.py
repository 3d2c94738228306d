"""Role map -> process groups, rebuilt at step boundaries in one deterministic order.

Every process in the default group (coordinator included) calls `GroupManager.apply(role_map)`
with the same map at the same step boundary:

  1. agree: each rank writes (rebuild epoch, role-map version, digest) to the store and waits for
     all others; a rank that is missing or holds another version fails loudly with the ranks
     named (a skipped `new_group` would otherwise hang everyone: docs/platform.md);
  2. create the new groups, always in this order: trainer group, one TP group per rollout
     instance with TP > 1 (by instance id), the weight-sync group (first trainer rank + every
     rollout rank). With `leader_engines` (`--rollout.backend vllm`) an instance's engine spans its
     ranks by itself: the leader's vLLM runs one worker per rank of the instance in its own world,
     so there is no TP group and only each instance's leader joins the weight sync. A trainer or TP
     group whose rank set is unchanged is kept, not re-created (every rank makes the same choice
     from the same two maps), so an untouched FSDP trainer or TP instance keeps its device mesh and
     its in-flight state across the change;
  3. destroy the previous groups that were not kept.

Devices (`devices`: each global rank's "host/device"): a group is created with the default
backend ("cpu:gloo,cuda:nccl": device tensors over nccl, object messages and CPU tensors over
gloo) unless its members share a device, which NCCL/HCCL refuse: then the weight-sync group is
gloo-only (the weights are staged on the host), and a trainer or TP group is refused before any
group is touched (`engine/devices.py`).

Role maps number worker ranks 0..N-1; with a coordinator at global rank 0 (our launcher and
torchrun alike) worker i is global rank i + `rank_offset`.

Invariants (tests/engine/runtime/test_groups.py): after any sequence of valid maps, a collective in every new
group sums over exactly its members; version disagreement raises instead of hanging; rebuilds
do not leak threads or file descriptors; with `leader_engines` there is no TP group and the sync
group is the trainer's first rank and the instance leaders; with ranks sharing a device the sync group is gloo and
a trainer group over a shared device raises on every rank (tests/engine/test_devices.py).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
from dataclasses import dataclass, field

import torch.distributed as dist

from engine.devices import check_compute_group, group_backend
from scheduler.layout import RoleMap

log = logging.getLogger(__name__)


def role_map_digest(role_map: RoleMap) -> str:
    return hashlib.sha1(json.dumps(role_map.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Groups:
    """The groups of one role-map version, as seen from one rank (None where not a member)."""

    role_map: RoleMap
    trainer: dist.ProcessGroup | None = None
    tp: dict[int, dist.ProcessGroup] = field(default_factory=dict)  # instance id -> TP group (TP > 1)
    sync: dist.ProcessGroup | None = None
    sync_src: int = -1  # global rank that broadcasts weights in `sync`
    sync_backend: str | None = None  # None: the default "cpu:gloo,<dev>:<nccl|hccl>"; "gloo": members share a device
    owned: list[dist.ProcessGroup] = field(default_factory=list)  # every group created (members or not)
    keyed: dict[tuple[int, ...], dist.ProcessGroup] = field(default_factory=dict)  # trainer/TP groups by global ranks


class GroupManager:
    def __init__(self, store: dist.Store, *, global_rank: int, world_size: int, rank_offset: int, timeout_s: float = 60.0,
                 device_kind: str = "cpu", devices: list[str] | None = None, leader_engines: bool = False):
        self.leader_engines = leader_engines  # vLLM: an instance's leader hosts the engine over all its ranks
        self.device_kind = device_kind  # cpu | cuda | npu
        self.devices = devices  # device key ("host/cuda:0") per global rank; None: every rank on CPU
        self.store = store
        self.global_rank = global_rank
        self.world_size = world_size  # processes in the default group
        self.rank_offset = rank_offset
        self.timeout_s = timeout_s
        self.epoch = 0
        self.current: Groups | None = None

    def to_global(self, worker_ranks) -> list[int]:
        return [r + self.rank_offset for r in worker_ranks]

    def apply(self, role_map: RoleMap) -> Groups:
        role_map.validate()
        need = role_map.world_size + self.rank_offset
        if need != self.world_size:
            raise ValueError(
                f"role map v{role_map.version} places {role_map.world_size} workers (+{self.rank_offset} coordinator) "
                f"but the process group has {self.world_size} ranks; plan for {self.world_size - self.rank_offset} workers"
            )
        self._check_devices(role_map)  # before any rank touches a group: all ranks raise alike
        self._agree(role_map)
        old = self.current
        reusable = {} if old is None else old.keyed
        self.current = self._build(role_map, reusable)
        if old is not None:
            kept = {id(pg) for pg in self.current.owned}
            self._destroy([pg for pg in old.owned if id(pg) not in kept])
        return self.current

    def device_keys(self, worker_ranks) -> list[str]:
        """Each worker rank's device key (\"host/cuda:0\"); empty on CPU."""
        return [self.devices[r] for r in self.to_global(worker_ranks)] if self.devices else []

    def _check_devices(self, role_map: RoleMap) -> None:
        if not self.devices:
            return
        if len(role_map.trainer_ranks) > 1:
            check_compute_group(self.device_kind, self.device_keys(role_map.trainer_ranks),
                                f"role map v{role_map.version}: the trainer group {list(role_map.trainer_ranks)}")
        for inst in role_map.instances:
            if inst.tp > 1:
                check_compute_group(self.device_kind, self.device_keys(inst.ranks),
                                    f"role map v{role_map.version}: TP{inst.tp} instance {inst.instance_id} {list(inst.ranks)}")

    def _agree(self, role_map: RoleMap) -> None:
        self.epoch += 1
        mine = f"{role_map.version}:{role_map_digest(role_map)}"
        prefix = f"libra/rolemap/{self.epoch}"
        self.store.set(f"{prefix}/{self.global_rank}", mine)
        keys = [f"{prefix}/{r}" for r in range(self.world_size)]
        try:
            self.store.wait(keys, datetime.timedelta(seconds=self.timeout_s))
        except Exception as exc:  # the store raises its own timeout types; name the missing ranks
            missing = [r for r, k in enumerate(keys) if not self.store.check([k])]
            raise RuntimeError(
                f"rank {self.global_rank}: ranks {missing} did not confirm role map v{role_map.version} "
                f"(rebuild #{self.epoch}) within {self.timeout_s:.0f} s; they are dead, hung or on another step"
            ) from exc
        seen = {r: self.store.get(k).decode() for r, k in enumerate(keys)}
        wrong = {r: v for r, v in seen.items() if v != mine}
        if wrong:
            raise RuntimeError(
                f"rank {self.global_rank}: role map disagreement at rebuild #{self.epoch}: this rank has "
                f"v{mine}, ranks {sorted(wrong)} have {sorted(set(wrong.values()))}; refusing to build groups"
            )
        if self.epoch > 2:  # keep the store small over long runs
            self.store.delete_key(f"libra/rolemap/{self.epoch - 2}/{self.global_rank}")

    def _new_group(self, worker_ranks, groups: Groups, reusable: dict | None = None,
                   backend: str | None = None) -> dist.ProcessGroup | None:
        ranks = tuple(sorted(self.to_global(worker_ranks)))
        pg = (reusable or {}).get(ranks)
        if pg is None:
            pg = dist.new_group(ranks=list(ranks), timeout=datetime.timedelta(seconds=self.timeout_s), backend=backend)
        groups.owned.append(pg)
        if reusable is not None:
            groups.keyed[ranks] = pg
        return pg if self.global_rank in ranks else None

    def _build(self, role_map: RoleMap, reusable: dict) -> Groups:
        groups = Groups(role_map=role_map)
        groups.trainer = self._new_group(role_map.trainer_ranks, groups, reusable)
        for inst in sorted(role_map.instances, key=lambda i: i.instance_id):
            if inst.tp > 1 and not self.leader_engines:
                pg = self._new_group(inst.ranks, groups, reusable)
                if pg is not None:
                    groups.tp[inst.instance_id] = pg
        src = role_map.trainer_ranks[0]
        receivers = [i.ranks[0] for i in role_map.instances] if self.leader_engines else role_map.rollout_ranks
        sync_members = sorted({src, *receivers})
        if len(sync_members) > 1:
            groups.sync_backend = group_backend(self.device_kind, self.device_keys(sync_members)) if self.devices else None
            groups.sync = self._new_group(sync_members, groups, backend=groups.sync_backend)
        groups.sync_src = src + self.rank_offset
        log.debug("rank %d built groups for %s", self.global_rank, role_map.describe())
        return groups

    def destroy(self) -> None:
        if self.current is not None:
            self._destroy(self.current.owned)
        self.current = None

    @staticmethod
    def _destroy(pgs) -> None:
        for pg in pgs:
            if pg is not None and pg != dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(pg)
