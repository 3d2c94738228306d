"""Run untrusted model-written code and test commands in an isolated, limited subprocess.

Algorithm, per `Sandbox.run(argv, cwd=workdir)`:
1. Take a slot of the concurrency semaphore (`max_concurrent`).
2. Start `unshare --net --pid --fork --kill-child --mount --mount-proc` (plus `--user
   --map-root-user` when we are not root). Its init shell runs one `mount -a` over a per-call
   fstab: fresh tmpfs over /tmp, /var/tmp, /dev/shm, the `hidden_paths` (/root, /home) and this repo, the
   interpreter's dirs and the work dir bound back in. It then drops to the sandbox uid (65534
   when we are root, in a fresh user namespace so RLIMIT_NPROC counts only this call) and execs
   `prlimit` (CPU s, address space, processes, file size, open files, no core) with the command.
   The new network namespace has no interfaces, so every connect fails; the PID namespace is
   the cleanup boundary: when its init dies, the kernel kills every descendant, `setsid`
   daemons included.
3. Wait up to the wall timeout; on expiry SIGKILL the whole tree (status "timeout").
4. Read at most `max_output_bytes` of stdout/stderr from unlinked temp files (no pipe
   deadlocks, no unbounded memory), release the slot.

Where user namespaces are unavailable the sandbox falls back to rlimits in a new session plus a
marker-based sweep of leftover processes, and logs once what it lacks (network isolation, a
private /tmp, kernel-enforced cleanup). `Sandbox.isolation` names the active mechanism.

Invariants (tests/test_sandbox*.py): fork bombs, memory blow-ups, infinite loops, 1 GB writes,
network connects, reads/writes outside the work dir and setsid daemons are contained; every call
returns within timeout + 1 s; no process, open file or temp dir outlives its call / work dir.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from envs.base import ToolInfraError

logger = logging.getLogger(__name__)

_SETUP_FAILED_RC = 213  # exit code of the init shell when a mount fails: an infra error, not the model's
_MARKER_ENV = "LIBRA_SANDBOX_ID"
_NOBODY_UID = 65534
_PR_SET_CHILD_SUBREAPER = 36
_REAP_TIMEOUT_S = 0.5  # the kernel tears a killed PID namespace down in milliseconds
_PROJECT_ROOT = Path(__file__).resolve().parents[1]
_PRIVATE_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


@dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    timeout_s: float = 10.0  # default wall-clock limit of one command
    cpu_s: int = 10  # RLIMIT_CPU of the command (CPU seconds, all threads)
    memory_mb: int = 1024  # RLIMIT_AS (virtual address space) of each process
    max_procs: int = 64  # RLIMIT_NPROC inside the sandbox (threads count too)
    max_file_mb: int = 64  # RLIMIT_FSIZE: largest file one write may grow
    max_open_files: int = 256  # RLIMIT_NOFILE
    max_output_bytes: int = 65536  # stdout and stderr are each cut to this many bytes
    max_concurrent: int = 8  # commands running at once across threads
    tmpfs_mb: int = 128  # size of the private /tmp inside the sandbox
    root_dir: str = ""  # parent of work dirs; "" = the system temp dir
    hidden_paths: tuple[str, ...] = ("/root", "/home")  # replaced by empty dirs inside
    expose_paths: tuple[str, ...] = ()  # dirs under hidden paths to keep visible (the interpreter's are added)
    hide_project: bool = True  # hide this repo too (it holds the swe projects' unbroken sources)
    isolation: str = "auto"  # "auto" (namespaces if they work) | "namespaces" | "rlimits"
    uid: int | None = None  # uid to run as; None = 65534 when root, else our own

    def __post_init__(self):
        for name in ("timeout_s", "cpu_s", "memory_mb", "max_procs", "max_file_mb", "max_open_files", "max_output_bytes", "max_concurrent", "tmpfs_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxConfig.{name}={getattr(self, name)} must be > 0; pass a positive value.")
        if self.memory_mb < 64:
            raise ValueError(f"SandboxConfig.memory_mb={self.memory_mb} must be >= 64 (a Python interpreter needs ~30 MB of address space); raise it.")
        if self.isolation not in ("auto", "namespaces", "rlimits"):
            raise ValueError(f"SandboxConfig.isolation={self.isolation!r} must be 'auto', 'namespaces' or 'rlimits'; pick one.")
        for p in self.hidden_paths + self.expose_paths:
            if not p.startswith("/"):
                raise ValueError(f"SandboxConfig.hidden_paths/expose_paths entry {p!r} must be an absolute path; write it starting with '/'.")


@dataclass(frozen=True, kw_only=True)
class SandboxResult:
    returncode: int  # -N when killed by signal N
    stdout: str
    stderr: str
    status: str  # "success" (rc 0) | "failure" | "timeout"
    latency_s: float
    truncated: bool = False  # stdout or stderr was cut to max_output_bytes
    info: dict = field(default_factory=dict)  # e.g. {"isolation": ...}

    @property
    def output(self) -> str:
        """stdout and stderr together, as a model usually sees them."""
        return self.stdout + (("\n" if self.stdout and not self.stdout.endswith("\n") else "") + self.stderr if self.stderr else "")


_probe_lock = threading.Lock()
_probe_cache: dict[int | None, str | None] = {}
_warned: set[str] = set()


def _outer_argv(as_root: bool) -> list[str]:
    # As root, real-root namespaces let the init shell bind the interpreter out of /root (0700)
    # before it drops to the sandbox uid; otherwise a user namespace gives us mount rights.
    user = [] if as_root else ["--user", "--map-root-user"]
    return ["unshare", *user, "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc"]


def _drop_argv(uid: int | None) -> list[str]:
    # A fresh user namespace per call makes RLIMIT_NPROC count only this sandbox's processes.
    if uid is None:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "unshare", "--user", "--map-root-user"]


def _probe_namespaces(uid: int | None) -> str | None:
    """None if the namespace sandbox works here for `uid`, else why not (cached per uid)."""
    with _probe_lock:
        if uid in _probe_cache:
            return _probe_cache[uid]
        why: str | None = None
        tools = ["unshare", "prlimit"] + (["setpriv"] if uid is not None else [])
        missing = [t for t in tools if shutil.which(t) is None]
        if missing:
            why = f"util-linux {'/'.join(missing)} not found"
        else:
            argv = [*_outer_argv(uid is not None), "sh", "-c", 'mount -t tmpfs -o size=1m none /tmp && exec "$@"', "probe", *_drop_argv(uid), "true"]
            try:
                p = subprocess.run(argv, capture_output=True, timeout=10, cwd="/", text=True)
                if p.returncode != 0:
                    why = f"unshare failed (rc={p.returncode}): {p.stderr.strip()[:200]}"
            except (OSError, subprocess.SubprocessError) as e:
                why = f"unshare could not start: {e}"
        _probe_cache[uid] = why
        return why


def _fstab_path(path: str) -> str:
    return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")


def _stage_root() -> str:
    """Where exposed dirs wait while their parents get covered: outside every covered dir when we
    are root (so a venv or repo under /tmp, as in a CI checkout, stays reachable), else in /tmp."""
    return "/run/.libra-stage" if os.geteuid() == 0 and os.path.isdir("/run") else "/tmp/.libra-stage"


def _fstab(hidden: list[str], exposed: list[str], tmpfs_mb: int, cwd: str, stage: str | None = None) -> str:
    """Mounts for the namespace init, in order; one `mount -a` does them all (one exec, not ten)."""
    q = _fstab_path
    stage = stage or _stage_root()
    private = [d for d in _PRIVATE_TMP_DIRS if os.path.isdir(d)]
    tmp_rows = [f"none {d} tmpfs size={tmpfs_mb}m,mode=1777 0 0" for d in private]
    # Stage exposed dirs (e.g. the interpreter under /root or a venv under /tmp) before their
    # parents get covered; a stage inside /tmp itself must wait until the fresh /tmp is there.
    stage_rows = [f"{q(d)} {stage}/{i} none bind,X-mount.mkdir 0 0" for i, d in enumerate(exposed)]
    rows = tmp_rows + stage_rows if any(_under(stage, d) for d in private) else stage_rows + tmp_rows
    # a hidden dir under a fresh tmpfs is hidden already (and its mount point is gone)
    rows += [f"none {q(d)} tmpfs size=1m,mode=755 0 0" for d in hidden
             if os.path.isdir(d) and not any(_under(d, p) for p in private)]
    rows += [f"{stage}/{i} {q(d)} none bind,X-mount.mkdir 0 0" for i, d in enumerate(exposed)]
    # The init's cwd still is the real work dir after /tmp was covered: bind it back at its path
    # (--no-canonicalize keeps /proc/self/cwd a magic link the kernel follows).
    rows.append(f"/proc/self/cwd {q(cwd)} none bind,X-mount.mkdir 0 0")
    return "\n".join(rows) + "\n"


_INIT_SCRIPT = (
    f'mount --no-canonicalize -a -T "$1" || {{ echo "libra-sandbox-setup: mount failed" >&2; exit {_SETUP_FAILED_RC}; }}\n'
    'cd "$2" && shift 2 && exec "$@"'
)


class Sandbox:
    """Thread-safe runner of untrusted commands; see the module docstring for the mechanism."""

    def __init__(self, cfg: SandboxConfig = SandboxConfig()):
        self.cfg = cfg
        self._slots = threading.BoundedSemaphore(cfg.max_concurrent)
        self._uid = cfg.uid if cfg.uid is not None else (_NOBODY_UID if os.geteuid() == 0 else None)
        self._root = Path(cfg.root_dir or tempfile.gettempdir()) / "libra-sandbox"
        self._root.mkdir(parents=True, exist_ok=True)
        self._use_ns = self._choose_isolation()
        # The running interpreter must stay reachable inside (it often lives under /root or /home).
        prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, *cfg.expose_paths)}
        self._exposed = sorted(p for p in prefixes if os.path.isdir(p))
        self._hidden = list(cfg.hidden_paths) + ([str(_PROJECT_ROOT)] if cfg.hide_project else [])

    def _choose_isolation(self) -> bool:
        if self.cfg.isolation == "rlimits":
            self._lacks = "requested by config"
            _become_subreaper()
            return False
        why = _probe_namespaces(self._uid)
        if why is None:
            return True
        if self.cfg.isolation == "namespaces":
            raise ToolInfraError(f"sandbox isolation='namespaces' requested but unavailable: {why}")
        self._lacks = f"{why}; no network isolation, no private /tmp or hidden dirs, cleanup by marker sweep"
        if self._uid is not None:
            self._lacks += f"; commands run as uid {self._uid} and cannot reach files only root may read (e.g. under /root)"
        # Orphans must come back to us to be reaped (some containers' PID 1 never reaps them).
        if not _become_subreaper():
            self._lacks += "; cannot become subreaper, orphaned zombies are left to PID 1"
        if self._lacks not in _warned:
            _warned.add(self._lacks)
            logger.warning("sandbox falls back to rlimits only: %s", self._lacks)
        return False

    @property
    def isolation(self) -> str:
        return "pid+net namespace" if self._use_ns else f"rlimits only: {self._lacks}"

    # ---- work dirs -------------------------------------------------------------------------

    def make_workdir(self, prefix: str = "task") -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=self._root))
        self.own(path)
        return path

    def own(self, path: Path) -> None:
        """Give the sandbox uid the tree at `path` (call after copying files in as root)."""
        if self._uid is None or os.geteuid() != 0:
            return
        os.chown(path, self._uid, self._uid)
        for dirpath, dirnames, filenames in os.walk(path):
            for name in dirnames + filenames:
                os.chown(os.path.join(dirpath, name), self._uid, self._uid, follow_symlinks=False)

    def remove_workdir(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=False)

    @contextmanager
    def workdir(self, prefix: str = "task") -> Iterator[Path]:
        path = self.make_workdir(prefix)
        try:
            yield path
        finally:
            if path.exists():
                self.remove_workdir(path)

    # ---- running ---------------------------------------------------------------------------

    def _limits(self) -> list[str]:
        c = self.cfg
        return [
            "prlimit", f"--cpu={c.cpu_s}", f"--as={c.memory_mb << 20}", f"--nproc={c.max_procs}",
            f"--fsize={c.max_file_mb << 20}", f"--nofile={c.max_open_files}", "--core=0", "--",
        ]

    def _command(self, argv: list[str], cwd: Path) -> tuple[list[str], Path | None]:
        """The wrapped command and the per-call fstab it reads (None in the fallback)."""
        if not self._use_ns:
            return [*self._limits(), *argv], None
        cwd_real = os.path.realpath(cwd)
        hidden = [h for h in self._hidden if not _under(cwd_real, h)]
        covered = hidden + [d for d in _PRIVATE_TMP_DIRS if os.path.isdir(d)]
        exposed = [e for e in self._exposed if any(_under(e, h) for h in covered)]
        fstab = self._root / f".fstab-{uuid.uuid4().hex}"
        fstab.write_text(_fstab(hidden, exposed, self.cfg.tmpfs_mb, cwd_real))
        command = [*_outer_argv(self._uid is not None), "sh", "-c", _INIT_SCRIPT, "libra-sandbox", str(fstab), cwd_real,
                   *_drop_argv(self._uid), *self._limits(), *argv]
        return command, fstab

    def _env(self, cwd: Path, env: dict | None, marker: str) -> dict:
        base = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(cwd), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
            _MARKER_ENV: marker,
        }
        return {**base, **(env or {})}

    def run(self, argv: list[str], *, cwd: Path, timeout_s: float | None = None, stdin: str | None = None, env: dict | None = None) -> SandboxResult:
        """Run `argv` in `cwd` under the limits; never raises for the command's own failures."""
        if not argv:
            raise ValueError("Sandbox.run: argv is empty; pass the command as a list, e.g. ['python', 'main.py'].")
        if not Path(cwd).is_dir():
            raise ToolInfraError(f"sandbox work dir {cwd} does not exist (removed early?)")
        timeout = self.cfg.timeout_s if timeout_s is None else timeout_s
        with self._slots:
            return self._run_locked(list(argv), Path(cwd), timeout, stdin, env)

    def _run_locked(self, argv: list[str], cwd: Path, timeout: float, stdin: str | None, env: dict | None) -> SandboxResult:
        marker = uuid.uuid4().hex
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as inp:
            if stdin is not None:
                inp.write(stdin.encode("utf-8", "replace"))
                inp.seek(0)
            t0 = time.monotonic()
            command, fstab = self._command(argv, cwd)
            try:
                proc = subprocess.Popen(
                    command, cwd=cwd, stdin=inp, stdout=out, stderr=err,
                    env=self._env(cwd, env, marker), user=None if self._use_ns else self._uid,
                    start_new_session=True, close_fds=True,
                )
            except OSError as e:
                if fstab is not None:
                    fstab.unlink()
                raise ToolInfraError(f"sandbox could not start {argv[0]!r}: {e}") from e
            try:
                timed_out = _wait(proc, timeout)
            finally:
                self._kill_tree(proc, marker)
                if fstab is not None:
                    fstab.unlink()
            latency_s = time.monotonic() - t0
            stdout, cut_out = _read_capped(out, self.cfg.max_output_bytes)
            stderr, cut_err = _read_capped(err, self.cfg.max_output_bytes)
        rc = proc.returncode
        if self._use_ns and rc == _SETUP_FAILED_RC and "libra-sandbox-setup" in stderr:
            raise ToolInfraError(f"sandbox set-up failed: {stderr.strip()[:300]}")
        if timed_out:
            # Report the kill itself, not how the wrapper exited after its child was killed.
            rc = -signal.SIGKILL
            stderr = "".join(ln for ln in stderr.splitlines(keepends=True) if not ln.startswith("unshare: "))
        status = "timeout" if timed_out else "success" if rc == 0 else "failure"
        return SandboxResult(returncode=rc, stdout=stdout, stderr=stderr, status=status, latency_s=latency_s,
                             truncated=cut_out or cut_err, info={"isolation": self.isolation})

    def _kill_tree(self, proc: subprocess.Popen, marker: str) -> None:
        # Killing the namespace init makes the kernel kill and reap every process in it before
        # unshare's wait returns, so nothing is left once proc.wait() does (setsid daemons too).
        # The fallback kills the session and then sweeps processes that carry our marker.
        if proc.poll() is None and self._use_ns:
            for child in _children(proc.pid):
                _kill(child)
            try:
                proc.wait(timeout=_REAP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                logger.warning("sandbox: namespace of pid %d not reaped after %.1f s; killing its session", proc.pid, _REAP_TIMEOUT_S)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        if not self._use_ns:
            _sweep_marked(marker, self._uid)


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait for `proc` up to `timeout_s`; True if it is still running (timed out)."""
    # A pidfd wakes us the moment the process exits; Popen.wait(timeout) polls with sleeps of up
    # to 50 ms, which was a third of a trivial call's latency.
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout=timeout_s)
            return False
        except subprocess.TimeoutExpired:
            return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
    finally:
        os.close(fd)
    if not ready:
        return True
    proc.wait()
    return False


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _under(path: str, parent: str) -> bool:
    return (path.rstrip("/") + "/").startswith(parent.rstrip("/") + "/")


def _read_capped(f, max_bytes: int) -> tuple[str, bool]:
    size = f.seek(0, os.SEEK_END)
    f.seek(0)
    data = f.read(max_bytes)
    return data.decode("utf-8", "replace"), size > max_bytes


def _become_subreaper() -> bool:
    """Make this process the reaper of orphaned descendants (Linux prctl); False if unsupported."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid_dir: Path) -> tuple[int, str, int] | None:
    """(ppid, state, uid) of a /proc/<pid> entry, or None when it vanished."""
    try:
        fields = (pid_dir / "stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), fields[0], pid_dir.stat().st_uid
    except (OSError, IndexError, ValueError):
        return None


def _sweep_marked(marker: str, uid: int | None) -> None:
    """Kill every process whose environment carries `marker`, then reap what was orphaned to us.

    Fallback cleanup, needs /proc. Reaping matters: a container whose PID 1 does not reap keeps
    orphaned zombies forever, and they count against the sandbox uid's RLIMIT_NPROC. We are a
    subreaper in fallback mode, so orphans come to us; we reap the ones we killed and, when the
    sandbox has its own uid, every zombie child of that uid.
    """
    needle = f"{_MARKER_ENV}={marker}".encode()
    killed: set[int] = set()
    for _ in range(5):  # a dying fork loop can spawn between passes
        found = False
        for pid_dir in Path("/proc").glob("[0-9]*"):
            try:
                if needle in (pid_dir / "environ").read_bytes().split(b"\0"):
                    _kill(int(pid_dir.name))
                    killed.add(int(pid_dir.name))
                    found = True
            except (OSError, ValueError):
                continue
        if not found:
            break
        time.sleep(0.01)
    me, own_uid = os.getpid(), uid is not None and uid != os.getuid()
    deadline = time.monotonic() + _REAP_TIMEOUT_S
    while time.monotonic() < deadline:
        for pid_dir in Path("/proc").glob("[0-9]*"):
            st = _stat(pid_dir)
            if st and st[0] == me and st[1] == "Z" and (int(pid_dir.name) in killed or (own_uid and st[2] == uid)):
                try:
                    os.waitpid(int(pid_dir.name), os.WNOHANG)
                except ChildProcessError:
                    pass
        killed = {pid for pid in killed if Path(f"/proc/{pid}").exists()}
        if not killed:
            return
        time.sleep(0.01)
