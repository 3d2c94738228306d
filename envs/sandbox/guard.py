"""The guard every sandboxed command runs under: no way to open a unix socket, no new privileges.

Installed once per process, not per call: a launcher thread (`launch`) sets no_new_privs and loads a
seccomp filter (raw BPF built by `program`, no library) on itself, then starts every sandboxed
command with `subprocess.Popen`. A filter and no_new_privs belong to the thread that set them and
are inherited by every process it forks (fork and vfork copy the calling thread's), so the whole
chain of envs/sandbox/procs.py and the command run under them, while the runtime's other threads do
not. (Before issue 30 a second Python interpreter installed the filter in every call: ~12 ms of the
~50 ms a sandboxed `true` cost.) The filter answers EACCES to socket() of any family but
AF_INET/AF_INET6 (which the empty network namespace makes useless), to socketpair() of anything
but an AF_UNIX pair whose `type & 0xF` is SOCK_STREAM or SOCK_SEQPACKET (an allow-list: the kernel
makes SOCK_RAW a datagram pair, and a datagram socket can sendto() any path), and to
io_uring_setup() (io_uring can create sockets past the filter); a syscall of a foreign ABI
(32-bit, x32) is refused outright. So no unix socket is reachable wherever it lives, whenever it
was made: a boundary, not a scan of the filesystem. No host descriptor reaches the command: Popen
closes every fd but 0-2 and the ones a call passes on purpose, and the set-up verdict is a file,
not a pipe (envs/sandbox/procs.py).
When the kernel refuses the filter, `launch` raises a one-line RuntimeError naming the cause.

Invariants (tests/envs/sandbox/test_sandbox.py, tests/envs/sandbox/adversarial_escapes.py): inside, socket(AF_UNIX) and
socketpair() of type SOCK_DGRAM, SOCK_RAW, an unknown type or a family but AF_UNIX fail with EACCES
(with or without SOCK_NONBLOCK/SOCK_CLOEXEC) while TCP sockets and stream and seqpacket socketpairs
work; no unix datagram socket can be made; no fd above 2 but the passed ones is open; the
runtime's own threads are not filtered.
"""

import ctypes
import os
import struct
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

# seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i (low word first on little-endian)
_ARCH = {"x86_64": (0xC000003E, {"socket": 41, "socketpair": 53, "io_uring_setup": 425}),
         "aarch64": (0xC00000B7, {"socket": 198, "socketpair": 199, "io_uring_setup": 425})}
_LD, _JEQ, _JGE, _AND, _RET = 0x20, 0x15, 0x35, 0x54, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JGE|K, ALU|AND|K, RET|K
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_EACCES, _AF_UNIX, _AF_INET, _AF_INET6, _SOCK_TYPE_MASK = 13, 1, 2, 10, 0xF
_SOCK_STREAM, _SOCK_SEQPACKET = 1, 5
_X32_BIT = 0x40000000


def program(machine: str, little_endian: bool = True) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) rows; jumps are relative, so it is built back to front."""
    arch, nr = _ARCH[machine]
    low = 0 if little_endian else 4
    deny, allow = (_RET, 0, 0, _ERRNO | _EACCES), (_RET, 0, 0, _ALLOW)
    # socketpair(domain, type, ...): an allow-list, AF_UNIX with a connected type only; a deny-list of
    # SOCK_DGRAM let SOCK_RAW through, which the kernel turns into a datagram pair that sendto()s any path
    pair = [(_LD, 0, 0, 16 + low), (_JEQ, 0, 4, _AF_UNIX), (_LD, 0, 0, 24 + low), (_AND, 0, 0, _SOCK_TYPE_MASK),
            (_JEQ, 2, 0, _SOCK_STREAM), (_JEQ, 1, 0, _SOCK_SEQPACKET), deny, allow]
    # socket(domain, ...): only the families the empty network namespace isolates
    sock = [(_LD, 0, 0, 16 + low), (_JEQ, 2, 0, _AF_INET), (_JEQ, 1, 0, _AF_INET6), deny, allow]
    tail = [(_JEQ, 0, 1, nr["io_uring_setup"]), deny, allow]
    # dispatch on the syscall number: socket -> sock block, socketpair -> pair block
    body = [(_JEQ, 1 + len(tail) + len(sock), 0, nr["socketpair"])] + [(_JEQ, len(tail), 0, nr["socket"])] + tail + sock + pair
    head = [(_LD, 0, 0, 4), (_JEQ, 1, 0, arch), deny, (_LD, 0, 0, 0)]
    if machine == "x86_64":
        head.append((_JGE, 0, 1, _X32_BIT))
        head.append(deny)
    return head + body


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(rows: list[tuple[int, int, int, int]]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    raw = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *r) for r in rows))
    prog = _Fprog(len(rows), ctypes.cast(raw, ctypes.c_void_p))
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


_lock = threading.Lock()
_launcher: tuple[int, ThreadPoolExecutor] | None = None  # (pid that made it, its one thread)
_failed: list[str] = []  # why the launcher thread could not install the guard


def _install_here() -> None:
    try:
        install(program(os.uname().machine, sys.byteorder == "little"))
    except (OSError, KeyError, AttributeError) as e:
        _failed.append(f"sandbox: cannot install the socket filter on {os.uname().machine} ({e}); the kernel must allow "
                       "seccomp filters (CONFIG_SECCOMP_FILTER, and no container profile that forbids them)")


def launch(start: Callable[[], T]) -> T:
    """Run `start()` (a Popen) on the launcher thread, whose children inherit the guard; its result or exception."""
    return launch_later(start).result()


def launch_later(start: Callable[[], T]) -> Future:
    """`launch` without waiting: the Future of `start()`."""
    global _launcher
    with _lock:
        if _launcher is None or _launcher[0] != os.getpid():  # a forked child has no copy of the thread
            _failed.clear()
            _launcher = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="libra-sandbox-launcher",
                                                         initializer=_install_here))
        pool = _launcher[1]
    return pool.submit(_checked, start)


def on_launcher() -> bool:
    """Whether the calling thread is the launcher (a `launch` from it would wait on itself)."""
    return threading.current_thread().name.startswith("libra-sandbox-launcher")


def _checked(start: Callable[[], T]) -> T:
    if _failed:
        raise RuntimeError(_failed[0])
    return start()
