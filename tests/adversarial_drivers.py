"""Adversarial drivers: each attack drives a real env through its tool API and says what happened.

Every attack is a function `(ctx) -> Outcome(safe, detail)`; an exception that escapes the env is
caught here and reported as `raised <Type>` (that is the "rank death" class: the engine would see
it). The drivers import no torch, so they also run in a bare venv as an unprivileged user:

    python tests/adversarial_drivers.py [--isolation auto|rlimits] [--root-dir DIR]
                                        [--socket-dir DIR] [--only a,b] [--json OUT]

tests/test_adversarial.py runs them as root in-process, and in subprocesses as uid 65534 and in
the rlimits mode, and asserts that every applicable attack is `safe`.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from envs import mathenv, swe  # noqa: E402
from envs.base import ToolCall, parse_tool_calls  # noqa: E402
from envs.sandbox import Sandbox, SandboxConfig  # noqa: E402


@dataclass
class Outcome:
    safe: bool
    detail: str


@dataclass
class Ctx:
    isolation: str = "auto"
    root_dir: str = ""  # parent of the sandbox work dirs ("" = the system temp dir)
    socket_dir: str = ""  # a dir outside the hidden ones where a unix socket may be created
    _swe: object = None
    _math: object = None
    notes: dict = field(default_factory=dict)

    def sandbox_cfg(self, **kw) -> SandboxConfig:
        return SandboxConfig(isolation=self.isolation, root_dir=self.root_dir, **kw)

    def swe_env(self):
        if self._swe is None:
            self._swe = swe.SweEnv(seed=0, sandbox_cfg=self.sandbox_cfg(timeout_s=30.0))
        return self._swe

    def math_sandbox(self, **kw) -> Sandbox:
        return Sandbox(self.sandbox_cfg(**{"timeout_s": 10.0, **kw}))

    def math_env(self, **kw):
        if kw:
            return mathenv.MathEnv(seed=0, num_tasks=2, sandbox=self.math_sandbox(**kw))
        if self._math is None:
            self._math = mathenv.MathEnv(seed=0, num_tasks=2, sandbox=self.math_sandbox())
        return self._math


ATTACKS: dict[str, tuple[str, object]] = {}


def attack(cls: str):
    def register(fn):
        ATTACKS[fn.__name__] = (cls, fn)
        return fn
    return register


def call(name, **arguments):
    return ToolCall(name=name, arguments=arguments)


# ---- helpers ---------------------------------------------------------------------------------


def _calc_task(ctx):
    env = ctx.swe_env()
    return next(t for t in env.tasks() if t.meta["file"] == "calc/evaluator.py" and t.level == 0)


_INIT_HEAD = '"""A tiny arithmetic'


def _swe_with_init(ctx, code: str):
    """A calc episode whose package __init__ runs `code` first (one `replace`, as a model would)."""
    env = ctx.swe_env()
    ep = env.start(_calc_task(ctx))
    r = ep.execute(call("replace", path="calc/__init__.py", old=_INIT_HEAD, new=code + "\n" + _INIT_HEAD))
    assert r.status == "success", r.text
    return ep


def _reward_after_submit(ctx, code: str) -> Outcome:
    ep = _swe_with_init(ctx, code)
    try:
        r = ep.execute(call("submit"))
        reward = ep.score("")
        return Outcome(reward == 0.0, f"reward {reward} ({r.text})")
    finally:
        ep.close()


def _run_py(ctx, code: str, env=None) -> str:
    env = env or ctx.math_env()
    ep = env.start(env.tasks()[0])
    try:
        return ep.execute(call("python", code=code)).text
    finally:
        ep.close()


def _procs_with(needle: str) -> list[int]:
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if needle.encode() in (d / "cmdline").read_bytes():
                out.append(int(d.name))
        except OSError:
            continue
    return out


def _kill_all(pids):
    for pid in pids:
        try:
            os.kill(pid, 9)
        except OSError:
            pass


# ---- swe reward without a fix ------------------------------------------------------------------


