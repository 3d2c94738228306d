"""The discrete-event loop: batches -> trajectories -> turns -> tools -> step core -> trainer -> planner.

One `ClusterSim` plays one system on one workload for S steps. What a step is (admission with
lookahead, routing and migration decisions, the ledger, the metrics row, the planner's stats,
which requests drain at a layout change) is the real runtime's own `steps/core.py`,
driving the very same router and planner objects; this module only supplies time, from the
cost model.

Algorithm:
1. Whenever the core admits step j (`lookahead`, from `scheduler.systems.lookahead_of`:
   max_staleness, 0 for synchronous systems, so `colocate` alternates rollout and training), the workload's batch j is routed by the core
   and queued on its instances.
2. Instances decode with continuous batching (`sim/instance.py`). At a turn end the trajectory
   leaves for its tool (latency from the workload); at the tool return the core may migrate it
   (exported at once; the target re-prefills the whole context). At its bucket's token limit the
   core may demote it. Its last turn finishes it in the core.
3. When the core hands out a batch and the trainer is free, the trainer runs `train_s` (with the
   idle instances the core names as helpers, `elastic_train_s`: each helper is stalled, busy,
   until the update ends, and requests routed to it meanwhile wait); then
   weights sync to the rollout (`sync_s`, instances pause) and the core ends the step (row,
   stats, planner). A new role map is applied at once: the switch waits for the scorings of the
   requests it moves (one in a tool call moves with it), the trainer then waits `reconfig_s` (the hand-off) while the engines
   pause only for the rebuild and the sync, and the requests of instances that go away (or
   change bucket engine) re-prefill where the core re-homes them.
4. On a CPU profile (`shared_cores`), ranks, tool calls and scorings share the cores: while more
   of them are busy than there are cores, every engine and the trainer run at cores/busy of
   their measured speed (processor sharing, as the OS shares the cores).

Invariants (tests/sim/test_sim_engine.py): every admitted trajectory finishes exactly once and is
trained in its own step; staleness never exceeds the bound; same inputs give the same metrics.
"""

from __future__ import annotations

import heapq
import logging

from steps import commands, core
from scheduler.costmodel import MemoizedCost, shared_core_slowdown
from scheduler.layout import RoleMap
from scheduler.layout_search import switch_of
from sim.instance import SimInstance, SimRequest

log = logging.getLogger(__name__)

_INST, _TOOL, _TRAIN_DONE, _SYNC_DONE, _ADMIT, _SCORED = 0, 1, 2, 3, 4, 5


