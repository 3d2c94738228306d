"""Math answer equivalence that is right on any thread and bounded in time.

`math_verify` bounds its own time with `signal.alarm`, which works only on the main thread:
off it (where the coordinator scores) it raised, and a swallowed exception made every
equivalent but differently written answer (`96.0`, `x = 96`, `\\dfrac{47}{15}`, `47/15`) a 0.
So comparisons run with math_verify's signal timeouts off, in worker processes:

1. `MathGrader.equal(pred, gold)`: an exact match (spaces ignored) is decided here; otherwise the
   next idle worker (a `python -c` subprocess that imported math_verify once, with an
   address-space limit) gets one JSON line and answers one line.
2. A worker that does not answer within `timeout_s` (sympy on `9^{9^{9^9}}`), dies or runs out
   of memory is killed and replaced; that comparison is not equivalent, with reason "timeout"
   or "grader_error", never an exception and never a silent False: the reason goes to the
   metrics row (envs.base.Reward) and the log.
3. Workers start on the first comparison that is not an exact match (their import takes ~1-3 s,
   within `start_timeout_s`); `close()` ends them, and a worker whose parent died exits at the
   end of its stdin.

Invariants (tests/test_envs_math.py): equivalent forms score 1 and junk 0 on any thread, through
the real coordinator; a comparison that hangs returns within timeout_s + 1 s with "timeout"; a
killed worker is replaced and the next comparison works.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

_REPO = str(Path(__file__).resolve().parents[1])
_WORKER = "from envs.math_grade import worker_main; worker_main()"


def worker_main() -> None:
    """One comparison per stdin line, {"pred", "gold"} -> {"equal": bool} or {"error": str}."""
    import resource

    limit = int(os.environ.get("LIBRA_MATH_GRADE_MEMORY_MB", "1024")) << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import logging as _logging

    _logging.disable(_logging.WARNING)  # math_verify warns once that its timeouts are off: this process is the timeout
    from math_verify import parse, verify

    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            gold = parse(f"${req['gold']}$", parsing_timeout=None)
            pred = parse(f"${req['pred']}$", parsing_timeout=None)
            reply = {"equal": bool(verify(gold, pred, timeout_seconds=None))}
        except Exception as e:  # noqa: BLE001 - sympy raises assorted errors on junk: junk is not equivalent
            reply = {"equal": False, "error": f"{type(e).__name__}: {str(e)[:200]}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


class _Worker:
    def __init__(self, memory_mb: int):
        env = {**os.environ, "PYTHONPATH": _REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "LIBRA_MATH_GRADE_MEMORY_MB": str(memory_mb), "PYTHONDONTWRITEBYTECODE": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, text=True, bufsize=1, cwd=_REPO)
        self.ready = False

    def _read(self, deadline: float) -> dict | None:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            line = self.proc.stdout.readline()
            if not line:
                return None  # died
            try:
                reply = json.loads(line)
            except ValueError:
                return None
            return reply if isinstance(reply, dict) else None

    def ask(self, pred: str, gold: str, timeout_s: float, start_timeout_s: float) -> dict | None:
        """The worker's answer, or None (timed out or died: the caller kills it)."""
        if not self.ready:
            if self._read(time.monotonic() + start_timeout_s) is None:
                return None
            self.ready = True
        try:
            self.proc.stdin.write(json.dumps({"pred": pred, "gold": gold}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        return self._read(time.monotonic() + timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


class MathGrader:
    """Thread-safe equivalence of a predicted and a gold answer (see the module docstring)."""

    def __init__(self, *, timeout_s: float = 5.0, num_workers: int = 2, memory_mb: int = 1024, start_timeout_s: float = 60.0):
        if timeout_s <= 0 or num_workers < 1 or memory_mb < 128:
            raise ValueError(f"MathGrader: timeout_s={timeout_s} must be > 0, num_workers={num_workers} >= 1 and "
                             f"memory_mb={memory_mb} >= 128 (sympy needs ~150 MB)")
        self.timeout_s, self.memory_mb, self.start_timeout_s = timeout_s, memory_mb, start_timeout_s
        self.num_workers = num_workers
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._started = False

    def _spawn(self) -> _Worker:
        w = _Worker(self.memory_mb)
        with self._lock:
            self._all.append(w)
        return w

    def equal(self, pred: str, gold: str) -> tuple[bool, str]:
        """(equivalent, reason): reason "exact", "verified", "not_equal", "timeout" or "grader_error"."""
        if pred.replace(" ", "") == gold.replace(" ", ""):
            return True, "exact"
        with self._lock:
            start, self._started = not self._started, True
        if start:  # on first need, not per env made: most envs of a test never compare anything
            for _ in range(self.num_workers):
                self._idle.put(self._spawn())
        worker = self._idle.get()
        t0 = time.monotonic()
        reply = worker.ask(pred, gold, self.timeout_s, self.start_timeout_s)
        if reply is None:
            started = worker.ready
            worker.kill()
            with self._lock:
                self._all.remove(worker)
            self._idle.put(self._spawn())
            # it ran out its time, or died (killed, out of memory, never started) before that
            why = "timeout" if started and time.monotonic() - t0 >= self.timeout_s else "grader_error"
            log.warning("math grading: a comparison gave no answer after %.1f s (%s); its worker was replaced: %r vs %r",
                        time.monotonic() - t0, why, pred[:80], gold[:80])
            return False, why
        self._idle.put(worker)
        if reply.get("error"):
            log.debug("math grading: %r vs %r: %s", pred[:80], gold[:80], reply["error"])
        return bool(reply.get("equal")), "verified" if reply.get("equal") else "not_equal"

    def close(self) -> None:
        """End the workers (a later comparison starts new ones)."""
        with self._lock:
            workers, self._all, self._started = list(self._all), [], False
            self._idle = queue.Queue()
        for w in workers:
            w.kill()