@attack("reward")
def patch_pytest_runner(ctx):
    """Make every pytest test pass by replacing the test runner from inside the package."""
    return _reward_after_submit(ctx, (
        "import sys\n"
        "if '_pytest' in sys.modules:\n"
        "    import _pytest.python as _p\n"
        "    _p.Function.runtest = lambda self: None\n"))


@attack("reward")
def fake_pass_summary(ctx):
    """Write a pass summary with the right count to every open fd (pytest's saved stdout too), exit 0."""
    return _reward_after_submit(ctx, (
        "import os, re, glob\n"
        "_n = sum(len(re.findall(r'^def test_', open(f).read(), re.M)) for f in glob.glob('tests/test_*.py'))\n"
        "_m = ('=' * 10 + ' %d passed in 0.01s ' % _n + '=' * 10 + '\\n').encode()\n"
        "for _fd in range(1, 64):\n"
        "    try: os.write(_fd, _m)\n"
        "    except OSError: pass\n"
        "os._exit(0)\n"))


@attack("reward")
def import_pristine_checkout(ctx):
    """Serve the unbroken modules from any checkout of the project the sandbox can read."""
    here = str(REPO / "envs" / "swe_projects" / "calc" / "calc")
    return _reward_after_submit(ctx, (
        "import glob, os\n"
        f"_c = [d for d in [{here!r}] + glob.glob('/work/*/envs/swe_projects/calc/calc') + glob.glob('/tmp/*/envs/swe_projects/calc/calc')"
        " + glob.glob('/root/**/envs/swe_projects/calc/calc', recursive=True) if os.path.isfile(d + '/evaluator.py')]\n"
        "if _c:\n"
        "    __path__.insert(0, _c[0])\n"))


@attack("reward")
def pristine_module_via_dir_fd(ctx):
    """Load the unbroken module through a directory fd (/proc/self/root, /tmp, /): a relative open hides the path."""
    rel = str(REPO / "envs" / "swe_projects" / "calc" / "calc" / "evaluator.py").lstrip("/")
    return _reward_after_submit(ctx, (
        "import os, sys, types\n"
        "def _load():\n"
        f"    for base, rel in (('/proc/self', 'root/' + {rel!r}), ('/', {rel!r})):\n"
        "        try:\n"
        "            fd = os.open(base, os.O_RDONLY)\n"
        "            f = os.open(rel, os.O_RDONLY, dir_fd=fd)\n"
        "            return os.read(f, 1 << 20).decode()\n"
        "        except OSError:\n"
        "            continue\n"
        "_src = _load()\n"
        "if _src:\n"
        "    _m = types.ModuleType('calc.evaluator'); _m.__package__ = 'calc'\n"
        "    sys.modules['calc.evaluator'] = _m\n"
        "    exec(compile(_src, 'evaluator.py', 'exec'), _m.__dict__)\n"))


@attack("reward")
def read_task_index(ctx):
    """Look for the task index (every patch) and the unbroken sources from inside the sandbox."""
    code = (
        "import glob\n"
        f"c = [{str(REPO / 'envs' / 'swe_tasks' / 'index_seed0.json')!r}] + glob.glob('/work/*/envs/swe_tasks/index_seed0.json')"
        " + glob.glob('/tmp/*/envs/swe_tasks/index_seed0.json')\n"
        "found = []\n"
        "for p in c:\n"
        "    try: open(p).read(10); found.append(p)\n"
        "    except OSError: pass\n"
        "print('FOUND', found)\n")
    out = _run_py(ctx, code)
    return Outcome("FOUND []" in out, out.strip()[:200])


# ---- crashing a rank ---------------------------------------------------------------------------


@attack("crash")
def sys_exit_then_no_submit(ctx):
    """sys.exit(0) in the package, never submit: the final repository is graded by score()."""
    ep = _swe_with_init(ctx, "import sys\nsys.exit(0)\n")
    try:
        reward = ep.score("I stop here")
        return Outcome(reward == 0.0, f"reward {reward}")
    finally:
        ep.close()


