"""The filesystem a sandboxed command sees (a fresh read-only root), and the episodes' work dirs.

New root, built by one `mount -a` over a per-call fstab inside the call's own mount namespace:
  1. a small tmpfs on the runtime dir's `root/` mount point becomes the new "/";
  2. the system dirs (/usr, /etc, /bin, /sbin, /lib*) and the interpreter's prefixes (plus
     `expose_paths`) are bound read-only, nosuid, nodev at their own paths, and an interpreter dir
     the host reaches through a symlink also at that path (`interpreter_aliases`);
  3. /dev is a read-only skeleton (empty files, /proc/self/fd links) with null, zero, full,
     random, urandom and tty bound onto it; /proc is a fresh proc of the call's own PID namespace;
  4. one size-limited tmpfs serves /tmp, /var/tmp and /dev/shm; /run is a private tmpfs;
  5. the work dir is bound read-write at its own path (read-only for grading runs).
Nothing else of the host exists there: no /home or /root, no checkout, no other episode's work
dir, and the data dirs the caller hides (`hidden`: its bench's, e.g. the swe projects and task
index) are covered by an empty tmpfs when a bound dir contains them. Unix
sockets that remain visible in the bound dirs cannot be used: the guard's seccomp filter refuses
every unix socket (envs/sandbox/guard.py). The command is then chrooted into it by `unshare --root`, as a
non-root uid without capabilities (envs/sandbox/procs.py: as root chroot then setuid, else a nested
user namespace that maps only that uid): no mount, umount, chroot or new namespace.

Work dirs: as root each is a tmpfs with a size and an inode cap (`mount(2)` at creation, lazily
detached at removal; mounts of a dead process are swept at start). Otherwise a plain dir whose
usage `usage()` polls during each call (envs/sandbox/sandbox.py kills the call when it goes over) and
`trim()` brings back under the caps after it: what the call changed (ctime at or after its start
on the kernel's coarse clock, the one file times come from) is removed, largest file first, then
its emptied dirs, deepest first. The walk and every removal go through dir fds opened with
O_NOFOLLOW, so a link planted in the work dir never leads a removal outside it.

rlimits mode (root, where the kernel gives it a mount namespace) has no new root; `rlimits_fstab` covers
the work-dir root with an empty tmpfs in the call's namespace and binds the call's own work dir back.

Invariants (tests/envs/sandbox/test_sandbox.py, tests/envs/sandbox/test_adversarial.py): inside, only the bound dirs and
the work dir exist and only the work dir and the private tmpfs are writable; a work dir never
exceeds its caps as root, and is back under them after every call otherwise (what the call wrote
is removed, nothing older); `remove_tree` removes what the model made unreadable; the per-call files of a
dead process are removed by the next sandbox's start (`sweep_call_files`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import subprocess
import stat
import sys
import time
from pathlib import Path

SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"}
_MNT_DETACH = 2
_WORKDIR_FS = "libra-wd"  # mount source name: libra-wd-<pid>, so a dead owner's mounts can be swept


def _q(path: str) -> str:
    """A path as an fstab field (octal escapes for blanks and backslashes)."""
    return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")


def under(path: str, parent: str) -> bool:
    return (path.rstrip("/") + "/").startswith(parent.rstrip("/") + "/")


# ---- runtime dirs: the new root's mount point and the /dev skeleton ------------------------------


def runtime_dirs(base: Path) -> tuple[Path, Path]:
    """(mount point of the new root, /dev skeleton) next to the work-dir root; made once."""
    rt = base.parent / (base.name + ".rt")
    newroot, dev = rt / "root", rt / "dev"
    for d in (rt, newroot, dev, dev / "shm", dev / "pts"):
        d.mkdir(mode=0o755, exist_ok=True)
    for name in DEVICES:
        f = dev / name
        if not f.exists():
            f.touch(mode=0o666)
    for name, target in _DEV_LINKS.items():
        link = dev / name
        if not link.is_symlink():
            link.symlink_to(target)
    return newroot, dev


def sweep_call_files(rt: Path) -> None:
    """Remove the per-call files (`<kind>-<pid>-<id>`: verdict, fstab, job, stdin, mount point) that a process
    which died without cleaning up (SIGKILL, os._exit) left in the runtime dir; live processes' files stay."""
    for f in rt.glob("*-[0-9]*-*"):
        kind, _, rest = f.name.partition("-")
        pid = rest.split("-", 1)[0]
        if kind not in ("ok", "fstab", "job", "in", "keep") or not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        try:
            f.rmdir() if kind == "keep" else f.unlink()
        except OSError:
            continue


