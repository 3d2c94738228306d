"""The discrete-event loop: batches -> trajectories -> turns -> tools -> router -> trainer -> planner.

One `ClusterSim` plays one system on one workload for S steps, driving the very same router and
planner objects as the real runtime, with time from the cost model.

Algorithm:
1. Batch j (prompts x n trajectories) is admitted once the rollout holds policy version
   >= j - max_staleness (0 for synchronous systems, so `colocate` alternates rollout and
   training). Each trajectory is routed by `router.admit` and queued on its instance.
2. Instances decode with continuous batching (`sim/instance.py`). At a turn end the trajectory
   leaves for its tool (latency from the workload); at the tool return `router.on_tool_return`
   may migrate it (re-prefill on the target). At its bucket's token limit `router.on_decode` may
   demote it. Its last turn ends with `router.on_finish`.
3. When batch j is complete and the trainer is free, the trainer runs `train_s`; then weights
   sync to the rollout (`sync_s`, instances pause), version j+1 is published, and the planner
   sees the step's `StepStats`. A new role map is applied at once: its moved ranks pay
   `reconfig_s`, trajectories on removed instances are re-homed by `router.set_layout` and
   re-prefill there.

Invariants (tests/test_sim_engine.py): every admitted trajectory finishes exactly once and is
trained in its own step; staleness never exceeds the bound; same inputs give the same metrics.
"""

from __future__ import annotations

import heapq
import logging

from scheduler.api import StepStats
from scheduler.layout import RoleMap
from sim.instance import SimInstance, SimRequest

log = logging.getLogger(__name__)

_INST, _TOOL, _TRAIN_DONE, _SYNC_DONE = 0, 1, 2, 3


