"""The coordinator (global rank 0): the step loop of every system, on real ranks.

        tasks ──admit──▶ router ──route──▶ rollout leader(s) ──events──▶ coordinator
          ▲                 ▲  migrate: export ─▶ coordinator ─▶ add(state) on the target   │
          │                 └──────── ToolReturned / Progress / Finished ◀─────────────────┘
          │  env calls (execute/score) ◀──▶ episodes live here (tools run in a thread pool)
          └── step k complete ─▶ train(k) on trainer ranks ─▶ trained ─▶ sync weights to all
              rollout ranks ─▶ metrics row ─▶ planner ─▶ (drain, hand off, new role map) ─▶ ...

Algorithm:
  1. Step s owns `prompts_per_step` tasks (a deterministic function of s and the seed), each
     sampled `samples_per_prompt` times (one GRPO group per task). Step s is admitted while
     s <= steps trained + lookahead (lookahead = max_staleness for async systems, 0 for colocate),
     which bounds staleness by construction.
  2. Rollout events feed the router; a "migrate" decision exports the request from its
     instance (token ids so far) and re-adds it on the target, which re-prefills.
  3. When every trajectory of step s is finished (or dropped), the trainer ranks get the batch
     (stale ones dropped with a reason); when they answer, the new weights go to every rollout
     rank, the step's metrics row is written and the planner may return a new role map.
  4. A new role map is applied at that boundary: admission pauses, requests on instances that
     change are exported, a changed trainer group saves its state for the new one, every rank
     rebuilds its groups, exported requests are re-added where the router puts them.

Invariants (tests/test_e2e.py): every started trajectory is trained exactly once or dropped
with a reason (`Ledger.check`); the task ids trained follow the deterministic step order, also
across a resume; staleness never exceeds max_staleness.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine import checkpoint
from engine.groups import GroupManager
from engine.launch import RankContext
from engine.ledger import Ledger
from engine.trajectory import Trajectory
from engine.view import StepView
from runlog import RunWriter, summarize
from scheduler.api import StepStats
from scheduler.layout import RoleMap, keep_instance_ids

log = logging.getLogger(__name__)


@dataclass
class _Req:
    rid: str
    task: object
    group_id: str
    step: int
    episode: object
    instance_id: int
    migrating: bool = False


@dataclass
class _Step:
    index: int
    admitted_s: float
    rids: list[str] = field(default_factory=list)
    done: dict[str, Trajectory | None] = field(default_factory=dict)  # None: dropped
    ready_s: float | None = None

    @property
    def complete(self) -> bool:
        return len(self.done) == len(self.rids)


class Coordinator:
    def __init__(self, ctx: RankContext, cfg, role_map: RoleMap, out_dir: Path, parts, resume: dict | None):
        self.ctx, self.cfg, self.out = ctx, cfg, Path(out_dir)
        self.mailbox = ctx.mailbox
        self.env, self.tasks, self.tokenizer = parts.env, parts.tasks, parts.tokenizer
        self.router, self.planner, self.spec = parts.router, parts.planner, parts.spec
        self.role_map = role_map
        self.groups_mgr = GroupManager(ctx.store, global_rank=0, world_size=ctx.world_size, rank_offset=1,
                                       timeout_s=cfg.launch.timeout_s)
        self.pool = cf.ThreadPoolExecutor(max(8, cfg.rollout.tool_workers), thread_name_prefix="libra-env")
        self.writer = RunWriter(self.out)
        self.view = StepView()
        self.ledger = Ledger()
        self.reqs: dict[str, _Req] = {}
        self.steps: dict[int, _Step] = {}
        self.parked: dict[str, object] = {}  # exported states waiting for their new instance
        self.replies: list[tuple] = []
        self.lookahead = 0 if self.spec.colocated or not self.spec.async_pipeline else cfg.step.max_staleness
        self.trained = resume["step"] if resume else 0
        self.version = resume["policy_version"] if resume else 0
        self.admitted = self.trained
        self.t0 = time.monotonic()
        self.last_step_end = 0.0
        self.migrations = 0
        self.reconfig_s = 0.0
        self.metrics: list[dict] = []
        self.prompt_cache: dict[str, list[int]] = {}
        self.leaving: set[int] = set()  # instances being drained for a role-map change
        self._progress_t = self._stall_t = time.monotonic()
        if resume:
            self.ledger.trained_order = list(resume["trained_task_ids"])
            self.metrics = self.writer.truncate_to_step(resume["step"])

    # ---- time & messages ---------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self.t0

    def leader(self, instance_id: int) -> int:
        return self.role_map.instance(instance_id).ranks[0] + 1

    def workers(self) -> range:
        return range(1, self.ctx.world_size)

    def send_all(self, msg) -> None:
        for r in self.workers():
            self.mailbox.send(r, msg)

    def pump(self) -> None:
        msgs = self.mailbox.poll()
        for src, msg in msgs:
            handler = getattr(self, f"_on_{msg[0]}", None)
            if handler is None:
                self.replies.append((src, msg))
            else:
                handler(src, *msg[1:])
        if not msgs:
            time.sleep(0.001)
        self._report_stall()
        self.view.tick(self.now(), self.role_map, self.reqs, self.trained, self.cfg.run.steps)
        self.view.check_health(self.mailbox, self.ctx.world_size, self.cfg.launch.rank_timeout_s, self.now())

    def _report_stall(self, every_s: float = 30.0) -> None:
        """Say what the run waits for when nothing has finished for a while."""
        t = time.monotonic()
        if t - self._progress_t < every_s or t - self._stall_t < every_s:
            return
        self._stall_t = t
        waiting = {}
        for st in self.steps.values():
            for rid in st.rids:
                if rid not in st.done:
                    req = self.reqs.get(rid)
                    where = "gone" if req is None else f"instance {req.instance_id}" + (" (migrating)" if req.migrating else "")
                    waiting.setdefault(where, []).append(rid)
        if not waiting:  # every admitted trajectory is done: the run waits on the trainer, which is not a stall
            return
        log.warning("[libra] no trajectory finished for %.0f s; waiting for %s; parked %s",
                    t - self._progress_t, {k: v[:4] + (["..."] if len(v) > 4 else []) for k, v in waiting.items()},
                    list(self.parked)[:4])

    def wait_for(self, kind: str, count: int, what: str) -> list[tuple]:
        """Pump until `count` replies of `kind` arrived (env calls keep being served meanwhile)."""
        deadline = time.monotonic() + self.cfg.launch.rank_timeout_s
        got: list[tuple] = []
        while len(got) < count:
            self.pump()
            keep = []
            for src, msg in self.replies:
                (got if msg[0] == kind else keep).append((src, msg))
            self.replies = keep
            if time.monotonic() > deadline:
                raise RuntimeError(f"coordinator: waited {self.cfg.launch.rank_timeout_s:.0f} s for {what}; got {len(got)}/{count}")
        return got

    # ---- the run -------------------------------------------------------------------------------------
    def run(self, handoff: str | None) -> dict:
        self.groups_mgr.apply(self.role_map)
        self.wait_for("ready", self.ctx.world_size - 1, "every worker to load its role")
        self.t0 = time.monotonic()  # throughput counts from here: model loading is start-up, not training
        self.router.set_layout(self.role_map, self.now())
        if handoff:  # resumed: rollout ranks need the trained weights
            self.sync_weights()
        log.info("[libra] %s on %s | %s", self.cfg.run.system, self.cfg.run.bench, self.role_map.describe())
        try:
            while self.trained < self.cfg.run.steps:
                self.admit()
                self.pump()
                self.maybe_train()
        finally:
            self.writer.trace()
            self.view.close()
        return self.shutdown()

    def admit(self) -> None:
        while self.admitted <= self.trained + self.lookahead and self.admitted < self.cfg.run.steps and not self.parked:
            self._admit_step(self.admitted)
            self.admitted += 1

    def task_for(self, step: int, j: int):
        """Task j of step s: a seeded shuffle per pass over the tasks, so (seed, s, j) fixes it (resume)."""
        idx, n = step * self.cfg.step.prompts_per_step + j, len(self.tasks)
        order = list(range(n))
        random.Random(self.cfg.run.seed * 100_003 + idx // n).shuffle(order)
        return self.tasks[order[idx % n]]

    def _admit_step(self, s: int) -> None:
        st = self.steps[s] = _Step(index=s, admitted_s=self.now())
        from engine.chat import render_prompt

        for j in range(self.cfg.step.prompts_per_step):
            task = self.task_for(s, j)
            if task.task_id not in self.prompt_cache:
                self.prompt_cache[task.task_id] = render_prompt(self.tokenizer, list(task.messages), list(task.tools))
            prompt_ids = self.prompt_cache[task.task_id]
            group_id = f"s{s}-p{j}"
            for i in range(self.cfg.step.samples_per_prompt):
                rid = f"{group_id}-n{i}"
                route = self.router.admit(rid, task.task_id, len(prompt_ids), self.now())
                self.reqs[rid] = _Req(rid, task, group_id, s, self.env.start(task), route.instance_id)
                self.ledger.start(rid, s)
                st.rids.append(rid)
                self.mailbox.send(self.leader(route.instance_id), ("add", {
                    "request_id": rid, "task": task, "prompt_ids": prompt_ids, "group_id": group_id}))

    # ---- worker messages ------------------------------------------------------------------------------
    def _on_env(self, src: int, call_id: int, rid: str, op: str, arg) -> None:
        req = self.reqs.get(rid)
        if req is None:
            assert op == "close", f"env {op} for unknown request {rid}"
            return
        self.pool.submit(self._env_call, src, call_id, req, op, arg)

    def _env_call(self, src: int, call_id: int, req: _Req, op: str, arg) -> None:
        from envs.base import ToolInfraError

        try:
            if op == "close":
                req.episode.close()
                return
            value = req.episode.execute(arg) if op == "execute" else req.episode.score(arg)
            reply = ("env_result", call_id, True, value)
        except ToolInfraError as exc:
            reply = ("env_result", call_id, False, exc)
        except Exception as exc:  # an env bug must not hang the trajectory: it is an infra failure
            log.exception("[libra coordinator] env %s failed for %s", op, req.rid)
            reply = ("env_result", call_id, False, ToolInfraError(f"{op} raised {type(exc).__name__}: {exc}"))
        self.mailbox.send(src, reply)

    def _on_events(self, src: int, instance_id: int, events: list) -> None:
        now = self.now()
        for ev in events:
            kind = type(ev).__name__
            req = self.reqs.get(ev.request_id)
            if req is None:
                continue
            if kind == "Finished":  # also while an export is in flight: that export will fail, the result stands
                self._finished(req, ev.trajectory)
                continue
            if req.migrating:
                continue
            if kind == "ToolReturned":
                decision = self.router.on_tool_return(req.rid, ev.outcome, ev.tokens_so_far, now)
            else:
                decision = self.router.on_decode(req.rid, ev.tokens_so_far, now)
            moving = decision.migrate and decision.instance_id != req.instance_id
            if moving or req.instance_id in self.leaving:  # leaving: its instance goes away at this boundary
                self._export(req)

    def _export(self, req: _Req) -> None:
        req.migrating = True
        self.mailbox.send(self.leader(req.instance_id), ("export", req.rid))

    def _on_exported(self, src: int, rid: str, state) -> None:
        req = self.reqs[rid]
        route = self.router.route_of(rid)
        if self.view.reconfiguring:
            self.parked[rid] = state
            return
        self._readd(req, route.instance_id, state)
        self.migrations += 1

    def _readd(self, req: _Req, instance_id: int, state) -> None:
        req.instance_id, req.migrating = instance_id, False
        self.mailbox.send(self.leader(instance_id), ("add", {
            "request_id": req.rid, "task": req.task, "prompt_ids": [], "group_id": req.group_id, "state": state}))

    def _on_export_failed(self, src: int, rid: str, reason: str) -> None:
        req = self.reqs.get(rid)
        if req is not None:
            req.migrating = False  # it finished or waits on a tool: it stays where it is

    def _finished(self, req: _Req, traj: Trajectory) -> None:
        self._progress_t = time.monotonic()
        self.router.on_finish(req.rid, traj.num_tokens, self.now())
        st = self.steps[req.step]
        if traj.finish_reason == "tool_infra":
            self.ledger.drop(req.rid, "tool_infra")
            st.done[req.rid] = None
        else:
            self.ledger.finish(req.rid)
            st.done[req.rid] = traj
        del self.reqs[req.rid]
        self.writer.trajectory({"step": req.step, "request_id": req.rid, "task_id": traj.task_id, "num_tokens": traj.num_tokens,
                                "prompt_len": traj.prompt_len, "turns": traj.turns, "tool_outcomes": traj.tool_outcomes,
                                "tool_latency_s": traj.tool_latency_s, "instances": traj.instances, "reward": traj.reward,
                                "finish_reason": traj.finish_reason})
        if st.complete and st.ready_s is None:
            st.ready_s = self.now()

    # ---- training, sync, step end ---------------------------------------------------------------------
    def maybe_train(self) -> None:
        st = self.steps.get(self.trained)
        if st is None or not st.complete:
            return
        batch = []
        for rid, traj in sorted(st.done.items()):  # finish order is a race: train in request order
            if traj is None:
                continue
            versions = traj.policy_versions
            if versions and self.version - versions[0] > self.cfg.step.max_staleness:
                self.ledger.drop(rid, "stale")
            else:
                batch.append(traj)
        t_train = self.now()
        if batch:
            for r in self.role_map.trainer_ranks:
                self.mailbox.send(r + 1, ("train", st.index, batch, self.version))
            (_, (_, _, train_metrics)), = self.wait_for("trained", 1, f"the trainer to finish step {st.index}")
            for t in batch:
                self.ledger.train(t.request_id, t.task_id)
            self.version += 1
        else:
            train_metrics = {}
        train_s = self.now() - t_train
        sync_s = self.sync_weights() if batch else 0.0
        self.end_step(st, batch, t_train, train_s, sync_s, train_metrics)

    def sync_weights(self) -> float:
        t0 = self.now()
        self.send_all(("sync", self.version))
        leaders = {inst.ranks[0] for inst in self.role_map.instances} | {self.role_map.trainer_ranks[0]}
        self.wait_for("synced", len(leaders), f"weights v{self.version} to reach every rollout rank")
        return self.now() - t0

    def end_step(self, st: _Step, batch: list[Trajectory], t_train: float, train_s: float, sync_s: float, train_metrics: dict) -> None:
        now = self.now()
        rewards = [t.reward for t in batch if t.reward is not None]
        staleness = max((self.version - 1 - t.policy_versions[0] for t in batch if t.policy_versions), default=0)
        row = {
            "step": st.index + 1, "time_s": now, "step_s": now - self.last_step_end,
            "rollout_s": (st.ready_s or now) - st.admitted_s, "train_s": train_s, "sync_s": sync_s,
            "reconfig_s": self.reconfig_s, "tokens": sum(t.num_tokens for t in batch), "trajectories": len(batch),
            "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0, "staleness_max": staleness,
            "migrations": self.migrations, "role_map": self.role_map.summary(), "role_map_desc": self.role_map.describe(),
            "policy_version": self.version, **{k: v for k, v in train_metrics.items() if isinstance(v, (int, float))},
        }
        row.update(self.view.idle_fractions(row, self.role_map))
        self.writer.span(f"rollout step {st.index + 1}", "rollout", st.admitted_s, row["rollout_s"])
        self.writer.span(f"train step {st.index + 1}", "trainer", t_train, train_s)
        self.writer.span(f"sync v{self.version}", "sync", t_train + train_s, sync_s)
        self.metrics.append(row)
        self.writer.metrics(row)
        self.view.step_line(row, self.cfg.run.steps)
        self._write_samples(st, batch)
        self.trained += 1
        self.last_step_end = now
        self.reconfig_s = 0.0
        del self.steps[st.index]
        self._replan(row, batch)
        every = self.cfg.step.checkpoint_every
        if every and self.trained % every == 0 and self.trained < self.cfg.run.steps:
            checkpoint.save_run_state(self)

    def _write_samples(self, st: _Step, batch: list[Trajectory]) -> None:
        for t in batch[: self.cfg.step.trajectories_logged_per_step]:
            text = self.tokenizer.decode(t.token_ids[t.prompt_len:], skip_special_tokens=False)
            self.writer.sample({"step": st.index + 1, "request_id": t.request_id, "task_id": t.task_id, "reward": t.reward,
                                "finish_reason": t.finish_reason, "tool_outcomes": t.tool_outcomes, "instances": t.instances,
                                "completion": text})

    # ---- planner & reconfiguration ---------------------------------------------------------------------
    def _replan(self, row: dict, batch: list[Trajectory]) -> None:
        if self.planner is None:
            return
        train_s = row["train_s"] if row.get("train/stepped", 1) else 0.0  # a skipped update measures no training
        stats = StepStats(step=row["step"], rollout_s=row["rollout_s"], train_s=train_s, sync_s=row["sync_s"],
                          trajectory_tokens=tuple(t.num_tokens for t in batch),
                          decode_tokens=tuple(t.num_model_tokens for t in batch),  # tool output is not decoded
                          tool_latency_s=tuple(x for t in batch for x in t.tool_latency_s),
                          train_tokens=row["tokens"], role_map=self.role_map)
        decision = self.planner.on_step_end(stats, self.now())
        if decision is not None and self.trained < self.cfg.run.steps:
            log.info("[libra] planner: %s -> %s (%s)", self.role_map.describe(), decision.role_map.describe(), decision.reason)
            self.reconfigure(decision.role_map)

    def reconfigure(self, proposed: RoleMap) -> None:
        t0 = self.now()
        new = keep_instance_ids(self.role_map, proposed).with_version(self.role_map.version + 1)
        kept = {inst.instance_id for inst in new.instances}
        leaving = {inst.instance_id for inst in self.role_map.instances} - kept
        self.view.reconfiguring = True
        for req in list(self.reqs.values()):
            if req.instance_id in leaving and not req.migrating:
                self._export(req)
        # requests waiting on a tool refuse export: `_on_events` exports them when their tool returns
        self.leaving = leaving
        while any(r.instance_id in leaving and r.rid not in self.parked for r in self.reqs.values()):
            self.pump()
        self.leaving = set()
        handoff = None
        if new.trainer_ranks != self.role_map.trainer_ranks:
            handoff = str(self.out / "handoff" / f"v{new.version}")
            for r in self.role_map.trainer_ranks:
                self.mailbox.send(r + 1, ("save", handoff))
            self.wait_for("saved", 1, "the trainer to save its state for the new trainer group")
        self.send_all(("role_map", new, handoff))
        self.groups_mgr.apply(new)
        self.wait_for("ready", self.ctx.world_size - 1, f"every worker to take its role in {new.describe()}")
        self.role_map = new
        moved = self.router.set_layout(new, self.now())
        for rid, state in self.parked.items():
            route = moved.get(rid) or self.router.route_of(rid)
            self._readd(self.reqs[rid], route.instance_id, state)
        self.parked.clear()
        self.view.reconfiguring = False
        self.sync_weights()
        self.reconfig_s = self.now() - t0
        self.view.role_changes += 1
        self.writer.span(f"reconfigure -> v{new.version}", "planner", t0, self.reconfig_s, layout=new.describe())

    # ---- end of run -------------------------------------------------------------------------------------
    def shutdown(self) -> dict:
        for req in list(self.reqs.values()):
            self.mailbox.send(self.leader(req.instance_id), ("cancel", req.rid))
            self.router.on_cancel(req.rid, self.now())
            req.episode.close()  # here, not via the engine: the coordinator stops serving env calls
        self.reqs.clear()
        self.ledger.close()
        self.ledger.check()
        checkpoint.save_run_state(self)
        self.send_all(("stop",))
        self.groups_mgr.destroy()
        self.pool.shutdown(wait=True, cancel_futures=True)
        wall_s = self.now()
        counts = self.ledger.counts()
        summary = summarize(self.metrics, bench=self.cfg.run.bench, system=self.cfg.run.system, mode="real",
                            wall_s=wall_s, dropped=counts["dropped"], peak_rss_mb=0.0, ledger=counts,
                            role_map_changes=self.view.role_changes, model=self.cfg.run.model,
                            trained_task_ids=self.ledger.trained_order)
        return summary
