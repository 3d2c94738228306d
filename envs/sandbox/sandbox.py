"""Run untrusted model-written code and test commands in an isolated, limited subprocess.

Algorithm, per `Sandbox.run(argv, cwd=workdir)`:
1. Take a slot of the concurrency semaphore (`max_concurrent`) and a chain started ahead of the
   call (else start one now). Chains are started by the launcher thread of envs/sandbox/guard.py,
   which holds no_new_privs and a seccomp filter that refuses unix and every other non-IP socket:
   every process of a chain inherits both, with no fd but 0-2 and the passed ones. A chain's init
   shell has already joined a cgroup set (memory incl. tmpfs, pids, CPU; envs/sandbox/cgroup.py)
   that a `Pool` made once and reuses, and waits for "go". While the call runs, the next call's
   chain starts. (Joining a cgroup cost 5-15 ms per call here, the guard's interpreter ~12 ms:
   `python -m bench.sandbox` measured `true` at 37-54 ms before, 6-11 ms after, on this 2-core box.)
2. Hand it the call: a per-call fstab and a job (argv, env, stdin) in the runtime dir, then "go".
   Namespace mode (isolation "auto"/"namespaces"): the chain (envs/sandbox/procs.py) runs in
   fresh user (when not root), PID, network, IPC and mount namespaces; its init shell mounts a
   fresh read-only root that holds only the system dirs, the interpreter, a private /tmp and /run
   and the work dir (envs/sandbox/fs.py), writes its verdict into a file the command cannot reach,
   and execs the command chrooted there as a non-root uid without capabilities, under `prlimit`.
   The network namespace has no interfaces, so every connect fails; the PID namespace is the
   cleanup boundary. A chain started before a work dir's tmpfs was mounted does not see it
   (`_sees`) and is replaced.
   rlimits mode (only when asked for: `isolation="rlimits"`, and only as root: as another user
   every call would run as the runtime's own uid; with a warning naming what it lacks): the same
   cgroups, rlimits and guard, as uid 65534; where the kernel allows it, in a PID and mount
   namespace of its own (a /proc of its own; the work-dir root covered by an empty tmpfs, the
   call's work dir bound back), so no call can signal another episode's process or reach its work
   dir; cleanup by the namespace, cgroup kill (or marker, session and orphan sweeps).
3. Wait up to the wall timeout; then kill every process of the call (status "timeout" if it had
   to be killed before it exited), read the cgroup's stats into `info`, give the cgroups back.
4. Read at most `max_output_bytes` of stdout/stderr from unlinked temp files, release the slot.
Work dirs (`make_workdir`) are size- and inode-capped tmpfs mounts when we are root. Otherwise
the wait polls the work dir's usage every `_QUOTA_POLL_S` and kills the call once it is over a cap,
and after every call (a timed-out one too) what the call wrote is removed until the dir is back
under its caps (envs/sandbox/fs.py `trim`): the call is then a "failure" whose stderr names the
cap and what was removed.

Start-up: which isolation this machine gives, what it lacks, and whether our interpreter runs inside
are checked when a Sandbox is built (envs/sandbox/startup.py).

Invariants (tests/envs/sandbox/test_sandbox*.py, tests/envs/sandbox/test_adversarial.py, tests/engine/runtime/test_startup_errors.py):
fork bombs, memory blow-ups (also across processes and through tmpfs), infinite loops, 1 GB writes,
network connects, reads/writes outside the work dir, unmounts and setsid daemons are contained;
every call returns within timeout + 1 s; no process, open file, cgroup or temp dir outlives its
call / work dir but the one chain a sandbox keeps started ahead (and the free cgroups of the pool);
a call in a work dir made after its chain started runs in that work dir; no call of an episode can
signal another episode's process, write its work dir, or read or signal the runtime, in namespace mode
and in rlimits mode with a PID namespace (rlimits mode without one says so), and rlimits mode without
root is refused; a work dir is within its caps after every call (a call that went over is a failure
that says so, and what it wrote is gone); a venv reached through a symlink runs; an interpreter the sandbox uid cannot read
is a one-line error naming the path.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from envs.sandbox import cgroup as cg
from envs.sandbox import fs as sfs
from envs.sandbox import guard as sandbox_guard
from envs.sandbox import procs as sp
from envs.sandbox import startup
from envs.sandbox.startup import StartUpChecks, start_up_check
from envs.base import ToolInfraError
from envs.config import SandboxConfig, SandboxResult

__all__ = ["Sandbox", "SandboxConfig", "SandboxResult", "start_up_check"]

logger = logging.getLogger(__name__)

_NOBODY_UID = 65534
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUOTA_POLL_S = 0.1  # how often a work dir that is not a capped tmpfs is measured during a call
_READY_CHAINS = 1  # chains started ahead of their calls, per sandbox and mode


class Sandbox(StartUpChecks):
    """Thread-safe runner of untrusted commands; see the module docstring for the mechanism."""

    def __init__(self, cfg: SandboxConfig = SandboxConfig()):
        self.cfg = cfg
        self._check_only = startup.checking()
        self._as_root = os.geteuid() == 0
        if not self._as_root and cfg.uid is not None and cfg.uid != os.getuid():
            raise ValueError(f"SandboxConfig.uid={cfg.uid} needs root (we run as uid {os.getuid()}); pass uid=None.")
        self._uid = (cfg.uid if cfg.uid is not None else _NOBODY_UID) if self._as_root else os.getuid()
        self._gid = self._uid if self._as_root else os.getgid()
        self._slots = threading.BoundedSemaphore(cfg.max_concurrent)
        base = Path(cfg.root_dir or tempfile.gettempdir())
        self._root = base / ("libra-sandbox" if self._as_root else f"libra-sandbox-{os.getuid()}")
        try:
            self._root.mkdir(mode=0o711, parents=True, exist_ok=True)
        except OSError as e:
            raise RuntimeError(f"sandbox: cannot create the work-dir root {self._root} ({e.strerror}); "
                               "pass --env.root-dir a directory this user can write to") from None
        self._newroot, self._devskel = sfs.runtime_dirs(self._root)
        sfs.sweep_call_files(self._newroot.parent)
        self._exposed = sfs.interpreter_dirs(cfg.expose_paths)
        bound = [*sfs.SYSTEM_DIRS, *self._exposed]
        self._aliases = sfs.interpreter_aliases(bound, clear=os.path.realpath(self._root))
        # the data dirs the caller (its bench) hides, where a bound dir holds them
        self._hidden = [h for h in cfg.hidden_paths if os.path.isdir(h) and any(sfs.under(h, b) for b in bound)]
        sup = cg.support() if cfg.use_cgroup else None
        self._cgroups = sup if sup is not None and (sup.parents or sup.tracker is not None) else None
        self._pool = cg.pool(self._cgroups, self._limits_for_cgroup()) if self._cgroups is not None else None
        self._workdir_tmpfs = self._probe_workdir_tmpfs()
        self._ready: list[sp.Chain] = []
        self._ready_lock = threading.Lock()
        weakref.finalize(self, sp.abandon_all, self._ready)
        self._use_ns = self._choose_isolation()

    # ---- work dirs -------------------------------------------------------------------------

    def make_workdir(self, prefix: str = "task", *, owned: bool = True) -> Path:
        """A fresh work dir; `owned=False`: readable but not writable by the sandbox uid (when we are root)."""
        path = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=self._root))
        if self._workdir_tmpfs:
            try:
                sfs.mount_workdir(path, self.cfg.workdir_mb, self.cfg.workdir_inodes)
            except OSError as e:
                path.rmdir()
                raise ToolInfraError(f"sandbox: could not mount the work dir tmpfs: {e}") from e
        if owned:
            self.own(path)
        else:
            path.chmod(0o755)
        return path

    @property
    def owner(self) -> tuple[int, int] | None:
        """(uid, gid) that files written into a work dir should get, or None when they keep ours."""
        return (self._uid, self._gid) if self._as_root else None

    def own(self, path: Path) -> None:
        """Give the sandbox uid the tree at `path` (call after copying files in as root)."""
        if not self._as_root:
            return
        os.chown(path, self._uid, self._gid)
        for dirpath, dirnames, filenames in os.walk(path):
            for name in dirnames + filenames:
                os.chown(os.path.join(dirpath, name), self._uid, self._gid, follow_symlinks=False)

    def remove_workdir(self, path: Path) -> None:
        try:
            if os.path.ismount(path):
                sfs.unmount_workdir(path)
                path.rmdir()
            else:
                sfs.remove_tree(path)
        except OSError as e:
            raise ToolInfraError(f"sandbox: could not remove the work dir {path}: {e}") from e

    @contextmanager
    def workdir(self, prefix: str = "task", *, owned: bool = True) -> Iterator[Path]:
        path = self.make_workdir(prefix, owned=owned)
        try:
            yield path
        finally:
            if path.exists():
                self.remove_workdir(path)

    # ---- running ---------------------------------------------------------------------------

    def _limits(self) -> list[str]:
        c = self.cfg
        return sp.limits_argv(cpu_s=c.cpu_s, memory_bytes=c.memory_mb << 20, max_procs=c.max_procs,
                              max_file_bytes=c.max_file_mb << 20, max_open_files=c.max_open_files)

    def _base_env(self, marker: str) -> dict:
        """The env a chain starts with (the job exports HOME and the call's own on top)."""
        return {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "LANG": "C.UTF-8", "TMPDIR": "/tmp",
                "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", sp.MARKER_ENV: marker}

    def _spawn(self, use_ns: bool, pass_fds: tuple[int, ...] = ()) -> sp.Chain:
        """Start a chain up to its init shell waiting for a job (on the launcher thread: it inherits the guard)."""
        assert sandbox_guard.on_launcher()
        marker = uuid.uuid4().hex
        try:
            group = self._pool.acquire() if self._pool is not None else None
        except OSError as e:
            raise ToolInfraError(f"sandbox: could not create the call's cgroup: {e}") from e
        rt = self._newroot.parent  # root's (or ours), not writable by the sandbox uid, outside every new root
        files = {k: rt / f"{k}-{os.getpid()}-{marker}" for k in ("ok", "fstab", "job", "in", "keep")}  # pid: for the sweep
        procs = group.procs_files if group is not None else []
        argv = (sp.ns_argv(as_root=self._as_root, files=files, cgroup_procs=procs) if use_ns
                else sp.rlimits_argv(files=files, cgroup_procs=procs, pid_ns=self._rl_ns))
        go_r, go_w = os.pipe()
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        chain = sp.Chain(proc=None, go_fd=go_w, out=out, err=err, files=files, group=group, marker=marker, use_ns=use_ns)
        try:
            chain.proc = sp.start(lambda: subprocess.Popen(
                argv, cwd=rt, stdin=go_r, stdout=out, stderr=err, env=self._base_env(marker), start_new_session=True,
                close_fds=True, pass_fds=pass_fds))
        except OSError as e:
            sp.discard(chain, self._pool)
            raise ToolInfraError(f"sandbox could not start its chain ({argv[0]!r}): {e}") from e
        finally:
            os.close(go_r)
        return chain

    def _refill(self, use_ns: bool) -> None:
        """Keep `_READY_CHAINS` chains started ahead of their calls (runs on the launcher thread)."""
        with self._ready_lock:
            if sum(c.use_ns == use_ns for c in self._ready) >= _READY_CHAINS:
                return
        try:
            chain = self._spawn(use_ns)
        except ToolInfraError as e:  # the next call starts its own chain and reports it
            logger.warning("sandbox: could not start a chain ahead of its call (%s)", e)
            return
        with self._ready_lock:
            self._ready.append(chain)

    def _take(self, use_ns: bool, pass_fds: tuple[int, ...], cwd: Path) -> sp.Chain:
        """A chain started ahead (its cgroups joined), else one started now; a dead one is discarded."""
        if not pass_fds:  # a ready chain holds no passed fd
            with self._ready_lock:
                chain = next((c for c in self._ready if c.use_ns == use_ns), None)
                if chain is not None:
                    self._ready.remove(chain)
            if chain is not None and chain.proc.poll() is None and self._sees(chain, cwd):
                return chain
            if chain is not None:
                sp.discard(chain, self._pool)
        return sandbox_guard.launch(lambda: self._spawn(use_ns, pass_fds))

    def _sees(self, chain: sp.Chain, cwd: Path) -> bool:
        """Whether a chain started ahead sees `cwd` as we do: its mount namespace is a private copy of ours made
        when it started, so a work dir's tmpfs mounted since then is missing there (it would bind the bare dir)."""
        if not ((chain.use_ns or self._rl_ns) and self._workdir_tmpfs):
            return True
        kids = sp.children(chain.proc.pid)  # the init shell: forked once the outer unshare has made the namespace
        if not kids:
            return False
        try:
            return os.stat(f"/proc/{kids[0]}/root{os.path.realpath(cwd)}").st_dev == os.stat(cwd).st_dev
        except OSError:
            return False

    def _go(self, chain: sp.Chain, argv: list[str], cwd: Path, stdin: str | None, env: dict | None, read_only: bool) -> bool:
        """Hand the chain its call: fstab, job and stdin written, then "go"; False if the chain is gone."""
        c = self.cfg
        command = [*self._limits(), *argv]
        call_env = {"HOME": str(cwd), **(env or {})}
        stdin_file = chain.files["in"] if stdin else None
        if stdin_file is not None:
            sp.write_private(stdin_file, stdin.encode("utf-8", "replace"))
        if chain.use_ns:
            cwd_real = os.path.realpath(cwd)
            hidden = [h for h in self._hidden if not sfs.under(cwd_real, h)]
            sp.write_private(chain.files["fstab"], sfs.fstab(
                newroot=self._newroot, devskel=self._devskel, cwd=cwd_real, exposed=self._exposed, hidden=hidden,
                tmpfs_mb=c.tmpfs_mb, cwd_read_only=read_only, aliases=self._aliases).encode())
            job = sp.job_text(sp.ns_job_argv(as_root=self._as_root, uid=self._uid, gid=self._gid, newroot=self._newroot,
                                             cwd=cwd_real, command=command), call_env, stdin_file)
        else:
            if self._rl_ns:
                sp.write_private(chain.files["fstab"], sfs.rlimits_fstab(
                    root=os.path.realpath(self._root), cwd=os.path.realpath(cwd), keep=chain.files["keep"],
                    read_only=read_only).encode())
            job = sp.job_text(sp.rlimits_job_argv(uid=self._uid, gid=self._gid, command=command), call_env, stdin_file,
                              cwd=os.path.realpath(cwd))
        sp.write_private(chain.files["job"], job)
        if chain.group is not None:
            chain.group.begin()
        try:
            os.write(chain.go_fd, b"go\n")
            return True
        except BrokenPipeError:
            return False
        finally:
            os.close(chain.go_fd)
            chain.go_fd = -1

    def run(self, argv: list[str], *, cwd: Path, timeout_s: float | None = None, stdin: str | None = None, env: dict | None = None,
            pass_fds: tuple[int, ...] = (), read_only: bool = False, deadline: float | None = None) -> SandboxResult:
        """Run `argv` in `cwd` under the limits; never raises for the command's own failures.

        `pass_fds` stay open in the command (e.g. a results file it cannot otherwise reach);
        `read_only` binds `cwd` read-only (namespace mode; else rely on `make_workdir(owned=False)`);
        `deadline` (time.monotonic()) bounds the wait for a slot and the run together: a call still
        waiting for a slot at the deadline is a "timeout" that never ran.
        """
        if not argv:
            raise ValueError("Sandbox.run: argv is empty; pass the command as a list, e.g. ['python', 'main.py'].")
        if any("\0" in str(a) for a in [*argv, *(env or {}).keys(), *(env or {}).values()]):
            raise ValueError(f"Sandbox.run: a NUL byte in argv or env ({[a for a in argv if chr(0) in str(a)][:2]!r}); no command "
                             "line can carry one: refuse it where it came from (a tool argument of the model)")
        bad = [k for k in (env or {}) if not _ENV_NAME.fullmatch(str(k))]
        if bad:
            raise ValueError(f"Sandbox.run: env names {bad[:3]!r} are not shell names ([A-Za-z_][A-Za-z0-9_]*); rename them")
        if not Path(cwd).is_dir():
            raise ToolInfraError(f"sandbox work dir {cwd} does not exist (removed early?)")
        timeout = self.cfg.timeout_s if timeout_s is None else timeout_s
        wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._slots.acquire(timeout=wait_s):
            return SandboxResult(returncode=-signal.SIGKILL, stdout="", stderr="[sandbox: no slot free before the deadline]\n",
                                 status="timeout", latency_s=0.0, info={"isolation": self.isolation})
        try:
            if deadline is not None:
                timeout = min(timeout, max(0.01, deadline - time.monotonic()))
            return self._run_locked(list(argv), Path(cwd), timeout, stdin, env, use_ns=self._use_ns, pass_fds=pass_fds,
                                    read_only=read_only)
        finally:
            self._slots.release()

    def _limits_for_cgroup(self) -> cg.Limits:
        c = self.cfg
        return cg.Limits(memory_bytes=c.memory_mb << 20, max_procs=c.max_procs, cpu_quota_us=int(c.cpu_cores * cg.CPU_PERIOD_US))

    def _run_locked(self, argv: list[str], cwd: Path, timeout: float, stdin: str | None, env: dict | None, *, use_ns: bool,
                    pass_fds: tuple[int, ...] = (), read_only: bool = False) -> SandboxResult:
        chain = self._take(use_ns, pass_fds, cwd)
        t0 = time.monotonic()
        since_ns = sfs.coarse_now_ns()
        if not self._go(chain, argv, cwd, stdin, env, read_only):
            sp.discard(chain, self._pool)  # died while it waited (killed from outside): one fresh try
            chain = sandbox_guard.launch(lambda: self._spawn(use_ns, pass_fds))
            t0 = time.monotonic()
            if not self._go(chain, argv, cwd, stdin, env, read_only):
                sp.discard(chain, self._pool)
                raise ToolInfraError(f"sandbox: a chain exited before its call ({chain.err.read(300)!r})")
        # the next call's chain starts (and joins its cgroups) while this one runs
        refill = sandbox_guard.launch_later(lambda: self._refill(use_ns)) if not pass_fds else None
        proc, group, stats = chain.proc, chain.group, {}
        polled = not self._workdir_tmpfs and not read_only
        try:
            try:
                timed_out, over_cap = self._wait(proc, cwd, timeout, polled)
            finally:
                self._kill_all(proc, chain.marker, group, chain.use_ns)
                sp.unregister(proc.pid)
            latency_s = time.monotonic() - t0
            stdout, cut_out = sp.read_capped(chain.out, self.cfg.max_output_bytes)
            stderr, cut_err = sp.read_capped(chain.err, self.cfg.max_output_bytes)
            set_up = sp.read_verdict(chain.files["ok"])
            if group is not None:
                stats = group.stats()
        finally:
            sp.discard(chain, self._pool)
            if refill is not None:
                refill.result()  # a call leaves exactly the ready chains it found: no residue grows or shrinks
        if not set_up:
            what = f"did not finish within {timeout:g} s" if timed_out else f"failed (exit {proc.returncode})"
            raise ToolInfraError(f"sandbox set-up {what}: {stderr.strip()[:300]}")
        rc = proc.returncode
        if timed_out or over_cap:
            # Report the kill itself, not how the wrapper exited after its child was killed.
            rc = -signal.SIGKILL
            stderr = "".join(ln for ln in stderr.splitlines(keepends=True) if not ln.startswith("unshare: "))
        status = "timeout" if timed_out else "success" if rc == 0 else "failure"
        if polled:
            status, stderr = self._check_quota(cwd, status, stderr, since_ns, stopped=over_cap)
        return SandboxResult(returncode=rc, stdout=stdout, stderr=stderr, status=status, latency_s=latency_s,
                             truncated=cut_out or cut_err, info={"isolation": self.isolation, **stats})

    def _over_cap(self, cwd: Path) -> bool:
        used, entries = sfs.usage(cwd, self.cfg.workdir_inodes)
        return used > self.cfg.workdir_mb << 20 or entries > self.cfg.workdir_inodes

    def _wait(self, proc: subprocess.Popen, cwd: Path, timeout: float, polled: bool) -> tuple[bool, bool]:
        """(timed out, stopped over the work-dir cap): a work dir that is no capped tmpfs is measured while we wait."""
        if not polled:
            return sp.wait_exit(proc, timeout), False
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if not sp.wait_exit(proc, max(0.0, min(_QUOTA_POLL_S, left))):
                return False, False
            if left <= _QUOTA_POLL_S:
                return True, False
            if self._over_cap(cwd):
                return False, True

    def _check_quota(self, cwd: Path, status: str, stderr: str, since_ns: int, *, stopped: bool) -> tuple[str, str]:
        """The work dir back under its caps: what this call wrote is removed, largest first; the call is then a failure."""
        cap_bytes, cap_entries = self.cfg.workdir_mb << 20, self.cfg.workdir_inodes
        if not stopped and not self._over_cap(cwd):
            return status, stderr
        try:
            used, entries, removed = sfs.trim(cwd, since_ns=since_ns, max_bytes=cap_bytes, max_entries=cap_entries)
        except OSError as e:
            raise ToolInfraError(f"sandbox: could not bring the work dir {cwd} back under its cap: {e}") from e
        shown = ", ".join(removed[:10]) + (f" and {len(removed) - 10} more" if len(removed) > 10 else "")
        note = (f"\n[sandbox: the call went over the work dir's cap of {self.cfg.workdir_mb} MB / {cap_entries} entries"
                + (" and was stopped" if stopped else "")
                + (f"; removed what it wrote: {shown}" if removed else "")
                + f"; the work dir now holds {used >> 20} MB in {entries} entries]\n")
        return "failure", stderr + note

    def _kill_all(self, proc: subprocess.Popen, marker: str, group: cg.CallGroup | None, use_ns: bool) -> None:
        # Killing the namespace init makes the kernel kill and reap every process in it before
        # unshare's wait returns (setsid daemons too); the cgroup kill catches what a rlimits
        # call left; without a cgroup the sweeps of envs/sandbox/procs.py do.
        if proc.poll() is None and (use_ns or self._rl_ns) and not sp.kill_namespace(proc):
            logger.warning("sandbox: namespace of pid %d not reaped after %.1f s; killing its session", proc.pid, sp.REAP_TIMEOUT_S)
        if group is not None:
            group.kill()
        sp.kill_session(proc)
        if not use_ns:
            if group is None:
                sp.sweep(marker, self._uid)
            elif self._subreaper:
                sp.reap_orphans(self._uid)
