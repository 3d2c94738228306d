"""500 sandboxed `run_tests`-like calls leave processes, open files and temp disk at baseline."""

import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

from envs.sandbox.sandbox import Sandbox, SandboxConfig

NUM_CALLS = 500
NUM_THREADS = 4  # the loop also exercises concurrent callers; 2 cores make 4 threads ~2x faster


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _children() -> list[int]:
    pid = os.getpid()
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_many_calls_leave_no_residue():
    root = Path(tempfile.mkdtemp(prefix="libra-loop-"))
    os.chmod(root, 0o755)
    try:
        sb = Sandbox(SandboxConfig(timeout_s=5, memory_mb=128, max_concurrent=NUM_THREADS, root_dir=str(root)))
        base_fds = _open_fds()
        base_children = set(_children())  # e.g. the launcher's forkserver, left by earlier tests
        failures: list[str] = []

        def worker(n: int) -> None:
            # A fresh work dir every 10 calls, like one episode's run_tests calls.
            for i in range(n):
                if i % 10 == 0:
                    w = sb.make_workdir("loop")
                    (w / "test_x.py").write_text("print('ok')\n")
                    sb.own(w)
                r = sb.run([sys.executable, "-S", "test_x.py"], cwd=w)
                if (r.status, r.stdout) != ("success", "ok\n"):
                    failures.append(repr(r))
                if i % 10 == 9 or i == n - 1:
                    sb.remove_workdir(w)

        threads = [threading.Thread(target=worker, args=(NUM_CALLS // NUM_THREADS,)) for _ in range(NUM_THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        assert set(_children()) - base_children == set()
        assert _open_fds() == base_fds
        assert os.listdir(root / "libra-sandbox") == []
    finally:
        shutil.rmtree(root)

