"""Attacks on the host-side tools (FIFOs, huge lines and listings) and on the per-call limits."""

from __future__ import annotations

import glob
import os
import sys
import threading
import uuid

from adversarial_base import Outcome, attack, call, run_py, swe_with_init
from envs.sandbox.fs import usage  # noqa: E402 - adversarial_base puts the repo on sys.path

# ---- host-side tools ----------------------------------------------------------------------------


def _swe_after_run(ctx, code: str):
    ep = swe_with_init(ctx, "import os\nif not os.path.exists('.done'):\n    open('.done', 'w').close()\n" +
                        "".join("    " + ln + "\n" for ln in code.splitlines()))
    ep.execute(call("run_tests"))
    return ep


def _in_thread(fn, timeout_s: float):
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except Exception as e:  # noqa: BLE001 - the driver reports whatever escaped
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    return t, box


@attack("host")
def fifo_blocks_search(ctx):
    ep = _swe_after_run(ctx, "os.mkfifo('calc/zz_fifo.py')")
    fifo = ep.workdir / "calc" / "zz_fifo.py"
    try:
        t, box = _in_thread(lambda: ep.execute(call("search", pattern="def ")), 5.0)
        if t.is_alive():
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
            t.join(5)
            return Outcome(False, "search blocked > 5 s on a FIFO")
        if "error" in box:
            return Outcome(False, f"raised {type(box['error']).__name__}")
        return Outcome(True, f"{box['value'].status}, {len(box['value'].text)} chars")
    finally:
        ep.close()


@attack("host")
def fifo_in_package_at_submit(ctx):
    ep = _swe_after_run(ctx, "os.mkfifo('calc/zz_fifo.py')")
    try:
        t, box = _in_thread(lambda: (ep.execute(call("submit")), ep.score("")), 10.0)
        if t.is_alive():
            os.close(os.open(ep.workdir / "calc" / "zz_fifo.py", os.O_WRONLY | os.O_NONBLOCK))
            t.join(5)
            return Outcome(False, "submit blocked > 10 s")
        if "error" in box:
            return Outcome(False, f"raised {type(box['error']).__name__}: {str(box['error'])[:80]}")
        return Outcome(box["value"][1] == 0.0, f"reward {box['value'][1]}")
    finally:
        ep.close()


@attack("host")
def huge_line_view_and_search(ctx):
    ep = _swe_after_run(ctx, "open('calc/big.py', 'w').write('needle' + 'x' * (15 << 20) + '\\n')")
    try:
        v = ep.execute(call("view_file", path="calc/big.py"))
        s = ep.execute(call("search", pattern="needle"))
        n = max(len(v.text), len(s.text))
        return Outcome(n <= 100_000, f"view {len(v.text)} chars, search {len(s.text)} chars")
    finally:
        ep.close()


@attack("host")
def huge_directory_listing(ctx):
    ep = _swe_after_run(ctx, "os.makedirs('calc/d')\nfor i in range(20000):\n    try: open('calc/d/f%05d.py' % i, 'w').close()\n    except OSError: break")
    try:
        v = ep.execute(call("view_file", path="."))
        return Outcome(len(v.text) <= 100_000, f"listing {len(v.text)} chars")
    finally:
        ep.close()


# ---- limits ------------------------------------------------------------------------------------------


@attack("limits")
def memory_across_processes(ctx):
    """Six processes of 200 MB each under a 300 MB limit."""
    env = ctx.math_env(memory_mb=300, max_procs=32)
    code = (
        "import multiprocessing as mp, sys, time\n"
        "def hog(q):\n"
        "    b = bytearray(200 << 20)\n"
        "    for i in range(0, len(b), 4096): b[i] = 1\n"
        "    q.put(1); time.sleep(1.5)\n"
        "if __name__ == '__main__':\n"
        "    mp.set_start_method('fork')\n"
        "    q = mp.Queue(); ps = [mp.Process(target=hog, args=(q,)) for _ in range(6)]\n"
        "    [p.start() for p in ps]\n"
        "    n = 0\n"
        "    t = time.time()\n"
        "    while n < 6 and time.time() - t < 4:\n"
        "        try: q.get(timeout=0.2); n += 1\n"
        "        except Exception: pass\n"
        "        if not any(p.is_alive() for p in ps) and q.empty(): break\n"
        "    print('HELD', n * 200, 'MB')\n")
    out = run_py(ctx, code, env)
    held = int(out.split("HELD", 1)[1].split()[0]) if "HELD" in out else 0
    return Outcome(held <= 300, out.strip()[-120:] if "HELD" in out else f"killed: {out.strip()[-80:]}")


