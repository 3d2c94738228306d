"""Spawn ranks, watch them, tear every one down on any exit path.

`spawn(target, num_procs, ...)` starts `num_procs` processes (forkserver with preloaded modules
on CPU: docs/platform.md measured ~5 s for 8 ranks against 17-28 s with spawn; `start_forkserver` starts its
imports early, beside the launcher's planning), hosts the TCPStore
they rendezvous on, and waits. Each child:
  - dies with its parent (PR_SET_PDEATHSIG); its parent is the forkserver (or the launcher with
    spawn), which exits when the launcher dies, so a SIGKILLed launcher leaves no orphans;
  - binds its device (engine/devices.py: the coordinator stays on CPU, worker r uses local
    device r - 1) and publishes it on the store, *then* joins the default process group (gloo on
    CPU, "cpu:gloo,cuda:nccl" on GPU) through the store;
  - runs `target(ctx, *args)` and sends back its result, or its traceback with its role named.
The launcher returns the results in rank order, or, as soon as one rank raises or dies,
kills the others (SIGKILL to each child's process group) and raises `WorkerFailed` naming the
rank and role. `run_in_torchrun` is the same child path for processes that torchrun started.

Stop signals (Ctrl-C's SIGINT, SIGTERM, SIGHUP) stop a run gracefully, whoever gets them: the
coordinator (rank 0) takes one as a stop request (`stop_requested()`: it ends the run at once, a
training step first finishing, with a checkpoint of the last trained step, the trace and the
summary), workers ignore them (the coordinator
stops them), and the launcher forwards its own to the coordinator, waits for every rank to finish,
then kills them all (at once on a second signal, saying what that loses). It waits `stop_grace_s`
or what the coordinator published it needs to finish the step in progress and checkpoint it
(`STOP_NEEDS_KEY`: measured from the last step and checkpoint; `FIRST_STEP_NEEDS_S` while the first
step has not been measured), whichever is longer. The exception it raised
carries the results (`.results`, None when the ranks did not finish in time). So `kill PID`, a
signal to the whole process group (a closed terminal, `kill -TERM -PGID`) or to every process
(systemd, Slurm) all end the same way. The forkserver shares the launcher's process group and its
children die with it, so it ignores SIGTERM and SIGHUP (`engine/runtime/forkserver_signals.py`).

Invariants (tests/engine/runtime/test_launch.py, tests/engine/runtime/test_e2e.py): a worker that raises -> `WorkerFailed` with
its rank and role within seconds and no child left alive; results come back in rank order; a
stop signal to the launcher, its process group or every rank ends the run with the coordinator's
results and no child left alive.
"""

from __future__ import annotations

import atexit
import ctypes
import datetime
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from engine.runtime.control import Mailbox, connect_store, host_store, store_from_env
from engine.devices import DeviceInfo, device_key, set_rank_device

log = logging.getLogger(__name__)

# Imported once by the forkserver so that every rank starts with them: importing a transformers
# model class costs 6-8 s per process on 2 cores (docs/platform.md). The forkserver outlives one
# `spawn`, and only its first start reads this list, so it names everything any rank may need.
PRELOAD = ["torch", "torch.distributed", "transformers", "transformers.models.qwen2.modeling_qwen2",
           "transformers.models.llama.modeling_llama", "engine.runtime.control", "engine.runtime.groups", "engine.runtime.weights",
           "engine.models", "engine.rollout.engine", "engine.trainer.trainer", "engine.rollout.tp", "engine.runtime.worker", "engine.runtime.coordinator",
           "envs.registry", "engine.runtime.forkserver_signals"]
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_NEEDS_KEY = "libra/stop_needs_s"  # the coordinator: seconds the ranks need to finish the step in progress and checkpoint it
CHECKPOINT_KEY = "libra/checkpoint_step"  # the coordinator: the step of the newest complete checkpoint
FIRST_STEP_NEEDS_S = 600.0  # a stop before the first step is measured waits this long at most for it (a second signal: at once)


