"""Host-side file access inside a work dir that untrusted code controls: no links followed, bounded.

The host tools (swe view/search/replace, grading's copy of the model's package) run as the
runtime's user, often root, on a dir that sandboxed code may change at any moment (a daemon of
an earlier call, or a concurrent call of the same episode). So every access:
  1. walks from an fd of the work dir one component at a time with O_NOFOLLOW|O_DIRECTORY
     (`openat`), so a component swapped for a symlink fails instead of leading outside;
  2. opens files with O_NOFOLLOW|O_NONBLOCK and keeps them only when `fstat` says regular
     (a FIFO, socket or device is refused, and opening a FIFO cannot block);
  3. reads at most `max_bytes`, walks at most `max_entries` entries, and gives up at `deadline`
     (a monotonic time), so no call can return megabytes or hang;
  4. writes a new file next to the target and renames it over the target (`renameat`): a
     symlink that appears at the target is replaced, never written through.

Invariants (tests/envs/swe/test_envs_swe.py, tests/envs/sandbox/test_adversarial.py): no read or write ever reaches
a file outside the root, whatever links the sandboxed code plants or swaps in; FIFOs and devices
are refused without blocking; outputs respect their byte and entry caps; a read or write of the
root itself ('.') or a directory is a HostFsError naming it, never another exception.
"""

from __future__ import annotations

import os
import stat
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from envs.base import ToolRefused

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class HostFsError(ToolRefused):
    """A path the model gave that cannot be used (missing, a link, not a regular file, too big); says why."""


def parts_of(rel: str) -> list[str]:
    """The components of a model-given relative path; HostFsError for absolute paths and `..`."""
    if not rel or rel.startswith(("/", "\\", "~")) or "\0" in rel:
        raise HostFsError(f"path {rel!r} must be relative to the repository root, e.g. 'pkg/module.py'")
    parts = [p for p in Path(rel).parts if p not in ("", ".")]
    if ".." in parts:
        raise HostFsError(f"path {rel!r} may not contain '..'")
    return parts