def interpreter_dirs(extra: tuple[str, ...] = ()) -> list[str]:
    """Dirs the running interpreter needs (prefixes, real executable) plus `extra`, outside SYSTEM_DIRS."""
    exe_root = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
    dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, exe_root, *extra)}
    dirs = {d for d in dirs if os.path.isdir(d) and d != "/"}
    keep = [d for d in sorted(dirs) if not any(under(d, s) for s in SYSTEM_DIRS)]
    # a dir inside another kept one is bound with it
    return [d for d in keep if not any(d != o and under(d, o) for o in keep)]


def _interpreter_paths() -> list[str]:
    """The interpreter's dirs as the host reaches them, symlinks unresolved: the prefixes, the root of
    each hop of the executable's symlink chain, and the base install a venv's pyvenv.cfg names."""
    paths = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]
    link = os.path.abspath(sys.executable)
    for _ in range(40):  # the kernel's own limit on symlink hops
        paths.append(os.path.dirname(os.path.dirname(link)))
        if not os.path.islink(link):
            break
        link = os.path.normpath(os.path.join(os.path.dirname(link), os.readlink(link)))
    for cfg in (Path(sys.prefix) / "pyvenv.cfg", Path(sys.executable).parent.parent / "pyvenv.cfg"):
        try:
            home = next((v.strip() for k, _, v in (ln.partition("=") for ln in cfg.read_text().splitlines())
                         if k.strip() == "home"), "")
        except OSError:
            continue
        if home.startswith("/"):
            paths.append(os.path.dirname(os.path.normpath(home)))
    return [os.path.abspath(p) for p in paths]


def interpreter_aliases(bound: list[str], clear: str = "") -> list[tuple[str, str]]:
    """(real dir, symlinked path the host reaches it by) for each interpreter dir reached through a symlink
    outside the bound dirs, e.g. a venv run as /tmp/v/bin/python where /tmp/v -> /work/.venv. The new
    root binds only real paths, where /tmp/v would not exist, so it binds the real dir there too: the
    paths the host hands the sandbox (sys.executable, pyvenv.cfg's home) then resolve inside. An alias
    that would cover a bound dir or `clear` (the work dirs' root) is left out."""
    out: dict[str, str] = {}
    for alias in _interpreter_paths():
        real = os.path.realpath(alias)
        if alias in ("/", real) or not os.path.isdir(real) or not any(under(real, b) for b in bound):
            continue
        if any(under(alias, b) for b in bound):
            continue  # the symlink itself is visible in a bound dir and resolves to a bound real dir
        if any(under(b, alias) for b in bound) or (clear and under(clear, alias)):
            continue  # binding there would cover a bound dir or the work dirs
        out[alias] = real
    # an alias inside another one is bound with it
    return sorted((real, a) for a, real in out.items() if not any(a != o and under(a, o) for o in out))


def _alias_rows(newroot: Path, aliases: list[tuple[str, str]], hidden: list[str]) -> list[str]:
    """fstab rows binding each real dir at its alias (after the other rows), and covering the hidden dirs
    inside it there too."""
    nr = str(newroot)
    rows = [f"{_q(real)} {_q(nr + alias)} none bind,ro,nosuid,nodev,X-mount.mkdir 0 0" for real, alias in aliases]
    rows += [f"none {_q(nr + alias + h[len(real.rstrip('/')):])} tmpfs size=4k,mode=755,nosuid,nodev 0 0"
             for real, alias in aliases for h in sorted(hidden, key=len) if under(h, real)]
    return rows


def world_executable(path: str) -> bool:
    """Whether any uid may run `path`: the file and every dir above it are executable by others."""
    real = os.path.realpath(path)
    parts = real.split("/")
    dirs = ["/".join(parts[:i]) or "/" for i in range(1, len(parts))]
    try:
        return all(os.stat(d).st_mode & stat.S_IXOTH for d in dirs) and bool(os.stat(real).st_mode & stat.S_IXOTH)
    except OSError:
        return False


