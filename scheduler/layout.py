"""Role maps: which ranks train and which rollout instances (buckets, TP degree) exist.

A `RoleMap` is the one description of a placement that every part of Libra shares: the planner
returns one, the simulator runs one, `engine/runtime/groups.py` turns one into process groups, and
`--plan-only` prints one. It is plain frozen data (no torch), versioned so that every rank can
check it agrees with the coordinator before it touches a process group.

Buckets are ordered from short to long: bucket i serves trajectories up to
`buckets[i].max_tokens` tokens (the last one is unbounded). Each rollout instance belongs to one
bucket and spans `tp` consecutive-or-not ranks that form its tensor-parallel group.

Invariants (tests/scheduler/test_layout.py):
- `validate()` accepts a map iff ranks are in range and unique per role, every instance's TP
  degree is in {1, 2, 4, 8}, each bucket named by an instance exists, bucket limits increase
  with only the last unbounded, both stages are non-empty, and (unless colocated) no rank is both
  trainer and rollout and every rank has a role.
- `to_dict`/`from_dict` round-trip exactly (JSON-safe).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

VALID_TP = (1, 2, 4, 8)  # TP degrees a rollout instance may have
# Sequences one engine instance decodes at once, whatever its TP (vLLM's max_num_seqs; KV memory may
# cap it lower): the default of the engine (RolloutConfig.max_batch), of what the planner prices
# (PlannerConfig.max_batch, which a run derives from the engine's) and of the simulated engines.
MAX_SEQS_PER_INSTANCE = 128


@dataclass(frozen=True, kw_only=True)
class Bucket:
    name: str  # e.g. "short", "medium", "long"
    max_tokens: int | None  # longest trajectory (total tokens) it serves; None = unbounded


@dataclass(frozen=True, kw_only=True)
class BucketsConfig:
    """The rollout buckets: one definition that the first layout, the routers and the planner read."""

    names: tuple[str, ...] = ("short", "medium", "long")  # bucket names, short to long
    max_tokens: tuple[int, ...] = (4096, 12288)  # limits of all buckets but the last (unbounded)

    def __post_init__(self) -> None:
        n, lim = len(self.names), self.max_tokens
        if n < 1 or len(set(self.names)) != n:
            raise ValueError(f"BucketsConfig: names={self.names} must be non-empty and unique, e.g. short,medium,long")
        if len(lim) != n - 1:
            raise ValueError(f"BucketsConfig: max_tokens={lim} has {len(lim)} limits for {n} buckets; give {n - 1} "
                             "(the last bucket is unbounded)")
        if any(x < 1 for x in lim) or any(a >= b for a, b in zip(lim, lim[1:])):
            raise ValueError(f"BucketsConfig: max_tokens={lim} must be positive and strictly increasing, e.g. 4096,12288")

    def buckets(self) -> tuple[Bucket, ...]:
        limits = (*self.max_tokens, None)
        return tuple(Bucket(name=n, max_tokens=m) for n, m in zip(self.names, limits))

    def single(self) -> tuple[Bucket, ...]:
        """The one unbounded bucket of a homogeneous system (named after the first)."""
        return (Bucket(name=self.names[0], max_tokens=None),)


@dataclass(frozen=True, kw_only=True)
class RolloutInstance:
    instance_id: int  # unique within a role map, stable across maps where the ranks are unchanged
    bucket: str  # name of the bucket it serves
    ranks: tuple[int, ...]  # global ranks of its TP group; ranks[0] is the instance leader

    @property
    def tp(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True, kw_only=True)
class RoleMap:
    version: int  # bumped on every change; ranks refuse a map whose version they do not expect
    world_size: int  # number of worker ranks (devices) the map places
    trainer_ranks: tuple[int, ...]  # ranks of the trainer group (FSDP over these)
    instances: tuple[RolloutInstance, ...]  # rollout engine instances
    buckets: tuple[Bucket, ...] = field(default=(Bucket(name="short", max_tokens=None),))
    colocated: bool = False  # True for verl-style colocate: every rank both generates and trains

    # ---- derived views -------------------------------------------------------------------
    @property
    def rollout_ranks(self) -> tuple[int, ...]:
        return tuple(sorted(r for inst in self.instances for r in inst.ranks))

    def bucket_index(self, name: str) -> int:
        for i, b in enumerate(self.buckets):
            if b.name == name:
                return i
        raise KeyError(f"bucket {name!r} is not in {[b.name for b in self.buckets]}")

    def instances_in(self, bucket: str) -> tuple[RolloutInstance, ...]:
        return tuple(i for i in self.instances if i.bucket == bucket)

    def instance(self, instance_id: int) -> RolloutInstance:
        for inst in self.instances:
            if inst.instance_id == instance_id:
                return inst
        raise KeyError(f"instance {instance_id} is not in role map v{self.version}")

    def instance_of(self, rank: int) -> RolloutInstance | None:
        for inst in self.instances:
            if rank in inst.ranks:
                return inst
        return None

    def roles_of(self, rank: int) -> tuple[str, ...]:
        roles = []
        if rank in self.trainer_ranks:
            roles.append("trainer")
        if self.instance_of(rank) is not None:
            roles.append("rollout")
        return tuple(roles)

    def summary(self) -> dict[str, int]:
        """Ranks per role and per bucket, as written to metrics.jsonl `role_map`."""
        out = {"trainer": len(self.trainer_ranks), "rollout": len(self.rollout_ranks)}
        for b in self.buckets:
            out[f"bucket/{b.name}"] = sum(i.tp for i in self.instances_in(b.name))
        return out

    def describe(self, *, version: bool = True) -> str:
        """One short line, e.g. `v3 train=4 | short:TP1x2 long:TP2x1` (without `v3 ` for version=False)."""
        parts = []
        for b in self.buckets:
            tps: dict[int, int] = {}
            for inst in self.instances_in(b.name):
                tps[inst.tp] = tps.get(inst.tp, 0) + 1
            if tps:
                parts.append(b.name + ":" + "+".join(f"TP{tp}x{n}" for tp, n in sorted(tps.items())))
        mode = " colocated" if self.colocated else ""
        return (f"v{self.version} " if version else "") + f"train={len(self.trainer_ranks)}{mode} | " + " ".join(parts)

    # ---- validation --------------------------------------------------------------------
    def validate(self) -> RoleMap:
        """Raise ValueError naming the broken constraint; return self so calls chain."""
        g = self.world_size
        if g < 1:
            raise ValueError(f"role map v{self.version}: world_size={g} must be >= 1")
        if not self.trainer_ranks:
            raise ValueError(f"role map v{self.version}: no trainer ranks; give training >= 1 rank")
        if not self.instances:
            raise ValueError(f"role map v{self.version}: no rollout instances; give rollout >= 1 rank")
        if len(set(self.trainer_ranks)) != len(self.trainer_ranks):
            raise ValueError(f"role map v{self.version}: trainer ranks {self.trainer_ranks} repeat a rank")
        rollout = [r for inst in self.instances for r in inst.ranks]
        if len(set(rollout)) != len(rollout):
            raise ValueError(f"role map v{self.version}: rollout ranks {sorted(rollout)} repeat a rank")
        bad = [r for r in (*self.trainer_ranks, *rollout) if not 0 <= r < g]
        if bad:
            raise ValueError(f"role map v{self.version}: ranks {bad} are outside 0..{g - 1}")
        ids = [inst.instance_id for inst in self.instances]
        if len(set(ids)) != len(ids):
            raise ValueError(f"role map v{self.version}: instance ids {ids} repeat")
        self._validate_buckets()
        for inst in self.instances:
            if inst.tp not in VALID_TP:
                raise ValueError(
                    f"role map v{self.version}: instance {inst.instance_id} has TP={inst.tp}; "
                    f"TP must be one of {VALID_TP}"
                )
        if not self.colocated:
            both = sorted(set(self.trainer_ranks) & set(rollout))
            if both:
                raise ValueError(
                    f"role map v{self.version}: ranks {both} are both trainer and rollout; "
                    "set colocated=True for a colocated layout or give each rank one role"
                )
            idle = sorted(set(range(g)) - set(self.trainer_ranks) - set(rollout))
            if idle:
                raise ValueError(f"role map v{self.version}: ranks {idle} have no role; {g} ranks must all be placed")
        return self

    def _validate_buckets(self) -> None:
        names = [b.name for b in self.buckets]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"role map v{self.version}: bucket names {names} must be non-empty and unique")
        limits = [b.max_tokens for b in self.buckets]
        if limits[-1] is not None or any(m is None for m in limits[:-1]):
            raise ValueError(f"role map v{self.version}: bucket limits {limits}: only the last bucket is unbounded (None)")
        if any(a >= b for a, b in zip(limits[:-2], limits[1:-1])):
            raise ValueError(f"role map v{self.version}: bucket limits {limits} must increase")
        unknown = sorted({i.bucket for i in self.instances} - set(names))
        if unknown:
            raise ValueError(f"role map v{self.version}: instances name unknown buckets {unknown}; known: {names}")

    # ---- (de)serialisation ---------------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RoleMap:
        return cls(
            version=int(d["version"]),
            world_size=int(d["world_size"]),
            trainer_ranks=tuple(d["trainer_ranks"]),
            instances=tuple(
                RolloutInstance(instance_id=int(i["instance_id"]), bucket=i["bucket"], ranks=tuple(i["ranks"]))
                for i in d["instances"]
            ),
            buckets=tuple(Bucket(name=b["name"], max_tokens=b["max_tokens"]) for b in d["buckets"]),
            colocated=bool(d.get("colocated", False)),
        )

    def with_version(self, version: int) -> RoleMap:
        return dataclasses.replace(self, version=version)


def split_role_map(
    *,
    world_size: int,
    num_trainer: int,
    rollout_tp: tuple[tuple[str, int], ...],
    buckets: tuple[Bucket, ...],
    version: int = 0,
) -> RoleMap:
    """Build a disaggregated map: trainer on ranks [0, num_trainer), then instances in order.

    `rollout_tp` lists (bucket name, TP degree) per instance; their TP degrees must add up to
    `world_size - num_trainer`. Instances are placed on consecutive ranks so a TP group sits on
    neighbouring devices (on a GPU node: the same NVLink/PCIe switch where that matters).
    """
    need = world_size - num_trainer
    have = sum(tp for _, tp in rollout_tp)
    if have != need:
        raise ValueError(
            f"rollout instances {list(rollout_tp)} use {have} ranks but {world_size} - {num_trainer} "
            f"trainer = {need} are left for rollout; make the TP degrees add up to {need}"
        )
    instances, nxt = [], num_trainer
    for iid, (bucket, tp) in enumerate(rollout_tp):
        instances.append(RolloutInstance(instance_id=iid, bucket=bucket, ranks=tuple(range(nxt, nxt + tp))))
        nxt += tp
    return RoleMap(
        version=version,
        world_size=world_size,
        trainer_ranks=tuple(range(num_trainer)),
        instances=tuple(instances),
        buckets=buckets,
    ).validate()


def colocated_role_map(*, world_size: int, tp: int = 1, version: int = 0) -> RoleMap:
    """verl-style: every rank trains, and the same ranks form homogeneous rollout instances."""
    if world_size % tp:
        raise ValueError(f"colocate: TP={tp} does not divide world_size={world_size}; pick a TP that divides it")
    instances = tuple(
        RolloutInstance(instance_id=i, bucket="short", ranks=tuple(range(i * tp, (i + 1) * tp)))
        for i in range(world_size // tp)
    )
    return RoleMap(
        version=version,
        world_size=world_size,
        trainer_ranks=tuple(range(world_size)),
        instances=instances,
        buckets=(Bucket(name="short", max_tokens=None),),
        colocated=True,
    ).validate()


def keep_instance_ids(old: RoleMap, new: RoleMap) -> RoleMap:
    """`new` with the ids of `old` kept for instances on the same ranks, fresh ids for the rest.

    The engine keeps an instance (its KV cache, its in-flight requests) across a role-map
    change only when its ranks are unchanged; giving it the same id lets the router keep its
    requests where they are, and a fresh id for every other instance makes the router re-home
    the requests of the instances that disappeared.
    """
    by_ranks = {inst.ranks: inst.instance_id for inst in old.instances}
    nxt = max([i.instance_id for i in old.instances] + [i.instance_id for i in new.instances]) + 1
    out = []
    for inst in new.instances:
        iid = by_ranks.get(inst.ranks)
        if iid is None:
            iid, nxt = nxt, nxt + 1
        out.append(dataclasses.replace(inst, instance_id=iid))
    return dataclasses.replace(new, instances=tuple(out)).validate()


def random_role_map(rng, world_size: int, version: int, buckets: tuple[Bucket, ...]) -> RoleMap:
    """A valid random split (TP1 instances in the first bucket, TP2/TP4 in the last), from `rng`
    (a `random.Random`): group-rebuild tests and benchmarks draw the same sequence on every rank."""
    num_trainer = rng.randint(1, world_size - 1)
    left, insts = world_size - num_trainer, []
    while left:
        tp = rng.choice([t for t in (1, 2, 4) if t <= left])
        insts.append((buckets[-1].name if tp > 1 else buckets[0].name, tp))
        left -= tp
    return split_role_map(world_size=world_size, num_trainer=num_trainer, rollout_tp=tuple(insts), buckets=buckets,
                          version=version)