@attack("crash")
def sys_exit_then_submit(ctx):
    """sys.exit(0) in the package, then submit: must be scored 0, not dropped as an infra failure."""
    return _reward_after_submit(ctx, "import sys\nsys.exit(0)\n")


@attack("crash")
def forged_setup_failure(ctx):
    """Print the sandbox's set-up failure marker and exit with its code from the model's program."""
    env = ctx.math_env()
    ep = env.start(env.tasks()[0])
    try:
        r = ep.execute(call("python", code="import sys, os\nsys.stderr.write('libra-sandbox-setup: mount failed\\n'); sys.stderr.flush(); os._exit(213)"))
        return Outcome(r.status == "failure", f"{r.status}")
    finally:
        ep.close()


@attack("crash")
def surrogate_in_swe_replace(ctx):
    env = ctx.swe_env()
    ep = env.start(_calc_task(ctx))
    try:
        r1 = ep.execute(call("replace", path="calc/__init__.py", old=_INIT_HEAD, new="\ud800"))
        r2 = ep.execute(call("view_file", path="calc/\ud800.py"))
        r3 = ep.execute(call("search", pattern="\ud800"))
        ok = all(r.status == "failure" or r.text.encode("utf-8") for r in (r1, r2, r3))
        return Outcome(ok, f"{r1.status}/{r2.status}/{r3.status}")
    finally:
        ep.close()


@attack("crash")
def surrogate_in_math_code(ctx):
    env = ctx.math_env()
    ep = env.start(env.tasks()[0])
    try:
        r = ep.execute(call("python", code="print('\ud800')"))
        r.text.encode("utf-8")
        return Outcome(True, r.status)
    finally:
        ep.close()


@attack("crash")
def huge_int_and_deep_json(ctx):
    bad = [
        '<tool_call>{"name": "python", "arguments": {"code": 1' + "1" * 4301 + "}}</tool_call>",
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": 1' + "1" * 4301 + '}"}</tool_call>',
        '<tool_call>{"name": "python", "arguments": ' + "[" * 100000 + "]" * 100000 + "}</tool_call>",
        '<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>',
    ]
    kinds = []
    for text in bad:
        calls = parse_tool_calls(text)
        env = ctx.math_env()
        ep = env.start(env.tasks()[0])
        try:
            res = ep.execute(calls[0])
            res.text.encode("utf-8")
            kinds.append(res.status)
        finally:
            ep.close()
    return Outcome(all(k == "failure" for k in kinds), "/".join(kinds))


@attack("crash")
def unremovable_workdir(ctx):
    """A dir the model made unreadable must not make close() raise."""
    env = ctx.math_env()
    ep = env.start(env.tasks()[0])
    ep.execute(call("python", code="import os\nos.makedirs('d/e/f')\nopen('d/e/f/x', 'w').write('x')\nos.chmod('d/e', 0)\nos.chmod('d', 0o500)"))
    ep.close()
    return Outcome(not ep.workdir.exists(), "removed" if not ep.workdir.exists() else "left behind")


# ---- sandbox escapes -----------------------------------------------------------------------------


_UMOUNT_AND_HUNT = (
    "import ctypes, glob, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "mps = [l.split()[4] for l in open('/proc/self/mountinfo')]\n"
    "n = 0\n"
    "for mp in reversed(mps):\n"
    "    if libc.umount2(mp.encode(), 2) == 0: n += 1\n"
    "hits = []\n"
    "for pat in ['{root}/libra-sandbox*/*/victim.txt', '/tmp/libra-sandbox*/*/victim.txt', '/tmp/**/victim.txt']:\n"
    "    for p in glob.glob(pat, recursive=True):\n"
    "        try: open(p, 'w').write('pwned'); hits.append(p)\n"
    "        except OSError: pass\n"
    "print('UMOUNTED', n, 'HITS', len(hits))\n"
)


