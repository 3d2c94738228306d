"""Per-call cgroups: one memory/pids/CPU budget for all processes of a sandbox call, and a kill switch.

Discovery (once per process, `support()`): read /proc/self/cgroup and /proc/self/mountinfo.
  - cgroup v2 (the unified hierarchy): our own cgroup dir, if we may write it, hosts the per-call
    groups. Its `cgroup.kill` (Linux 5.14+) kills a call's processes, setsid daemons included,
    even when v2 has no controllers (a hybrid host). memory/pids/cpu come from v2 when our
    cgroup offers them; enabling them in `cgroup.subtree_control` fails while processes sit in
    our own cgroup, so we then move this process into a `libra-runtime` leaf once and retry.
  - cgroup v1: each controller still missing (memory, pids, cpu) comes from its v1 hierarchy
    when we may create groups in our cgroup there (root, typically).
Groups (`CallGroup`): mkdir `libra-<pid>-<id>` under each parent and write the limits, once: a
`Pool` keeps the groups of finished calls and hands them to later ones (a call in a group made
for it ran ~6 ms slower here than in one reused). Per call: `CallGroup.begin` resets the peak-memory
counter and notes the OOM-kill and throttle counters; the call's first process joins (the sandbox
init shell writes "0" to each `cgroup.procs`); after the call every process left in it is killed,
its stats are read (peak memory, and OOM kills and throttled CPU periods of this call only), and
`Pool.release` keeps the group for the next call only when it is empty and holds no more than
1/32 of its memory limit in tmpfs pages (what a call wrote into a tmpfs work dir stays charged to
the group that wrote it, and would shrink a later call's budget); otherwise, or where a v2 peak
cannot be reset (Linux < 6.12), it is removed. Memory includes page cache and the tmpfs pages a
call writes (the private /tmp), which are charged to the writer's memory cgroup.

Invariants (tests/envs/sandbox/test_sandbox.py, tests/envs/sandbox/test_adversarial.py): a call's processes together stay
under its memory limit; no process is left in a group after its call, and a reused group reports
the stats of its latest call only; a group holding a call's tmpfs pages is not reused; no group
outlives the runtime's process (the free ones are removed at exit, a crashed process's by the
next start's sweep); without cgroups `support().why` says what is missing and the sandbox says so
in its warning.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
_RMDIR_TIMEOUT_S = 1.0
_LEFTOVER_FRACTION = 32  # a group holding more than limit/32 of tmpfs pages after its call is not reused


@dataclass(frozen=True, kw_only=True)
class Limits:
    memory_bytes: int  # all processes of the call plus the tmpfs pages they write
    max_procs: int  # processes and threads
    cpu_quota_us: int  # CPU microseconds per CPU_PERIOD_US of wall time


@dataclass
class Support:
    tracker: Path | None = None  # v2 parent dir whose children have cgroup.kill
    parents: dict[str, tuple[str, Path]] = field(default_factory=dict)  # controller -> ("v1"|"v2", parent dir)
    why: str = ""  # what is missing, "" when everything is there

    def describe(self) -> str:
        have = ", ".join(f"{c} ({v})" for c, (v, _) in sorted(self.parents.items())) or "none"
        kill = "cgroup.kill" if self.tracker is not None else "no cgroup.kill"
        return f"cgroup limits: {have}; {kill}" + (f"; missing: {self.why}" if self.why else "")


_lock = threading.Lock()
_support: Support | None = None


def _own_paths() -> dict[str, str]:
    """{controller or "" for v2: our cgroup path} from /proc/self/cgroup."""
    out = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            out[name] = path
    return out


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(fs type, mount root, mount point, super options) of every cgroup mount."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        parts, rparts = left.split(), right.split()
        if rparts[0] in ("cgroup", "cgroup2"):
            out.append((rparts[0], parts[3], parts[4], set(rparts[2].split(","))))
    return out


def _join(mount_point: str, mount_root: str, path: str) -> Path | None:
    rel = os.path.relpath(path, mount_root) if (path + "/").startswith(mount_root.rstrip("/") + "/") else None
    if rel is None:
        return None
    return Path(mount_point) if rel == "." else Path(mount_point) / rel


def _writable(d: Path | None) -> bool:
    return d is not None and d.is_dir() and os.access(d, os.W_OK) and os.access(d / "cgroup.procs", os.W_OK)


def _enable_v2(own: Path, wanted: list[str]) -> tuple[list[str], str]:
    """Enable `wanted` controllers for our children; ([enabled], why not the rest)."""
    ctl = own / "cgroup.subtree_control"
    try:
        ctl.write_text(" ".join(f"+{c}" for c in wanted))
    except OSError as e:
        if e.errno != errno.EBUSY:
            return [], f"v2 {'/'.join(wanted)} not delegable ({e.strerror})"
        # processes in our own cgroup block delegation: move this process into a leaf once
        leaf = own / "libra-runtime"
        try:
            leaf.mkdir(exist_ok=True)
            (leaf / "cgroup.procs").write_text("0")
            ctl.write_text(" ".join(f"+{c}" for c in wanted))
            logger.info("sandbox: moved this process into %s so that %s can delegate %s", leaf, own, "/".join(wanted))
        except OSError as e2:
            return [], f"v2 {'/'.join(wanted)} not delegable: other processes share {own} ({e2.strerror})"
    enabled = set(ctl.read_text().split())
    return [c for c in wanted if c in enabled], ""


def _discover() -> Support:
    s, why = Support(), []
    own, mounts = _own_paths(), _mounts()
    v2 = next(((root, mp) for fs, root, mp, _ in mounts if fs == "cgroup2"), None)
    if v2 is not None and "" in own:
        d = _join(v2[1], v2[0], own[""])
        if _writable(d):
            s.tracker = d  # its children have cgroup.kill from Linux 5.14 on; kill() falls back to a procs loop
            offered = [c for c in CONTROLLERS if c in (d / "cgroup.controllers").read_text().split()]
            enabled, no = _enable_v2(d, offered) if offered else ([], "")
            if no:
                why.append(no)
            for c in enabled:
                s.parents[c] = ("v2", d)
        elif d is not None:
            why.append(f"v2 cgroup {d} not writable")
    for c in CONTROLLERS:
        if c in s.parents:
            continue
        m = next(((root, mp) for fs, root, mp, opts in mounts if fs == "cgroup" and c in opts), None)
        d = _join(m[1], m[0], own[c]) if m is not None and c in own else None
        if _writable(d):
            s.parents[c] = ("v1", d)
        else:
            why.append(f"no writable {c} cgroup")
    s.why = "; ".join(why)
    for _, d in {str(p): p for _, p in s.parents.values()}.items():
        _sweep_stale(d)
    if s.tracker is not None:
        _sweep_stale(s.tracker)
    return s


def support() -> Support:
    global _support
    with _lock:
        if _support is None:
            _support = _discover()
        return _support


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _sweep_stale(parent: Path) -> None:
    """rmdir empty call groups left by a process that died mid-call (a crash, SIGKILL)."""
    for d in parent.glob("libra-[0-9]*-*"):
        try:
            if not _pid_alive(int(d.name.split("-")[1])):
                d.rmdir()
        except (OSError, ValueError):
            continue


def _write(path: Path, value: str) -> None:
    path.write_text(value)


class CallGroup:
    """The cgroups of one sandbox call (one dir per distinct parent)."""

    def __init__(self, sup: Support, limits: Limits):
        name = f"libra-{os.getpid()}-{uuid.uuid4().hex[:10]}"
        self.dirs: dict[str, Path] = {}  # parent dir -> created dir
        self.by_controller: dict[str, tuple[str, Path]] = {}
        try:
            parents = {str(p): p for _, p in sup.parents.values()}
            if sup.tracker is not None:
                parents[str(sup.tracker)] = sup.tracker
            for key, parent in parents.items():
                d = parent / name
                d.mkdir()
                self.dirs[key] = d
            for c, (version, parent) in sup.parents.items():
                self.by_controller[c] = (version, self.dirs[str(parent)])
            self._apply(limits)
        except OSError:
            self.remove()
            raise
        self.kill_file = self.dirs[str(sup.tracker)] / "cgroup.kill" if sup.tracker is not None else None
        self.limits = limits
        self.reusable = True
        self._base: dict[str, int] = {}  # counters at the start of the current call
        self._peak_fd: int | None = None  # v2 memory.peak, reset for this call through this fd

    def begin(self) -> None:
        """Start a call: the peak-memory counter from now on, the other counters as they are now."""
        mem = self.by_controller.get("memory")
        if mem is not None and mem[0] == "v1":
            _write(mem[1] / "memory.max_usage_in_bytes", "0")
        elif mem is not None:
            try:  # Linux 6.12+: a write resets the peak seen through this fd
                self._peak_fd = os.open(mem[1] / "memory.peak", os.O_RDWR | os.O_CLOEXEC)
                os.write(self._peak_fd, b"reset\n")
            except OSError:
                self._close_peak()
                self.reusable = False  # its next call would see this one's peak
        self._base = self._counters()

    def _counters(self) -> dict[str, int]:
        out = {}
        mem = self.by_controller.get("memory")
        if mem is not None:
            version, d = mem
            events = d / ("memory.events" if version == "v2" else "memory.oom_control")
            if events.exists():
                kv = dict(ln.split() for ln in events.read_text().splitlines() if len(ln.split()) == 2)
                out["oom_kills"] = int(kv.get("oom_kill", 0))
        cpu = self.by_controller.get("cpu")
        if cpu is not None and (cpu[1] / "cpu.stat").exists():
            kv = dict(ln.split() for ln in (cpu[1] / "cpu.stat").read_text().splitlines() if len(ln.split()) == 2)
            out["cpu_throttled_periods"] = int(kv.get("nr_throttled", 0))
        return out

    def _close_peak(self) -> None:
        if self._peak_fd is not None:
            os.close(self._peak_fd)
            self._peak_fd = None

    def leftover_bytes(self) -> int:
        """tmpfs pages still charged to the group (what its calls wrote into a tmpfs that outlives them)."""
        mem = self.by_controller.get("memory")
        if mem is None:
            return 0
        try:
            kv = dict(ln.split() for ln in (mem[1] / "memory.stat").read_text().splitlines() if len(ln.split()) == 2)
        except OSError:
            return 0
        return int(kv.get("shmem", 0))

    def _apply(self, lim: Limits) -> None:
        for c, (version, d) in self.by_controller.items():
            if c == "memory" and version == "v2":
                _write(d / "memory.max", str(lim.memory_bytes))
                if (d / "memory.swap.max").exists():
                    _write(d / "memory.swap.max", "0")
                _write(d / "memory.oom.group", "1")
            elif c == "memory":
                _write(d / "memory.limit_in_bytes", str(lim.memory_bytes))
                if (d / "memory.memsw.limit_in_bytes").exists():
                    _write(d / "memory.memsw.limit_in_bytes", str(lim.memory_bytes))
            elif c == "pids":
                _write(d / "pids.max", str(lim.max_procs))
            elif c == "cpu" and version == "v2":
                _write(d / "cpu.max", f"{lim.cpu_quota_us} {CPU_PERIOD_US}")
            elif c == "cpu":
                _write(d / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(d / "cpu.cfs_quota_us", str(lim.cpu_quota_us))

    @property
    def procs_files(self) -> list[str]:
        """The `cgroup.procs` files the call's first process writes "0" to (joins every group)."""
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def pids(self) -> list[int]:
        out: set[int] = set()
        for d in self.dirs.values():
            try:
                out.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except OSError:
                continue
        return sorted(out)

    def kill(self) -> None:
        """SIGKILL every process of the call, until none is left (a fork loop included)."""
        if self.kill_file is not None and self.kill_file.exists():
            _write(self.kill_file, "1")
        for _ in range(100):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.001)
        logger.warning("sandbox: processes %s of %s survived 100 kill rounds", self.pids()[:10], list(self.dirs.values()))

    def stats(self) -> dict:
        """Peak memory, OOM kills and throttled CPU periods of the call since `begin`."""
        out: dict = {}
        mem = self.by_controller.get("memory")
        if mem is not None:
            version, d = mem
            if self._peak_fd is not None:
                out["memory_peak_bytes"] = int(os.pread(self._peak_fd, 64, 0).split()[0])
            else:
                peak = d / ("memory.peak" if version == "v2" else "memory.max_usage_in_bytes")
                if peak.exists():
                    out["memory_peak_bytes"] = int(peak.read_text().split()[0])
        now = self._counters()
        out.update({k: v - self._base.get(k, 0) for k, v in now.items()})
        return out

    def remove(self) -> None:
        """rmdir every group; processes that are still exiting get up to a second."""
        self._close_peak()
        deadline = time.monotonic() + _RMDIR_TIMEOUT_S
        for key, d in list(self.dirs.items()):
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY or time.monotonic() > deadline:
                        logger.warning("sandbox: could not remove cgroup %s (%s); a later start sweeps it", d, e.strerror)
                        break
                    time.sleep(0.002)
            del self.dirs[key]


