"""A worker rank: runs whatever roles the current role map gives it, as the coordinator says.

Loop of a worker (global rank >= 1):
  1. poll its mailbox for `engine/runtime/protocol.py` messages: `Add`/`Export`/`Cancel` (rollout
     leader), `EnvResult` (a tool or score reply for one of its trajectories), and the collective
     ones that every concerned rank receives: `Train`, `Sync`, `Save`, `ApplyRoleMap`, `Stop`
     (`Train` also reaches the leaders of idle TP1 instances the step core chose to join training:
     they compute a share of the gradient, engine/trainer/elastic.py);
  2. if it leads a rollout instance: one `RolloutEngine.step()`, events sent to the coordinator;
  3. meanwhile a thread beats (wall time + role) on the store (`engine.runtime.control.Heartbeat`).
Followers of a TP instance sit in a tick loop: the leader broadcasts `Tick.STEP` before each engine
step (the followers replay its KV ops) or `Tick.MAILBOX` before a collective command, so every rank
of the instance enters the same collective at the same time. With `--rollout.backend vllm` an
instance's engine is a `VllmRolloutEngine` (engine/rollout/vllm_engine.py) on its leader, over the model
saved as a directory, with one vLLM worker per rank of the instance (`tensor_parallel_size` = its
TP degree, each on that rank's device); its followers run no engine, join no TP group and no
weight sync (engine/runtime/groups.py `leader_engines`), and only take the collective commands.

Episodes (tool state, sandboxes, work dirs) live in the coordinator, so a trajectory can move to
another instance without moving any files: the engine gets a `RemoteEpisode` whose `execute` and
`score` are calls to the coordinator, answered through the mailbox (they block only the tool
thread that made them, never the decode loop). A request that moves during its tool call
re-issues it on its new instance with `execute_once`: the coordinator runs it once.

Role changes (`ApplyRoleMap`): every rank applies the map through `GroupManager` (same order
everywhere). A trainer whose group changed rebuilds its FSDP trainer from the hand-off state the
old trainers saved; a rollout instance whose ranks changed starts a new engine (its requests were
exported before the change) and gets the current weights at the next `sync`.

Invariants (tests/engine/runtime/test_e2e.py): every `add` ends in exactly one `Finished`, `exported` or cancel;
a rank only enters a collective the coordinator announced to every member.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import json
import logging
import os
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from engine.devices import peak_memory_mb
from engine.runtime import protocol as msg
from engine.runtime.control import Heartbeat
from engine.runtime.groups import GroupManager, Groups
from engine.runtime.launch import RankContext
from engine.precision import precision_for
from engine.runtime.protocol import COORDINATOR, WORKER_OFFSET, EnvOp, Tick, to_global, to_worker
from engine.runtime.view import ToCoordinator
from engine.runtime.weights import WeightReceiver, WeightSender, manifest
from scheduler.systems import get_system

log = logging.getLogger(__name__)


class ToolLink:
    """Blocking env calls from tool threads, answered by the coordinator through the mailbox."""

    def __init__(self, mailbox, timeout_s: float):
        self.mailbox = mailbox
        self.timeout_s = timeout_s
        self._ids = itertools.count()
        self._waiting: dict[int, cf.Future] = {}
        self._lock = threading.Lock()

    def call(self, request_id: str, op: EnvOp, arg, key=None):
        fut: cf.Future = cf.Future()
        with self._lock:
            call_id = next(self._ids)
            self._waiting[call_id] = fut
        self.mailbox.send(COORDINATOR, msg.EnvCall(call_id, request_id, op, arg, key))
        try:
            ok, value = fut.result(timeout=self.timeout_s)
        except cf.TimeoutError:
            from envs.base import ToolInfraError

            raise ToolInfraError(f"{request_id}: the coordinator did not answer {op} within {self.timeout_s:.0f} s") from None
        finally:
            with self._lock:
                self._waiting.pop(call_id, None)
        if not ok:
            raise value
        return value

    def fail_all(self, why: str) -> None:
        from envs.base import ToolInfraError

        with self._lock:
            waiting, self._waiting = list(self._waiting.values()), {}
        for fut in waiting:
            fut.set_result((False, ToolInfraError(why)))

    def resolve(self, call_id: int, ok: bool, value) -> None:
        with self._lock:
            fut = self._waiting.get(call_id)
        if fut is not None:  # None: the caller gave up (timeout) already
            fut.set_result((ok, value))


class RemoteEpisode:
    def __init__(self, link: ToolLink, request_id: str):
        self.link, self.request_id = link, request_id

    def execute(self, call):
        return self.link.call(self.request_id, EnvOp.EXECUTE, call)

    def execute_once(self, call, key):
        """`execute`, run once per key: a request that moved during its tool call re-issues it and gets its result."""
        return self.link.call(self.request_id, EnvOp.EXECUTE, call, key)

    def score(self, final_text: str) -> float:
        return self.link.call(self.request_id, EnvOp.SCORE, final_text)

    def close(self) -> None:
        self.link.mailbox.send(COORDINATOR, msg.EnvCall(-1, self.request_id, EnvOp.CLOSE, None))


def offload_rollout_for_training(colocated: bool, device_type: str) -> bool:
    """Colocated on an accelerator: free the rollout's KV and move its weights to the host while training.

    On CPU both copies share one memory anyway, so there is nothing to gain from moving them.
    """
    return colocated and device_type in ("cuda", "npu")


def _device_keys(ctx: RankContext, cfg) -> list[str] | None:
    """Every rank's device, for the groups' backend choice; None on CPU (gloo everywhere)."""
    return ctx.device_keys(cfg.launch.timeout_s) if ctx.device_info.kind != "cpu" else None


class Worker:
    def __init__(self, ctx: RankContext, cfg, device: torch.device):
        self.ctx, self.cfg, self.device = ctx, cfg, device
        # bf16 rollout, fp32 master + bf16 compute on accelerators; --rollout.dtype overrides the rollout's
        self.precision = precision_for(device.type, cfg.rollout.dtype)
        self.idx = to_worker(ctx.rank)  # worker index in role maps
        self.mailbox = ctx.mailbox
        self.groups_mgr = GroupManager(ctx.store, global_rank=ctx.rank, world_size=ctx.world_size,
                                       rank_offset=WORKER_OFFSET, timeout_s=cfg.launch.timeout_s,
                                       device_kind=ctx.device_info.kind, devices=_device_keys(ctx, cfg),
                                       leader_engines=cfg.rollout.backend == "vllm")
        self.groups: Groups | None = None
        self.link = ToolLink(self.mailbox, cfg.rollout.tool_timeout_s + 120.0)
        self.engine = None
        self.instance = None
        self.trainer = None
        self.trainer_ranks: tuple[int, ...] = ()
        self.receiver: WeightReceiver | None = None
        self.specs = None
        self.version = 0
        self.stats = {"engine_steps": 0, "busy_s": 0.0}
        self.rank_file: Path | None = None

    # ---- roles ----------------------------------------------------------------------------------
    def role(self) -> str:
        parts = []
        if self.trainer is not None:
            parts.append(f"trainer:{self.idx}")
        if self.instance is not None:
            i = self.instance
            parts.append(f"rollout:{self.idx} (instance {i.instance_id}, {i.bucket} TP{i.tp})")
        return " + ".join(parts) or f"idle:{self.idx}"

    def _load_model(self, dtype: torch.dtype):
        from engine.models import load_policy

        return load_policy(self.cfg.run.model, device=self.device, dtype=dtype, seed=self.cfg.run.seed)

    def apply_role_map(self, role_map, handoff: str | None) -> None:
        self.groups = self.groups_mgr.apply(role_map)
        self._setup_trainer(role_map, handoff)
        self._setup_rollout(role_map)
        self.ctx.set_role(self.role())
        self.mailbox.beat(self.role())
        if self.rank_file is not None:  # who is who, for people and fault tests: pid and role per rank
            self.rank_file.parent.mkdir(parents=True, exist_ok=True)
            self.rank_file.write_text(json.dumps({"rank": self.ctx.rank, "pid": os.getpid(), "role": self.role(),
                                                  "trainer": self.trainer is not None, "rollout": self.instance is not None}))

    def _setup_trainer(self, role_map, handoff: str | None) -> None:
        if self.idx not in role_map.trainer_ranks:
            self.trainer, self.trainer_ranks = None, ()
            return
        if self.trainer is not None and self.trainer_ranks == role_map.trainer_ranks:
            return  # same group: keep the live trainer (and its optimizer state)
        from engine.trainer.trainer import Trainer, load_handoff

        model, _ = self._load_model(self.precision.master_dtype)
        group = self.groups.trainer if len(role_map.trainer_ranks) > 1 else None
        self.trainer = Trainer(model, self.cfg.trainer, group=group, device=self.device, policy_version=self.version)
        self.trainer_ranks = role_map.trainer_ranks
        if handoff:
            load_handoff(self.trainer, handoff, self.device)

    def _setup_rollout(self, role_map) -> None:
        inst = role_map.instance_of(self.idx)
        if inst is None:
            self._close_engine()
            return
        if self.engine is not None and self.instance is not None and self.instance.ranks == inst.ranks:
            self.instance = inst
            self.engine.instance_id = inst.instance_id
            return
        self._close_engine()
        if self.cfg.rollout.backend == "vllm":
            self.instance = inst
            if inst.ranks[0] == self.idx:  # the leader's engine runs the whole instance; a follower lends its device
                self.engine = self._vllm_engine(inst)
            return
        from engine.rollout.engine import RolloutEngine

        model, tokenizer = self._load_model(self.precision.rollout_dtype)
        self.specs = manifest(model.state_dict())
        tp_group = self.groups.tp.get(inst.instance_id)
        if tp_group is not None:
            from engine.rollout.tp import parallelize

            model = parallelize(model, tp_group, device_type=self.device.type)
        self.engine = RolloutEngine(model, tokenizer, self.cfg.rollout, device=self.device, policy_version=self.version,
                                    tp_group=tp_group, instance_id=inst.instance_id,
                                    recompute_kv_on_update=get_system(self.cfg.run.system).interrupt_on_update)
        self.instance = inst

    def _vllm_engine(self, inst):
        """A vLLM engine over the instance's ranks: `tensor_parallel_size` = its TP degree, one vLLM worker per rank,
        each on that rank's device (GPU/NPU) or with that rank's threads (CPU). The HF model is loaded only for the
        weight receiver's manifest."""
        from engine.models import policy_dir
        from engine.rollout.vllm_engine import VllmRolloutEngine

        model, tokenizer = self._load_model(self.precision.rollout_dtype)
        self.specs = manifest(model.state_dict())
        del model
        keys = self.groups_mgr.device_keys(inst.ranks)
        return VllmRolloutEngine(policy_dir(self.cfg.run.model, self.cfg.run.seed), tokenizer, self.cfg.rollout, device=self.device,
                                 policy_version=self.version, instance_id=inst.instance_id, tensor_parallel_size=len(inst.ranks),
                                 dtype=str(self.precision.rollout_dtype).removeprefix("torch."),
                                 kv_cache_mb=self.cfg.rollout.vllm_kv_cache_mb, devices=keys,
                                 recompute_kv_on_update=get_system(self.cfg.run.system).interrupt_on_update)

    def _close_engine(self) -> None:
        if self.engine is not None:
            assert self.engine.idle, f"rank {self.idx}: rollout engine closed with requests in flight"
            self.engine.close()
        self.engine, self.instance = None, None

    @property
    def tp_leader(self) -> bool:
        return self.instance is not None and self.instance.ranks[0] == self.idx

    @property
    def tp_follower(self) -> bool:
        """A TP rank that replays its leader's engine steps (torch backend; a vLLM follower only lends its device)."""
        return self.instance is not None and self.instance.ranks[0] != self.idx and self.engine is not None

    def _tick(self, what: Tick | None) -> Tick:
        """Leader -> followers of this TP instance: what every rank does next."""
        group = self.groups.tp.get(self.instance.instance_id)
        if group is None:
            return what
        box = [what]
        dist.broadcast_object_list(box, src=to_global(self.instance.ranks[0]), group=group)
        return box[0]

    # ---- main loop --------------------------------------------------------------------------------
    def run(self, role_map, handoff: str | None) -> dict:
        heartbeat = Heartbeat(self.mailbox, lambda: self.ctx.role).start()
        try:
            self.apply_role_map(role_map, handoff)
            self.mailbox.send(COORDINATOR, msg.Ready(self.idx, self.role()))
            while True:
                if self.tp_follower:
                    tick = self._tick(None)
                    if tick is Tick.STEP:
                        self.engine.step()
                        continue
                    _, command = self.mailbox.recv(timeout_s=self.cfg.launch.rank_timeout_s, expect_from="the coordinator")
                    if self._collective(command):
                        break
                    continue
                if self._serve_messages():
                    break
                self._rollout_step()
        finally:
            heartbeat.stop()
        return {"rank": self.ctx.rank, "peak_rss_mb": peak_memory_mb().host_mb, **self.stats}

    def _rollout_step(self) -> None:
        if self.engine is None or not self.tp_leader:
            time.sleep(0.002)
            return
        if self.engine.idle:
            self._tick(Tick.STEP)  # followers keep replaying even while idle
            self.engine.step()
            time.sleep(0.002)
            return
        t0 = time.perf_counter()
        self._tick(Tick.STEP)
        events = self.engine.step()
        self.stats["engine_steps"] += 1
        if self.engine.num_running:
            self.stats["busy_s"] += time.perf_counter() - t0
        else:
            time.sleep(0.001)  # only tools in flight: let their threads run
        if events:
            log.debug("[libra %s] events %s", self.role(), [(type(e).__name__, e.request_id) for e in events])
            self.mailbox.send(COORDINATOR, msg.Events(self.instance.instance_id, events))

    def _serve_messages(self) -> bool:
        """Serve every waiting message; True once told to stop."""
        for _, command in self.mailbox.poll():
            match command:
                case msg.EnvResult(call_id, ok, value):
                    self.link.resolve(call_id, ok, value)
                case msg.Add():
                    self._add(command)
                case msg.Export(rid):
                    self._export(rid)
                case msg.Cancel(rid):
                    if rid in self.engine.seqs:
                        self.engine.cancel(rid)
                case _:
                    if self.tp_leader:
                        self._tick(Tick.MAILBOX)
                    if self._collective(command):
                        return True
        return False

    def _add(self, add: msg.Add) -> None:
        from engine.rollout.api import RolloutRequest

        log.debug("[libra %s] add %s (resumed=%s)", self.role(), add.request_id, add.state is not None)
        self.engine.add(RolloutRequest(request_id=add.request_id, task=add.task, episode=RemoteEpisode(self.link, add.request_id),
                                       prompt_ids=add.prompt_ids, group_id=add.group_id, state=add.state))

    def _export(self, rid: str) -> None:
        try:
            state = self.engine.export(rid)
        except (KeyError, ValueError) as exc:  # finished meanwhile, or being scored
            self.mailbox.send(COORDINATOR, msg.ExportFailed(rid, str(exc)))
            return
        self.mailbox.send(COORDINATOR, msg.Exported(rid, state))

    # ---- collective commands ----------------------------------------------------------------------
    def _collective(self, command) -> bool:
        """One command every member rank receives; True once told to stop."""
        match command:
            case msg.Train() if self.trainer is not None:
                self._train(command)
            case msg.Train():
                self._help(command)
            case msg.Sync(version):
                self._sync(version)
            case msg.Save(path):
                self._save(path)
            case msg.ApplyRoleMap(role_map, handoff):
                self.apply_role_map(role_map, handoff)
                self.mailbox.send(COORDINATOR, msg.Ready(self.idx, self.role()))
            case msg.Stop():
                self.link.fail_all("the run is stopping")
                if self.engine is not None:
                    self.engine.close()
                self.groups_mgr.destroy()
                return True
            case _:
                raise RuntimeError(f"worker {self.idx}: unexpected message {type(command).__name__} from the coordinator")
        return False

    def _train(self, train: msg.Train) -> None:
        t0 = time.perf_counter()
        if self.engine is not None and offload_rollout_for_training(self.groups.role_map.colocated, self.device.type):
            self.engine.offload()  # colocated: the trainer gets the rollout's KV and weight memory back
        metrics = self.trainer.train_step(train.trajectories, train.policy_version,
                                          helpers=tuple(to_global(w) for w in train.helpers))
        if self.idx == self.trainer_ranks[0]:
            metrics["train/wall_s"] = time.perf_counter() - t0
            self.mailbox.send(COORDINATOR, msg.Trained(train.step, metrics))

    def _help(self, train: msg.Train) -> None:
        """An idle TP1 instance joins the step: the gradient of its share, with the weights it decodes with."""
        from engine.trainer.elastic import help_step

        # the step core offered it with nothing in flight; a request that reached it since waits for the gradient
        assert self.idx in train.helpers and self.engine is not None, \
            f"worker {self.idx}: asked to help train step {train.step} but it hosts no rollout engine"
        t0 = time.perf_counter()
        trainers = self.groups.role_map.trainer_ranks
        help_step(self.engine.policy_model(train.policy_version), self.engine.policy_version, train.trajectories,
                  train.policy_version, self.cfg.trainer, slot=len(trainers) + train.helpers.index(self.idx),
                  num_slots=len(trainers) + len(train.helpers), trainer_ranks=tuple(to_global(r) for r in trainers),
                  device=self.device)
        self.stats["elastic_steps"] = self.stats.get("elastic_steps", 0) + 1
        self.stats["elastic_s"] = self.stats.get("elastic_s", 0.0) + time.perf_counter() - t0

    def _sync(self, version: int) -> None:
        """New weights to every rollout rank: local reload when colocated, else a broadcast."""
        t0 = time.perf_counter()
        rm = self.groups.role_map
        named = self.trainer.full_state_dict() if self.trainer is not None else None
        if rm.colocated and self.engine is None:  # a vLLM instance's follower: its leader's engine holds the weights
            pass
        elif rm.colocated:
            self.engine.reload()  # back on the device (a no-op unless offloaded for training)
            self.engine.set_weights(named, version)
        elif self.idx == rm.trainer_ranks[0] and self.groups.sync is not None:
            WeightSender(self.groups.sync, self.groups.sync_src, bucket_size_mb=self.cfg.sync.bucket_size_mb,
                         device=self._sync_device()).send(named, version, dtype=self.precision.rollout_dtype)
        elif self.engine is not None:
            if self.receiver is None or self.receiver.group is not self.groups.sync:  # new groups: new receiver
                self.receiver = WeightReceiver(self.groups.sync, self.groups.sync_src, self.specs,
                                               bucket_size_mb=self.cfg.sync.bucket_size_mb, device=self._sync_device())
            self.receiver.recv()
            got_version, tensors = self.receiver.weights.read()  # applied at the engine's next step
            self.engine.set_weights(tensors, got_version)
        self.version = version
        if self.tp_leader or (self.trainer is not None and self.idx == rm.trainer_ranks[0]):
            self.mailbox.send(COORDINATOR, msg.Synced(self.idx, version, time.perf_counter() - t0))

    def _sync_device(self) -> torch.device:
        """Weight buffers live on the device, except in a gloo-only sync group (ranks sharing a GPU): host."""
        return torch.device("cpu") if self.groups.sync_backend == "gloo" else self.device

    def _save(self, path: str) -> None:
        from engine.trainer.trainer import save_handoff

        writer = self.idx == self.trainer_ranks[0]
        error = ""
        try:
            save_handoff(self.trainer, path, write=writer)  # collective over the trainer group; only the writer writes
        except (OSError, RuntimeError) as exc:  # torch.save on a full disk raises RuntimeError ("unexpected pos")
            if not writer:
                raise
            error = f"{type(exc).__name__}: {exc}"
        if writer:
            self.mailbox.send(COORDINATOR, msg.Saved(path, error))


def worker_main(ctx: RankContext, cfg, role_map, handoff: str | None = None, out_dir: str | None = None) -> dict:
    ctx.set_role(f"worker:{to_worker(ctx.rank)}")
    worker = Worker(ctx, cfg, ctx.device)  # bound by the launcher before the default group existed
    worker.rank_file = Path(out_dir) / "ranks" / f"rank{ctx.rank}.json" if out_dir else None
    # on a terminal rank 0 draws a live panel: this rank's log lines are printed by it, above the panel
    swapped = ToCoordinator.install(lambda text: ctx.mailbox.send(COORDINATOR, msg.LogLine(text)))
    try:
        return worker.run(role_map, handoff)
    finally:
        ToCoordinator.restore(swapped)
