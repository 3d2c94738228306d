"""Sandbox containment: each hostile command is stopped, returns in time and leaves nothing behind."""

import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest

from envs.base import ToolInfraError
from envs.sandbox import Sandbox, SandboxConfig, SandboxResult

PY = sys.executable
# The rlimits fallback runs as uid 65534 when we are root: it needs an interpreter outside /root.
PY_PUBLIC = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
TIMEOUT_S = 1.0
CFG = SandboxConfig(timeout_s=TIMEOUT_S, cpu_s=2, memory_mb=256, max_procs=32, max_file_mb=8, max_output_bytes=4096)


def _procs_with(needle: bytes) -> list[int]:
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (d / "cmdline").read_bytes():
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


@pytest.fixture(scope="module", params=["auto", "rlimits"])
def sandbox(request):
    return Sandbox(SandboxConfig(**{**CFG.__dict__, "isolation": request.param}))


@pytest.fixture(scope="module")
def ns_sandbox():
    sb = Sandbox(CFG)
    if not sb.isolation.startswith("pid+net"):
        pytest.skip(f"no namespaces here: {sb.isolation}")
    return sb


@pytest.fixture
def work(sandbox):
    with sandbox.workdir("t") as w:
        yield w


def _run(sb: Sandbox, code: str, cwd: Path, **kw) -> SandboxResult:
    t0 = time.monotonic()
    py = PY if sb.isolation.startswith("pid+net") else PY_PUBLIC
    r = sb.run([py, "-c", code], cwd=cwd, **kw)
    # The contract: every call returns within its timeout plus one second.
    assert time.monotonic() - t0 < TIMEOUT_S + 1.0, r
    return r


def test_trivial_command_succeeds_in_its_workdir(sandbox, work):
    r = _run(sandbox, "import os; print(os.getcwd()); open('f.txt', 'w').write('ok')", work)
    assert r.status == "success" and r.returncode == 0
    assert r.stdout.strip() == os.path.realpath(work)
    assert (work / "f.txt").read_text() == "ok"


def test_stdin_env_and_failure_status(sandbox, work):
    r = _run(sandbox, "import os, sys; print(sys.stdin.read() + os.environ['X']); sys.exit(3)", work, stdin="ab", env={"X": "cd"})
    assert (r.status, r.returncode, r.stdout) == ("failure", 3, "abcd\n")


def test_infinite_loop_times_out(sandbox, work):
    r = _run(sandbox, "while True: pass", work)
    assert r.status == "timeout" and r.returncode == -9


def test_fork_bomb_is_contained(sandbox, work):
    r = _run(sandbox, "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", work)
    assert r.status == "timeout"
    assert _procs_with(b"os.fork()") == []


def test_memory_blowup_fails(sandbox, work):
    r = _run(sandbox, "x = bytearray(1 << 30); print('allocated')", work)
    assert r.status == "failure" and "MemoryError" in r.stderr and "allocated" not in r.stdout


def test_big_file_write_is_cut(sandbox, work):
    r = _run(sandbox, "f = open('big', 'wb')\nfor _ in range(1024): f.write(b'0' * (1 << 20))", work)
    assert r.status == "failure"
    assert (work / "big").stat().st_size <= CFG.max_file_mb << 20


def test_output_is_truncated(sandbox, work):
    r = _run(sandbox, "print('y' * 100000)", work)
    assert r.status == "success" and r.truncated and len(r.stdout) == CFG.max_output_bytes


def test_setsid_daemon_does_not_outlive_call(sandbox, work):
    r = _run(sandbox, "import subprocess; subprocess.Popen(['setsid', 'sleep', '1234.5']); print('spawned')", work)
    assert r.stdout == "spawned\n", r
    time.sleep(0.1)
    assert _procs_with(b"1234.5") == []


