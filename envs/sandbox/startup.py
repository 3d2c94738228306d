"""What a `Sandbox` checks when it is built: the isolation this machine gives, what it lacks, our interpreter inside.

`StartUpChecks` is mixed into envs/sandbox/sandbox.py's `Sandbox` (its methods use the sandbox's
state: config, uid, root, cgroups, work dirs, `run`): whether work dirs can be size-capped tmpfs
mounts, the namespace probe (a chain runs `true`; cached per uid and layout), the choice of
isolation and the warning of what it lacks (once per lack), the `isolation` description, and
`check_interpreter`. `start_up_check()` marks the sandboxes the launcher builds to check the run's
env (engine/runtime/preflight.py): they probe and check as usual, but warn nothing and do not
make the launcher a subreaper. Warnings go to the `envs.sandbox.sandbox` logger, the Sandbox's.

`auto` never falls back silently: where namespaces do not work it raises RuntimeError telling
to pass `--env.isolation rlimits` and what that lacks.

The interpreter inside is the host's, at the host's paths. The new root binds real paths, so an
interpreter reached through a symlink (a venv run as /tmp/v/bin/python with /tmp/v -> /work/.venv,
or a venv under a symlinked dir) would not exist there: `sandbox_fs.interpreter_aliases` finds the
interpreter's dirs as the host reaches them (prefixes, each hop of the executable's symlink chain,
pyvenv.cfg's home) and the new root binds each real dir at that path too. When our interpreter
still cannot run inside (`check_interpreter`, or the probe failing on it), the RuntimeError is one
line naming the cause, never the namespaces (`envs/sandbox/access.py` finds it: the first dir or
file on the way that the sandbox uid cannot enter or read, a module the interpreter lacks or takes
from a dir the sandbox does not bind, or a symlink that cannot be bound). The launcher builds the
run's env once before any rank starts, inside `start_up_check()` (engine/runtime/preflight.py), so these
errors end a run as that one line.

Invariants (tests/envs/sandbox/test_sandbox.py, tests/envs/sandbox/test_adversarial.py,
tests/engine/runtime/test_startup_errors.py): `auto` never falls back silently; rlimits mode without
root is refused; rlimits mode names in its warning and `isolation` everything it lacks; an
interpreter the sandbox uid cannot read is a one-line error naming the path.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from envs.sandbox import access
from envs.sandbox import fs as sfs
from envs.sandbox import procs as sp
from envs.base import ToolInfraError

__all__ = ["StartUpChecks", "checking", "start_up_check"]

logger = logging.getLogger("envs.sandbox.sandbox")  # the Sandbox's logger: its start-up warnings keep their name

_probe_lock = threading.Lock()
_probe_cache: dict[object, str | None] = {}  # per layout, and "rl_ns"
_warned: set[str] = set()
_interpreter_ok: set[tuple] = set()
_start_up = threading.local()


def _pid_namespaces_work() -> bool:
    """Whether a PID and mount namespace with a /proc of its own can be made here (rlimits mode, as root)."""
    with _probe_lock:
        if "rl_ns" not in _probe_cache:
            try:
                r = subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "true"],
                                   capture_output=True, timeout=10)
                _probe_cache["rl_ns"] = None if r.returncode == 0 else r.stderr.decode(errors="replace")[:200]
            except (OSError, subprocess.TimeoutExpired) as e:
                _probe_cache["rl_ns"] = str(e)
        return _probe_cache["rl_ns"] is None


@contextmanager
def start_up_check() -> Iterator[None]:
    """Sandboxes built inside are the launcher's start-up check of the run's env (engine/runtime/preflight.py):
    they probe and check the interpreter as usual, but warn nothing (the run's own sandbox warns, in
    its rank) and do not make the launcher the subreaper of its ranks' orphans."""
    _start_up.check = True
    try:
        yield
    finally:
        _start_up.check = False


def checking() -> bool:
    """Whether sandboxes built now are the launcher's start-up check (inside `start_up_check()`)."""
    return getattr(_start_up, "check", False)


class StartUpChecks:
    """The start-up checks of a `Sandbox` (mixed into it; see the module docstring)."""

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
        self._use_ns, self._lacks, self._subreaper, self._rl_ns = self.cfg.isolation != "rlimits", "", False, False
        if self.cfg.isolation == "rlimits":
            if not self._as_root:
                raise RuntimeError(
                    f"sandbox: isolation 'rlimits' needs root here: we run as uid {os.getuid()} with no other uid to give the "
                    "calls, so a call could signal this process and read its memory and environment through /proc; run as "
                    "root (calls then run as uid 65534), or use --env.isolation auto where user namespaces work")
            # orphans must come back to us to be killed and reaped (some containers' PID 1 never reaps)
            self._subreaper = not self._check_only and sp.become_subreaper()
            self._rl_ns = _pid_namespaces_work()
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
                f"needs them. " + (f"Pass --env.isolation rlimits to run anyway, which lacks: {self._rlimits_lacks()}"
                                   if self._as_root else "--env.isolation rlimits (which lacks their isolation) needs root"))
        self._lacks = "; ".join(self._limit_lacks())
        if self._lacks and self._lacks not in _warned and not self._check_only:
            _warned.add(self._lacks)
            logger.warning("sandbox (namespaces) lacks: %s", self._lacks)
        return True

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
        others = (f"work dirs of other episodes outside {self._root}, whose own are covered" if self._rl_ns else
                  "work dirs of other episodes")
        lacks = ("no network namespace (loopback ports, e.g. the torch TCPStore, are reachable); "
                 f"no private filesystem (the command sees every file uid {self._uid} may read, e.g. other checkouts with "
                 f"the swe projects' unbroken sources, so swe rewards can be earned without a fix, and {others}); "
                 "no read-only binds, no private /tmp or /run")
        if not self._rl_ns:
            lacks += (f"; no PID namespace: every call runs as uid {self._uid}, so one episode's calls can signal other "
                      "episodes' processes and write their work dirs (found through /proc/<pid>/cwd or /proc/self/mountinfo)")
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
        if r.returncode != 0:
            raise RuntimeError(access.why_cannot_run(self._user(), r, what, use_ns=self._use_ns))
        with _probe_lock:
            _interpreter_ok.add(key)