@contextmanager
def open_dir(root: Path, parts: list[str]) -> Iterator[int]:
    """An fd of the dir `root/parts...`, reached without following any link."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for name in parts:
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                raise HostFsError(f"no directory {'/'.join(parts)!r}; view '.' to list the repository") from None
            except OSError as e:
                if os.path.islink(f"/proc/self/fd/{fd}/{name}"):
                    raise HostFsError(f"path {'/'.join(parts)!r} leaves the repository through the symlink {name!r} "
                                      "(links are not followed)") from None
                raise HostFsError(f"{'/'.join(parts)}: {name!r} is not a directory of the repository ({e.strerror})") from None
            os.close(fd)
            fd = nfd
        yield fd
    finally:
        os.close(fd)


def kind(root: Path, rel: str) -> str:
    """'dir', 'file' (regular), 'missing' or 'other' (FIFO, socket, device), without following links.

    HostFsError when the path is or goes through a symlink (it may lead outside the root).
    """
    parts = parts_of(rel) if rel not in ("", ".") else []
    if not parts:
        return "dir"
    with open_dir(root, parts[:-1]) as d:
        try:
            st = os.stat(parts[-1], dir_fd=d, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return "missing"
    if stat.S_ISLNK(st.st_mode):
        raise HostFsError(f"path {rel!r} leaves the repository through the symlink {parts[-1]!r} (links are not followed)")
    return "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"


def _read_fd(fd: int, max_bytes: int) -> tuple[bytes, bool]:
    chunks, size = [], 0
    while size <= max_bytes:
        b = os.read(fd, min(1 << 20, max_bytes + 1 - size))
        if not b:
            break
        chunks.append(b)
        size += len(b)
    data = b"".join(chunks)
    return data[:max_bytes], len(data) > max_bytes


def _file_parts(rel: str) -> list[str]:
    parts = parts_of(rel)
    if not parts:  # '.', './': the root itself
        raise HostFsError(f"path {rel!r} is the repository's root directory, not a file; name a file, e.g. 'pkg/module.py'")
    return parts


def _open_file(dir_fd: int, name: str, shown: str) -> int:
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise HostFsError(f"no file {shown!r}; view '.' to list the repository") from None
    except OSError as e:  # ELOOP: a symlink
        raise HostFsError(f"path {shown!r} leaves the repository or is not a regular file ({e.strerror}; links are not followed)") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = "a directory" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, socket or device)"
        raise HostFsError(f"{shown!r} is {what}; only regular files can be read")
    return fd


def read_file(root: Path, rel: str, max_bytes: int) -> tuple[bytes, bool]:
    """(at most `max_bytes` of a regular file, whether it was longer)."""
    parts = _file_parts(rel)
    with open_dir(root, parts[:-1]) as d:
        fd = _open_file(d, parts[-1], rel)
        try:
            return _read_fd(fd, max_bytes)
        finally:
            os.close(fd)


def write_file(root: Path, rel: str, data: bytes, owner: tuple[int, int] | None = None) -> None:
    """Replace the regular file `rel` with `data` (new file + rename: a link there is replaced, not followed)."""
    parts = _file_parts(rel)
    with open_dir(root, parts[:-1]) as d:
        mode = 0o644
        try:
            st = os.stat(parts[-1], dir_fd=d, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise HostFsError(f"{rel!r} is not a regular file; only regular files can be edited")
            mode = stat.S_IMODE(st.st_mode) & 0o777
        except FileNotFoundError:
            pass
        tmp = f".libra-{uuid.uuid4().hex}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=d)
        try:
            with os.fdopen(fd, "wb", closefd=False) as f:
                f.write(data)
            if owner is not None:
                os.fchown(fd, *owner)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        try:
            os.rename(tmp, parts[-1], src_dir_fd=d, dst_dir_fd=d)
        except OSError:
            os.unlink(tmp, dir_fd=d)
            raise


def walk_files(root: Path, rel: str, *, max_entries: int, deadline: float, suffixes: tuple[str, ...] = ()) -> tuple[list[str], bool]:
    """(sorted relative paths of regular files under `rel`, whether the walk was cut short).

    Links, FIFOs, sockets and devices are skipped, `__pycache__` too; at most `max_entries`
    directory entries are looked at, and the walk stops at `deadline`.
    """
    base = parts_of(rel) if rel not in ("", ".") else []
    out: list[str] = []
    seen, cut = 0, False
    with open_dir(root, base) as top:
        stack: list[tuple[int, list[str]]] = [(os.dup(top), base)]
        try:
            while stack:
                fd, parts = stack.pop()
                try:
                    with os.scandir(fd) as it:
                        for e in it:
                            seen += 1
                            if seen > max_entries or time.monotonic() > deadline:
                                cut = True
                                break
                            st = e.stat(follow_symlinks=False)
                            if stat.S_ISDIR(st.st_mode) and e.name != "__pycache__":
                                try:
                                    stack.append((os.open(e.name, _DIR_FLAGS, dir_fd=fd), parts + [e.name]))
                                except OSError:
                                    continue
                            elif stat.S_ISREG(st.st_mode) and (not suffixes or e.name.endswith(suffixes)):
                                out.append("/".join(parts + [e.name]))
                finally:
                    os.close(fd)
                if cut:
                    break
        finally:
            for fd, _ in stack:
                os.close(fd)
    return sorted(out), cut


def copy_tree(root: Path, rel: str, dest: Path, *, max_files: int, max_bytes: int, deadline: float,
              max_depth: int = 16) -> int:
    """Copy the regular files under `root/rel` to `dest` (mode 0644, dirs 0755); returns bytes copied.

    HostFsError when the tree holds more than `max_files` files or `max_bytes` bytes, files more
    than `max_depth` dirs deep, or the deadline passes: the caller treats it as the model's doing
    (reward 0), never as an infra fault.
    """
    files, cut = walk_files(root, rel, max_entries=max_files * 4, deadline=deadline)
    if cut or len(files) > max_files:
        raise HostFsError(f"{rel!r} holds more than {max_files} files or took too long to list")
    prefix = len(parts_of(rel)) if rel not in ("", ".") else 0
    deep = [f for f in files if f.count("/") - prefix >= max_depth]
    if deep:
        raise HostFsError(f"{rel!r} holds files more than {max_depth} directories deep, e.g. {deep[0][:120]!r}...")
    total = 0
    for f in files:
        data, longer = read_file(root, f, max_bytes - total)
        total += len(data)
        if longer:
            raise HostFsError(f"{rel!r} holds more than {max_bytes} bytes")
        target = dest.joinpath(*f.split("/")[prefix:])
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(0o644)
    return total
