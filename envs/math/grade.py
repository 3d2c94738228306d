"""Math answer equivalence that is right on any thread, bounded in time, and fair to honest answers under load.

`math_verify` bounds its own time with `signal.alarm`, which works only on the main thread:
off it (where the coordinator scores) it raised, and a swallowed exception made every
equivalent but differently written answer (`96.0`, `x = 96`, `\\dfrac{47}{15}`, `47/15`) a 0.
So comparisons run with math_verify's signal timeouts off, in processes of their own:

1. `MathGrader.equal(pred, gold)`: an exact match (spaces ignored) is decided here. Otherwise the
   comparison gets its deadline, `timeout_s` after it arrived (a wait for one of the
   `max_concurrent` slots counts; the zygote's one start-up, below, does not), and is sent as one
   JSON line to the zygote: a `python -c` process that imported and warmed math_verify once, under
   an address-space limit. The zygote forks one child per comparison (a few ms); the child answers
   one line on the shared pipe (one `write` under PIPE_BUF: lines never interleave) and exits.
2. Slow answers cannot delay honest ones past `fast_s` plus their own time: at most
   `max_concurrent` fresh comparisons run at once (each in its own child; an honest answer takes
   milliseconds); one still running after `fast_s` gives its slot up, moves to the slow lane (at most
   `max_concurrent` there too; past that it is cut short as "timeout") and is reniced to 19, so the
   CPU goes to the fresh ones. Before, two long-lived workers served a FIFO queue without a bound:
   with slow answers queued an honest one waited out their timeouts (29.3 s behind 8).
3. A child not done by its deadline is killed: (False, "timeout"), a scored 0, never an exception
   and never an infra drop. A child that dies (out of memory) is "grader_error", as is every
   comparison in flight when the zygote dies; the next comparison starts a new zygote. Each reason
   goes to the metrics row (envs.base.Reward) and the log.
4. `close()` ends the zygote (SIGTERM: it kills and reaps its children; then SIGKILL to its process
   group for anything left): comparisons in flight return
   "grader_error" at once, without raising or hanging; a later comparison starts a new zygote. A
   zygote whose parent died exits at the end of its stdin, and its children die with it
   (PR_SET_PDEATHSIG).

Invariants (tests/envs/math/test_envs_math.py): equivalent forms score 1 and junk 0 on any thread, through
the real coordinator; a comparison that hangs returns within timeout_s + 1 s with "timeout"; a
killed zygote makes the comparisons in flight "grader_error" and the next comparison works; with
16 slow answers in flight an honest one is scored 1 within its own deadline; `close()` with
comparisons in flight returns at once and they come back "grader_error".
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

_REPO = str(Path(__file__).resolve().parents[2])
_ZYGOTE = "from envs.math.grade import zygote_main; zygote_main()"
_PR_SET_PDEATHSIG = 1


def _compare(parse, verify, req: dict) -> dict:
    try:
        gold = parse(f"${req['gold']}$", parsing_timeout=None)
        pred = parse(f"${req['pred']}$", parsing_timeout=None)
        return {"equal": bool(verify(gold, pred, timeout_seconds=None))}
    except Exception as e:  # noqa: BLE001 - sympy raises assorted errors on junk: junk is not equivalent
        return {"equal": False, "error": f"{type(e).__name__}: {str(e)[:200]}"}


def _child(parse, verify, req: dict, out_fd: int, zygote_pid: int) -> None:
    """The forked child: die with the zygote, answer one line, exit (never returns)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != zygote_pid:  # the zygote died before the prctl
            os._exit(1)
        reply = {"id": req["id"], **_compare(parse, verify, req)}
        os.write(out_fd, (json.dumps(reply) + "\n").encode())
    finally:
        os._exit(0)


