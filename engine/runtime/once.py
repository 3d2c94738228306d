"""Env calls that run once per key: a request that moved during its tool call re-issues the call and shares the result.

A layout change exports a request in a tool call at once (engine/rollout/turns.py); the instance it
moves to re-issues the turn's calls under the same (turn, index) keys. The coordinator holds the
episodes, so it is where a repeat is recognised:
  1. `run(request_id, key, fn, reply)`: the first call under a key runs `fn` (on the caller's thread; it
     returns the outcome, failures included, and never raises) and keeps the outcome; every call under that key, the first included, gets `reply(outcome)`,
     at once when the outcome is known, else when the first run ends.
  2. `forget(request_id)` when its episode closes drops its keys.

Invariants (tests/engine/runtime/test_once.py): `fn` runs once per key, however the calls interleave;
every call is answered exactly once, with the first run's outcome; forgotten keys run again.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from typing import Any, Callable, Hashable

__all__ = ["CallOnce"]


class CallOnce:
    def __init__(self) -> None:
        self._runs: dict[tuple[str, Hashable], cf.Future] = {}
        self._lock = threading.Lock()

    def run(self, request_id: str, key: Hashable, fn: Callable[[], Any], reply: Callable[[Any], None]) -> None:
        with self._lock:
            fut = self._runs.get((request_id, key))
            first = fut is None
            if first:
                fut = self._runs[(request_id, key)] = cf.Future()
        if first:
            fut.set_result(fn())
        # a repeat waits without holding a thread: answered when the first run ends
        fut.add_done_callback(lambda f: reply(f.result()))

    def forget(self, request_id: str) -> None:
        with self._lock:
            for k in [k for k in self._runs if k[0] == request_id]:
                del self._runs[k]

    def __len__(self) -> int:
        return len(self._runs)
