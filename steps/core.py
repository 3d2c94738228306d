"""The step core: what a training step is, shared by the real coordinator and the simulator.

Pure Python, no clock, no I/O (in the style of vLLM's `schedule()` / `update_from_output()`):
the caller tells it what happened, with an explicit `now`, and gets small frozen commands back.
`engine/runtime/coordinator.py` wraps it in the mailbox loop of real ranks; `sim/cluster.py` wraps it in
a discrete-event loop with times from the cost model. So a step, its metrics row and the
planner's `StepStats` mean the same thing in both by construction.

Algorithm:
1. Admission: step s may start while s <= steps trained + `lookahead` (0 for synchronous
   systems), s < num_steps, and no role-map change is in progress. This bounds staleness.
   `admit(s, requests)` routes every request (`router.admit`) and starts it in the ledger.
2. Events: a tool return or a decode boundary asks the router; a migration, or a request whose
   instance is leaving the layout, becomes `Export`; `on_exported` answers with the `Add` on its
   new instance (or parks it while the layout changes). A finished trajectory is counted in its
   step; an infrastructure failure is dropped with the reason "tool_infra".
3. Training: once every trajectory of step `trained` is finished or dropped, `take_batch`
   drops the stale ones (older than `max_staleness` versions) and returns the rest in request
   order (finish order is a race). `on_trained` bumps the policy version and says whether the
   trainer stepped (the no-signal rule, `has_signal`: a batch in which no GRPO group's rewards
   differ trains nothing, and its `StepStats.train_s` is 0); `end_step` builds the `MetricsRow`
   and the planner's `StepStats` (with the next batch's head start, `ahead_s`), and asks the
   planner for a new layout.
   With `elastic`, the batch also names its `helpers`: the TP1 rollout instances on no trainer
   rank with nothing of the core on them or moving to them at that moment (`idle_instances`;
   none while a layout changes) that the planner lets join (`elastic_helpers`: whether the split
   pays for the gradient hand-off); the row reports how many (`train/elastic_helpers`).
   `batch_by_finish` (fully async, AReaL-style): a batch is instead the first complete GRPO
   groups to finish, as many as a step admits, from whichever admitted steps they come; a
   long group waits for a later batch instead of holding this one; the planner's stats carry the
   running trajectories' lengths so far (`censored_tokens`). Its staleness is bounded at
   admission, as AReaL bounds it (at most `lookahead` steps ahead of the trainer), not by dropping:
   a group that outlives several updates is trained, and the row reports its lag. With
   `bound_trained_lag` (libra's designs) `max_staleness` bounds the trained lag as well: every group
   is trained within `max_staleness` versions of the rollout's version at its admission, earliest
   deadline first, and a batch waits for a group only where the deadlines force it in
   (`steps/finish_order.py`).
4. A new layout: `begin_reconfigure` pauses admission and exports every request on an instance
   that goes away; once `drained()`, `finish_reconfigure` re-homes them (`router.set_layout`).
   A plan that carries a new design (lookahead, staleness bound, step or finish-order batches)
   is applied by `end_step` itself (`set_design`): it takes effect from the next admission and
   the next batch; the caller only changes the layout.

Invariants (tests/steps/test_stepcore.py, test_stepcore_elastic.py): every started trajectory is trained exactly once or
dropped with a reason; steps are trained in order and a step never starts more than
`lookahead` steps ahead of the trainer; staleness never exceeds `max_staleness` (finish-order batches: with
`bound_trained_lag`); a finished
trajectory counts even when its migration was under way; a layout change re-homes every
request of a removed instance; a helper is never busy, on a trainer rank, of TP > 1, nor chosen
during a layout change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from runlog import LAG_KEY, PREDICTED_KEY, MetricsRow, idle_fractions
from scheduler.api import OutcomeState, StepStats
from scheduler.elastic import idle_tp1_instances, planner_helpers
from scheduler.layout import RoleMap, keep_instance_ids
from steps.commands import Add, Cancel, CoreConfig, Export, Finished, NewRequest, RunState, StepEnd, TrainBatch
from steps.finish_order import next_batch
from steps.records import Request, Step
from steps.ledger import Ledger


ELASTIC_KEY = "train/elastic_helpers"  # the row's count of idle rollout instances that helped train its batch


def has_signal(members: Iterable[tuple[str, float | None]]) -> bool:
    """The no-signal rule over a batch's (group id, reward) pairs: False when every reward is known and
    no GRPO group holds two different rewards (every advantage is 0, so the trainer skips the step).

    The simulator applies it to decide whether a step trains; the real trainer applies it to its
    advantages (engine/trainer/trainer.py) and reports the outcome, which reaches the core as
    `on_trained(stepped=...)`."""
    groups: dict[str, set] = {}
    for group, reward in members:
        if reward is None:
            return True
        groups.setdefault(group, set()).add(reward)
    return any(len(rewards) > 1 for rewards in groups.values())


class StepCore:
    def __init__(self, cfg: CoreConfig, router, planner, role_map: RoleMap, state: RunState | None = None) -> None:
        self.cfg, self.router, self.planner = cfg, router, planner
        self.role_map = role_map
        self.ledger = Ledger()
        self.trained = state.step if state else 0  # steps trained (and synced)
        self.version = state.policy_version if state else 0
        if state:
            self.ledger.trained_order = list(state.trained_task_ids)
            self.ledger.prior = state.ledger
        self.admitted = self.trained  # next step to admit
        self.requests: dict[str, Request] = {}
        self.steps: dict[int, Step] = {}
        self.parked: set[str] = set()  # exported during a layout change, waiting for the new layout
        self.leaving: set[int] = set()  # instances that go away at the current layout change
        self.reconfiguring: RoleMap | None = None
        self.migrations = 0
        self._training: TrainBatch | None = None
        self._trained = False  # the batch in training was trained (an empty batch is not)
        self._stepped = False  # and the trainer updated the weights (it skips a step with no signal)
        self._trained_s = 0.0
        self._train_metrics: dict = {}
        self._train_tokens: int | None = None
        self._train_start_s = 0.0  # when the batch in training was handed out (colocated ranks stop generating)
        self._last_step_end = state.wall_s if state else 0.0  # the caller's clock continues a resumed run's
        self._checkpoint_s = self._last_step_end
        self._first_step = self.trained + 1  # the first step this run (or this resume) trains
        self._reconfig_s = 0.0  # paid since the last step ended; reported in the next row
        # finish-order batching (fully async): complete groups in the order they completed, the
        # members each group still waits for, and the batch in training as a step of its own
        self._ready_groups: list[tuple[int, str]] = []
        self._group_left: dict[tuple[int, str], int] = {}
        self._batch_step: Step | None = None
        self._to_step_batches = False  # finish-order batches until the admitted steps are drained (`set_design`)

    @property
    def done(self) -> bool:
        return self.trained >= self.cfg.num_steps

    def start(self, now: float) -> None:
        """The run starts on the current layout (after model loading: time counts from here)."""
        self.router.set_layout(self.role_map, now)

    # ---- admission -----------------------------------------------------------------------------
    def next_admissible(self) -> int | None:
        """The step that may be admitted now, or None (the trainer is behind, or a layout change runs)."""
        s = self.admitted
        if self._drained_to_step_batches():  # finish-order groups still in flight before step batches start
            return None
        if s < self.cfg.num_steps and s <= self.trained + self.cfg.lookahead and self.reconfiguring is None:
            return s
        return None

    def admit(self, step: int, requests: list[NewRequest], now: float) -> list[Add]:
        assert step == self.next_admissible(), f"step {step} admitted out of order (next admissible: {self.next_admissible()})"
        # a batch trained but not yet synced: the rollout still samples with the version before it
        rollout_version = self.version - (self._training is not None and self._trained)
        st = self.steps[step] = Step(index=step, admitted_s=now, admitted_version=rollout_version)
        adds = []
        for r in requests:
            route = self.router.admit(r.request_id, r.prompt_id, r.prompt_tokens, now)
            self.requests[r.request_id] = Request(r.request_id, step, r.group_id, r.prompt_id, r.task, route.instance_id)
            self.ledger.start(r.request_id, step)
            st.request_ids.append(r.request_id)
            st.prompt_ids[r.request_id] = r.prompt_id
            st.groups.setdefault(r.group_id, []).append(r.request_id)
            self._group_left[(step, r.group_id)] = self._group_left.get((step, r.group_id), 0) + 1
            adds.append(Add(r.request_id, route.instance_id, r.group_id, r.task, resumed=False))
        self.admitted += 1
        if not requests:
            st.ready_s = now
        return adds

    # ---- rollout events ------------------------------------------------------------------------
    def on_tool_return(self, request_id: str, outcome: OutcomeState, tokens_so_far: int, now: float) -> Export | None:
        req = self.requests.get(request_id)
        if req is not None:
            req.tokens = tokens_so_far
        if req is None or req.migrating:
            return None
        return self._maybe_export(req, self.router.on_tool_return(request_id, outcome, tokens_so_far, now))

    def on_decode(self, request_id: str, tokens_so_far: int, now: float) -> Export | None:
        req = self.requests.get(request_id)
        if req is not None:
            req.tokens = tokens_so_far
        if req is None or req.migrating:
            return None
        return self._maybe_export(req, self.router.on_decode(request_id, tokens_so_far, now))

    def _maybe_export(self, req: Request, decision) -> Export | None:
        moving = decision.migrate and decision.instance_id != req.instance_id
        if moving or req.instance_id in self.leaving:  # leaving: its instance goes away at this boundary
            req.migrating, req.target = True, decision.instance_id if moving else None
            return Export(req.request_id, req.instance_id)
        return None

    def on_exported(self, request_id: str, now: float) -> Add | None:
        """The request left its instance; None while a layout change runs (it is parked until then)."""
        req = self.requests[request_id]
        if self.reconfiguring is not None:
            self.parked.add(request_id)
            return None
        assert req.target is not None, f"{request_id} exported without a migration target"
        self.migrations += 1
        return self._readd(req, req.target)

    def on_export_failed(self, request_id: str) -> None:
        req = self.requests.get(request_id)
        if req is not None:
            req.migrating, req.target = False, None  # it finished or waits on a tool: it stays where it is

    def _readd(self, req: Request, instance_id: int) -> Add:
        req.instance_id, req.migrating, req.target = instance_id, False, None
        return Add(req.request_id, instance_id, req.group_id, req.task, resumed=True)

    def on_finished(self, request_id: str, fin: Finished, now: float) -> None:
        """Also while an export is in flight: that export will fail, the result stands."""
        req = self.requests.pop(request_id)
        self.parked.discard(request_id)
        self.router.on_finish(request_id, fin.num_tokens, now)
        st = self.steps[req.step]
        if fin.infra_failed:
            self.ledger.drop(request_id, "tool_infra")
            st.drop_reasons[request_id] = "tool_infra"
            st.done[request_id] = None
        else:
            self.ledger.finish(request_id)
            st.done[request_id] = fin
        if st.complete and st.ready_s is None:
            st.ready_s = now
        key = (req.step, req.group_id)
        self._group_left[key] -= 1
        if not self._group_left[key]:
            del self._group_left[key]
            self._ready_groups.append(key)

    # ---- training ------------------------------------------------------------------------------
    def take_batch(self, now: float) -> TrainBatch | None:
        """The next step's batch once all of it is in (stale trajectories dropped), else None.

        With `batch_by_finish`: once as many complete groups as a step admits have finished
        (in any admitted step), the first of them in finish order (AReaL-style fully async)."""
        if self._training is not None:
            return None
        if self.cfg.batch_by_finish:
            st = self._finish_order_step(now)
            if st is None:
                return None
        else:
            st = self.steps.get(self.trained)
            if st is None or not st.complete:
                return None
        ids, payloads = [], []
        for rid, fin in sorted(st.done.items()):  # finish order is a race: train in request order
            if fin is None:
                continue
            # fully async bounds staleness where AReaL does, at admission (at most `lookahead` steps
            # ahead); a long group that spans more updates is trained, its lag reported in the row
            if (not self.cfg.batch_by_finish and fin.first_version is not None
                    and self.version - fin.first_version > self.cfg.max_staleness):
                self.ledger.drop(rid, "stale")
                st.drop_reasons[rid] = "stale"
                st.done[rid] = None
                continue
            ids.append(rid)
            payloads.append(fin.payload)
        tokens = sum(st.done[rid].num_tokens for rid in ids)
        group_of = {rid: g for g, members in st.groups.items() for rid in members}
        # a batch without signal trains nothing (`has_signal`): no gradient for anyone to help with
        signal = has_signal((group_of.get(rid, rid), st.done[rid].reward) for rid in ids)
        helpers = self._elastic_helpers(tokens) if ids and signal else ()
        self._training = TrainBatch(st.index, tuple(payloads), tuple(ids), self.version, helpers=helpers)
        self._trained, self._trained_s, self._train_metrics, self._train_tokens = False, 0.0, {}, None
        self._stepped, self._train_start_s = False, now
        return self._training

    def _elastic_helpers(self, num_tokens: int) -> tuple[int, ...]:
        """The idle rollout instances that help train a batch of `num_tokens` (`CoreConfig.elastic`)."""
        return planner_helpers(self.planner, num_tokens, self.role_map, self.idle_instances()) if self.cfg.elastic else ()

    def idle_instances(self) -> tuple[int, ...]:
        """`scheduler.elastic.idle_tp1_instances` of the core's requests; none while a layout changes (its parked
        requests are about to land somewhere)."""
        if self.reconfiguring is not None or self.parked:
            return ()
        return idle_tp1_instances(self.role_map, busy={i for r in self.requests.values() for i in (r.instance_id, r.target)})

    def _finish_order_step(self, now: float) -> Step | None:
        """The batch of the first complete groups to finish, as a step of its own; None until enough are in.

        With `bound_trained_lag`, each group must be trained within `max_staleness` versions of the rollout's
        version at its admission: `steps/finish_order.py` takes the groups those deadlines force in, then the
        first to finish."""
        first = self.steps.get(min(self.steps)) if self.steps else None
        need = len(first.groups) if first is not None else 0
        if not need or len(self._ready_groups) < need:  # asked at every event: no deadlines built for nothing
            return None
        deadlines = None
        if self.cfg.bound_trained_lag:
            deadlines = {(st.index, g): st.admitted_version + self.cfg.max_staleness
                         for st in self.steps.values() for g in st.groups if g not in st.taken}
        keys = next_batch(self._ready_groups, need, deadlines, self.version)
        if keys is None:
            return None
        taking = set(keys)
        self._ready_groups = [k for k in self._ready_groups if k not in taking]
        st = Step(index=self.trained, admitted_s=min(self.steps[s].admitted_s for s, _ in keys), ready_s=now)
        for s, group in keys:
            src = self.steps[s]
            for rid in src.groups[group]:
                st.request_ids.append(rid)
                st.prompt_ids[rid] = src.prompt_ids[rid]
                st.done[rid] = src.done[rid]
                if rid in src.drop_reasons:
                    st.drop_reasons[rid] = src.drop_reasons[rid]
            src.taken.add(group)
            if len(src.taken) == len(src.groups):
                del self.steps[s]
        self._batch_step = st
        return st

    def on_trained(self, *, train_s: float, stepped: bool = True, metrics: dict | None = None,
                   train_tokens: int | None = None) -> None:
        """The trainer finished the batch of `take_batch` (not called for an empty batch).

        `stepped`: whether it updated the weights. False when it skipped the step: no group's rewards
        differ (every advantage is 0: the no-signal rule, `has_signal`), or a non-finite loss. A skipped
        step measures no training time: its `StepStats.train_s` is 0. `metrics` are only reported."""
        batch = self._training
        assert batch is not None and batch.request_ids, "on_trained without a non-empty batch in training"
        st = self._batch_step if self.cfg.batch_by_finish else self.steps[batch.step]
        for rid in batch.request_ids:
            self.ledger.train(rid, st.prompt_ids[rid])
        self.version += 1
        self._trained, self._trained_s, self._stepped = True, train_s, stepped
        self._train_metrics, self._train_tokens = dict(metrics or {}), train_tokens

    def end_step(self, now: float, *, sync_s: float) -> StepEnd:
        """The step's row and stats; the planner's decision for the next layout."""
        batch, self._training = self._training, None
        assert batch is not None, "end_step without take_batch"
        if self.cfg.batch_by_finish:
            st, self._batch_step = self._batch_step, None
        else:
            st = self.steps.pop(batch.step)
            self._ready_groups = [k for k in self._ready_groups if k[0] != batch.step]  # only finish order reads them
        fins = [st.done[rid] for rid in batch.request_ids]
        row = self._row(st, fins, now, sync_s, helpers=len(batch.helpers))
        stats = StepStats(step=row.step, rollout_s=row.rollout_s, train_s=row.train_s if self._stepped else 0.0, sync_s=sync_s,
                          trajectory_tokens=tuple(f.num_tokens for f in fins),
                          decode_tokens=tuple(f.num_model_tokens for f in fins),  # tool output is not decoded
                          signal_tokens=tuple(f.signal_tokens for f in fins) if all(f.signal_tokens for f in fins) else (),
                          tool_latency_s=tuple(x for f in fins for x in f.tool_latency_s),
                          train_tokens=self._train_tokens if self._train_tokens is not None else row.tokens,
                          role_map=self.role_map, reconfig_s=row.reconfig_s, censored_tokens=self._censored(),
                          ahead_s=self._ahead_s(batch.step, now))
        self.trained += 1
        self._last_step_end = now
        self._reconfig_s = 0.0
        plan = self.planner.on_step_end(stats, now) if self.planner is not None and not self.done else None
        if plan is not None and plan.lookahead is not None:  # a new design: it runs from the next admission and batch
            self.set_design(lookahead=plan.lookahead, max_staleness=plan.max_staleness, batch_by_finish=plan.batch_by_finish)
        every, every_s = self.cfg.checkpoint_every, self.cfg.checkpoint_every_s
        due = not self.done and (bool(every) and self.trained % every == 0 or bool(every_s) and now - self._checkpoint_s >= every_s
                                 or self.cfg.checkpoint_first and self.trained == self._first_step)
        if due:
            self._checkpoint_s = now
        notes = tuple(self.planner.take_notes()) if self.planner is not None else ()
        return StepEnd(st.admitted_s, row, stats, plan, checkpoint=due, planner_notes=notes)

    def _ahead_s(self, step: int, now: float) -> float:
        """How long the next step's batch has generated (`StepStats.ahead_s`): a pipelined step's head start."""
        nxt = None if self.cfg.batch_by_finish else self.steps.get(step + 1)
        if nxt is None:
            return 0.0
        until = self._train_start_s if self.role_map.colocated else now  # colocated ranks pause to train
        return max(0.0, until - nxt.admitted_s)

    def _censored(self) -> tuple[int, ...]:
        """Finish-order batches are a length-biased sample (the first groups to finish): the running
        trajectories' lengths so far go to the planner as lower bounds. A step batch is a complete sample."""
        if not self.cfg.batch_by_finish:
            return ()
        return tuple(r.tokens for r in self.requests.values() if r.tokens > 0)

    def _row(self, st: Step, fins: list[Finished], now: float, sync_s: float, *, helpers: int) -> MetricsRow:
        rewards = [f.reward for f in fins if f.reward is not None]
        versions = [f.first_version for f in fins if f.first_version is not None]
        step_s = now - self._last_step_end
        rollout_s = (st.ready_s if st.ready_s is not None else now) - st.admitted_s
        train_s = self._trained_s if self._trained else 0.0
        idle_r, idle_t = idle_fractions(step_s=step_s, rollout_s=rollout_s, train_s=train_s, sync_s=sync_s,
                                        colocated=self.role_map.colocated)
        extra = {k: v for k, v in self._train_metrics.items() if isinstance(v, (int, float))}
        for f in fins:  # why each trained reward is what it is, and why the others were not trained
            if f.reward_reason:
                extra[f"score/{f.reward_reason}"] = extra.get(f"score/{f.reward_reason}", 0) + 1
        extra.update({f"dropped/{reason}": n for reason, n in sorted(st.dropped.items())})
        if self.cfg.elastic:  # the core knows who helped, so a real row and a simulated one both say it
            extra[ELASTIC_KEY] = helpers
        if self.planner is not None and self.planner.forecast_step_s is not None:  # foreseen before this step ran
            extra[PREDICTED_KEY] = self.planner.forecast_step_s
        # each trajectory's own lag (its oldest token): the simulator's reward model prices every one
        for lag in (self.version - 1 - v for v in versions):
            extra[f"{LAG_KEY}{lag}"] = extra.get(f"{LAG_KEY}{lag}", 0) + 1
        return MetricsRow(step=st.index + 1, time_s=now, step_s=step_s, rollout_s=rollout_s, train_s=train_s,
                          sync_s=sync_s, reconfig_s=self._reconfig_s, tokens=sum(f.num_tokens for f in fins),
                          trajectories=len(fins), reward_mean=sum(rewards) / len(rewards) if rewards else 0.0,
                          staleness_max=max((self.version - 1 - v for v in versions), default=0),
                          migrations=self.migrations, role_map=self.role_map.summary(),
                          role_map_desc=self.role_map.describe(), idle_frac_rollout=idle_r, idle_frac_train=idle_t,
                          policy_version=self.version, extra=extra)

    # ---- layout changes ------------------------------------------------------------------------
    def begin_reconfigure(self, proposed: RoleMap) -> tuple[RoleMap, list[Export]]:
        """Pause admission and export every request on an instance the new layout drops.

        A request that cannot leave now (it is being scored) finishes where it is; the layout change waits for it."""
        new = keep_instance_ids(self.role_map, proposed).with_version(self.role_map.version + 1)
        kept = {inst.instance_id for inst in new.instances}
        self.leaving = {inst.instance_id for inst in self.role_map.instances} - kept
        self.reconfiguring = new
        exports = []
        for req in self.requests.values():
            if req.instance_id in self.leaving and not req.migrating:
                req.migrating, req.target = True, None
                exports.append(Export(req.request_id, req.instance_id))
        return new, exports

    def drained(self) -> bool:
        return not any(r.instance_id in self.leaving and r.request_id not in self.parked for r in self.requests.values())

    def finish_reconfigure(self, now: float) -> list[Add]:
        """Switch to the new layout; every parked request goes where the router re-homes it."""
        new, self.reconfiguring, self.leaving = self.reconfiguring, None, set()
        assert new is not None, "finish_reconfigure without begin_reconfigure"
        self.role_map = new
        moved = self.router.set_layout(new, now)
        adds = []
        for rid in sorted(self.parked):
            req = self.requests[rid]
            route = moved.get(rid)  # every request of a removed instance is re-homed by the router
            adds.append(self._readd(req, route.instance_id if route else req.target if req.target is not None
                                    else req.instance_id))
        self.parked.clear()
        return adds

    def set_design(self, *, lookahead: int, max_staleness: int, batch_by_finish: bool) -> None:
        """Run on another design from the next admission (libra's planner chose it: scheduler/design.py).

        A lower lookahead holds admission until the trainer catches up. Step batches become
        finish-order ones at once (the complete groups of the steps in flight are the first ready).
        Finish-order batches become step batches once the admitted steps are drained: admission
        waits until every admitted group is trained (their steps are partly trained already), then
        the next admitted step is the next batch."""
        self._to_step_batches = self.cfg.batch_by_finish and not batch_by_finish
        if batch_by_finish and not self.cfg.batch_by_finish:
            self._ready_groups = [k for k in self._ready_groups if k[0] in self.steps]
        self.cfg = dataclasses.replace(self.cfg, lookahead=lookahead, max_staleness=max_staleness,
                                       batch_by_finish=batch_by_finish or self.cfg.batch_by_finish)
        self._drained_to_step_batches()

    def _drained_to_step_batches(self) -> bool:
        """Whether a switch to step batches still waits for admitted finish-order groups (`set_design`)."""
        if self._to_step_batches and not self.steps and self._training is None:
            self._to_step_batches = False
            self._ready_groups.clear()
            self.cfg = dataclasses.replace(self.cfg, batch_by_finish=False)
        return self._to_step_batches

    def add_reconfig_s(self, seconds: float) -> None:
        """Time a layout change cost; the next step's row reports it."""
        self._reconfig_s += seconds

    # ---- end of run ----------------------------------------------------------------------------
    def cancel_all(self, now: float) -> list[Cancel]:
        out = []
        for req in list(self.requests.values()):
            out.append(Cancel(req.request_id, req.instance_id))
            self.router.on_cancel(req.request_id, now)
        self.requests.clear()
        self.ledger.close()
        self.ledger.check()
        return out

    def state(self) -> RunState:
        return RunState(step=self.trained, policy_version=self.version, role_map=self.role_map,
                        prefix_tree=self.router.tree_json(),
                        ledger=self.ledger.counts(before_step=self.trained),
                        trained_task_ids=tuple(self.ledger.trained_order), wall_s=self._last_step_end)

    def waiting(self) -> dict[str, list[str]]:
        """Unfinished trajectories of admitted steps, by where they are (for stall reports)."""
        out: dict[str, list[str]] = {}
        for st in self.steps.values():
            for rid in st.request_ids:
                if rid not in st.done:
                    req = self.requests.get(rid)
                    where = "gone" if req is None else f"instance {req.instance_id}" + (" (migrating)" if req.migrating else "")
                    out.setdefault(where, []).append(rid)
        return out