@attack("limits")
def tmpfs_not_counted(ctx):
    """Fill the private /tmp with 200 MB, then allocate 200 MB, under a 300 MB limit."""
    env = ctx.math_env(memory_mb=300, tmpfs_mb=256)
    tag = uuid.uuid4().hex[:8]
    code = (
        "import os\n"
        "try:\n"
        "    for i in range(8):\n"
        f"        with open('/tmp/libra-adv-fill-{tag}-%d' % i, 'wb') as f:\n"
        "            for _ in range(25): f.write(b'1' * (1 << 20))\n"
        "    b = bytearray(200 << 20)\n"
        "    for i in range(0, len(b), 4096): b[i] = 1\n"
        "    print('BOTH 400 MB')\n"
        "except (OSError, MemoryError) as e: print('STOPPED', type(e).__name__)\n")
    out = run_py(ctx, code, env)
    for p in glob.glob(f"/tmp/libra-adv-fill-{tag}-*"):  # only without a private /tmp (rlimits mode)
        os.unlink(p)
    return Outcome("BOTH" not in out, out.strip()[-80:] or "killed")


@attack("limits")
def disk_and_inode_quota(ctx):
    code = (
        "import os\n"
        "mb = files = 0\n"
        "try:\n"
        "    for i in range(25):\n"
        "        with open('big%d' % i, 'wb') as f:\n"
        "            for _ in range(8): f.write(b'0' * (1 << 20)); mb += 1\n"
        "except OSError: pass\n"
        "for i in range(25):\n"
        "    try: os.unlink('big%d' % i)\n"
        "    except OSError: pass\n"
        "try:\n"
        "    os.mkdir('many')\n"
        "    for i in range(30000):\n"
        "        open('many/%d' % i, 'w').close(); files += 1\n"
        "except OSError: pass\n"
        "print('WROTE', mb, 'MB', files, 'FILES')\n")
    env = ctx.math_env(timeout_s=30.0)
    out = run_py(ctx, code, env)
    if "went over the work dir's cap" in out:  # not root: the poll stopped the call before it finished
        return Outcome(True, out.strip()[-120:])
    try:
        mb, files = int(out.split()[1]), int(out.split()[3])
    except (IndexError, ValueError):
        return Outcome(False, out.strip()[-80:])
    return Outcome(mb < 200 and files < 30000, out.strip())


@attack("limits")
def workdir_cap_keeps_no_files_past_it(ctx):
    """Issue 30: without root the work-dir cap was named but not enforced (1,086 MB written against 64 MB, and
    the files stayed). One call writes 3x a 16 MB cap and exits: after it the dir is back under the cap, and the
    model saw the call fail (its writes refused, or the call failed with the cap named)."""
    env = ctx.math_env(workdir_mb=16)
    ep = env.start(env.tasks()[0])
    try:
        first = ep.execute(call("python", code=(
            "n = 0\ntry:\n    for i in range(12):\n        open('big%d' % i, 'wb').write(b'0' * (4 << 20)); n += 1\n"
            "except OSError as e: print('REFUSED', e.errno)\nprint('WROTE', n)\n")))
        held, _ = usage(ep.workdir, 100_000)
    finally:
        ep.close()
    told = "REFUSED" in first.text or (first.status == "failure" and "cap of 16 MB" in first.text)
    return Outcome(told and held <= 16 << 20, f"{first.status}: {first.text.strip()[-120:]!r}; then holds {held >> 20} MB")