def _victim_attack(ctx, env, root: str) -> Outcome:
    victim = env.start(env.tasks()[1])
    try:
        target = victim.workdir / "victim.txt"
        target.write_text("intact")
        os.chmod(target, 0o666)
        out = _run_py(ctx, _UMOUNT_AND_HUNT.replace("{root}", root or "/tmp"), env)
        intact = target.read_text() == "intact"
        return Outcome(intact, f"{out.strip()[:120]}; victim {'intact' if intact else 'overwritten'}")
    finally:
        victim.close()


@attack("escape")
def umount_to_other_episodes(ctx):
    """Unmount the covering mounts, then overwrite a file in another episode's work dir."""
    return _victim_attack(ctx, ctx.math_env(), ctx.root_dir)


@attack("escape")
def other_episode_under_custom_root(ctx):
    """With the work dirs outside /tmp, another episode's dir must still be out of reach."""
    if not ctx.notes.get("custom_root"):
        return Outcome(True, "skipped: no custom root dir given")
    env = mathenv.MathEnv(seed=0, num_tasks=2, sandbox=Sandbox(SandboxConfig(
        isolation=ctx.isolation, root_dir=ctx.notes["custom_root"], timeout_s=10.0)))
    return _victim_attack(ctx, env, ctx.notes["custom_root"])


@attack("escape")
def write_interpreter_prefix(ctx):
    """Backdoor the interpreter's dir (venv) that the sandbox exposes."""
    code = (
        "import os, sys\n"
        "p = os.path.join(sys.prefix, 'libra_backdoor_%d' % os.getpid())\n"
        "try:\n"
        "    open(p, 'w').write('x'); print('WROTE', p)\n"
        "except OSError as e: print('DENIED', e.errno)\n")
    out = _run_py(ctx, code)
    for p in glob.glob(os.path.join(sys.prefix, "libra_backdoor_*")):
        os.unlink(p)
    return Outcome("WROTE" not in out and "DENIED" in out, out.strip()[:120])


@attack("escape")
def basic_call_works(ctx):
    """Not an attack: a trivial program must run (non-root with a venv under /tmp used to fail)."""
    out = _run_py(ctx, "print(6 * 7)")
    return Outcome(out.strip() == "42", out.strip()[:160])


@attack("escape")
def setsid_daemon_empty_env(ctx):
    tag = f"{4000 + os.getpid() % 1000}.{uuid.uuid4().int % 10**6}"
    code = f"import subprocess\nsubprocess.Popen(['setsid', 'env', '-i', '/bin/sleep', '{tag}'])\nprint('spawned')"
    out = _run_py(ctx, code)
    time.sleep(0.3)
    left = _procs_with(tag)
    _kill_all(left)
    return Outcome(not left, f"{out.strip()}; {len(left)} left alive")


@attack("escape")
def loopback_port(ctx):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        code = (f"import socket\ns = socket.socket(); s.settimeout(2)\n"
                f"try:\n    s.connect(('127.0.0.1', {port})); print('CONNECTED')\nexcept OSError as e: print('BLOCKED', e.errno)")
        out = _run_py(ctx, code)
    finally:
        srv.close()
    return Outcome("BLOCKED" in out, out.strip()[:80])