def fstab(*, newroot: Path, devskel: Path, cwd: str, exposed: list[str], hidden: list[str],
          tmpfs_mb: int, cwd_read_only: bool = False, aliases: list[tuple[str, str]] = ()) -> str:
    """The mounts that build the new root, in an order where every parent comes first; `aliases`
    (`interpreter_aliases`) bind interpreter dirs again at the symlinked paths the host reaches them by."""
    nr = str(newroot)
    ro = "bind,ro,nosuid,nodev,X-mount.mkdir"
    rows = [f"none {_q(nr)} tmpfs size=1m,mode=755,nosuid,nodev 0 0"]
    for d in SYSTEM_DIRS:
        if os.path.isdir(d):
            rows.append(f"{_q(d)} {_q(nr + d)} none {ro} 0 0")
    rows.append(f"{_q(str(devskel))} {_q(nr)}/dev none bind,ro,nosuid,X-mount.mkdir 0 0")
    rows += [f"/dev/{name} {_q(nr)}/dev/{name} none bind 0 0" for name in DEVICES if os.path.exists(f"/dev/{name}")]
    rows.append(f"proc {_q(nr)}/proc proc nosuid,nodev,noexec,X-mount.mkdir 0 0")  # the call's PID namespace: the init mounts it
    rows.append(f"none {_q(nr)}/tmp tmpfs size={tmpfs_mb}m,mode=1777,nosuid,nodev,X-mount.mkdir 0 0")
    rows.append(f"{_q(nr)}/tmp {_q(nr)}/var/tmp none bind,X-mount.mkdir 0 0")
    rows.append(f"{_q(nr)}/tmp {_q(nr)}/dev/shm none bind 0 0")
    rows.append(f"none {_q(nr)}/run tmpfs size=1m,mode=755,nosuid,nodev,X-mount.mkdir 0 0")
    # parents before children: exposed dirs may sit in /tmp (a CI venv), hidden dirs in exposed ones
    rows += [f"{_q(d)} {_q(nr + d)} none {ro} 0 0" for d in sorted(exposed, key=len)]
    rows.append(f"{_q(cwd)} {_q(nr + cwd)} none bind,{'ro,' if cwd_read_only else ''}nosuid,nodev,X-mount.mkdir 0 0")
    rows += [f"none {_q(nr + h)} tmpfs size=4k,mode=755,nosuid,nodev 0 0" for h in sorted(hidden, key=len)]
    rows += _alias_rows(newroot, list(aliases), hidden)
    return "\n".join(rows) + "\n"


def rlimits_fstab(*, root: str, cwd: str, keep: Path, read_only: bool = False) -> str:
    """rlimits mode with a mount namespace: the work-dir root covered by an empty tmpfs (no other episode's
    work dir is reachable, whatever path it learns), the call's own work dir bound back at its path via `keep`."""
    cover = f"none {_q(root)} tmpfs size=4k,mode=711,nosuid,nodev 0 0"
    if not under(cwd, root):
        return cover + "\n"
    return "\n".join([f"{_q(cwd)} {_q(str(keep))} none bind,X-mount.mkdir 0 0", cover,
                      f"{_q(str(keep))} {_q(cwd)} none bind,{'ro,' if read_only else ''}nosuid,nodev,X-mount.mkdir 0 0"]) + "\n"


# ---- work dirs ---------------------------------------------------------------------------------------

_libc = None


def _sys(name: str):
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return getattr(_libc, name)


def mount_workdir(path: Path, size_mb: int, inodes: int) -> None:
    """Put a tmpfs with a size and an inode cap on `path` (root only); OSError if the kernel refuses."""
    opts = f"size={size_mb}m,nr_inodes={inodes},mode=0700".encode()
    src = f"{_WORKDIR_FS}-{os.getpid()}".encode()
    if _sys("mount")(src, str(path).encode(), b"tmpfs", ctypes.c_ulong(0x2 | 0x4), opts) != 0:  # MS_NOSUID | MS_NODEV
        e = ctypes.get_errno()
        raise OSError(e, f"mount tmpfs on {path}: {os.strerror(e)}")


def unmount_workdir(path: Path) -> None:
    if _sys("umount2")(str(path).encode(), _MNT_DETACH) != 0:
        e = ctypes.get_errno()
        if e not in (errno.EINVAL, errno.ENOENT):  # EINVAL: not a mount point
            raise OSError(e, f"umount {path}: {os.strerror(e)}")


