"""Run untrusted model-written code and test commands in an isolated, limited subprocess.

Algorithm, per `Sandbox.run(argv, cwd=workdir)`:
1. Take a slot of the concurrency semaphore (`max_concurrent`); create the call's cgroups
   (memory incl. tmpfs, pids, CPU; envs/sandbox_cgroup.py) where we may.
2. Namespace mode (isolation "auto"/"namespaces"): start the chain of envs/sandbox_procs.py in
   fresh user (when not root), PID, network, IPC and mount namespaces. Its init shell joins the
   cgroups, mounts a fresh read-only root that holds only the system dirs, the interpreter, a
   private /tmp and /run and the work dir (envs/sandbox_fs.py), reports success on a private
   pipe, and execs the command chrooted there as a non-root uid without capabilities, under
   `prlimit` and the guard (envs/sandbox_guard.py: every inherited fd but the passed ones
   closed, a seccomp filter that refuses unix and every other non-IP socket). The network
   namespace has no interfaces, so every connect fails; the PID namespace is the cleanup boundary.
   rlimits mode (only when asked for: `isolation="rlimits"`, with a warning naming what it
   lacks): the same cgroups, rlimits and guard, as uid 65534 when we are root, no_new_privs,
   cleanup by cgroup kill (or marker, session and orphan sweeps).
3. Wait up to the wall timeout; then kill every process of the call (status "timeout" if it had
   to be killed before it exited), read the cgroup's stats into `info`, remove the cgroups.
4. Read at most `max_output_bytes` of stdout/stderr from unlinked temp files, release the slot.
Work dirs (`make_workdir`) are size- and inode-capped tmpfs mounts when we are root. Otherwise
the wait polls the work dir's usage every `_QUOTA_POLL_S` and kills the call once it is over a cap,
and after every call (a timed-out one too) what the call wrote is removed until the dir is back
under its caps (envs/sandbox_fs.py `trim`): the call is then a "failure" whose stderr names the
cap and what was removed.

`auto` never falls back silently: where namespaces do not work it raises RuntimeError telling
to pass `--env.isolation rlimits` and what that lacks.

The interpreter inside is the host's, at the host's paths. The new root binds real paths, so an
interpreter reached through a symlink (a venv run as /tmp/v/bin/python with /tmp/v -> /work/.venv,
or a venv under a symlinked dir) would not exist there: `sandbox_fs.interpreter_aliases` finds the
interpreter's dirs as the host reaches them (prefixes, each hop of the executable's symlink chain,
pyvenv.cfg's home) and the new root binds each real dir at that path too. When our interpreter
still cannot run inside (`check_interpreter`, or the probe failing on it), the RuntimeError is one
line naming the cause, never the namespaces (`envs/sandbox_access.py` finds it: the first dir or
file on the way that the sandbox uid cannot enter or read, a module the interpreter lacks or takes
from a dir the sandbox does not bind, or a symlink that cannot be bound). The launcher builds the
run's env once before any rank starts, inside `start_up_check()` (engine/preflight.py), so these
errors end a run as that one line.

Invariants (tests/test_sandbox*.py, tests/test_adversarial.py, tests/test_startup_errors.py):
fork bombs, memory blow-ups (also across processes and through tmpfs), infinite loops, 1 GB writes,
network connects, reads/writes outside the work dir, unmounts and setsid daemons are contained;
every call returns within timeout + 1 s; no process, open file, cgroup or temp dir outlives its
call / work dir; a work dir is within its caps after every call (a call that went over is a failure
that says so, and what it wrote is gone); a venv reached through a symlink runs; an interpreter the sandbox uid cannot read
is a one-line error naming the path.
"""

from __future__ import annotations

import logging
import os
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
from pathlib import Path

from envs import sandbox_access as access
from envs import sandbox_cgroup as cg
from envs import sandbox_fs as sfs
from envs import sandbox_guard
from envs import sandbox_procs as sp
from envs.base import ToolInfraError
from envs.config import SandboxConfig, SandboxResult

__all__ = ["Sandbox", "SandboxConfig", "SandboxResult"]

logger = logging.getLogger(__name__)

_NOBODY_UID = 65534
_QUOTA_POLL_S = 0.1  # how often a work dir that is not a capped tmpfs is measured during a call
_ENVS_DIR = Path(__file__).resolve().parent
_DATA_DIRS = tuple(str(_ENVS_DIR / d) for d in ("swe_projects", "swe_tasks", "swe_hidden"))  # what a policy must not read


