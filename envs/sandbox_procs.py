"""Starting a sandboxed command, and making sure nothing of it outlives its call.

Argv chains (U = the sandbox uid: 65534 when we are root, else our own uid):
  namespaces, as root:
    unshare --ipc --net --pid --fork --kill-child --mount --mount-proc  sh -c NS_INIT ...
      setpriv --reuid=U --regid=U --clear-groups --no-new-privs
        unshare --user --map-user=U --map-group=U --root=NEWROOT --wd=CWD  prlimit ... -- GUARD ARGV
  namespaces, not root: the same with `--user --map-root-user` on the outer unshare and no setpriv.
  rlimits:  sh -c RL_INIT ...  setpriv [--reuid=U --regid=U --clear-groups] --no-new-privs  prlimit ... -- GUARD ARGV
(GUARD: `python -S -c <envs/sandbox_guard.py> KEEP_FDS --`.)
The init shell joins the call's cgroups (writes "0" to each cgroup.procs), mounts the new root
(namespaces), writes "ok" to a pipe, then execs the rest. The verdict is in the pipe before
the command starts, and the guard (envs/sandbox_guard.py, the last step before ARGV) closes the
pipe (dash cannot close an fd above 9, and an open fd can be reopened for reading through
/proc/self/fd), so the command can neither forge a set-up failure nor drain the verdict (an exit
code or a message could be forged, and a forged infra failure would drop the trajectory instead
of scoring it). The inner user namespace maps only U, so the command has no capabilities:
no mount or umount, and being chrooted it cannot create namespaces or chroot again; setuid
files do nothing (nosuid mounts, no_new_privs).

Cleanup: in namespace mode the kernel kills every process of the PID namespace when its init
dies. In rlimits mode the call's cgroup is killed; without a cgroup we kill the session, every
process carrying the call's environment marker, and every orphan reparented to us (we are the
subreaper) that runs as U outside our session and is not a live call (an `env -i setsid`
daemon sheds the marker and the session, not the reparenting).

Invariants (tests/test_sandbox.py, tests/test_adversarial.py): after `run` returns no process of
the call is alive (setsid daemons with an empty environment included) and none is a zombie
child of ours; a forged set-up failure is the command's own failure, not a ToolInfraError.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

SETUP_OK = b"ok"
MARKER_ENV = "LIBRA_SANDBOX_ID"
_PR_SET_CHILD_SUBREAPER = 36
REAP_TIMEOUT_S = 0.5  # the kernel tears a killed PID namespace down in milliseconds

# $1 ok fd, $2 cgroup.procs files (":"-separated, may be empty), $3 fstab; the rest is the command.
NS_INIT = (
    'IFS=:; for f in $2; do echo 0 > "$f" || exit 1; done; unset IFS\n'
    'mount --no-canonicalize -a -T "$3" || exit 1\n'
    'echo ok > /proc/self/fd/$1 || exit 1; shift 3; exec "$@"'
)
# $1 ok fd, $2 cgroup.procs files; the rest is the command.
RL_INIT = (
    'IFS=:; for f in $2; do echo 0 > "$f" || exit 1; done; unset IFS\n'
    'echo ok > /proc/self/fd/$1 || exit 1; shift 2; exec "$@"'
)

_live_lock = threading.Lock()
_live: set[int] = set()  # pids of calls in flight (all sandboxes of this process)


def limits_argv(*, cpu_s: int, memory_bytes: int, max_procs: int, max_file_bytes: int, max_open_files: int) -> list[str]:
    return ["prlimit", f"--cpu={cpu_s}", f"--as={memory_bytes}", f"--nproc={max_procs}",
            f"--fsize={max_file_bytes}", f"--nofile={max_open_files}", "--core=0", "--"]


def ns_argv(*, as_root: bool, uid: int, gid: int, ok_fd: int, cgroup_procs: list[str], fstab: Path,
            newroot: Path, cwd: str, command: list[str]) -> list[str]:
    outer = ["unshare", *([] if as_root else ["--user", "--map-root-user"]),
             "--ipc", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc"]
    drop = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs"] if as_root else []
    inner = ["unshare", "--user", f"--map-user={uid}", f"--map-group={gid}", f"--root={newroot}", f"--wd={cwd}"]
    return [*outer, "sh", "-c", NS_INIT, "libra-sandbox", str(ok_fd), ":".join(cgroup_procs), str(fstab),
            *drop, *inner, *command]


def rlimits_argv(*, as_root: bool, uid: int, gid: int, ok_fd: int, cgroup_procs: list[str], command: list[str]) -> list[str]:
    drop = [f"--reuid={uid}", f"--regid={gid}", "--clear-groups"] if as_root else []
    return ["sh", "-c", RL_INIT, "libra-sandbox", str(ok_fd), ":".join(cgroup_procs),
            "setpriv", *drop, "--no-new-privs", *command]


def start(popen) -> subprocess.Popen:
    """Call `popen()` and register its process as a live call, atomically for `_reap`."""
    with _live_lock:
        proc = popen()
        _live.add(proc.pid)
        return proc


def unregister(pid: int) -> None:
    with _live_lock:
        _live.discard(pid)


def read_setup(fd: int) -> bool:
    """True if the init shell reported a finished set-up on the pipe (all writers are gone)."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 16).startswith(SETUP_OK)
    except BlockingIOError:
        return False


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