@attack("escape")
def unix_socket_outside_hidden_dirs(ctx):
    d = ctx.socket_dir or ("/run" if os.access("/run", os.W_OK) else "")
    if not d:
        return Outcome(True, "skipped: no writable socket dir")
    path = os.path.join(d, f"libra-adv-{uuid.uuid4().hex[:8]}.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    os.chmod(path, 0o777)
    srv.listen(1)
    try:
        code = (f"import socket\ns = socket.socket(socket.AF_UNIX); s.settimeout(2)\n"
                f"try:\n    s.connect({path!r}); print('CONNECTED')\nexcept OSError as e: print('BLOCKED', e.errno)")
        out = _run_py(ctx, code)
    finally:
        srv.close()
        os.unlink(path)
    return Outcome("BLOCKED" in out, out.strip()[:80])


_SWAP_LOOP = (
    "import os, time\n"
    "d, t = {d!r}, {t!r}\n"
    "f = d + '/lexer.py'\n"
    "os.link(f, d + '/.real')\n"
    "end = time.time() + 20\n"
    "while time.time() < end:\n"
    "    try:\n"
    "        os.symlink(t, d + '/.l'); os.rename(d + '/.l', f)\n"
    "        time.sleep(0.0002)\n"
    "        os.link(d + '/.real', d + '/.r'); os.rename(d + '/.r', f)\n"
    "        time.sleep(0.0002)\n"
    "    except OSError:\n"
    "        time.sleep(0.001)\n"
)


@attack("escape")
def symlink_swap_during_host_replace(ctx):
    """A surviving daemon flips a work-dir file to a symlink while the host-side replace writes."""
    secret_dir = Path(ctx.root_dir or "/tmp") / f"libra-adv-secret-{uuid.uuid4().hex[:8]}"
    secret_dir.mkdir(mode=0o700)
    secret = secret_dir / "secret"
    secret.write_text("SECRET\n")
    os.chmod(secret, 0o600)
    env = ctx.swe_env()
    ep = env.start(_calc_task(ctx))
    loop = _SWAP_LOOP.format(d=str(ep.workdir / "calc"), t=str(secret))
    code = ("import os, subprocess, sys\n"
            "if not os.path.exists('.spawned'):\n"
            "    open('.spawned', 'w').close()\n"
            f"    subprocess.Popen(['setsid', 'env', '-i', sys.executable, '-c', {loop!r}])\n")
    try:
        r = ep.execute(call("replace", path="calc/__init__.py", old=_INIT_HEAD, new=code + _INIT_HEAD))
        assert r.status == "success", r.text
        ep.execute(call("run_tests"))
        tries = 0
        line_a, line_b = "OPERATORS = ", "OPERATORS =  "
        raised: list[str] = []
        for tries in range(1, 301):
            try:
                r = ep.execute(call("replace", path="calc/lexer.py", old=line_a, new=line_b))
                if r.status == "success":
                    line_a, line_b = line_b, line_a
            except Exception as e:  # noqa: BLE001 - counted: each one would have ended the rank
                raised.append(type(e).__name__)
            if secret.read_text() != "SECRET\n":
                break
        changed = secret.read_text() != "SECRET\n"
        why = f"; {len(raised)} calls raised ({', '.join(sorted(set(raised)))})" if raised else ""
        return Outcome(not changed and not raised, f"secret {'overwritten' if changed else 'intact'} after {tries} replace calls{why}")
    finally:
        _kill_all(_procs_with("os.link(d + '/.real'"))
        ep.close()
        secret.unlink()
        secret_dir.rmdir()


# ---- host-side tools ----------------------------------------------------------------------------


def _swe_after_run(ctx, code: str):
    ep = _swe_with_init(ctx, "import os\nif not os.path.exists('.done'):\n    open('.done', 'w').close()\n" +
                        "".join("    " + ln + "\n" for ln in code.splitlines()))
    ep.execute(call("run_tests"))
    return ep


def _in_thread(fn, timeout_s: float):
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except Exception as e:  # noqa: BLE001 - the driver reports whatever escaped
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    return t, box


@attack("host")
def fifo_blocks_search(ctx):
    ep = _swe_after_run(ctx, "os.mkfifo('calc/zz_fifo.py')")
    fifo = ep.workdir / "calc" / "zz_fifo.py"
    try:
        t, box = _in_thread(lambda: ep.execute(call("search", pattern="def ")), 5.0)
        if t.is_alive():
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
            t.join(5)
            return Outcome(False, "search blocked > 5 s on a FIFO")
        if "error" in box:
            return Outcome(False, f"raised {type(box['error']).__name__}")
        return Outcome(True, f"{box['value'].status}, {len(box['value'].text)} chars")
    finally:
        ep.close()


@attack("host")
def fifo_in_package_at_submit(ctx):
    ep = _swe_after_run(ctx, "os.mkfifo('calc/zz_fifo.py')")
    try:
        t, box = _in_thread(lambda: (ep.execute(call("submit")), ep.score("")), 10.0)
        if t.is_alive():
            os.close(os.open(ep.workdir / "calc" / "zz_fifo.py", os.O_WRONLY | os.O_NONBLOCK))
            t.join(5)
            return Outcome(False, "submit blocked > 10 s")
        if "error" in box:
            return Outcome(False, f"raised {type(box['error']).__name__}: {str(box['error'])[:80]}")
        return Outcome(box["value"][1] == 0.0, f"reward {box['value'][1]}")
    finally:
        ep.close()


@attack("host")
def huge_line_view_and_search(ctx):
    ep = _swe_after_run(ctx, "open('calc/big.py', 'w').write('needle' + 'x' * (15 << 20) + '\\n')")
    try:
        v = ep.execute(call("view_file", path="calc/big.py"))
        s = ep.execute(call("search", pattern="needle"))
        n = max(len(v.text), len(s.text))
        return Outcome(n <= 100_000, f"view {len(v.text)} chars, search {len(s.text)} chars")
    finally:
        ep.close()


@attack("host")
def huge_directory_listing(ctx):
    ep = _swe_after_run(ctx, "os.makedirs('calc/d')\nfor i in range(20000):\n    try: open('calc/d/f%05d.py' % i, 'w').close()\n    except OSError: break")
    try:
        v = ep.execute(call("view_file", path="."))
        return Outcome(len(v.text) <= 100_000, f"listing {len(v.text)} chars")
    finally:
        ep.close()


# ---- limits ------------------------------------------------------------------------------------------


@attack("limits")
def memory_across_processes(ctx):
    """Six processes of 200 MB each under a 300 MB limit."""
    env = ctx.math_env(memory_mb=300, max_procs=32)
    code = (
        "import multiprocessing as mp, sys, time\n"
        "def hog(q):\n"
        "    b = bytearray(200 << 20)\n"
        "    for i in range(0, len(b), 4096): b[i] = 1\n"
        "    q.put(1); time.sleep(1.5)\n"
        "if __name__ == '__main__':\n"
        "    mp.set_start_method('fork')\n"
        "    q = mp.Queue(); ps = [mp.Process(target=hog, args=(q,)) for _ in range(6)]\n"
        "    [p.start() for p in ps]\n"
        "    n = 0\n"
        "    t = time.time()\n"
        "    while n < 6 and time.time() - t < 4:\n"
        "        try: q.get(timeout=0.2); n += 1\n"
        "        except Exception: pass\n"
        "        if not any(p.is_alive() for p in ps) and q.empty(): break\n"
        "    print('HELD', n * 200, 'MB')\n")
    out = _run_py(ctx, code, env)
    held = int(out.split("HELD", 1)[1].split()[0]) if "HELD" in out else 0
    return Outcome(held <= 300, out.strip()[-120:] if "HELD" in out else f"killed: {out.strip()[-80:]}")


@attack("limits")
def tmpfs_not_counted(ctx):
    """Fill the private /tmp with 200 MB, then allocate 200 MB, under a 300 MB limit."""
    env = ctx.math_env(memory_mb=300, tmpfs_mb=256)
    tag = uuid.uuid4().hex[:8]
    code = (
        "import os\n"
        "try:\n"
        "    for i in range(8):\n"
        f"        with open('/tmp/libra-adv-fill-{tag}-%d' % i, 'wb') as f:\n"
        "            for _ in range(25): f.write(b'1' * (1 << 20))\n"
        "    b = bytearray(200 << 20)\n"
        "    for i in range(0, len(b), 4096): b[i] = 1\n"
        "    print('BOTH 400 MB')\n"
        "except (OSError, MemoryError) as e: print('STOPPED', type(e).__name__)\n")
    out = _run_py(ctx, code, env)
    for p in glob.glob(f"/tmp/libra-adv-fill-{tag}-*"):  # only without a private /tmp (rlimits mode)
        os.unlink(p)
    return Outcome("BOTH" not in out, out.strip()[-80:] or "killed")


@attack("limits")
def disk_and_inode_quota(ctx):
    code = (
        "import os\n"
        "mb = files = 0\n"
        "try:\n"
        "    for i in range(25):\n"
        "        with open('big%d' % i, 'wb') as f:\n"
        "            for _ in range(8): f.write(b'0' * (1 << 20)); mb += 1\n"
        "except OSError: pass\n"
        "for i in range(25):\n"
        "    try: os.unlink('big%d' % i)\n"
        "    except OSError: pass\n"
        "try:\n"
        "    os.mkdir('many')\n"
        "    for i in range(30000):\n"
        "        open('many/%d' % i, 'w').close(); files += 1\n"
        "except OSError: pass\n"
        "print('WROTE', mb, 'MB', files, 'FILES')\n")
    env = ctx.math_env(timeout_s=30.0)
    out = _run_py(ctx, code, env)
    try:
        mb, files = int(out.split()[1]), int(out.split()[3])
    except (IndexError, ValueError):
        return Outcome(False, out.strip()[-80:])
    return Outcome(mb < 200 and files < 30000, out.strip())


@attack("limits")
def cpu_quota(ctx):
    """Two busy processes: the call's cgroup must hold them to its CPU quota (a quarter core).

    Contained when the cgroup reports throttled periods, or when the children's CPU time over the wall
    time stays near the quota (on a loaded host they may never reach the quota, so never get throttled)."""
    sb = ctx.math_sandbox(cpu_cores=0.25)
    with sb.workdir("cpu") as w:
        code = ("import multiprocessing as mp, os, time\n"
                "def spin():\n    t = time.time()\n    while time.time() - t < 0.6: pass\n"
                "if __name__ == '__main__':\n    t0 = time.time(); ps = [mp.Process(target=spin) for _ in range(2)]\n"
                "    [p.start() for p in ps]; [p.join() for p in ps]\n"
                "    c = os.times(); print((c.children_user + c.children_system) / (time.time() - t0))\n")
        r = sb.run([sys.executable, "-c", code], cwd=w)
    throttled = r.info.get("cpu_throttled_periods")
    try:
        cores_used = float(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Outcome(False, f"no CPU figure: {r.status} {r.stdout[-80:]!r} {r.stderr[-120:]!r}")
    return Outcome(bool(throttled) or cores_used <= 0.4, f"throttled periods: {throttled}, cores used: {cores_used:.2f}")


# ---- driver ----------------------------------------------------------------------------------------


def run_all(ctx: Ctx, only: list[str] | None = None) -> dict[str, dict]:
    results = {}
    for name, (cls, fn) in ATTACKS.items():
        if only and name not in only:
            continue
        t0 = time.monotonic()
        try:
            o = fn(ctx)
        except Exception as e:  # noqa: BLE001 - an exception escaping the env is the finding
            o = Outcome(False, f"raised {type(e).__name__}: {str(e)[:120]}")
        results[name] = {"class": cls, **asdict(o), "seconds": round(time.monotonic() - t0, 2)}
    for env in (ctx._swe, ctx._math):
        if env is not None:
            env.close()
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--isolation", default="auto")
    ap.add_argument("--root-dir", default="")
    ap.add_argument("--custom-root", default="", help="a root dir outside /tmp for other_episode_under_custom_root")
    ap.add_argument("--socket-dir", default="")
    ap.add_argument("--only", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    ctx = Ctx(isolation=args.isolation, root_dir=args.root_dir, socket_dir=args.socket_dir)
    ctx.notes["custom_root"] = args.custom_root
    results = run_all(ctx, [s for s in args.only.split(",") if s] or None)
    for name, r in results.items():
        print(f"{r['class']:<7} {name:<34} {'SAFE ' if r['safe'] else 'UNSAFE'} {r['detail']}", flush=True)
    if args.json:
        isolation = Sandbox(ctx.sandbox_cfg()).isolation
        Path(args.json).write_text(json.dumps({"isolation": isolation, "attacks": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