_GUARD_SOURCE = Path(sandbox_guard.__file__).read_text()
_probe_lock = threading.Lock()
_probe_cache: dict[tuple, str | None] = {}
_warned: set[str] = set()
_interpreter_ok: set[tuple] = set()
_start_up = threading.local()
@contextmanager
def start_up_check() -> Iterator[None]:
    """Sandboxes built inside are the launcher's start-up check of the run's env (engine/preflight.py):
    they probe and check the interpreter as usual, but warn nothing (the run's own sandbox warns, in
    its rank) and do not make the launcher the subreaper of its ranks' orphans."""
    _start_up.check = True
    try:
        yield
    finally:
        _start_up.check = False


class Sandbox:
    """Thread-safe runner of untrusted commands; see the module docstring for the mechanism."""

    def __init__(self, cfg: SandboxConfig = SandboxConfig()):
        self.cfg = cfg
        self._check_only = getattr(_start_up, "check", False)
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
        self._exposed = sfs.interpreter_dirs(cfg.expose_paths)
        bound = [*sfs.SYSTEM_DIRS, *self._exposed]
        self._aliases = sfs.interpreter_aliases(bound, clear=os.path.realpath(self._root))
        hidden = [*cfg.hidden_paths, *(_DATA_DIRS if cfg.hide_project else ())]
        self._hidden = [h for h in hidden if os.path.isdir(h) and any(sfs.under(h, b) for b in bound)]
        sup = cg.support() if cfg.use_cgroup else None
        self._cgroups = sup if sup is not None and (sup.parents or sup.tracker is not None) else None
        self._workdir_tmpfs = self._probe_workdir_tmpfs()
        self._guard_python = os.path.abspath(sys.executable)  # what the namespace probe runs; rlimits mode may need another
        self._use_ns = self._choose_isolation()
        self._guard_python = self._pick_guard_python()

    def _probe_workdir_tmpfs(self) -> bool:
        if not self._as_root:
            return False
        sfs.sweep_workdir_mounts(self._root)
        probe = Path(tempfile.mkdtemp(prefix=".probe-", dir=self._root.parent / (self._root.name + ".rt")))
        try:
            sfs.mount_workdir(probe, 1, 16)
            sfs.unmount_workdir(probe)
            return True
        except OSError as e:
            logger.warning("sandbox: work dirs cannot be size-capped tmpfs mounts here (%s); their size is checked after each call", e)
            return False
        finally:
            probe.rmdir()

    def _choose_isolation(self) -> bool:
        self._use_ns, self._lacks, self._subreaper = self.cfg.isolation != "rlimits", "", False
        if self.cfg.isolation == "rlimits":
            # orphans must come back to us to be killed and reaped (some containers' PID 1 never reaps)
            self._subreaper = not self._check_only and sp.become_subreaper()
            self._lacks = self._rlimits_lacks()
            if self._lacks not in _warned and not self._check_only:
                _warned.add(self._lacks)
                logger.warning("sandbox isolation 'rlimits' (explicitly chosen) lacks: %s", self._lacks)
            return False
        why = self._probe_namespaces()
        if why is not None:
            # the chain may have failed to start our interpreter (the guard): not a namespace problem
            why_not = access.interpreter_unusable(self._user(), use_ns=True)
            if why_not:
                raise RuntimeError(why_not)
            raise RuntimeError(
                f"sandbox: user/PID/network/mount namespaces do not work here ({why}); isolation={self.cfg.isolation!r} "
                f"needs them. Pass --env.isolation rlimits to run anyway, which lacks: {self._rlimits_lacks()}")
        self._lacks = "; ".join(self._limit_lacks())
        if self._lacks and self._lacks not in _warned and not self._check_only:
            _warned.add(self._lacks)
            logger.warning("sandbox (namespaces) lacks: %s", self._lacks)
        return True

    def _pick_guard_python(self) -> str:
        """An interpreter the sandbox uid can run for the guard: ours, or (rlimits mode as root, ours
        under /root) a system python3; RuntimeError when there is none."""
        if self._use_ns or not self._as_root or sfs.world_executable(sys.executable):
            return os.path.abspath(sys.executable)
        for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
            if os.path.exists(candidate) and sfs.world_executable(candidate):
                return candidate
        raise RuntimeError(f"sandbox (rlimits, uid {self._uid}): uid {self._uid} cannot run {sys.executable} and there is "
                           "no system python3; install python3 under /usr or use --env.isolation auto")

    def _limit_lacks(self) -> list[str]:
        """What limits this machine cannot give, in either mode."""
        out = []
        if self._cgroups is None:
            out.append("no cgroups (memory, processes and CPU are limited per process by rlimits, not per call; "
                       "a private /tmp is not counted as memory)")
        elif self._cgroups.why:
            out.append(f"cgroups lack {self._cgroups.why}")
        if not self._workdir_tmpfs:
            out.append("work dir size polled during each call and trimmed after it, not capped by a mount (not root)")
        return out

    def _rlimits_lacks(self) -> str:
        lacks = ("no network namespace (loopback ports, e.g. the torch TCPStore, are reachable); "
                 "no private filesystem (the command sees every file uid %d may read, e.g. other checkouts with the swe "
                 "projects' unbroken sources, so swe rewards can be earned without a fix, and work dirs of other episodes); "
                 "no read-only binds, no private /tmp or /run" % self._uid)
        lacks += "".join(f"; {x}" for x in self._limit_lacks())
        if self._cgroups is None:
            lacks += "; cleanup by marker, session and orphan sweeps (needs this process to be the subreaper)"
            if not self._subreaper:
                lacks += "; cannot become subreaper, so daemons that clear their environment may survive"
        else:
            lacks += f"; {self._cgroups.describe()}"
        if self._as_root:
            lacks += f"; commands run as uid {self._uid} and cannot read files only root may read (e.g. an interpreter under /root)"
        return lacks

    def _probe_namespaces(self) -> str | None:
        """None if the namespace chain runs `true` here, else why not (cached per uid and layout)."""
        key = (self._uid, str(self._root), tuple(self._exposed), tuple(self._aliases))
        with _probe_lock:
            if key in _probe_cache:
                return _probe_cache[key]
            missing = [t for t in ("unshare", "prlimit", "setpriv", "mount") if shutil.which(t) is None]
            if missing:
                why: str | None = f"util-linux {'/'.join(missing)} not found"
            else:
                with self.workdir("probe") as w:
                    try:
                        r = self._run_locked(["true"], w, 10.0, None, None, use_ns=True)
                        why = None if r.returncode == 0 else f"`true` exited {r.returncode}: {access.one_line(r.stderr)[:200]}"
                    except ToolInfraError as e:
                        why = access.one_line(str(e))[:300]
            _probe_cache[key] = why
            return why

    @property
    def isolation(self) -> str:
        if self._use_ns:
            cgroups = self._cgroups.describe() if self._cgroups else "no cgroups"
            return f"pid+net namespace, read-only root, {cgroups}" + (f"; lacks: {self._lacks}" if self._lacks else "")
        return f"rlimits only: lacks {self._lacks}"

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

    def _user(self) -> access.SandboxUser:
        return access.SandboxUser(uid=self._uid, gid=self._gid, as_root=self._as_root, exposed=tuple(self._exposed),
                                  aliases=tuple(self._aliases))

    def check_interpreter(self, args: list[str], what: str) -> None:
        """RuntimeError unless `python ARGS` (this interpreter) succeeds inside; once per sandbox layout.
        The error is one line naming the cause (a path the sandbox uid cannot read, a module the
        interpreter lacks or the sandbox does not expose) and the fix."""
        key = (self._uid, self._use_ns, sys.executable, tuple(args))
        with _probe_lock:
            if key in _interpreter_ok:
                return
        with self.workdir("probe") as w:
            r = self.run([sys.executable, *args], cwd=w, timeout_s=30.0)
        if r.returncode == sandbox_guard.GUARD_FAILED:
            raise RuntimeError(f"sandbox: {access.one_line(r.stderr)[-300:]}; the kernel must allow seccomp filters "
                               "(CONFIG_SECCOMP_FILTER, and no container profile that forbids them)")
        if r.returncode != 0:
            raise RuntimeError(access.why_cannot_run(self._user(), r, what, use_ns=self._use_ns))
        with _probe_lock:
            _interpreter_ok.add(key)

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

    def _command(self, argv: list[str], cwd: Path, ok_fd: int, group: cg.CallGroup | None, use_ns: bool,
                 read_only: bool = False, keep_fds: tuple[int, ...] = ()) -> tuple[list[str], Path | None]:
        """The wrapped command and the per-call fstab it reads (None in rlimits mode)."""
        procs = group.procs_files if group is not None else []
        guard = [self._guard_python, "-S", "-c", _GUARD_SOURCE, ",".join(map(str, keep_fds)), "--"]
        command = [*self._limits(), *guard, *argv]
        if not use_ns:
            return sp.rlimits_argv(as_root=self._as_root, uid=self._uid, gid=self._gid, ok_fd=ok_fd,
                                   cgroup_procs=procs, command=command), None
        cwd_real = os.path.realpath(cwd)
        fstab = self._newroot.parent / f"fstab-{uuid.uuid4().hex}"
        hidden = [h for h in self._hidden if not sfs.under(cwd_real, h)]
        fstab.write_text(sfs.fstab(newroot=self._newroot, devskel=self._devskel, cwd=cwd_real, exposed=self._exposed,
                                   hidden=hidden, tmpfs_mb=self.cfg.tmpfs_mb, cwd_read_only=read_only,
                                   aliases=self._aliases))
        return sp.ns_argv(as_root=self._as_root, uid=self._uid, gid=self._gid, ok_fd=ok_fd, cgroup_procs=procs,
                          fstab=fstab, newroot=self._newroot, cwd=cwd_real, command=command), fstab

    def _env(self, cwd: Path, env: dict | None, marker: str) -> dict:
        base = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "HOME": str(cwd), "LANG": "C.UTF-8", "TMPDIR": "/tmp",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", sp.MARKER_ENV: marker,
        }
        return {**base, **(env or {})}

    def run(self, argv: list[str], *, cwd: Path, timeout_s: float | None = None, stdin: str | None = None, env: dict | None = None,
            pass_fds: tuple[int, ...] = (), read_only: bool = False) -> SandboxResult:
        """Run `argv` in `cwd` under the limits; never raises for the command's own failures.

        `pass_fds` stay open in the command (e.g. a results file it cannot otherwise reach);
        `read_only` binds `cwd` read-only (namespace mode; else rely on `make_workdir(owned=False)`).
        """
        if not argv:
            raise ValueError("Sandbox.run: argv is empty; pass the command as a list, e.g. ['python', 'main.py'].")
        if any("\0" in str(a) for a in [*argv, *(env or {}).keys(), *(env or {}).values()]):
            raise ValueError(f"Sandbox.run: a NUL byte in argv or env ({[a for a in argv if chr(0) in str(a)][:2]!r}); no command "
                             "line can carry one: refuse it where it came from (a tool argument of the model)")
        if not Path(cwd).is_dir():
            raise ToolInfraError(f"sandbox work dir {cwd} does not exist (removed early?)")
        timeout = self.cfg.timeout_s if timeout_s is None else timeout_s
        with self._slots:
            return self._run_locked(list(argv), Path(cwd), timeout, stdin, env, use_ns=self._use_ns, pass_fds=pass_fds,
                                    read_only=read_only)

    def _limits_for_cgroup(self) -> cg.Limits:
        c = self.cfg
        return cg.Limits(memory_bytes=c.memory_mb << 20, max_procs=c.max_procs, cpu_quota_us=int(c.cpu_cores * cg.CPU_PERIOD_US))

    def _run_locked(self, argv: list[str], cwd: Path, timeout: float, stdin: str | None, env: dict | None, *, use_ns: bool,
                    pass_fds: tuple[int, ...] = (), read_only: bool = False) -> SandboxResult:
        marker = uuid.uuid4().hex
        try:
            group = cg.CallGroup(self._cgroups, self._limits_for_cgroup()) if self._cgroups is not None else None
        except OSError as e:
            raise ToolInfraError(f"sandbox: could not create the call's cgroup: {e}") from e
        ok_r, ok_w = os.pipe()
        stats: dict = {}
        try:
            with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as inp:
                if stdin is not None:
                    inp.write(stdin.encode("utf-8", "replace"))
                    inp.seek(0)
                t0 = time.monotonic()
                since_ns = sfs.coarse_now_ns()
                command, fstab = self._command(argv, cwd, ok_w, group, use_ns, read_only, keep_fds=pass_fds)
                proc = None
                try:
                    proc = sp.start(lambda: subprocess.Popen(
                        command, cwd=cwd, stdin=inp, stdout=out, stderr=err, env=self._env(cwd, env, marker),
                        start_new_session=True, close_fds=True, pass_fds=(ok_w, *pass_fds)))
                except OSError as e:
                    raise ToolInfraError(f"sandbox could not start {argv[0]!r}: {e}") from e
                finally:
                    os.close(ok_w)
                    ok_w = -1
                    if proc is None and fstab is not None:  # nothing started: nothing else would remove it
                        fstab.unlink(missing_ok=True)
                polled = not self._workdir_tmpfs and not read_only
                try:
                    timed_out, over_cap = self._wait(proc, cwd, timeout, polled)
                finally:
                    self._kill_all(proc, marker, group, use_ns)
                    sp.unregister(proc.pid)
                    if fstab is not None:
                        fstab.unlink()
                latency_s = time.monotonic() - t0
                stdout, cut_out = sp.read_capped(out, self.cfg.max_output_bytes)
                stderr, cut_err = sp.read_capped(err, self.cfg.max_output_bytes)
            set_up = sp.read_setup(ok_r)
            if group is not None:
                stats = group.stats()
        finally:
            os.close(ok_r)
            if ok_w >= 0:
                os.close(ok_w)
            if group is not None:
                group.remove()
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
        # call left; without a cgroup the sweeps of envs/sandbox_procs.py do.
        if proc.poll() is None and use_ns and not sp.kill_namespace(proc):
            logger.warning("sandbox: namespace of pid %d not reaped after %.1f s; killing its session", proc.pid, sp.REAP_TIMEOUT_S)
        if group is not None:
            group.kill()
        sp.kill_session(proc)
        if not use_ns:
            if group is None:
                sp.sweep(marker, self._uid)
            elif self._subreaper:
                sp.reap_orphans(self._uid)
