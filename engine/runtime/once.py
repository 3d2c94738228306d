"""Env calls that run once per key: a request that moved during its tool call re-issues the call and shares the result.

A layout change exports a request in a tool call at once (engine/rollout/turns.py); the instance it
moves to re-issues the turn's calls under the same (turn, index) keys. The coordinator holds the
episodes, so it is where a repeat is recognised:
  1. `run(request_id, key, fn, reply)`: the first call under a key runs `fn` (on the caller's thread; it
     returns the outcome, failures included, and never raises) and keeps the outcome; every call under
     that key, the first included, gets `reply(outcome)`, at once when the outcome is known, else when
     the first run ends.
  2. A request's turns come one after another, and only the turn in flight is ever re-issued: a key of a
     later turn drops the outcomes of the earlier ones (tool outputs are not kept for a trajectory's life);
     `forget(request_id)`, when its episode closes, drops the rest.

Invariants (tests/engine/runtime/test_once.py): `fn` runs once per key, however the calls interleave;
every call is answered exactly once, with the first run's outcome; an earlier turn's outcomes and
forgotten keys are not kept.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from typing import Any, Callable

__all__ = ["CallOnce"]


class CallOnce:
    def __init__(self) -> None:
        self._runs: dict[str, dict[tuple[int, int], cf.Future]] = {}  # request -> (turn, index) -> its run
        self._lock = threading.Lock()

    def run(self, request_id: str, key: tuple[int, int], fn: Callable[[], Any], reply: Callable[[Any], None]) -> None:
        with self._lock:
            runs = self._runs.setdefault(request_id, {})
            fut = runs.get(key)
            first = fut is None
            if first:
                fut = runs[key] = cf.Future()
                for old in [k for k in runs if k[0] < key[0]]:  # a turn is re-issued only while it runs
                    del runs[old]
        if first:
            fut.set_result(fn())
        # a repeat waits without holding a thread: answered when the first run ends
        fut.add_done_callback(lambda f: reply(f.result()))

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._runs.pop(request_id, None)

    def __len__(self) -> int:
        return sum(len(runs) for runs in self._runs.values())