class CachedCost:
    """The cost model with decode/prefill times memoised; contexts are rounded to `ctx_quantum` tokens.

    A cluster-scale run asks for the same (batch, context, TP) step time hundreds of thousands of
    times; rounding the context to 64 tokens changes a step time by well under 1%.
    """

    def __init__(self, cost, ctx_quantum: int = 64):
        self.cost, self.hw, self.model = cost, cost.hw, cost.model
        self.q = ctx_quantum
        self._decode: dict[tuple[int, int, int], float] = {}
        self._prefill: dict[tuple[int, int], float] = {}

    def decode_step_s(self, batch: int, context_tokens: float, tp: int) -> float:
        key = (batch, int(context_tokens) // self.q, tp)
        t = self._decode.get(key)
        if t is None:
            t = self._decode[key] = self.cost.decode_step_s(batch, key[1] * self.q + self.q // 2, tp)
        return t

    def prefill_s(self, num_tokens: int, tp: int) -> float:
        key = (int(num_tokens) // self.q, tp)
        t = self._prefill.get(key)
        if t is None:
            t = self._prefill[key] = self.cost.prefill_s(max(1, key[0] * self.q + self.q // 2), tp)
        return t

    def train_s(self, num_tokens: int, num_devices: int) -> float:
        return self.cost.train_s(num_tokens, num_devices)

    def sync_s(self, num_rollout_devices: int) -> float:
        return self.cost.sync_s(num_rollout_devices)

    def reconfig_s(self, num_moved_devices: int) -> float:
        return self.cost.reconfig_s(num_moved_devices)


class ClusterSim:
    def __init__(self, *, cfg, cost, workload, router, planner, role_map: RoleMap, is_async: bool,
                 longest_first: bool = False, clairvoyant: bool = False, free_sync: bool = False, free_reconfig: bool = False,
                 record: bool = False, ctx_quantum: int = 64):
        self.cfg = cfg
        self.cost = CachedCost(cost, ctx_quantum)
        self.workload = workload
        self.router = router
        self.planner = planner
        self.max_staleness = cfg.max_staleness if is_async else 0
        self.longest_first = longest_first
        self.clairvoyant = clairvoyant  # the router is the oracle: tell it every spec up front
        self.retired_busy_dev_s = 0.0
        self.free_sync = free_sync
        self.free_reconfig = free_reconfig
        self.admitted: list[SimRequest] | None = [] if record else None  # admission order, for traces
        self.events: list = []
        self.seq = 0
        self.now = 0.0
        self.instances: dict[int, SimInstance] = {}
        self.role_map = role_map
        self.batches: dict[int, dict] = {}
        self.rollout_version = 0
        self.next_admit = 0
        self.next_train = 0
        self.trainer_free_at = 0.0
        self.trainer_busy = False
        self.num_migrations = 0
        self.step_rows: list[dict] = []
        self.pending_reconfig_s = 0.0
        self.tool_latencies: list[float] = []
        self._build_instances(role_map)
        router.set_layout(role_map, 0.0)

    # ---- event plumbing -----------------------------------------------------------------
    def _push(self, t: float, kind: int, obj, tag: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, obj, tag))

    def _kick(self, inst: SimInstance) -> None:
        """Re-plan an instance after its batch changed: one live event per instance (epoch)."""
        inst.advance(self.now)
        inst.fill()
        inst.epoch += 1
        t = inst.next_event_time(self.now)
        if t is not None:
            self._push(t, _INST, inst, inst.epoch)

    def _build_instances(self, role_map: RoleMap) -> None:
        limits = {b.name: b.max_tokens for b in role_map.buckets}
        cap = self.cfg.max_seqs_per_device
        new = {}
        for ri in role_map.instances:
            old = self.instances.get(ri.instance_id)
            if old is not None and old.tp == ri.tp and old.bucket == ri.bucket:
                new[ri.instance_id] = old
                continue
            inst = SimInstance(instance_id=ri.instance_id, tp=ri.tp, bucket=ri.bucket,
                               bucket_limit=limits[ri.bucket], capacity=cap * ri.tp, cost=self.cost,
                               kv_capacity_tokens=kv_capacity_tokens(self.cost, ri.tp))
            inst.last_t = self.now
            new[ri.instance_id] = inst
        for iid, inst in self.instances.items():
            if new.get(iid) is not inst:
                self.retired_busy_dev_s += inst.busy_dev_s
        self.instances = new

    # ---- main loop ----------------------------------------------------------------------
    def run(self) -> list[dict]:
        self._try_admit()
        while self.events:
            t, _, kind, obj, tag = heapq.heappop(self.events)
            self.now = t
            if kind == _INST:
                if tag == obj.epoch and self.instances.get(obj.instance_id) is obj:
                    self._on_instance(obj)
            elif kind == _TOOL:
                self._on_tool_return(obj)
            elif kind == _TRAIN_DONE:
                self._on_train_done(obj)
            else:
                self._on_sync_done(obj)
        assert self.next_train == self.cfg.steps, f"simulation stalled after {self.next_train}/{self.cfg.steps} steps"
        return self.step_rows

    # ---- rollout ------------------------------------------------------------------------
    def _try_admit(self) -> None:
        while self.next_admit < self.cfg.steps and self.next_admit - self.rollout_version <= self.max_staleness:
            self._admit_batch(self.next_admit)
            self.next_admit += 1

    def _admit_batch(self, j: int) -> None:
        specs = self.workload.batch(j, self.cfg.prompts_per_step, self.cfg.samples_per_prompt)
        if self.longest_first:
            specs = sorted(specs, key=lambda s: -s.total_tokens)
        if self.clairvoyant:
            self.router.know(specs)
        self.batches[j] = {"num_left": len(specs), "admitted_at": self.now, "complete_at": None,
                           "version": self.rollout_version, "tokens": [], "decode": [], "num": len(specs)}
        touched = set()
        for spec in specs:
            req = SimRequest(spec, j, self.rollout_version, self.now)
            if self.admitted is not None:
                self.admitted.append(req)
            route = self.router.admit(spec.request_id, spec.prompt_id, spec.prompt_tokens, self.now)
            inst = self.instances[route.instance_id]
            inst.advance(self.now)
            inst.queue.append(req)
            touched.add(inst)
        for inst in sorted(touched, key=lambda i: i.instance_id):
            self._kick(inst)

    def _on_instance(self, inst: SimInstance) -> None:
        inst.advance(self.now)
        for req in inst.pop_due():
            if req.left == 0:
                self._end_turn(req)
            else:
                d = self.router.on_decode(req.spec.request_id, req.context, self.now)
                self._place(req, d.instance_id, migrate=d.migrate)
        self._kick(inst)

    def _end_turn(self, req: SimRequest) -> None:
        spec = req.spec
        if req.turn == len(spec.turn_tokens) - 1:
            self._finish(req)
            return
        latency = spec.tool_latency_s[req.turn]
        self.tool_latencies.append(latency)
        self._push(self.now + latency, _TOOL, req)

    def _on_tool_return(self, req: SimRequest) -> None:
        spec = req.spec
        outcome = spec.tool_outcomes[req.turn]
        out_tokens = spec.tool_output_tokens[req.turn]
        req.context += out_tokens
        req.need_prefill += out_tokens
        req.turn += 1
        req.left = spec.turn_tokens[req.turn]
        d = self.router.on_tool_return(spec.request_id, outcome, req.context, self.now)
        self._place(req, d.instance_id, migrate=d.migrate)

    def _place(self, req: SimRequest, instance_id: int, *, migrate: bool) -> None:
        inst = self.instances[instance_id]
        if migrate or instance_id != req.instance_id:
            self.num_migrations += 1
            req.num_migrations += 1
            # KV does not move: the target re-prefills the whole context
            req.need_prefill = req.context
        inst.advance(self.now)
        inst.queue.append(req)
        self._kick(inst)

    def _finish(self, req: SimRequest) -> None:
        req.finished_at = self.now
        self.router.on_finish(req.spec.request_id, req.context, self.now)
        b = self.batches[req.batch]
        b["tokens"].append(req.context)
        b["decode"].append(req.decode_done)
        b["num_left"] -= 1
        if b["num_left"] == 0:
            b["complete_at"] = self.now
            self._try_train()

    # ---- training, sync, planning -------------------------------------------------------
    def _try_train(self) -> None:
        j = self.next_train
        b = self.batches.get(j)
        if self.trainer_busy or b is None or b["complete_at"] is None:
            return
        start = max(self.now, self.trainer_free_at)
        tokens = sum(b["tokens"]) * self.cfg.train_epochs
        dur = self.cost.train_s(tokens, len(self.role_map.trainer_ranks))
        b["train_start"], b["train_s"] = start, dur
        self.trainer_busy = True
        self._push(start + dur, _TRAIN_DONE, j)

    def _on_train_done(self, j: int) -> None:
        sync = 0.0 if self.free_sync else self.cost.sync_s(len(self.role_map.rollout_ranks))
        for inst in self.instances.values():
            inst.stall(self.now, sync)
            self._kick(inst)
        self.batches[j]["sync_s"] = sync
        self._push(self.now + sync, _SYNC_DONE, j)

    def _on_sync_done(self, j: int) -> None:
        self.rollout_version = j + 1
        self.trainer_busy = False
        self.next_train = j + 1
        self._record_step(j)
        self._plan(j)
        self._try_admit()
        self._try_train()

    def _plan(self, j: int) -> None:
        if self.planner is None or j == self.cfg.steps - 1:
            return
        b = self.batches[j]
        stats = StepStats(step=j, rollout_s=b["rollout_s"], train_s=b["train_s"], sync_s=b["sync_s"],
                          trajectory_tokens=tuple(b["tokens"]), tool_latency_s=tuple(self.tool_latencies),
                          train_tokens=sum(b["tokens"]) * self.cfg.train_epochs, role_map=self.role_map,
                          decode_tokens=tuple(b["decode"]))
        self.tool_latencies = []
        decision = self.planner.on_step_end(stats, self.now)
        if decision is not None:
            self._apply_layout(decision.role_map)

    def _apply_layout(self, new_map: RoleMap) -> None:
        old = self.role_map
        moved = sum(1 for r in range(new_map.world_size) if _rank_role(old, r) != _rank_role(new_map, r))
        cost = 0.0 if self.free_reconfig or moved == 0 else self.cost.reconfig_s(moved)
        self.pending_reconfig_s += cost
        evicted = []
        keep = {ri.instance_id for ri in new_map.instances}
        for iid, inst in self.instances.items():
            inst.advance(self.now)
            ri_new = next((ri for ri in new_map.instances if ri.instance_id == iid), None)
            if iid not in keep or ri_new.tp != inst.tp or ri_new.bucket != inst.bucket:
                evicted.extend(inst.evict_all())
        self.role_map = new_map
        self._build_instances(new_map)
        routes = self.router.set_layout(new_map, self.now)
        for inst in self.instances.values():
            inst.stall(self.now, cost)
        self.trainer_free_at = max(self.trainer_free_at, self.now + cost)
        for req in evicted:
            route = routes.get(req.spec.request_id)
            # an instance id kept with new ranks/TP is a new engine: the request stays, its KV is gone
            iid = route.instance_id if route is not None else req.instance_id
            assert iid in self.instances, f"router did not re-home {req.spec.request_id} off removed instance {iid}"
            req.need_prefill = req.context
            req.instance_id = iid
            self.instances[iid].queue.append(req)
        for inst in self.instances.values():
            self._kick(inst)

    def _record_step(self, j: int) -> None:
        b = self.batches[j]
        prev = self.batches.get(j - 1)
        prev_end = prev["step_end"] if prev else 0.0
        b["step_end"] = self.now
        # the batch's own critical path (admission to last finish), as StepStats defines it; under
        # async pipelining it overlaps the previous batch's tail, so steps may sum to more than the run
        b["rollout_s"] = b["complete_at"] - b["admitted_at"]
        self.step_rows.append({"step": j, "time_s": self.now, "step_s": self.now - prev_end, "batch": b,
                               "migrations": self.num_migrations, "role_map": self.role_map,
                               "reconfig_s": self.pending_reconfig_s,
                               "rollout_busy_dev_s": self.retired_busy_dev_s + sum(i.busy_dev_s for i in self.instances.values())})
        self.pending_reconfig_s = 0.0


def kv_capacity_tokens(cost, tp: int, mem_frac: float = 0.9) -> float:
    """KV-cache tokens an instance holds: memory left after its weight shard (vLLM's gpu_memory_utilization)."""
    free = cost.hw.mem_bytes * mem_frac * tp - cost.model.weight_bytes
    return max(0.0, free) / cost.model.kv_bytes_per_token


def _rank_role(role_map: RoleMap, rank: int) -> tuple:
    inst = role_map.instance_of(rank)
    return (rank in role_map.trainer_ranks, None if inst is None else (inst.bucket, inst.ranks))
