"""The control plane: pickled messages between the coordinator and worker ranks over a TCPStore.

Tensors (weights, training math) move over torch.distributed groups; everything else (the
messages of `engine/runtime/protocol.py`: commands, events, trajectories, metrics) moves through
per-rank queues on the rendezvous TCPStore (`queue_push`/`queue_pop`). Queues can be polled without blocking, which
point-to-point object collectives cannot, so a rollout rank keeps decoding while it waits for
commands, and the coordinator gathers events from many ranks at once. The same store works
under our launcher (the launcher hosts it) and under torchrun (the agent's store), so the same
code runs on one node or many.

Each worker also publishes a heartbeat (`hb/<rank>` = wall time and role) from a thread of its
own (`Heartbeat`), so a rank busy in a long training step or a collective still beats, and one
that does not run at all (SIGSTOP, swapped out, a native hang that holds the GIL) falls silent;
the coordinator names a silent rank (engine/runtime/view.py).

Invariants (tests/engine/runtime/test_control.py): messages from one sender to one receiver arrive in order
and exactly once; `recv` with a timeout raises TimeoutError naming the awaited rank; a heartbeat
thread beats while its rank's main thread is blocked and stops when told.
"""

from __future__ import annotations

import datetime
import os
import pickle
import threading
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

def host_store(timeout_s: float = 60.0) -> dist.TCPStore:
    """Start a TCPStore server on a free loopback port (the launcher hosts it)."""
    return dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout_s)
    )


def connect_store(host: str, port: int, timeout_s: float = 60.0) -> dist.TCPStore:
    return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


def store_from_env(rank: int, timeout_s: float = 60.0) -> dist.TCPStore:
    """Under torchrun: the agent's store (TORCHELASTIC_USE_AGENT_STORE) or one hosted by rank 0."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    is_master = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    return dist.TCPStore(
        host, port, is_master=is_master, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout_s)
    )


class Mailbox:
    """Ordered message queues keyed by destination rank on a shared store."""

    def __init__(self, store: dist.Store, rank: int, *, namespace: str = "libra"):
        self.store = store
        self.rank = rank
        self.ns = namespace
        self._lock = threading.Lock()  # tool threads send while the main loop polls

    def _queue(self, rank: int) -> str:
        return f"{self.ns}/mb/{rank}"

    def send(self, dst: int, msg: Any) -> None:
        data = pickle.dumps((self.rank, msg), protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self.store.queue_push(self._queue(dst), data)

    def poll(self, max_messages: int = 1 << 30) -> list[tuple[int, Any]]:
        """Every message waiting for this rank, oldest first, without blocking."""
        key = self._queue(self.rank)
        with self._lock:
            n = min(self.store.queue_len(key), max_messages)
            raw = [self.store.queue_pop(key, False) for _ in range(n)]
        return [pickle.loads(r) for r in raw]

    def recv(self, *, timeout_s: float, expect_from: str = "any rank") -> tuple[int, Any]:
        """Block until one message arrives; TimeoutError says what was awaited."""
        deadline = time.monotonic() + timeout_s
        wait = 0.0005
        key = self._queue(self.rank)
        while True:
            with self._lock:
                raw = self.store.queue_pop(key, False) if self.store.queue_len(key) else None
            if raw is not None:
                return pickle.loads(raw)
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {self.rank}: no message from {expect_from} within {timeout_s:.0f} s")
            time.sleep(wait)
            wait = min(wait * 2, 0.01)

    # ---- heartbeats ------------------------------------------------------------------------
    def beat(self, role: str = "") -> None:
        with self._lock:
            self.store.set(f"{self.ns}/hb/{self.rank}", f"{time.time()!r} {role}")

    def last_beat_and_role(self, rank: int) -> tuple[float, str] | None:
        key = f"{self.ns}/hb/{rank}"
        with self._lock:
            if not self.store.check([key]):
                return None
            stamp, _, role = self.store.get(key).decode().partition(" ")
        return float(stamp), role


class Heartbeat:
    """Beats `mailbox.beat(role())` every `every_s` from a daemon thread until `stop()`."""

    def __init__(self, mailbox: Mailbox, role: Callable[[], str], every_s: float = 1.0):
        self.mailbox, self.role, self.every_s = mailbox, role, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="libra-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.mailbox.beat(self.role())
            except Exception:  # the store is gone: the run is ending, and the main thread will say why
                return
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