def test_network_connect_fails(ns_sandbox, tmp_path):
    with ns_sandbox.workdir() as w:
        code = "import socket\ns = socket.socket(); s.settimeout(1)\ntry:\n    s.connect(('1.1.1.1', 80)); print('connected')\nexcept OSError as e: print('blocked', e.errno)"
        r = _run(ns_sandbox, code, w)
    assert r.stdout.startswith("blocked")


def test_cannot_read_or_write_outside_workdir(ns_sandbox, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    os.chmod(tmp_path, 0o755)
    os.chmod(secret, 0o644)
    with ns_sandbox.workdir() as w:
        code = (
            f"import os\nprint(os.path.exists({str(secret)!r}))\n"
            "for p in ['/work/escape.txt', '/etc/escape.txt', '/usr/escape.txt']:\n"
            "    try: open(p, 'w').write('x'); print('wrote', p)\n"
            "    except OSError as e: print('denied', e.errno)"
        )
        r = _run(ns_sandbox, code, w)
    assert r.stdout.split("\n")[0] == "False"
    repo = Path(__file__).resolve().parents[1]
    with ns_sandbox.workdir() as w:
        r2 = _run(ns_sandbox, f"import os; print(os.listdir({str(repo)!r}), os.path.exists({str(repo / 'envs' / 'base.py')!r}))", w)
    assert r2.stdout.endswith(" False\n") and "'envs'" not in r2.stdout, r2
    assert "wrote" not in r.stdout and r.stdout.count("denied") == 3
    assert not Path("/etc/escape.txt").exists()


def test_concurrency_is_bounded(tmp_path):
    sb = Sandbox(SandboxConfig(**{**CFG.__dict__, "max_concurrent": 2}))
    active, peak, lock = [0], [0], threading.Lock()
    orig = sb._run_locked

    def counting(*a, **kw):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            return orig(*a, **kw)
        finally:
            with lock:
                active[0] -= 1

    sb._run_locked = counting
    with sb.workdir() as w:
        threads = [threading.Thread(target=sb.run, args=([PY, "-c", "import time; time.sleep(0.2)"],), kwargs={"cwd": w}) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert peak[0] == 2


def test_workdir_removed_and_missing_workdir_is_infra_error():
    sb = Sandbox(CFG)
    with sb.workdir() as w:
        (w / "a").write_text("x")
    assert not w.exists()
    with pytest.raises(ToolInfraError, match="does not exist"):
        sb.run(["true"], cwd=w)
    with pytest.raises(ValueError, match="argv is empty"):
        sb.run([], cwd=Path("/"))


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"timeout_s": 0}, r"SandboxConfig.timeout_s=0 must be > 0"),
        ({"max_concurrent": -1}, r"SandboxConfig.max_concurrent=-1 must be > 0"),
        ({"memory_mb": 32}, r"SandboxConfig.memory_mb=32 must be >= 64"),
        ({"isolation": "docker"}, r"SandboxConfig.isolation='docker' must be 'auto', 'namespaces' or 'rlimits'"),
        ({"hidden_paths": ("rel",)}, r"SandboxConfig.hidden_paths/expose_paths entry 'rel' must be an absolute path"),
    ],
)
def test_config_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SandboxConfig(**kw)


def test_fstab_stages_a_venv_under_tmp_before_tmp_is_covered():
    # A CI checkout under /tmp: its venv must be bound away before the fresh /tmp hides it.
    from envs.sandbox import _fstab

    rows = _fstab(["/root", "/tmp/ci/repo"], ["/tmp/ci/repo/.venv"], 64, "/tmp/w", stage="/run/.libra-stage").splitlines()
    stage_in = rows.index("/tmp/ci/repo/.venv /run/.libra-stage/0 none bind,X-mount.mkdir 0 0")
    tmp = rows.index("none /tmp tmpfs size=64m,mode=1777 0 0")
    back = rows.index("/run/.libra-stage/0 /tmp/ci/repo/.venv none bind,X-mount.mkdir 0 0")
    assert stage_in < tmp < back
    assert not any(r.startswith("none /tmp/ci/repo ") for r in rows)  # hidden by the fresh /tmp already