def zygote_main() -> None:
    """Requests on stdin, one JSON object a line: {"id", "pred", "gold"} forks a child that answers
    {"id", "equal"[, "error"]}; {"nice": id} renices that child to 19; {"kill": id} kills it. Every
    child's end is reported as {"id", "exit": status}, after its answer if it gave one."""
    import resource

    limit = int(os.environ.get("LIBRA_MATH_GRADE_MEMORY_MB", "1024")) << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import logging as _logging

    _logging.disable(_logging.WARNING)  # math_verify warns once that its timeouts are off: the grader is the timeout
    from math_verify import parse, verify

    _compare(parse, verify, {"pred": "x = 1", "gold": "1"})  # warm: the first parse imports what every later one needs
    in_fd, out_fd, me = sys.stdin.fileno(), sys.stdout.fileno(), os.getpid()
    by_id: dict[int, int] = {}
    by_pid: dict[int, int] = {}

    def send(msg: dict) -> None:
        os.write(out_fd, (json.dumps(msg) + "\n").encode())

    def handle(req: dict) -> None:
        if "kill" in req or "nice" in req:
            pid = by_id.get(req.get("kill", req.get("nice")))
            if pid is not None:  # an unreaped child: its pid cannot have been reused
                if "kill" in req:
                    os.kill(pid, signal.SIGKILL)
                else:
                    os.setpriority(os.PRIO_PROCESS, pid, 19)
            return
        pid = os.fork()
        if pid == 0:
            _child(parse, verify, req, out_fd, me)
        by_id[req["id"]], by_pid[pid] = pid, req["id"]

    def stop(_sig, _frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)  # close(): kill and reap the children (a subreaper host would get zombies)
    send({"ready": True})
    buf = b""
    try:
        while True:
            ready, _, _ = select.select([in_fd], [], [], 0.02 if by_pid else None)
            if ready:
                data = os.read(in_fd, 1 << 16)
                if not data:
                    return  # our parent closed the pipe or died
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    handle(json.loads(line))
            while by_pid:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                cid = by_pid.pop(pid)
                del by_id[cid]
                send({"id": cid, "exit": status})
    finally:
        for pid in by_pid:
            os.kill(pid, signal.SIGKILL)
        for pid in by_pid:
            os.waitpid(pid, 0)


class _Pending:
    def __init__(self):
        self.done = threading.Event()
        self.reply: dict | None = None

    def finish(self, reply: dict | None) -> None:
        if not self.done.is_set():
            self.reply = reply
            self.done.set()