def sweep_workdir_mounts(root: Path) -> None:
    """Detach work-dir tmpfs mounts under `root` whose owning process is gone."""
    prefix = str(root).rstrip("/") + "/"
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        mp, src = left.split()[4], right.split()[1]
        if mp.startswith(prefix) and src.startswith(_WORKDIR_FS + "-"):
            pid = src.rsplit("-", 1)[1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                unmount_workdir(Path(mp))
                try:
                    os.rmdir(mp)
                except OSError:
                    pass


def remove_tree(path: Path) -> None:
    """rmtree that first gives back permissions the model took away (a dir of mode 000), and copes
    with trees nested past Python's recursion limit and PATH_MAX (coreutils walk them with fds)."""
    try:
        shutil.rmtree(path)
        return
    except PermissionError:
        pass
    except (RecursionError, OSError):  # ENAMETOOLONG, or too deep for shutil's recursion
        _remove_deep(path)
        return
    try:
        _give_back_dirs(path)
        shutil.rmtree(path)
    except (RecursionError, OSError):
        _remove_deep(path)


def _remove_deep(path: Path) -> None:
    subprocess.run(["chmod", "-R", "u+rwx", str(path)], capture_output=True, timeout=120)
    r = subprocess.run(["rm", "-rf", "--one-file-system", str(path)], capture_output=True, text=True, timeout=120)
    if os.path.lexists(path):
        raise OSError(f"could not remove {path}: {r.stderr.strip()[:200]}")


def _give_back_dirs(path: Path) -> None:
    stack = [str(path)]
    while stack:
        d = stack.pop()
        os.chmod(d, 0o700)  # only real dirs get here: scandir said so without following links
        with os.scandir(d) as it:
            stack.extend(e.path for e in it if e.is_dir(follow_symlinks=False))


def usage(path: Path, max_entries: int) -> tuple[int, int]:
    """(bytes, entries) under `path`, counting at most `max_entries` + 1 entries."""
    total = entries = 0
    stack = [str(path)]
    while stack and entries <= max_entries:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    entries += 1
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(e.path)
        except OSError:
            continue
    return total, entries


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
CLOCK_REALTIME_COARSE = 5  # Linux: the clock inode times are stamped from (time has no name for it)


def coarse_now_ns() -> int:
    """Now, on the clock file ctimes come from: a file changed after this has ctime_ns >= it."""
    try:
        return time.clock_gettime_ns(CLOCK_REALTIME_COARSE)
    except OSError:
        return time.time_ns() - 20_000_000  # no coarse clock: a tick early (a file changed just before may count)


def _open_dir(root: Path, parts: tuple) -> int:
    """An fd of `root/parts...` reached without following links; a dir the model made unreadable
    (mode 000: its owner is us when we are not root) gets u+rwx back first."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts:
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except PermissionError:
                pfd = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                try:
                    os.chmod(f"/proc/self/fd/{pfd}", 0o700)
                finally:
                    os.close(pfd)
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _walk_fd(root: Path):
    """(parent's path parts, name, lstat) of every entry under `root`, without following links.
    Each dir is reopened from `root` when its turn comes, so the walk holds one fd however wide the tree."""
    stack: list[tuple] = [()]
    while stack:
        parts = stack.pop()
        try:
            fd = _open_dir(root, parts)
        except OSError:  # swapped for a link or removed since it was listed
            continue
        try:
            for name in os.listdir(fd):
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
                yield parts, name, st
                if stat.S_ISDIR(st.st_mode):
                    stack.append((*parts, name))
        finally:
            os.close(fd)


def trim(path: Path, *, since_ns: int, max_bytes: int, max_entries: int) -> tuple[int, int, list[str]]:
    """Remove what changed under `path` at or after `since_ns` until it holds at most `max_bytes` in
    `max_entries` entries: files largest first, then emptied dirs deepest first.
    Returns (bytes, entries) after, and the paths removed, in order."""
    used = entries = 0
    files: list[tuple[int, tuple, str]] = []  # (bytes, parent parts, name)
    dirs: list[tuple[int, tuple, str]] = []  # (depth, parent parts, name)
    for parts, name, st in _walk_fd(path):
        used += st.st_blocks * 512
        entries += 1
        if st.st_ctime_ns < since_ns:
            continue
        if stat.S_ISDIR(st.st_mode):
            dirs.append((len(parts), parts, name))
        else:
            files.append((st.st_blocks * 512, parts, name))
    removed: list[str] = []
    for size, parts, name in sorted(files, reverse=True):
        if used <= max_bytes and entries <= max_entries:
            break
        if _remove(path, parts, name, rmdir=False):
            used, entries = used - size, entries - 1
            removed.append("/".join((*parts, name)))
    for _, parts, name in sorted(dirs, reverse=True):
        if entries <= max_entries:
            break
        if _remove(path, parts, name, rmdir=True):
            entries -= 1
            removed.append("/".join((*parts, name)) + "/")
    return used, entries, removed


def _remove(root: Path, parts: tuple, name: str, *, rmdir: bool) -> bool:
    try:
        fd = _open_dir(root, parts)
    except OSError:
        return False
    try:
        (os.rmdir if rmdir else os.unlink)(name, dir_fd=fd)
        return True
    except OSError:  # gone, or (a dir) not empty: it stays
        return False
    finally:
        os.close(fd)
