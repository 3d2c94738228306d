"""The coordinator (global rank 0): the mailbox loop of real ranks around the step core.

        tasks ──admit──▶ StepCore ──Add──▶ rollout leader(s) ──Events──▶ coordinator ──▶ StepCore
                          │  migrate: Export ─▶ Exported ─▶ Add(state) on the target
                          │  env calls: EnvCall ◀──▶ EnvResult (episodes live here, tools in a thread pool)
                          └── step complete ─▶ Train ─▶ Trained ─▶ Sync to all ─▶ Synced
                              ─▶ metrics row ─▶ planner ─▶ (export, Save hand-off, ApplyRoleMap) ─▶ ...

What a step *is* (admission with lookahead, the ledger, stale drops, the metrics row, the
planner's stats, which requests must drain for a new layout) is `steps/core.py`, the
same core the simulator drives. This module only turns its commands into `engine/runtime/protocol.py`
messages, feeds it the replies, runs the env calls, and writes the run outputs.

Algorithm:
  1. Step s owns `prompts_per_step` tasks (a deterministic function of s and the seed), each
     sampled `samples_per_prompt` times (one GRPO group per task); the core says when step s
     may start.
  2. Rollout events go to the core; its `Export` becomes a message to the instance leader and
     the `Exported` state is re-added where the core says (the target re-prefills).
  3. A complete step's batch goes to every trainer rank; after `Trained` the new weights go to
     every rollout rank, and the core closes the step (row, stats, planner).
  4. A new role map: the core exports the requests of instances that go away (one in a tool call at once:
     the instance it moves to re-issues the call, which runs once, `engine/runtime/once.py`; one being
     scored finishes first); once drained, a changed trainer group saves its state for the new one,
     every rank rebuilds its groups, and the parked requests are re-added.
  5. A stop (SIGTERM/SIGHUP/SIGINT, forwarded by the launcher: `engine/runtime/launch.py`) ends the run at
     once (a training step first finishes) the way its end does: in-flight work cancelled, a
     checkpoint of the last trained step, the trace and the summary (`stopped_by`). The trace is also rewritten
     every `TRACE_EVERY_S`, so a killed run keeps one; a resumed run continues the clock, trace,
     ledger and output files of the checkpoint it starts from. So that a stop never loses the run,
     the first step this run trains is checkpointed at once, and the coordinator publishes to the
     launcher what a stop needs (the last step's training, sync and checkpoint, measured) and the
     newest checkpoint's step, which the launcher says before it kills on a second signal.

Invariants (tests/engine/runtime/test_coordinator.py, tests/engine/runtime/test_e2e.py): every started trajectory is
trained exactly once or dropped with a reason; the task ids trained follow the deterministic
step order, also across a resume; staleness never exceeds max_staleness; a run ends with every
episode closed.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import random
import shutil
import time
from pathlib import Path

from engine.runtime import checkpoint
from engine.runtime import protocol as msg
from engine.runtime.groups import GroupManager
from engine.runtime.once import CallOnce
from engine.runtime.launch import CHECKPOINT_KEY, FIRST_STEP_NEEDS_S, STOP_NEEDS_KEY, RankContext, stop_requested
from engine.runtime.protocol import WORKER_OFFSET, to_global
from engine.rollout.api import Finished, Progress, ToolReturned
from engine.trajectory import Trajectory
from engine.runtime.view import StepView
from loggers import MetricLoggers
from runlog import RunWriter, summarize
from steps import commands, core
from scheduler.layout import RoleMap
from scheduler.systems import lookahead_of

log = logging.getLogger(__name__)

TRACE_EVERY_S = 30.0  # trace.json is rewritten at a step end at most this often (and at the end)


def core_config(cfg, spec, design=None) -> commands.CoreConfig:
    """Lookahead = max_staleness for async systems, 0 for synchronous ones: staleness is bounded by construction.
    Idle TP1 instances may join training (`elastic`) where the system does it and the runtime can.
    `design`: libra's first design (scheduler/design.py), whose lookahead, bound and batching the run starts on."""
    lookahead = design.lookahead if design else lookahead_of(spec.name, cfg.step.max_staleness)
    return commands.CoreConfig(num_steps=cfg.run.steps, lookahead=lookahead,
                               max_staleness=design.max_staleness if design else cfg.step.max_staleness,
                               checkpoint_every=cfg.step.checkpoint_every,
                               checkpoint_every_s=cfg.step.checkpoint_every_min * 60,
                               batch_by_finish=design.batch_by_finish if design else spec.batch_by_finish,
                               # libra's finish-order designs: the trained lag too (unless the planner says admission only)
                               bound_trained_lag=spec.chooses_design and cfg.planner.bound_trained_lag,
                               checkpoint_first=True,
                               # a helper computes its gradient with the torch model it decodes with, and has no KL reference
                               elastic=spec.elastic and cfg.rollout.backend != "vllm" and cfg.trainer.kl_coef == 0)


