"""Runner of swe probes inside the sandbox (copied into the grading dir as `libra_probe.py`; stdlib only).

    python -s -B libra_probe.py plan.json FD   (PYTHONHASHSEED=0, the same in every run)

`plan.json`: {"tests": [[module path, name], ...]}, names "test_x" or "TestC::test_x". For each
probe module it injects the site function `_o` and imports it (which imports the graded
package); then it forks one child per test, in plan order, so that no test sees another's
state, and waits for it. The child calls the test (with a fresh `tmp_path` when asked) and
writes JSON lines to fd FD:

    {"t": i, "k": site, "o": ["v", value] | ["x", [class names of the MRO], message]}
    {"t": i, "k": site, "r": [outcome of each expected-side thunk]}   (reference form only)
    {"t": i, "end": ["ok"] | ["x", [...], message]}
    {"m": module path, "x": [[...], message]}                         (the import failed)
    {"done": true}                                                    (the last line)

Values are dumped structurally (`dump`): builtins as tagged JSON, other objects as class name
and attributes, so the host compares data, never calls the package's `__eq__`.

Nothing here is trusted: the graded package runs in this process and may rewrite any of it.
That is why the host never asks it whether a test passed, only what values came out, and keeps
every expected value to itself (envs/swe/probe.py).
"""

import enum
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

MAX_DEPTH = 24
MAX_ITEMS = 10_000
MAX_TEXT = 100_000

_out_fd = -1
_current = -1


def _mro(cls) -> list:
    try:
        return [c.__qualname__ for c in cls.__mro__][:16]
    except Exception:  # noqa: BLE001 - a hostile class: its name is all we report
        return [str(getattr(cls, "__name__", "?"))]


def _text(e) -> str:
    try:
        return str(e)[:2000]
    except Exception:  # noqa: BLE001
        return "<unprintable>"


def _attrs(v):
    out = {}
    try:
        d = object.__getattribute__(v, "__dict__")
        if isinstance(d, dict):
            out.update(d)
    except AttributeError:
        pass
    for cls in type(v).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__"):
                try:
                    out[name] = object.__getattribute__(v, name)
                except AttributeError:
                    pass
    return out


class _Dumper:
    def __init__(self):
        self.items = 0

    def __call__(self, v, depth=0, seen=()):
        self.items += 1
        t = type(v)
        if v is None or t is bool or t is float:
            return v
        if t is int:
            return v if -(1 << 53) < v < (1 << 53) else {"I": hex(v)}
        if t is str:
            return v[:MAX_TEXT]
        if depth > MAX_DEPTH or self.items > MAX_ITEMS:
            return {"...": t.__qualname__}
        if id(v) in seen:
            return {"...": "cycle"}
        seen = (*seen, id(v))
        d = depth + 1
        if isinstance(v, enum.Enum):
            return {"E": t.__qualname__, "n": v.name}
        if isinstance(v, BaseException):
            return {"X": t.__qualname__, "r": _text(v)}
        if isinstance(v, (list, tuple)) and t in (list, tuple) or (isinstance(v, tuple) and hasattr(v, "_fields")):
            return {"L" if isinstance(v, list) else "T": [self(x, d, seen) for x in v]}
        if t is dict:
            return {"D": [[self(k, d, seen), self(x, d, seen)] for k, x in v.items()]}
        if t in (set, frozenset):
            items = [self(x, d, seen) for x in v]
            return {"S": sorted(items, key=lambda x: json.dumps(x, sort_keys=True))}
        if t in (bytes, bytearray):
            return {"B": bytes(v).hex()}
        if t is complex:
            return {"C": [v.real, v.imag]}
        if isinstance(v, (int, float, str, list, tuple, dict)):  # subclasses of builtins: their plain value
            return self(t.__mro__[[c.__module__ == "builtins" for c in t.__mro__].index(True)](v), depth, seen)
        if isinstance(v, type) or callable(v) and hasattr(v, "__code__"):
            return {"F": getattr(v, "__qualname__", "?")}
        attrs = _attrs(v)
        if attrs:
            return {"O": t.__qualname__, "a": {str(k): self(x, d, seen) for k, x in attrs.items()}}
        try:
            return {"R": t.__qualname__, "r": repr(v)[:2000]}
        except Exception:  # noqa: BLE001
            return {"R": t.__qualname__, "r": "<unprintable>"}


def dump(v):
    return _Dumper()(v)


def _write(record) -> None:
    os.write(_out_fd, (json.dumps(record, default=str) + "\n").encode("utf-8", "backslashreplace"))


def _outcome(thunk):
    try:
        v = thunk()
    except BaseException as e:  # noqa: BLE001 - SystemExit too: it is the value of this check
        return ["x", _mro(type(e)), _text(e)], e
    try:
        return ["v", dump(v)], v
    except BaseException as e:  # noqa: BLE001 - a value that cannot be dumped
        return ["x", _mro(type(e)), _text(e)], None


class _Raised:
    """What `with pytest.raises(...) as info` binds: the exception, like pytest's ExceptionInfo."""

    def __init__(self, e):
        self.value, self.type = e, type(e)

    def __str__(self):
        return str(self.value)


def _o(site, thunk, *expected):
    outcome, value = _outcome(thunk)
    _write({"t": _current, "k": site, "o": outcome})
    if expected:  # reference form: the expected side in a child, so its side effects stay there
        pid = os.fork()
        if pid == 0:
            try:
                _write({"t": _current, "k": site, "r": [_outcome(x)[0] for x in expected]})
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    return _Raised(value) if outcome[0] == "x" else value


def _call(module, name: str):
    cls, _, meth = name.rpartition("::")
    fn = getattr(getattr(module, cls)(), meth) if cls else getattr(module, name)
    code = getattr(fn, "__code__", None)
    wants = code.co_varnames[:code.co_argcount] if code else ()
    fn(**({"tmp_path": Path(tempfile.mkdtemp())} if "tmp_path" in wants else {}))


def main() -> int:
    global _out_fd, _current
    plan = json.loads(Path(sys.argv[1]).read_text())
    _out_fd = int(sys.argv[2])
    sys.path.insert(0, os.getcwd())
    modules, failed = {}, set()
    for path in dict.fromkeys(p for p, _ in plan["tests"]):
        name = "tests." + Path(path).stem
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        module._o = _o
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
            modules[path] = module
        except BaseException as e:  # noqa: BLE001 - the package failed to import: every test of it fails
            failed.add(path)
            _write({"m": path, "x": [_mro(type(e)), _text(e)]})
    for i, (path, name) in enumerate(plan["tests"]):
        if path in failed:
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _current = i
            try:
                _call(modules[path], name)
                _write({"t": i, "end": ["ok"]})
            except BaseException as e:  # noqa: BLE001
                _write({"t": i, "end": ["x", _mro(type(e)), _text(e)]})
            finally:
                sys.stdout.flush()
                os._exit(0)
        os.waitpid(pid, 0)
    _write({"done": True})
    return 0


if __name__ == "__main__":
    sys.exit(main())
