"""pytest plugin of swe grading (copied into the grading dir as `libra_grade.py`; imports only the stdlib).

Loaded with `-p libra_grade`, so it is configured before any test module is collected and
therefore before the graded package runs a line. In `pytest_configure` it takes the result fd and reads the per-run key
from a pipe whose write end the host already closed (so the key is on no fd once the package
runs), then signs one record per test phase: `HMAC(key, "nodeid\\twhen:outcome")`. The host
(envs/swe_grade.py) keeps only records whose tag verifies: text the package writes to any fd,
a fake summary or an exit code carry no weight.

It also installs an audit hook (it cannot be removed) that confines the test process, in every
isolation mode: files may be opened only under the grading dir, the interpreter's prefixes and
the system dirs (new temp files too), and links, processes, ctypes and sockets are refused. In
namespace mode the sandbox already shows nothing else; in rlimits mode this keeps the graded
package from importing an unbroken copy of itself from a checkout the host can read.
"""

import hashlib
import hmac
import os
import sys
import tempfile


def _make_emit():
    key_fd, out_fd = (int(x) for x in os.environ.pop("LIBRA_GRADE_FDS").split(","))
    key = os.read(key_fd, 64)
    os.close(key_fd)

    def emit(nodeid: str, what: str) -> None:
        msg = f"{nodeid}\t{what}".replace("\n", " ").encode("utf-8", "backslashreplace")
        tag = hmac.new(key, msg, hashlib.sha256).hexdigest().encode()
        os.write(out_fd, tag + b"\t" + msg + b"\n")

    return emit


_emit = None

_DENIED = frozenset(("os.symlink", "os.link", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
                     "subprocess.Popen", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "socket.connect",
                     "socket.bind", "socket.sendto", "sys.setprofile", "sys.settrace"))


def _guard():
    real = os.path.realpath
    # not /proc/self: its root/ and cwd/ links would let a relative open with dir_fd (the hook
    # cannot see dir_fd) reach anything
    sysdirs = ("/usr", "/lib", "/lib32", "/lib64", "/etc", "/dev/null", "/dev/urandom")
    roots = tuple(sorted({real(p) for p in (os.getcwd(), sys.prefix, sys.base_prefix, sys.exec_prefix,
                                            os.path.dirname(os.path.dirname(real(sys.executable))))} | set(sysdirs)))
    tmp = real(tempfile.gettempdir())
    new_file, unnamed = os.O_CREAT | os.O_EXCL, getattr(os, "O_TMPFILE", -1)

    def inside(path: str, dirs) -> bool:
        return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)

    def hook(event, args):
        if event in _DENIED:
            raise PermissionError(f"libra grading: {event} is not allowed while hidden tests run")
        if event != "open" or not args or isinstance(args[0], int):
            return
        path = os.fsdecode(args[0])
        if not path.startswith("/") and ".." in path.split("/"):
            raise PermissionError(f"libra grading: relative path {path!r} with '..' is not allowed")
        full = real(os.path.join(os.getcwd(), path))
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        if inside(full, roots):
            return
        # new temp files only: O_CREAT|O_EXCL, an unnamed O_TMPFILE, or the temp dir itself with
        # O_CREAT (open() announces an O_TMPFILE opener that way; on a dir alone the kernel refuses it)
        if inside(full, (tmp,)) and (flags & new_file == new_file or flags & unnamed == unnamed
                                     or (full == tmp and flags & os.O_CREAT)):
            return
        raise PermissionError(f"libra grading: {full} is outside the grading dir")

    sys.addaudithook(hook)


def pytest_configure(config):
    # here, not at import: importing this module (as the no-torch test does) must change nothing;
    # pytest configures `-p` plugins before it collects, i.e. before the graded package is imported
    global _emit
    _emit = _make_emit()
    _guard()


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        _emit(report.nodeid, f"{report.when}:{report.outcome}")