def finished_of(traj: Trajectory) -> commands.Finished:
    versions = traj.policy_versions
    return commands.Finished(num_tokens=traj.num_tokens, num_model_tokens=traj.num_model_tokens,
                         tool_latency_s=tuple(traj.tool_latency_s), signal_tokens=traj.signal_tokens,
                         first_version=versions[0] if versions else None, reward=traj.reward,
                         reward_reason=getattr(traj.reward, "reason", ""),
                         infra_failed=traj.finish_reason == "tool_infra", payload=traj)


class Coordinator:
    def __init__(self, ctx: RankContext, cfg, role_map: RoleMap, out_dir: Path, parts, resume: commands.RunState | None):
        self.ctx, self.cfg, self.out = ctx, cfg, Path(out_dir)
        self.mailbox = ctx.mailbox
        self.env, self.tasks, self.tokenizer = parts.env, parts.tasks, parts.tokenizer
        self.core = core.StepCore(core_config(cfg, parts.spec, parts.design), parts.router, parts.planner, role_map, state=resume)
        self.groups_mgr = GroupManager(ctx.store, global_rank=0, world_size=ctx.world_size, rank_offset=WORKER_OFFSET,
                                       timeout_s=cfg.launch.timeout_s, device_kind=ctx.device_info.kind,
                                       devices=ctx.device_keys(cfg.launch.timeout_s) if ctx.device_info.kind != "cpu" else None,
                                       leader_engines=cfg.rollout.backend == "vllm")
        self.pool = cf.ThreadPoolExecutor(max(8, cfg.rollout.tool_workers), thread_name_prefix="libra-env")
        self.writer = RunWriter(self.out)
        self.resumed_from = resume.step if resume else None
        self.loggers = MetricLoggers(cfg.run.loggers, self.out, cfg.to_dict(), resume_step=self.resumed_from)
        self.view = StepView()
        self.episodes: dict[str, object] = {}
        self.tool_calls = CallOnce()  # a request's tool call, re-issued by the instance it moved to, runs once
        self.env_start_s: dict[str, float] = {}  # request -> its episode's start time (the trace records it)
        self.exported: dict[str, object] = {}  # migration states waiting for their new instance
        self.replies: list = []
        self.prompt_cache: dict[str, list[int]] = {}
        self.metrics: list[dict] = self.writer.truncate_to_step(resume.step, resume.wall_s) if resume else []
        self.role_changes = 0
        self.planner_notes: list[list] = []  # [step, what the planner concluded there] for the summary's story
        if parts.design is not None:  # libra's first design, chosen in the launcher (engine/runtime/run.py)
            self.planner_notes.append([0, f"started on the design {parts.design.label}, ranked on the tasks' prompts at "
                                          f"the generation caps ({parts.design.step_s:.1f} s a step predicted)"])
        self.mailbox.beat("coordinator")  # the role a failure report names for rank 0
        self.t0 = time.monotonic()
        self.t_offset = resume.wall_s if resume else 0.0  # a resumed run's clock goes on from its checkpoint
        self._trace_t = 0.0
        self._step_s: float | None = None  # the last step's training and sync, as measured
        self._save_s: float | None = None  # the last checkpoint's save, as measured
        self._progress_t = self._stall_t = time.monotonic()

    @property
    def bench_name(self) -> str:
        """What the run trains on: the bench, or the name of the `--env` plug-in."""
        return self.env.name if self.cfg.run.env else self.cfg.run.bench

    @property
    def role_map(self) -> RoleMap:
        return self.core.role_map

    # ---- time & messages ---------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self.t0 + self.t_offset

    def leader(self, instance_id: int) -> int:
        return to_global(self.role_map.instance(instance_id).ranks[0])

    def send_workers(self, message, workers=None) -> None:
        """A collective command: every worker it concerns (all by default) gets the same message."""
        for w in (range(self.role_map.world_size) if workers is None else workers):
            self.mailbox.send(to_global(w), message)

    def pump(self) -> None:
        received = self.mailbox.poll()
        for src, message in received:
            self.view.heard_from(src)
            self._dispatch(src, message)
        if not received:
            time.sleep(0.001)
        self._report_stall()
        self.view.tick(self.now(), self.role_map, self.core.requests, self.core.trained, self.cfg.run.steps)
        self.view.check_health(self.mailbox, self.ctx.world_size, self.cfg.launch.rank_timeout_s, self.now(),
                               self.cfg.launch.straggler_s)

    def _dispatch(self, src: int, message) -> None:
        match message:
            case msg.Events(_, events):
                self._on_events(events)
            case msg.EnvCall():
                self._on_env_call(src, message)
            case msg.Exported(rid, state):
                self.exported[rid] = state
                self._send_adds([a for a in [self.core.on_exported(rid, self.now())] if a is not None])
            case msg.ExportFailed(rid, _):
                self.core.on_export_failed(rid)
            case msg.Ready() | msg.Trained() | msg.Synced() | msg.Saved():
                self.replies.append(message)
            case msg.LogLine(text):
                self.view.print_line(text)
            case _:
                raise RuntimeError(f"coordinator: unexpected {type(message).__name__} from rank {src}")

    def wait_for(self, kind: type, count: int, what: str) -> list:
        """Pump until `count` replies of `kind` arrived (env calls and events keep being served meanwhile)."""
        deadline = time.monotonic() + self.cfg.launch.rank_timeout_s
        got: list = []
        while len(got) < count:
            self.pump()
            got += [m for m in self.replies if isinstance(m, kind)]
            self.replies = [m for m in self.replies if not isinstance(m, kind)]
            if time.monotonic() > deadline:
                silent = self.view.silent()  # the root cause, when a rank stopped running
                raise RuntimeError(f"coordinator: waited {self.cfg.launch.rank_timeout_s:.0f} s for {what}; got {len(got)}/{count}"
                                   + (f"; {silent}" if silent else ""))
        return got

    def _report_stall(self, every_s: float = 30.0) -> None:
        """Say what the run waits for when nothing has finished for a while."""
        t = time.monotonic()
        if t - self._progress_t < every_s or t - self._stall_t < every_s:
            return
        self._stall_t = t
        waiting = self.core.waiting()
        if not waiting:  # every admitted trajectory is done: the run waits on the trainer, which is not a stall
            return
        log.warning("[libra] no trajectory finished for %.0f s; waiting for %s; parked %s",
                    t - self._progress_t, {k: v[:4] + (["..."] if len(v) > 4 else []) for k, v in waiting.items()},
                    sorted(self.core.parked)[:4])

    # ---- the run -------------------------------------------------------------------------------------
    def run(self, handoff: str | None) -> dict:
        self.groups_mgr.apply(self.role_map)
        self.wait_for(msg.Ready, self.role_map.world_size, "every worker to load its role")
        self.t0 = time.monotonic()  # throughput counts from here: model loading is start-up, not training
        self.core.start(self.now())
        if handoff:  # resumed: rollout ranks need the trained weights
            self.sync_weights()
        log.info("[libra] %s on %s | %s", self.cfg.run.system, self.bench_name, self.role_map.describe())
        try:
            while not self.core.done and not self._stopping():
                self.admit()
                self.pump()
                self.maybe_train()
        finally:
            self.writer.trace()
            self.view.close()
            self.loggers.close()
        return self.shutdown()

    def _stopping(self) -> bool:
        """A stop signal reached this process (the launcher forwards its own): end the run now."""
        signame = stop_requested()
        if signame:
            self.view.close()  # the stop notice and what follows are not drawn over by the panel
            log.warning("[libra] %s: stopping after step %d of %d; writing its checkpoint, the trace and the summary",
                        signame, self.core.trained, self.cfg.run.steps)
        return signame is not None

    def task_for(self, step: int, j: int):
        """Task j of step s: a seeded shuffle per pass over the tasks, so (seed, s, j) fixes it (resume)."""
        idx, n = step * self.cfg.step.prompts_per_step + j, len(self.tasks)
        order = list(range(n))
        random.Random(self.cfg.run.seed * 100_003 + idx // n).shuffle(order)
        return self.tasks[order[idx % n]]

    def admit(self) -> None:
        while (s := self.core.next_admissible()) is not None:
            requests = []
            for j in range(self.cfg.step.prompts_per_step):
                task = self.task_for(s, j)
                prompt_ids = self._prompt_ids(task)
                group = commands.group_id(s, j)
                for i in range(self.cfg.step.samples_per_prompt):
                    requests.append(commands.NewRequest(request_id=f"{group}-n{i}", group_id=group,
                                                        prompt_id=task.task_id, prompt_tokens=len(prompt_ids), task=task))
            for r in requests:  # one by one, on this loop: what the simulator charges per step (env_start_s)
                t0 = time.monotonic()
                self.episodes[r.request_id] = self.env.start(r.task)
                self.env_start_s[r.request_id] = time.monotonic() - t0
            self._send_adds(self.core.admit(s, requests, self.now()))

    def _prompt_ids(self, task) -> list[int]:
        if task.task_id not in self.prompt_cache:
            from engine.chat import render_prompt

            self.prompt_cache[task.task_id] = render_prompt(self.tokenizer, list(task.messages), list(task.tools))
        return self.prompt_cache[task.task_id]

    def _send_adds(self, adds: list[commands.Add]) -> None:
        for a in adds:
            state = self.exported.pop(a.request_id) if a.resumed else None
            prompt_ids = [] if a.resumed else self._prompt_ids(a.task)
            self.mailbox.send(self.leader(a.instance_id), msg.Add(a.request_id, a.task, prompt_ids, a.group_id, state))

    def _send_exports(self, exports: list[commands.Export]) -> None:
        for e in exports:
            self.mailbox.send(self.leader(e.instance_id), msg.Export(e.request_id))

    # ---- worker messages ------------------------------------------------------------------------------
    def _on_events(self, events: list) -> None:
        now = self.now()
        for ev in events:
            match ev:
                case Finished(rid, traj):  # also while an export is in flight: that export fails, the result stands
                    if rid in self.core.requests:
                        self._finished(rid, traj)
                case ToolReturned(rid, outcome, tokens):
                    self._send_exports([e for e in [self.core.on_tool_return(rid, outcome, tokens, now)] if e])
                case Progress(rid, tokens):
                    self._send_exports([e for e in [self.core.on_decode(rid, tokens, now)] if e])

    def _on_env_call(self, src: int, call: msg.EnvCall) -> None:
        episode = self.episodes.pop(call.request_id, None) if call.op is msg.EnvOp.CLOSE else self.episodes.get(call.request_id)
        if episode is None:
            if call.op is not msg.EnvOp.CLOSE:
                # a late call of a tool thread the engine stopped waiting for, after its episode closed:
                # answered (nobody waits for it any more), never a crash of the coordinator
                from envs.base import ToolInfraError

                self.mailbox.send(src, msg.EnvResult(call.call_id, False, ToolInfraError(
                    f"{call.request_id}: its episode is closed; the {call.op} call came too late")))
            return
        self.pool.submit(self._env_call, src, call, episode)

    def _env_call(self, src: int, call: msg.EnvCall, episode) -> None:
        def send(outcome: tuple[bool, object]) -> None:
            self.mailbox.send(src, msg.EnvResult(call.call_id, *outcome))

        if call.op is msg.EnvOp.EXECUTE and call.key is not None:  # re-issued by the instance it moved to: run once
            self.tool_calls.run(call.request_id, call.key, lambda: self._env_outcome(call, episode), send)
            return
        outcome = self._env_outcome(call, episode)
        if call.op is msg.EnvOp.CLOSE:
            self.tool_calls.forget(call.request_id)
        if outcome is not None:
            send(outcome)

    @staticmethod
    def _env_outcome(call: msg.EnvCall, episode) -> tuple[bool, object] | None:
        """The episode's answer as (ok, value); None after a close that went well (no reply)."""
        from envs.base import Reward, ToolInfraError, failure

        try:
            if call.op is msg.EnvOp.CLOSE:
                episode.close()
                return None
            return True, episode.execute(call.arg) if call.op is msg.EnvOp.EXECUTE else episode.score(call.arg)
        except ToolInfraError as exc:
            return False, exc
        except Exception as exc:  # noqa: BLE001 - the env raised on what the model made: a failure it sees, or a 0
            log.warning("[libra coordinator] env %s raised %s for %s: %s", call.op, type(exc).__name__, call.request_id,
                        str(exc)[:200], exc_info=True)
            return True, (failure(getattr(call.arg, "name", "<parse>"), f"the tool raised {type(exc).__name__}: {str(exc)[:300]}")
                          if call.op is msg.EnvOp.EXECUTE else Reward(0.0, "score_error"))

    def _finished(self, rid: str, traj: Trajectory) -> None:
        self._progress_t = time.monotonic()
        step = self.core.requests[rid].step
        self.core.on_finished(rid, finished_of(traj), self.now())
        self.writer.trajectory({"step": step + 1, "request_id": rid, "task_id": traj.task_id, "num_tokens": traj.num_tokens,
                                "prompt_len": traj.prompt_len, "turns": traj.turns, "tool_outcomes": traj.tool_outcomes,
                                "tool_latency_s": traj.tool_latency_s, "instances": traj.instances, "reward": traj.reward,
                                "reward_reason": getattr(traj.reward, "reason", ""), "finish_reason": traj.finish_reason, "score_s": round(traj.score_s, 4),
                                "env_start_s": round(self.env_start_s.pop(rid, 0.0), 4)})

    # ---- training, sync, step end ---------------------------------------------------------------------
    def maybe_train(self) -> None:
        batch = self.core.take_batch(self.now())
        if batch is None:
            return
        t_train = self.now()
        sync_s = 0.0
        if batch.payloads:
            self._publish(STOP_NEEDS_KEY, self._stop_needs_s())  # a stop from here on waits for this step
            helpers = tuple(self.role_map.instance(i).ranks[0] for i in batch.helpers)  # idle TP1 instances join
            self.send_workers(msg.Train(batch.step, list(batch.payloads), batch.policy_version, helpers),
                              self.role_map.trainer_ranks + helpers)
            trained, = self.wait_for(msg.Trained, 1, f"the trainer to finish step {batch.step}")
            # the trainer reports whether it stepped (it skips a step with no signal, or a non-finite one)
            self.core.on_trained(train_s=self.now() - t_train, stepped=bool(trained.metrics.get("train/stepped", 1)),
                                 metrics=trained.metrics)
            sync_s = self.sync_weights()
        end = self.core.end_step(self.now(), sync_s=sync_s)
        self._step_s = end.row.train_s + sync_s
        self._write_step(end, batch, t_train)
        self.planner_notes += [[end.row.step, note] for note in end.planner_notes]
        if end.plan is not None:
            log.info("[libra] planner: %s -> %s (%s)", self.role_map.describe(), end.plan.role_map.describe(), end.plan.reason)
            self.reconfigure(end.plan.role_map)  # a new design's lookahead and batching: the core applied them
        if end.checkpoint:
            self.save_checkpoint()
        if self.now() - self._trace_t >= TRACE_EVERY_S:  # a killed run keeps a recent trace
            self._trace_t = self.now()
            self.writer.trace()

    def sync_weights(self) -> float:
        t0 = self.now()
        self.send_workers(msg.Sync(self.core.version))
        leaders = {inst.ranks[0] for inst in self.role_map.instances} | {self.role_map.trainer_ranks[0]}
        self.wait_for(msg.Synced, len(leaders), f"weights v{self.core.version} to reach every rollout rank")
        return self.now() - t0

    def _write_step(self, end: commands.StepEnd, batch: commands.TrainBatch, t_train: float) -> None:
        row = end.row
        d = row.to_dict()
        self.writer.span(f"rollout step {row.step}", "rollout", end.admitted_s, row.rollout_s)
        self.writer.span(f"train step {row.step}", "trainer", t_train, row.train_s)
        self.writer.span(f"sync v{row.policy_version}", "sync", t_train + row.train_s, row.sync_s)
        self.metrics.append(d)
        self.writer.metrics(d)
        self.loggers.log(d)
        if "console" in self.cfg.run.loggers:
            self.view.step_line(d, self.cfg.run.steps)
        for t in batch.payloads[: self.cfg.step.trajectories_logged_per_step]:
            text = self.tokenizer.decode(t.token_ids[t.prompt_len:], skip_special_tokens=False)
            self.writer.sample({"step": row.step, "request_id": t.request_id, "task_id": t.task_id, "reward": t.reward,
                                "finish_reason": t.finish_reason, "tool_outcomes": t.tool_outcomes, "instances": t.instances,
                                "completion": text})

    # ---- reconfiguration & checkpoints ------------------------------------------------------------------
    def reconfigure(self, proposed: RoleMap) -> None:
        t0 = self.now()
        old = self.role_map
        new, exports = self.core.begin_reconfigure(proposed)
        self._send_exports(exports)
        while not self.core.drained():  # a request being scored finishes where it is
            self.pump()
        phases = {"drain_s": self.now() - t0}
        handoff = None
        if new.trainer_ranks != old.trainer_ranks:
            handoff = str(self.out / "handoff" / f"v{new.version}")
            self.save_trainer(handoff, "the trainer to save its state for the new trainer group")
        phases["save_s"] = self.now() - t0 - sum(phases.values())
        self.send_workers(msg.ApplyRoleMap(new, handoff))
        self.groups_mgr.apply(new)
        self.wait_for(msg.Ready, new.world_size, f"every worker to take its role in {new.describe()}")
        if handoff:  # loaded by the new trainer group; a full model + optimizer copy is not kept around
            shutil.rmtree(handoff, ignore_errors=True)
        self._send_adds(self.core.finish_reconfigure(self.now()))
        phases["apply_s"] = self.now() - t0 - sum(phases.values())
        self.sync_weights()
        reconfig_s = self.now() - t0
        phases["sync_s"] = reconfig_s - sum(phases.values())
        self.core.add_reconfig_s(reconfig_s)
        self.role_changes += 1
        # where a switch's seconds go: the planner's payback rule is only as good as this figure
        log.info("[libra] reconfigured to %s in %.2f s (%s)", new.describe(), reconfig_s,
                 ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in phases.items()))
        self.writer.span(f"reconfigure -> v{new.version}", "planner", t0, reconfig_s, layout=new.describe(), **phases)

    def save_trainer(self, path: str, what: str) -> None:
        self.send_workers(msg.Save(path), self.role_map.trainer_ranks)
        saved, = self.wait_for(msg.Saved, 1, what)
        if saved.error:
            free = shutil.disk_usage(self.out).free / 2**20 if self.out.exists() else float("nan")
            raise OSError(f"{what} failed to write {path} ({free:.0f} MiB free there): {saved.error}")

    def save_checkpoint(self) -> Path | None:
        """A checkpoint of the last trained step; one that cannot be written (a full disk) is reported and
        training goes on: the newest complete checkpoint stays what `--resume` uses."""
        self.writer.trace()  # the trace up to the checkpoint survives a kill, and a resume continues it
        t0, state = time.monotonic(), self.core.state()
        try:
            path = checkpoint.save(self.out, state, self.save_trainer, keep=self.cfg.step.keep_checkpoints)
            self._save_s = time.monotonic() - t0
            self._publish(CHECKPOINT_KEY, state.step)
            self._publish(STOP_NEEDS_KEY, self._stop_needs_s())
            return path
        except OSError as exc:
            log.error("[libra] could not write the checkpoint of step %d (%s); --resume would use %s; training goes on",
                      self.core.trained, exc, checkpoint.latest(self.out) or "no checkpoint (none is complete)")
            return None

    def _stop_needs_s(self) -> float:
        """What a stop needs to finish the step in progress and checkpoint it, twice over as measured (the
        launcher waits that long: `engine.runtime.launch.stop_grace`); the first step is not measured yet."""
        if self._step_s is None:
            return FIRST_STEP_NEEDS_S
        return 2.0 * (self._step_s + (self._save_s or self._step_s)) + 5.0

    def _publish(self, key: str, value) -> None:
        self.ctx.store.set(key, str(value))

    # ---- end of run -------------------------------------------------------------------------------------
    def shutdown(self) -> dict:
        for c in self.core.cancel_all(self.now()):
            self.mailbox.send(self.leader(c.instance_id), msg.Cancel(c.request_id))
        for episode in self.episodes.values():
            episode.close()  # in flight, or its engine's close call has not arrived: the coordinator stops serving env calls
        self.episodes.clear()
        self.save_checkpoint()
        self.send_workers(msg.Stop())
        self.groups_mgr.destroy()
        self.pool.shutdown(wait=True, cancel_futures=True)
        counts = self.core.ledger.counts()
        return summarize(self.metrics, bench=self.bench_name, system=self.cfg.run.system, mode="real",
                         wall_s=self.now(), dropped=counts["dropped"], peak_rss_mb=0.0, ledger=counts,
                         role_map_changes=self.role_changes, model=self.cfg.run.model, planner_notes=self.planner_notes,
                         trained_task_ids=self.core.ledger.trained_order, resumed_from_step=self.resumed_from,
                         stopped_by=stop_requested())