class WorkerFailed(RuntimeError):
    def __init__(self, rank: int, role: str, detail: str):
        super().__init__(f"rank {rank} ({role}) failed: {detail}")
        self.rank, self.role, self.detail = rank, role, detail


@dataclass
class RankContext:
    """What a rank knows about its place in the job."""

    rank: int  # global rank (0 = coordinator when the job has one)
    world_size: int
    store: dist.Store
    mailbox: Mailbox
    device_info: DeviceInfo
    local_rank: int
    role: str = "starting"  # updated by the rank as it changes roles; named in failures
    device: torch.device = torch.device("cpu")  # bound before the default group exists (engine/devices.py)

    def device_keys(self, timeout_s: float = 60.0) -> list[str]:
        """Every rank's device ("host/cuda:3"), in global rank order, as each published it at start."""
        keys = [f"libra/device/{r}" for r in range(self.world_size)]
        self.store.wait(keys, datetime.timedelta(seconds=timeout_s))
        return [self.store.get(k).decode() for k in keys]

    def set_role(self, role: str) -> None:
        self.role = role
        _ROLE[0] = role


_ROLE = ["starting"]  # this process's role, for the failure report
_STOP: list[str] = []  # the stop signals this rank received (only the coordinator takes them)


def stop_requested() -> str | None:
    """The name of the first stop signal this process took as a stop request, or None."""
    return _STOP[0] if _STOP else None


def _note_stop(signum, _frame) -> None:
    _STOP.append(signal.Signals(signum).name)


def _ignore(_signum, _frame) -> None:
    """A no-op handler rather than SIG_IGN: an ignored disposition would pass to every tool process exec'd
    from here, a handler resets to the default there."""


def _route_stop_signals(rank: int) -> None:
    """The coordinator takes a stop signal as a request to stop (`stop_requested`); a worker
    ignores it: the coordinator stops it (or, past the grace time, the launcher kills it)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _note_stop if rank == 0 else _ignore)


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _init_dist(store: dist.Store, rank: int, world_size: int, info: DeviceInfo, timeout_s: float) -> None:
    """Join the default group; the caller has bound this process's device already (NCCL/HCCL
    communicators are created on the current device, so binding later would put every rank on
    device 0). No `device_id` is passed: that would create the NCCL communicator eagerly, with
    the CPU coordinator on device 0 beside worker 1."""
    dist.init_process_group(
        info.dist_backend,
        store=dist.PrefixStore("pg", store),
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def _child(rank, world_size, port, info, threads, timeout_s, target, args, out_q):
    _die_with_parent()
    os.setpgrp()  # our own process group, so teardown reaches tool subprocesses too
    _route_stop_signals(rank)
    logging.basicConfig(level=os.environ.get("LIBRA_LOG", "INFO"), format=f"%(asctime)s [rank {rank}] %(message)s",
                        datefmt="%H:%M:%S", force=True)
    status, payload = "ok", None
    try:
        device = set_rank_device(info, rank, rank, threads=threads)
        store = connect_store("127.0.0.1", port, timeout_s)
        store.set(f"libra/device/{rank}", device_key(device))
        _init_dist(store, rank, world_size, info, timeout_s)
        ctx = RankContext(rank, world_size, store, Mailbox(store, rank), info, local_rank=rank, device=device)
        payload = target(ctx, *args)
    except BaseException as exc:  # report everything, KeyboardInterrupt included
        status, payload = "error", (_ROLE[0], f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    out_q.put((rank, status, payload))
    if status == "error":
        os._exit(1)  # skip destroy_process_group: peers may be gone, it could hang
    if dist.is_initialized():
        dist.destroy_process_group()


_stop_registered = False  # `_stop_forkserver` is registered at exit (once)


def start_forkserver(preload: list[str] | None = None) -> None:
    """Start the forkserver now, so that it imports `preload` while the launcher still plans the run; `spawn`
    then finds it running. Both take seconds of CPU (a standalone tiny run on 2 cores: ~2 s planning and ~4 s
    of forkserver imports, one after the other without this). It is killed when the launcher exits: one
    that a start-up error ended before any rank started would finish its imports first, holding the
    launcher's stdout and stderr (and whoever waits on them) that long."""
    mp.get_context("forkserver").set_forkserver_preload(preload or PRELOAD)
    from multiprocessing import forkserver

    forkserver.ensure_running()
    global _stop_registered
    if not _stop_registered:
        _stop_registered = True
        atexit.register(_stop_forkserver)


