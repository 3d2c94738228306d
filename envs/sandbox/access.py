"""Why the sandbox cannot run our interpreter, said in one line with the fix.

When the sandboxed command (the guard, then `python ...`) fails to start, the cause is almost never
the isolation itself but access: the interpreter's path does not exist inside the new root (a
symlink that cannot be bound at its own path), the sandbox uid cannot enter a dir on the way to
the interpreter or read one of its files, or a module comes from a dir the sandbox does not bind.
`interpreter_unusable` and `why_cannot_run` find the first such cause for a `SandboxUser` (the
uid the command runs as and what the new root binds) and name it with the `chmod`, path or
install that fixes it. In namespace mode only what the new root binds counts (it makes the dirs
above); in rlimits mode the path as written counts too.

Invariants (tests/engine/runtime/test_startup_errors.py): an interpreter the sandbox uid cannot read names the
first dir it cannot enter and the chmod; a module taken from an unbound dir, or missing, names the
module and the pip command; a symlinked interpreter dir that cannot be bound names its real path.
"""

from __future__ import annotations

import importlib.util
import os
import re
import stat
import sys
from dataclasses import dataclass

from envs.sandbox import fs as sfs
from envs.config import SandboxResult

_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
_READABLE = "install the venv where uid {uid} can read it (not under /root or a 0700 home)"


@dataclass(frozen=True, kw_only=True)
class SandboxUser:
    """Who runs inside, and what the new root binds (envs/sandbox/sandbox.py builds it)."""

    uid: int
    gid: int
    as_root: bool  # we are root: the sandbox uid's access is judged from the mode bits
    exposed: tuple[str, ...]  # interpreter dirs bound at their real paths
    aliases: tuple[tuple[str, str], ...]  # (real dir, symlinked path) also bound (sandbox_fs.interpreter_aliases)


def one_line(text: str) -> str:
    """A command's output as one line of an error message (its lines joined by ' | ')."""
    return " | ".join(ln.strip() for ln in text.strip().splitlines() if ln.strip())


def _head(u: SandboxUser, use_ns: bool) -> str:
    return f"sandbox ({'namespaces' if use_ns else 'rlimits'}, uid {u.uid}) cannot run {os.path.abspath(sys.executable)}"


def _cannot_run(u: SandboxUser, why: str, use_ns: bool, unreadable: bool = True) -> str:
    head = f"{_head(u, use_ns)}: {why}"
    if not unreadable:
        return head
    return f"{head}, or {_READABLE.format(uid=u.uid)}{'' if use_ns else ', or use --env.isolation auto'}"


def interpreter_unusable(u: SandboxUser, use_ns: bool) -> str | None:
    """The one-line error when our interpreter cannot be reached or read inside, or None."""
    unbound = _not_bound(u) if use_ns else None
    if unbound:
        return _cannot_run(u, unbound, use_ns, unreadable=False)
    for path in (sys.executable, sys.prefix, sys.base_prefix):
        why = blocked(u, path, use_ns)
        if why:
            return _cannot_run(u, why, use_ns)
    return None


def why_cannot_run(u: SandboxUser, r: SandboxResult, what: str, use_ns: bool) -> str:
    """The one-line error for `python ...` (checking `what`) failing inside with result `r`."""
    unusable = interpreter_unusable(u, use_ns)
    if unusable:
        return unusable
    exe = os.path.abspath(sys.executable)
    where = f"{_head(u, use_ns)} with {what}"
    missing = _MISSING_MODULE.search(r.output)
    if missing:
        name = missing.group(1).split(".")[0]
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin:
            return f"{where}: this interpreter has no module {name!r}; install it into it (`{exe} -m pip install {name}`)"
        origin = os.path.realpath(spec.origin)
        why = blocked(u, origin, use_ns)
        if why:
            return _cannot_run(u, why, use_ns)
        if use_ns and not any(sfs.under(origin, d) for d in (*sfs.SYSTEM_DIRS, *u.exposed)):
            return (f"{where}: {name} comes from {origin}, outside the interpreter's dirs that the sandbox binds "
                    f"({', '.join(u.exposed)}); install {name} into this interpreter (`{exe} -m pip install {name}`)")
    return (f"{where} (exit {r.returncode}: {one_line(r.output)[-200:]}); {_READABLE.format(uid=u.uid)}"
            f"{'' if use_ns else ', or use --env.isolation auto'}")


def _not_bound(u: SandboxUser) -> str | None:
    """Namespace mode: why the path of our interpreter does not exist in the new root, or None."""
    exe_dir = os.path.dirname(os.path.abspath(sys.executable))
    inside = (*sfs.SYSTEM_DIRS, *u.exposed, *(alias for _, alias in u.aliases))
    if any(sfs.under(exe_dir, d) for d in inside):
        return None
    real_dir = os.path.realpath(exe_dir)
    if real_dir == exe_dir:
        return None
    return (f"its path does not exist inside: {exe_dir} is reached through a symlink to {real_dir} that cannot be "
            f"bound at its own path; fix: run the venv by its real path, {real_dir}/{os.path.basename(sys.executable)}")


def blocked(u: SandboxUser, path: str, use_ns: bool) -> str | None:
    """The first dir on the way to `path` that the sandbox uid cannot enter, or `path` itself when it
    cannot read (a dir, a plain file) or run (an executable) it."""
    real = os.path.realpath(path)
    roots = (*sfs.SYSTEM_DIRS, *u.exposed)
    for chain in ([real] if use_ns else [os.path.abspath(path), real]):
        parts = chain.split("/")
        for i in range(2, len(parts) + 1):
            comp = "/".join(parts[:i])
            if use_ns and not any(sfs.under(comp, d) for d in roots):
                continue
            try:
                st = os.stat(comp)
            except OSError as e:
                return f"{comp} cannot be read ({e.strerror})"
            is_dir, leaf = stat.S_ISDIR(st.st_mode), i == len(parts)
            need = (os.X_OK if not leaf else os.R_OK | os.X_OK if is_dir else os.X_OK if st.st_mode & 0o111 else os.R_OK)
            if not _may(u, comp, st, need):
                verb = "enter" if is_dir and not leaf else "run" if need == os.X_OK else "read"
                bits = "x" if need == os.X_OK else "r" if need == os.R_OK else "rx"
                way = f", on the way to {chain}" if comp != chain else ""
                real_of = f" (the real path of {path})" if chain == real and real != os.path.abspath(path) else ""
                return (f"uid {u.uid} cannot {verb} {comp} (mode {stat.S_IMODE(st.st_mode):04o}, owner uid "
                        f"{st.st_uid}){way}{real_of}; fix: `chmod o+{bits} {comp}`")
    return None


def _may(u: SandboxUser, path: str, st: os.stat_result, need: int) -> bool:
    """Whether the sandbox uid has `need` (os.R_OK | os.X_OK) on `path`: our own access when it is our uid,
    else the mode bits of the class it falls in (it runs with no supplementary groups)."""
    if not u.as_root:
        return os.access(path, need)
    bits = (4 if need & os.R_OK else 0) | (1 if need & os.X_OK else 0)
    shift = 6 if st.st_uid == u.uid else 3 if st.st_gid == u.gid else 0
    return (st.st_mode >> shift) & bits == bits