class ClusterSim:
    def __init__(self, *, cfg, cost, workload, router, planner, role_map: RoleMap, lookahead: int,
                 longest_first: bool = False, clairvoyant: bool = False, free_sync: bool = False, free_reconfig: bool = False,
                 record: bool = False, ctx_quantum: int = 64, batch_by_finish: bool = False,
                 interrupt_on_update: bool = False, elastic: bool = False, bound_trained_lag: bool = False):
        self.cfg = cfg
        self.cost = MemoizedCost(cost, ctx_quantum)  # contexts rounded to 64 tokens: < 1% off, most queries repeat
        self.workload = workload
        self.router = router
        self.core = core.StepCore(commands.CoreConfig(num_steps=cfg.steps, max_staleness=cfg.max_staleness,
                                                  lookahead=lookahead,
                                                  batch_by_finish=batch_by_finish, elastic=elastic,
                                                  bound_trained_lag=bound_trained_lag),
                                  router, planner, role_map)
        self.interrupt_on_update = interrupt_on_update  # AReaL: in-flight KV is recomputed on the new weights
        self.stats: list = []  # the core's StepStats, one per step (what a planner would have seen)
        self.longest_first = longest_first
        self.clairvoyant = clairvoyant  # the router is the oracle: tell it every spec up front
        self.free_sync = free_sync
        self.free_reconfig = free_reconfig
        self.admitted: list[SimRequest] | None = [] if record else None  # admission order, for traces
        self.reqs: dict[str, SimRequest] = {}
        self.events: list = []
        self.seq = 0
        self.now = 0.0
        self.instances: dict[int, SimInstance] = {}
        self.trainer_free_at = 0.0
        self.trainer_busy = False
        # processor sharing on a CPU (the profile's cores): what runs besides the rollout engines
        self.training = False  # the trainer ranks are computing an update
        self.tools_in_flight = 0  # tool calls and final scorings: processes of their own
        self.slowdown = 1.0
        self.starting: set[int] = set()  # steps whose episodes are being started (trace replay)
        self.rows: list[dict] = []  # the core's metrics rows
        self.layouts: list[RoleMap] = []  # the layout each step ran on
        self._build_instances(role_map)
        self.core.start(0.0)

    @property
    def role_map(self) -> RoleMap:
        return self.core.role_map

    @property
    def num_migrations(self) -> int:
        return self.core.migrations

    # ---- event plumbing -----------------------------------------------------------------
    def _push(self, t: float, kind: int, obj, tag: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, obj, tag))

    def _kick(self, inst: SimInstance) -> None:
        """Re-plan an instance after its batch changed: one live event per instance (epoch).
        Every caller has advanced it to `now` already."""
        if inst.queue:
            inst.fill()
        inst.epoch = epoch = inst.epoch + 1
        t = inst.next_event_time(self.now)
        if t is not None:  # `_push`, inline: an event per kick
            self.seq = seq = self.seq + 1
            heapq.heappush(self.events, (t, seq, _INST, inst, epoch))

    def _build_instances(self, role_map: RoleMap) -> list[SimRequest]:
        """Engines of `role_map`; an instance on the same ranks keeps its engine (as a real rank does).
        Returns the requests of the engines that went away."""
        limits = {b.name: b.max_tokens for b in role_map.buckets}
        new, evicted = {}, []
        for ri in role_map.instances:
            old = self.instances.get(ri.instance_id)
            if old is not None and old.tp == ri.tp:
                old.bucket, old.bucket_limit = ri.bucket, limits[ri.bucket]
                new[ri.instance_id] = old
                continue
            inst = SimInstance(instance_id=ri.instance_id, tp=ri.tp, bucket=ri.bucket,
                               bucket_limit=limits[ri.bucket], capacity=self.cfg.max_seqs_per_instance, cost=self.cost,
                               kv_capacity_tokens=self.cost.kv_capacity_tokens(ri.tp))
            inst.last_t, inst.slowdown = self.now, self.slowdown
            new[ri.instance_id] = inst
        for iid, inst in self.instances.items():
            if new.get(iid) is not inst:
                inst.advance(self.now)
                evicted.extend(inst.evict_all())
        self.instances = new
        return evicted

    # ---- main loop ----------------------------------------------------------------------
    def run(self) -> list[dict]:
        self._try_admit()
        if self.cost.shared_cores:
            self._share_cores()
        events, shared_cores, pop = self.events, self.cost.shared_cores, heapq.heappop
        while events:
            t, _, kind, obj, tag = pop(events)
            self.now = t
            if kind == _INST:
                if tag == obj.epoch and self.instances.get(obj.instance_id) is obj:
                    self._on_instance(obj)
            elif kind == _TOOL:
                self._on_tool_return(obj)
            elif kind == _TRAIN_DONE:
                self._on_train_done(*obj)
            elif kind == _ADMIT:
                self._admit(*obj)
                self._try_admit()
            elif kind == _SCORED:
                self.tools_in_flight -= 1
                self._finish(obj)
            else:
                self._on_sync_done(obj)
            if shared_cores:
                self._share_cores()
        assert self.core.done, f"simulation stalled after {self.core.trained}/{self.cfg.steps} steps"
        return self.rows

    # ---- rollout ------------------------------------------------------------------------
    def _try_admit(self) -> None:
        while (j := self.core.next_admissible()) is not None and j not in self.starting:
            specs = self.workload.batch(j, self.cfg.prompts_per_step, self.cfg.samples_per_prompt)
            start_s = sum(s.start_s for s in specs)  # the coordinator starts a step's episodes one by one
            if start_s > 0:
                self.starting.add(j)
                self._push(self.now + start_s, _ADMIT, (j, specs))
                return
            self._admit(j, specs)

    def _admit(self, j: int, specs: list) -> None:
        self.starting.discard(j)
        if self.longest_first:
            specs = sorted(specs, key=lambda s: -s.total_tokens)
        if self.clairvoyant:
            self.router.know(specs)
        groups: dict[str, str] = {}  # prompt -> its GRPO group: the samples of one prompt in this step
        new = [commands.NewRequest(request_id=s.request_id, prompt_id=s.prompt_id, prompt_tokens=s.prompt_tokens, task=s,
                                   group_id=groups.setdefault(s.prompt_id, commands.group_id(j, len(groups))))
               for s in specs]
        touched = set()
        for add in self.core.admit(j, new, self.now):
            req = self.reqs[add.request_id] = SimRequest(add.task, j, self.core.version, self.now, add.group_id)
            if self.admitted is not None:
                self.admitted.append(req)
            req.instance_id = add.instance_id
            inst = self.instances[add.instance_id]
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
            else:  # at its bucket's token limit: the MLFQ safety net may demote it
                self._place(req, self.core.on_decode(req.spec.request_id, req.context, self.now))
        self._kick(inst)

    def _end_turn(self, req: SimRequest) -> None:
        spec = req.spec
        if req.turn == len(spec.turn_tokens) - 1:
            if spec.score_s > 0:  # the final scoring runs on the rank's thread pool, beside decoding
                self.tools_in_flight += 1
                req.score_until = self.now + spec.score_s
                self._push(req.score_until, _SCORED, req)
            else:
                self._finish(req)
            return
        req.tool_until = t = self.now + spec.tool_latency_s[req.turn]
        self.tools_in_flight += 1
        self.seq = seq = self.seq + 1  # `_push`, inline: an event per turn
        heapq.heappush(self.events, (t, seq, _TOOL, req, 0))

    def _on_tool_return(self, req: SimRequest) -> None:
        self.tools_in_flight -= 1
        spec, turn = req.spec, req.turn
        outcome = spec.tool_outcomes[turn]
        out_tokens = spec.tool_output_tokens[turn]
        req.context += out_tokens
        req.need_prefill += out_tokens
        req.turn = turn = turn + 1
        req.left = spec.turn_tokens[turn]
        self._place(req, self.core.on_tool_return(spec.request_id, outcome, req.context, self.now))

    def _place(self, req: SimRequest, export: commands.Export | None) -> None:
        """Back into a batch: where it was, or (exported at once: it is between batches) on its target."""
        if export is not None:
            add = self.core.on_exported(req.spec.request_id, self.now)
            assert add is not None, "the simulator applies layouts at once: nothing is parked"
            req.num_migrations += 1
            req.instance_id = add.instance_id
            req.need_prefill = req.context  # KV does not move: the target re-prefills the whole context
        inst = self.instances[req.instance_id]
        inst.advance(self.now)
        inst.queue.append(req)
        self._kick(inst)

    def _finish(self, req: SimRequest) -> None:
        req.finished_at = self.now
        spec = req.spec
        del self.reqs[spec.request_id]
        self.core.on_finished(spec.request_id, commands.Finished(
            num_tokens=req.context, num_model_tokens=req.decode_done, tool_latency_s=tuple(spec.tool_latency_s),
            signal_tokens=spec.signal_tokens, first_version=req.version, payload=req), self.now)
        self._try_train()

    # ---- processor sharing (CPU runs) ---------------------------------------------------
    def _busy_processes(self) -> int:
        busy = sum(inst.tp for inst in self.instances.values() if inst.busy)
        return busy + self.tools_in_flight + (len(self.role_map.trainer_ranks) if self.training else 0)

    def _share_cores(self) -> None:
        """On a CPU every rank and tool process shares the profile's cores: when more are busy than
        there are cores, each runs at cores/busy of its measured speed (the OS shares them fairly).
        A change of that share re-times every engine; re-timing can start a queued batch, so repeat
        until it settles."""
        for _ in range(4):
            slowdown = shared_core_slowdown(self._busy_processes(), self.cost.shared_cores)
            if slowdown == self.slowdown:
                return
            for inst in self.instances.values():
                inst.advance(self.now)  # the work done so far at the old share
                inst.slowdown = slowdown
            self.slowdown = slowdown
            for inst in self.instances.values():
                self._kick(inst)

    # ---- training, sync, planning -------------------------------------------------------
    def _try_train(self) -> None:
        if self.trainer_busy:
            return
        batch = self.core.take_batch(self.now)
        if batch is None:
            return
        if not batch.payloads:  # every member was stale: nothing to train or sync (as the coordinator does)
            self.trainer_busy = True
            self._push(self.now, _SYNC_DONE, 0.0)
            return
        tokens = sum(r.context for r in batch.payloads) * self.cfg.train_epochs
        num_trainer, num_helpers = len(self.role_map.trainer_ranks), len(batch.helpers)
        # the real trainer skips a step in which no group's rewards differ: its gradient is zero
        stepped = core.has_signal((r.group_id, r.spec.reward) for r in batch.payloads)
        dur = self.cost.elastic_train_s(tokens, num_trainer, num_helpers) if stepped else 0.0
        self.training = dur > 0
        start = max(self.now, self.trainer_free_at)
        if dur and num_helpers:  # stalled before the share below: a helper is one of the busy processes
            for iid in batch.helpers:
                self._help_train(self.instances[iid], start - self.now + dur)
        if dur and self.cost.shared_cores:  # measured with its own ranks busy; now beside whatever else runs
            dur *= shared_core_slowdown(self._busy_processes(), self.cost.shared_cores,
                                        self.cost.elastic_measured_busy(num_trainer, num_helpers))
        self.trainer_busy = True
        if dur and self._time_shared():  # the ranks that train are the rollout's: generation pauses meanwhile
            for inst in self.instances.values():
                inst.stall(self.now, dur)
            self._drop_parked_kv()
        self._push(start + dur, _TRAIN_DONE, (dur, tokens, stepped))

    def _help_train(self, inst: SimInstance, seconds: float) -> None:
        """An idle instance computes gradients for the trainer for `seconds` of work (on shared cores they run at
        the core share, as the trainer's update is slowed): requests routed to it meanwhile wait."""
        assert not inst.num_active and not inst.queue, f"helper instance {inst.instance_id} is not idle"
        inst.stall(self.now, seconds)

    def _time_shared(self) -> bool:
        """A colocated layout with batches in flight while one trains (libra-hybrid)."""
        return self.role_map.colocated and self.core.cfg.lookahead > 0

    def _drops_kv(self) -> bool:
        """Whether training on the rollout's devices takes their KV memory (an accelerator; a CPU shares one memory)."""
        return self._time_shared() and not self.cost.shared_cores

    def _drop_parked_kv(self) -> None:
        """Requests out of a batch (waiting on a tool, or queued to rejoin) lose their parked KV to the trainer:
        they rejoin with their whole context. The running ones re-prefill at the sync (`_on_train_done`)."""
        if self._drops_kv():
            for req in self.reqs.values():
                if req.finished_at < 0 and req.tool_until > self.now:
                    req.need_prefill = req.context
            for inst in self.instances.values():
                for req in inst.queue:
                    req.need_prefill = req.context

    def _on_train_done(self, dur: float, tokens: int, stepped: bool) -> None:
        self.training = False
        self.core.on_trained(train_s=dur, stepped=stepped, train_tokens=tokens)
        rm = self.role_map
        sync = 0.0 if self.free_sync else self.cost.sync_s(len(rm.rollout_ranks), len(rm.trainer_ranks), rm.colocated)
        for inst in self.instances.values():
            # fully async: generation stops for the update, and the running sequences' KV, computed
            # by the old weights, is recomputed: a prefill of each sequence's context (attention is
            # quadratic per sequence, not over the batch's tokens taken as one sequence); a hybrid
            # rank on an accelerator re-prefills it too (the trainer took the KV memory)
            redo = 0.0
            if (self.interrupt_on_update or self._drops_kv()) and inst.num_active:
                redo = inst.num_active * self.cost.prefill_s(int(inst.kv_tokens() / inst.num_active), inst.tp)
            inst.stall(self.now, sync + redo)
            self._kick(inst)
        # the control plane's per-step cost (Train/Trained, Sync/Synced round trips) delays the step's end
        self._push(self.now + sync + self.cost.step_overhead_s, _SYNC_DONE, sync)

    def _on_sync_done(self, sync: float) -> None:
        self.trainer_busy = False
        end = self.core.end_step(self.now, sync_s=sync)
        self.rows.append(end.row.to_dict())
        self.stats.append(end.stats)
        self.layouts.append(self.role_map)
        if end.plan is not None:
            self._apply_layout(end.plan.role_map)
        self._try_admit()
        self._try_train()

    def _apply_layout(self, proposed: RoleMap) -> None:
        old = self.role_map
        new, exports = self.core.begin_reconfigure(proposed)
        # The runtime exports a request in a tool call at once (its new instance re-issues the call, which runs
        # once: it re-prefills when the tool returns) and one being scored when it finishes, and only then
        # switches: the other instances decode meanwhile, the trainer waits for the switch.
        drain = max((self.reqs[e.request_id].score_until - self.now for e in exports), default=0.0)
        for e in exports:
            self.core.on_exported(e.request_id, self.now)
        assert self.core.drained()
        switch = switch_of(old, new)
        free = self.free_reconfig or switch.moved == 0
        busy = new.world_size if self.cost.shared_cores else 0  # every rank runs on through a switch
        cost = 0.0 if free else self.cost.reconfig_s(switch.moved, switch.trainer_moved, busy)
        # engines pause for what every rank takes part in (the group rebuild, the sync), not the hand-off
        pause = 0.0 if free else min(cost, self.cost.reconfig_s(switch.moved, False))
        drain = 0.0 if self.free_reconfig else max(0.0, drain)
        self.core.add_reconfig_s(drain + cost)
        for inst in self.instances.values():
            inst.advance(self.now)
        evicted = self._build_instances(new)
        for add in self.core.finish_reconfigure(self.now):
            req = self.reqs[add.request_id]
            req.instance_id = add.instance_id
            req.need_prefill = req.context
        for inst in self.instances.values():
            inst.stall(self.now, pause)
        self.trainer_free_at = max(self.trainer_free_at, self.now + drain + cost)
        for req in evicted:  # an engine that went away lost its KV: the request re-prefills where the core put it
            req.need_prefill = req.context
            assert req.instance_id in self.instances, f"{req.spec.request_id} left on removed instance {req.instance_id}"
            self.instances[req.instance_id].queue.append(req)
        for inst in self.instances.values():
            self._kick(inst)