def _stop_forkserver() -> None:
    """At exit (`start_forkserver`): every rank is gone by then (`spawn` kills them all on any exit path)."""
    from multiprocessing import forkserver

    pid = forkserver._forkserver._forkserver_pid  # the stdlib keeps it private; the pid is all this needs
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def spawn(
    target: Callable[..., Any],
    num_procs: int,
    args: tuple = (),
    *,
    device_info: DeviceInfo,
    threads_per_rank: int = 1,
    start_method: str = "forkserver",
    timeout_s: float = 120.0,
    preload: list[str] | None = None,
    stop_grace_s: float = 20.0,
) -> list[Any]:
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(preload or PRELOAD)
    store = host_store(timeout_s)
    out_q = ctx.SimpleQueue()
    procs = []
    try:
        for rank in range(num_procs):
            p = ctx.Process(
                target=_child,
                args=(rank, num_procs, store.port, device_info, threads_per_rank, timeout_s, target, args, out_q),
                name=f"libra-rank{rank}",
            )
            p.start()
            procs.append(p)
        observer = Mailbox(store, -1)
        try:
            return _wait(procs, out_q, observer)
        except KeyboardInterrupt as stop:  # Ctrl-C, or libra.py's handler for SIGTERM/SIGHUP
            stop.results = _stop_gracefully(procs, out_q, observer, stop, stop_grace_s, store)
            raise
    finally:
        _kill_all(procs)
        out_q.close()
        del store


def published(store, key: str) -> str | None:
    """A value a rank published in the launcher's store, or None (not yet, or the store is gone)."""
    try:
        return store.get(key).decode() if store.check([key]) else None
    except RuntimeError:
        return None


def stop_grace(configured_s: float, needs: str | None) -> float:
    """Seconds a stop waits for the ranks: the configured grace, or what the coordinator said it needs to finish
    the step in progress and checkpoint it, whichever is longer; 0 (no grace asked) kills at once."""
    if configured_s <= 0:
        return 0.0
    return max(configured_s, float(needs) if needs is not None else 0.0)


def loss_note(checkpoint_step: str | None) -> str:
    """What killing the ranks now loses, in words."""
    if checkpoint_step is None:
        return "no checkpoint was written yet, so a rerun starts from step 0"
    return f"`--resume` continues from the checkpoint of step {checkpoint_step}; what trained after it is lost"


def _stop_gracefully(procs, out_q, observer: Mailbox, stop: KeyboardInterrupt, grace_s: float, store) -> list[Any] | None:
    """Forward the launcher's stop signal to the coordinator and wait for every rank's result (`stop_grace`);
    None when they do not all finish in time, a rank fails, or a second signal comes."""
    signum = getattr(stop, "signum", signal.SIGINT)
    if grace_s <= 0 or not procs or procs[0].exitcode is not None:
        return None
    grace_s = stop_grace(grace_s, published(store, STOP_NEEDS_KEY))
    log.warning("libra: %s: stopping; the ranks get up to %.0f s to finish the step in progress, checkpoint it and "
                "write the trace and the summary (send it again to kill them now: %s)", signal.Signals(signum).name,
                grace_s, loss_note(published(store, CHECKPOINT_KEY)))
    try:
        os.kill(procs[0].pid, signum)
        return _wait(procs, out_q, observer, deadline=time.monotonic() + grace_s)
    except (KeyboardInterrupt, TimeoutError, WorkerFailed, ProcessLookupError) as exc:
        log.warning("libra: the ranks did not finish the stop (%s); killing them: %s",
                    "a second signal" if isinstance(exc, KeyboardInterrupt) else exc or type(exc).__name__,
                    loss_note(published(store, CHECKPOINT_KEY)))
        return None


