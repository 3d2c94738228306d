"""Starting a sandboxed command, and making sure nothing of it outlives its call.

Argv chains (U = the sandbox uid: 65534 when we are root, else our own uid):
  namespaces, as root:
    unshare --ipc --net --pid --fork --kill-child --mount  sh -c NS_INIT ...
      unshare --root=NEWROOT --wd=CWD --setuid=U --setgid=U  prlimit ... -- ARGV
  namespaces, not root: `--user --map-root-user` on the outer unshare, and the inner one is
      unshare --user --map-user=U --map-group=U --root=NEWROOT --wd=CWD  (a nested user namespace
      that maps only U: our uid is root in the outer one, with every capability over its mounts)
  rlimits (as root only, envs/sandbox/sandbox.py): [unshare --pid --fork --kill-child --mount --mount-proc] sh -c RL_INIT ...
      setpriv --reuid=U --regid=U --clear-groups  prlimit ... -- ARGV
    (the unshare where the kernel allows it: then the call has a PID namespace and a /proc of its own,
    and its fstab covers the work-dir root with an empty tmpfs and binds back only the call's work dir)
Every chain is started by the launcher thread of envs/sandbox/guard.py, so it and the command run
with no_new_privs and the socket filter, and Popen hands it no fd but 0-2 and the passed ones.
The init shell joins the call's cgroups (writes "0" to each cgroup.procs), mounts the new root
(namespaces: one `mount -a` over a per-call fstab, its /proc a fresh proc of the call's PID
namespace), writes "ok" into the call's verdict file, then execs the rest. The verdict file lies
in the runtime dir (`<root>.rt`, root's or ours, not writable by U) outside the new root: the
command can neither forge a set-up failure nor erase a success (an exit code or a message could
be forged, and a forged infra failure would drop the trajectory instead of scoring it). As root
the inner unshare chroots, then drops to U (groups cleared): U holds no capability, so no mount
or umount, and being chrooted it cannot create namespaces or chroot again; setuid files do
nothing (nosuid mounts, no_new_privs).

A `Chain` is one such chain started ahead of its call (envs/sandbox/sandbox.py); `discard` releases all it holds
(its processes: a waiting init shell exits at EOF on its stdin; its cgroups back to their pool; its
files and fds), whether it ran a call or not.

Cleanup: in namespace mode the kernel kills every process of the PID namespace when its init
dies. In rlimits mode the call's cgroup is killed; without a cgroup we kill the session, every
process carrying the call's environment marker, and every orphan reparented to us (we are the
subreaper) that runs as U outside our session and is not a live call (an `env -i setsid`
daemon sheds the marker and the session, not the reparenting).

Invariants (tests/envs/sandbox/test_sandbox.py, tests/envs/sandbox/test_adversarial.py): after `run` returns no process of
the call is alive (setsid daemons with an empty environment included) and none is a zombie
child of ours; a forged set-up failure is the command's own failure, not a ToolInfraError.
"""

from __future__ import annotations

import ctypes
import os
import select
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from envs.sandbox import cgroup as cg

SETUP_OK = b"ok"
MARKER_ENV = "LIBRA_SANDBOX_ID"
_PR_SET_CHILD_SUBREAPER = 36
REAP_TIMEOUT_S = 0.5  # the kernel tears a killed PID namespace down in milliseconds

# $1 verdict file, $2 cgroup.procs files (":"-separated, may be empty), $3 fstab, $4 job.
# Started ahead of its call: it joins the cgroups, then waits for "go" on its stdin (EOF: exit); the
# job (`job_text`) then gives the command its stdin, exports the call's env and sets the rest of the
# chain as "$@".
_WAIT = (
    'v=$1 f=$3 j=$4\n'
    'IFS=:; for c in $2; do echo 0 > "$c" || exit 1; done; unset IFS\n'
    'read -r go && [ "$go" = go ] || exit 1\n'
    '. "$j" || exit 1\n'
)
NS_INIT = _WAIT + 'mount --no-canonicalize -a -T "$f" || exit 1\necho ok > "$v" || exit 1; exec "$@"'
RL_INIT = _WAIT + ('if [ -n "$f" ]; then mount --no-canonicalize -a -T "$f" || exit 1; fi\n'
                   'cd -- "$wd" || exit 1; echo ok > "$v" || exit 1; exec "$@"')


_live_lock = threading.Lock()
_live: set[int] = set()  # pids of calls in flight (all sandboxes of this process)