@attack("limits")
def cpu_quota(ctx):
    """Two busy processes: the call's cgroup must hold them to its CPU quota (a quarter core).

    Contained when the cgroup reports throttled periods, or when the children's CPU time over the wall
    time stays near the quota (on a loaded host they may never reach the quota, so never get throttled)."""
    sb = ctx.math_sandbox(cpu_cores=0.25)
    with sb.workdir("cpu") as w:
        code = ("import multiprocessing as mp, os, time\n"
                "def spin():\n    t = time.time()\n    while time.time() - t < 0.6: pass\n"
                "if __name__ == '__main__':\n    t0 = time.time(); ps = [mp.Process(target=spin) for _ in range(2)]\n"
                "    [p.start() for p in ps]; [p.join() for p in ps]\n"
                "    c = os.times(); print((c.children_user + c.children_system) / (time.time() - t0))\n")
        r = sb.run([sys.executable, "-c", code], cwd=w)
    throttled = r.info.get("cpu_throttled_periods")
    try:
        cores_used = float(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Outcome(False, f"no CPU figure: {r.status} {r.stdout[-80:]!r} {r.stderr[-120:]!r}")
    return Outcome(bool(throttled) or cores_used <= 0.4, f"throttled periods: {throttled}, cores used: {cores_used:.2f}")


@attack("limit")
def grader_hang_is_a_scored_timeout(ctx):
    """Issue 30: grader hangs (a package whose import ignores SIGTERM and spins, like `__del__`, a FIFO or a fork
    bomb) held a sandbox slot and a coordinator thread for 10-30 s per run, and slots taken by other calls were
    waited for without bound, past the link's timeout (an infra drop). One deadline bounds a grading: its runs
    and their waits for a slot. Both a hanging package and a grading behind a busy sandbox must come back as a
    scored 0 with reason `timeout` within the deadline plus a second, never an exception."""
    import time

    from envs.swe import env as swe

    limit_s = 2.0  # both cases time out by design: a short deadline checks the same
    env = swe.SweEnv(seed=0, sandbox_cfg=ctx.sandbox_cfg(timeout_s=limit_s, max_concurrent=1),
                     cfg=swe.SweConfig(test_timeout_s=limit_s))
    task = next(t for t in env.tasks() if t.meta["file"] == "calc/evaluator.py" and t.level == 0)
    out = []
    try:
        for case in ("hang", "busy"):
            ep = env.start(task)
            try:
                if case == "hang":
                    code = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass\n"
                    r = ep.execute(call("replace", path="calc/__init__.py", old='"""A tiny arithmetic',
                                        new=code + '"""A tiny arithmetic'))
                    assert r.status == "success", r.text
                    env.grader.suite(ep._reference())  # the reference run is the host's, made once: not timed here
                    busy = None
                else:
                    env.grader.suite(ep._reference())
                    with env.sandbox.workdir("busy") as w:  # the only slot, held 1.5 s past the submit's deadline
                        busy = threading.Thread(target=env.sandbox.run, args=(["sleep", str(limit_s + 2)],),
                                                kwargs={"cwd": w, "timeout_s": limit_s + 3})
                        busy.start()
                        time.sleep(0.5)
                        t0 = time.monotonic()
                        ep.execute(call("submit"))
                        took = time.monotonic() - t0
                        busy.join()
                if case == "hang":
                    t0 = time.monotonic()
                    ep.execute(call("submit"))
                    took = time.monotonic() - t0
                reward = ep.score("")
                out.append((case, float(reward), reward.reason, round(took, 1)))
            finally:
                ep.close()
    finally:
        env.close()
    ok = all(v == 0.0 and why == "timeout" and took <= limit_s + 1.0 for _, v, why, took in out)
    return Outcome(ok, "; ".join(f"{c}: reward {v} ({why}) in {t} s" for c, v, why, t in out))