class _Zygote:
    """The zygote process, and a reader thread that hands each answer to the comparison waiting for it."""

    def __init__(self, memory_mb: int):
        env = {**os.environ, "PYTHONPATH": _REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "LIBRA_MATH_GRADE_MEMORY_MB": str(memory_mb), "PYTHONDONTWRITEBYTECODE": "1"}
        # its own session: close() kills the zygote and every child at once
        self.proc = subprocess.Popen([sys.executable, "-c", _ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, cwd=_REPO, start_new_session=True)
        self.ready = threading.Event()
        self.ready_at = 0.0
        self.dead = False
        self.pending: dict[int, _Pending] = {}
        self._lock = threading.Lock()  # `pending` and `dead`; never held across a pipe write (the reader needs it)
        self._write_lock = threading.Lock()
        threading.Thread(target=self._read, name="libra-math-grade", daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("ready"):
                self.ready_at = time.monotonic()
                self.ready.set()
                continue
            with self._lock:
                p = self.pending.get(msg.get("id"))
            if p is not None:
                p.finish(None if "exit" in msg else msg)  # an exit before any answer: the child died
        with self._lock:
            self.dead = True
            pending = list(self.pending.values())
        self.ready.set()
        for p in pending:
            p.finish(None)

    def submit(self, cid: int, msg: dict) -> _Pending | None:
        p = _Pending()
        with self._lock:
            if self.dead:
                return None
            self.pending[cid] = p
        if not self.tell(msg):
            self.forget(cid)
            return None
        return p

    def tell(self, msg: dict) -> bool:
        with self._write_lock:
            try:
                self.proc.stdin.write((json.dumps(msg) + "\n").encode())
                self.proc.stdin.flush()
                return True
            except (BrokenPipeError, OSError, ValueError):
                return False  # dead: the reader fails what is in flight

    def forget(self, cid: int) -> None:
        with self._lock:
            self.pending.pop(cid, None)

    def kill(self) -> None:
        """SIGTERM (it kills and reaps its children), then SIGKILL to the whole group for what is left."""
        try:
            self.proc.terminate()
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:  # still alive, so its group id is still ours to kill
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        with self._write_lock:
            try:
                self.proc.stdin.close()
            except OSError:
                pass


class MathGrader:
    """Thread-safe equivalence of a predicted and a gold answer (see the module docstring)."""

    def __init__(self, *, timeout_s: float = 5.0, max_concurrent: int = 16, memory_mb: int = 1024, start_timeout_s: float = 60.0,
                 fast_s: float = 0.25):
        if timeout_s <= 0 or max_concurrent < 1 or memory_mb < 128 or fast_s <= 0:
            raise ValueError(f"MathGrader: timeout_s={timeout_s} must be > 0, max_concurrent={max_concurrent} >= 1, "
                             f"fast_s={fast_s} > 0 and memory_mb={memory_mb} >= 128 (sympy needs ~150 MB)")
        self.timeout_s, self.memory_mb, self.start_timeout_s, self.fast_s = timeout_s, memory_mb, start_timeout_s, fast_s
        self.max_concurrent = max_concurrent
        self._fast = threading.BoundedSemaphore(max_concurrent)  # comparisons in their first fast_s
        self._slow = threading.BoundedSemaphore(max_concurrent)  # comparisons past it, reniced
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._zygote: _Zygote | None = None

    def _ready_zygote(self) -> _Zygote | None:
        """The running zygote, started on first need (not per env made: most envs of a test never compare)."""
        with self._lock:
            z = self._zygote
            if z is None or z.dead:
                if z is not None:
                    z.kill()
                z = self._zygote = _Zygote(self.memory_mb)
        if z.ready.wait(self.start_timeout_s) and not z.dead:
            return z
        log.warning("math grading: the grader process did not start within %.0f s", self.start_timeout_s)
        with self._lock:
            if self._zygote is z:
                self._zygote = None
        z.kill()
        return None

    def equal(self, pred: str, gold: str) -> tuple[bool, str]:
        """(equivalent, reason): reason "exact", "verified", "not_equal", "timeout" or "grader_error"."""
        if pred.replace(" ", "") == gold.replace(" ", ""):
            return True, "exact"
        t0 = time.monotonic()
        if not self._fast.acquire(timeout=self.timeout_s):
            log.warning("math grading: no free slot of %d within %.1f s (timeout): %r vs %r", self.max_concurrent, self.timeout_s,
                        pred[:80], gold[:80])
            return False, "timeout"
        held = [self._fast]
        try:
            return self._compare(pred, gold, t0, held)
        finally:
            for slot in held:
                slot.release()

    def _compare(self, pred: str, gold: str, t0: float, held: list) -> tuple[bool, str]:
        z = self._ready_zygote()
        if z is None:
            return False, "grader_error"
        deadline = max(t0, z.ready_at) + self.timeout_s  # the one start-up is not this comparison's wait
        cid = next(self._ids)
        p = z.submit(cid, {"id": cid, "pred": pred, "gold": gold})
        if p is None:
            return False, "grader_error"
        try:
            if not p.done.wait(max(0.0, min(self.fast_s, deadline - time.monotonic()))) and time.monotonic() < deadline:
                held.pop().release()  # slow: its fresh slot goes to the next comparison
                if self._slow.acquire(blocking=False):
                    held.append(self._slow)
                    z.tell({"nice": cid})  # and the CPU to the fresh ones first
                    p.done.wait(max(0.0, deadline - time.monotonic()))
            if not p.done.is_set():
                z.tell({"kill": cid})
                log.warning("math grading: no answer within %.1f s (timeout; %d slow ones at most): %r vs %r",
                            self.timeout_s, self.max_concurrent, pred[:80], gold[:80])
                return False, "timeout"
        finally:
            z.forget(cid)
        if p.reply is None:
            log.warning("math grading: the comparison's process died (grader_error): %r vs %r", pred[:80], gold[:80])
            return False, "grader_error"
        if p.reply.get("error"):
            log.debug("math grading: %r vs %r: %s", pred[:80], gold[:80], p.reply["error"])
        return bool(p.reply.get("equal")), "verified" if p.reply.get("equal") else "not_equal"

    def close(self) -> None:
        """Kill the zygote and its children: comparisons in flight return "grader_error" (a later one starts a new zygote)."""
        with self._lock:
            z, self._zygote = self._zygote, None
        if z is not None:
            z.kill()