def limits_argv(*, cpu_s: int, memory_bytes: int, max_procs: int, max_file_bytes: int, max_open_files: int) -> list[str]:
    return ["prlimit", f"--cpu={cpu_s}", f"--as={memory_bytes}", f"--nproc={max_procs}",
            f"--fsize={max_file_bytes}", f"--nofile={max_open_files}", "--core=0", "--"]


def ns_argv(*, as_root: bool, files: dict[str, Path], cgroup_procs: list[str]) -> list[str]:
    """The chain's start, up to its init shell waiting for the job (`files`: ok, fstab, job, in)."""
    outer = ["unshare", *([] if as_root else ["--user", "--map-root-user"]),
             "--ipc", "--net", "--pid", "--fork", "--kill-child", "--mount"]
    return [*outer, "sh", "-c", NS_INIT, "libra-sandbox", str(files["ok"]), ":".join(cgroup_procs), str(files["fstab"]),
            str(files["job"])]


def ns_job_argv(*, as_root: bool, uid: int, gid: int, newroot: Path, cwd: str, command: list[str]) -> list[str]:
    """What the namespace init shell execs once the new root is mounted."""
    if as_root:  # chroot, then drop to U: one exec instead of setpriv plus a nested user namespace
        inner = ["unshare", f"--root={newroot}", f"--wd={cwd}", f"--setuid={uid}", f"--setgid={gid}"]
    else:
        inner = ["unshare", "--user", f"--map-user={uid}", f"--map-group={gid}", f"--root={newroot}", f"--wd={cwd}"]
    return [*inner, *command]


def rlimits_argv(*, files: dict[str, Path], cgroup_procs: list[str], pid_ns: bool) -> list[str]:
    """rlimits mode (root): with `pid_ns`, in a PID and mount namespace of its own (a /proc of its own,
    other episodes' work dirs covered by the fstab), where the kernel allows them."""
    outer = ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc"] if pid_ns else []
    return [*outer, "sh", "-c", RL_INIT, "libra-sandbox", str(files["ok"]), ":".join(cgroup_procs),
            str(files["fstab"]) if pid_ns else "", str(files["job"])]


def rlimits_job_argv(*, uid: int, gid: int, command: list[str]) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs", *command]