class Pool:
    """Call groups made once and reused by later calls (see the module docstring); thread-safe."""

    def __init__(self, sup: Support, limits: Limits):
        self.sup, self.limits = sup, limits
        self._free: list[CallGroup] = []
        self._lock = threading.Lock()

    def acquire(self) -> CallGroup:
        """A group for one call (a free one, else a new one; the call starts its counters with `begin`);
        OSError if none can be made."""
        if _abandoned:
            _remove_abandoned()
        with self._lock:
            group = self._free.pop() if self._free else None
        return group if group is not None else CallGroup(self.sup, self.limits)

    def release(self, group: CallGroup) -> None:
        """After the call (its processes killed): keep the group for a later call, or remove it."""
        group._close_peak()
        keep = (group.reusable and not group.pids()
                and group.leftover_bytes() <= group.limits.memory_bytes // _LEFTOVER_FRACTION)
        if not keep:
            group.remove()
            return
        with self._lock:
            self._free.append(group)

    def close(self) -> None:
        """Remove the free groups (a group still in a call is removed by its release)."""
        with self._lock:
            free, self._free = self._free, []
        for group in free:
            group.remove()


_abandoned: list[CallGroup] = []  # groups of collected sandboxes' chains, removed once their processes are gone


def abandon(group: CallGroup) -> None:
    """Remove `group` later (lock-free: called from a weakref finalizer)."""
    _abandoned.append(group)


def _remove_abandoned(wait: bool = False) -> None:
    for group in list(_abandoned):
        if wait or not group.pids():
            _abandoned.remove(group)
            group.kill()
            group.remove()


_pools: dict[Limits, Pool] = {}  # one per distinct limits, shared by every sandbox of this process


def pool(sup: Support, limits: Limits) -> Pool:
    with _lock:
        if limits not in _pools:
            _pools[limits] = Pool(sup, limits)
        return _pools[limits]


@atexit.register
def _remove_free_groups() -> None:
    for p in list(_pools.values()):
        p.close()
    _remove_abandoned(wait=True)