def _wait(procs, out_q, observer: Mailbox, deadline: float | None = None) -> list[Any]:
    """Results in rank order, or WorkerFailed for the root cause: a rank that died without a
    report (SIGKILL, OOM) is named before the ranks that only failed because it was gone.
    TimeoutError past `deadline` (a monotonic time)."""
    results: dict[int, Any] = {}
    errors: list[tuple[int, str, str]] = []
    while len(results) < len(procs):
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{len(procs) - len(results)} rank(s) still running")
        ready = mp.connection.wait([out_q._reader] + [p.sentinel for p in procs], timeout=1.0)
        while not out_q.empty():
            rank, status, payload = out_q.get()
            if status == "error":
                errors.append((rank, *payload))
            else:
                results[rank] = payload
        dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in results
                and all(r != e[0] for e in errors)]
        if dead and not errors:
            time.sleep(0.3)  # a dying rank's own report may still be in the pipe
            if not out_q.empty():
                continue
        if dead:
            rank = dead[0]
            beat = observer.last_beat_and_role(rank)  # the role it last announced
            role = beat[1] if beat and beat[1] else "unknown role"
            also = f"; {len(errors)} other rank(s) failed after it" if errors else ""
            raise WorkerFailed(rank, role, f"exited with code {procs[rank].exitcode} without a report (killed?){also}")
        if errors:
            time.sleep(0.3)  # give a killed peer's death time to show: it is the root cause
            if any(p.exitcode not in (None, 0) and r not in results and all(r != e[0] for e in errors)
                   for r, p in enumerate(procs)):
                continue
            rank, role, detail = errors[0]
            raise WorkerFailed(rank, role, detail)
        del ready
    return [results[r] for r in range(len(procs))]


def _kill_all(procs) -> None:
    for p in procs:
        if p.pid is None:
            continue
        for sig_target in (lambda: os.killpg(p.pid, signal.SIGKILL), lambda: os.kill(p.pid, signal.SIGKILL)):
            try:
                sig_target()
            except (ProcessLookupError, PermissionError):
                pass
    for p in procs:
        if p.pid is not None:
            p.join(timeout=10)


def run_in_torchrun(target: Callable[..., Any], args: tuple, *, device_info: DeviceInfo, threads_per_rank: int = 1,
                    timeout_s: float = 120.0) -> list[Any] | None:
    """The child path for a process that torchrun started (RANK/WORLD_SIZE/MASTER_* set).

    Returns every rank's result in rank order on global rank 0 (gathered over the default
    group, as objects: gloo even beside nccl), None on the others, like `spawn` does for its parent.
    A rank that raises exits non-zero and torchrun's agent stops the others.
    """
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    _route_stop_signals(rank)  # torchrun's agent forwards a stop signal to every rank
    device = set_rank_device(device_info, rank, local_rank, threads=threads_per_rank)
    store = store_from_env(rank, timeout_s)
    store.set(f"libra/device/{rank}", device_key(device))
    _init_dist(store, rank, world_size, device_info, timeout_s)
    ctx = RankContext(rank, world_size, store, Mailbox(store, rank), device_info, local_rank=local_rank, device=device)
    try:
        result = target(ctx, *args)
        gathered = [None] * world_size if rank == 0 else None
        dist.gather_object(result, gathered, dst=0)
        return gathered
    finally:
        dist.destroy_process_group()