def job_text(argv: list[str], env: dict[str, str], stdin: Path | None, cwd: str | None = None) -> bytes:
    """The job an init shell sources: stdin from `stdin` (else /dev/null), the call's env exported, its cwd
    (rlimits mode: `wd`, entered once the mounts are made), "$@" set to `argv`."""
    lines = [f"exec <{shlex.quote(str(stdin or '/dev/null'))} || exit 1"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    if cwd is not None:
        lines.append(f"wd={shlex.quote(cwd)}")
    lines.append("set -- " + " ".join(shlex.quote(a) for a in argv))
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


@dataclass
class Chain:
    """A sandbox chain started ahead of its call: its init shell has joined the call's cgroups and waits for "go"."""

    proc: subprocess.Popen | None
    go_fd: int  # write end of the init shell's stdin: "go" starts the job, EOF makes it exit
    out: IO[bytes]
    err: IO[bytes]
    files: dict[str, Path]  # ok (the verdict), fstab, job, in (the command's stdin)
    group: cg.CallGroup | None
    marker: str
    use_ns: bool


def write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def discard(chain: Chain, pool: cg.Pool | None) -> None:
    """Release what a chain holds: its processes (a waiting init shell exits at EOF), cgroup, files and fds."""
    if chain.go_fd >= 0:
        os.close(chain.go_fd)
        chain.go_fd = -1
    if chain.proc is not None:
        if chain.proc.poll() is None:
            try:
                chain.proc.wait(timeout=REAP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                kill_namespace(chain.proc)
        kill_session(chain.proc)
        unregister(chain.proc.pid)
    if chain.group is not None:
        chain.group.kill()
        pool.release(chain.group)
        chain.group = None
    for name, path in chain.files.items():
        if name == "keep":  # the mount point of a rlimits call's work dir, empty outside its namespace
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
        else:
            path.unlink(missing_ok=True)
    chain.out.close()
    chain.err.close()


def abandon_all(ready: list[Chain]) -> None:
    """A collected sandbox's chains (a weakref finalizer: it may run inside any thread's critical section, so it
    takes no lock): each waiting init shell exits at EOF; its cgroups go to `cg.abandon`, removed once empty."""
    for chain in ready:
        if chain.go_fd >= 0:
            os.close(chain.go_fd)
            chain.go_fd = -1
        for name, path in chain.files.items():
            if name != "keep":
                path.unlink(missing_ok=True)
        if chain.group is not None:
            cg.abandon(chain.group)
            chain.group = None
        if chain.proc is not None:
            _live.discard(chain.proc.pid)  # a set op is atomic; subprocess reaps the Popen once collected


def start(popen) -> subprocess.Popen:
    """Call `popen()` and register its process as a live call, atomically for `_reap`."""
    with _live_lock:
        proc = popen()
        _live.add(proc.pid)
        return proc


def unregister(pid: int) -> None:
    with _live_lock:
        _live.discard(pid)


def read_verdict(path: Path) -> bool:
    """True if the init shell reported a finished set-up in `path`; the file is removed."""
    try:
        with open(path, "rb") as f:
            ok = f.read(16).startswith(SETUP_OK)
    except FileNotFoundError:
        return False
    path.unlink()
    return ok


def wait_exit(proc: subprocess.Popen, timeout_s: float) -> bool:
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


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_namespace(proc: subprocess.Popen) -> bool:
    """Kill the PID namespace's init (the outer unshare's child); True once unshare has exited."""
    for child in children(proc.pid):
        kill(child)
    try:
        proc.wait(timeout=REAP_TIMEOUT_S)
        return True
    except subprocess.TimeoutExpired:
        return False


def kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def become_subreaper() -> bool:
    """Make this process the reaper of orphaned descendants (Linux prctl); False if unsupported."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> tuple[int, str, int, int] | None:
    """(ppid, state, session id, uid) of a process, or None when it vanished."""
    d = Path(f"/proc/{pid}")
    try:
        fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), fields[0], int(fields[3]), d.stat().st_uid
    except (OSError, IndexError, ValueError):
        return None


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").glob("[0-9]*")]


def _kill_tree(pid: int, killed: set[int]) -> None:
    stack = [pid]
    while stack:
        p = stack.pop()
        if p in killed:
            continue
        kill(p)
        killed.add(p)
        stack.extend(children(p))


def sweep(marker: str, uid: int) -> None:
    """Kill what escaped a call without a cgroup (see the module docstring), then reap it."""
    needle = f"{MARKER_ENV}={marker}".encode()
    me, my_sid = os.getpid(), os.getsid(0)
    with _live_lock:
        live = set(_live)
    killed: set[int] = set()
    for _ in range(5):  # a dying fork loop can spawn between passes
        before = len(killed)
        for pid in _pids():
            st = _stat(pid)
            if st is None or pid in killed:
                continue
            orphan = st[0] == me and pid not in live and st[2] != my_sid and st[3] == uid and st[1] != "Z"
            try:
                marked = not orphan and needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                marked = False
            if orphan or marked:
                _kill_tree(pid, killed)
        if len(killed) == before:
            break
        time.sleep(0.01)
    _reap(killed, uid)


def _reap(killed: set[int], uid: int) -> None:
    """Reap the zombies that were reparented to us (a container's PID 1 may never reap them).

    Zombies count against the sandbox uid's RLIMIT_NPROC, so a fork bomb's leftovers would make
    every later call fail to fork. A live call's own process (registered under `_live_lock`
    before it can exit unseen) is left to its Popen.
    """
    me = os.getpid()
    deadline = time.monotonic() + REAP_TIMEOUT_S
    while True:
        with _live_lock:
            for pid in _pids():
                st = _stat(pid)
                if st and st[0] == me and st[1] == "Z" and pid not in _live and (pid in killed or (uid != os.getuid() and st[3] == uid)):
                    try:
                        os.waitpid(pid, os.WNOHANG)
                    except ChildProcessError:
                        pass
        killed = {pid for pid in killed if Path(f"/proc/{pid}").exists()}
        if not killed or time.monotonic() > deadline:
            return
        time.sleep(0.01)


def reap_orphans(uid: int) -> None:
    """Reap zombie orphans of `uid` that a cgroup kill left reparented to us (rlimits mode)."""
    _reap(set(), uid)


def read_capped(f, max_bytes: int) -> tuple[str, bool]:
    size = f.seek(0, os.SEEK_END)
    f.seek(0)
    data = f.read(max_bytes)
    return data.decode("utf-8", "replace"), size > max_bytes
