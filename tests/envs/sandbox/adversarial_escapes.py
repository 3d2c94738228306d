"""Attacks that try to leave the sandbox: other episodes, the interpreter, daemons, sockets, symlinks."""

from __future__ import annotations

import glob
import os
import socket
import sys
import time
import uuid
from pathlib import Path

from adversarial_base import INIT_HEAD, Outcome, attack, calc_task, call, kill_all, procs_with, run_py
from envs.math import env as mathenv  # noqa: E402 - adversarial_base puts the repo on sys.path
from envs.sandbox.sandbox import Sandbox, SandboxConfig  # noqa: E402

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
        out = run_py(ctx, _UMOUNT_AND_HUNT.replace("{root}", root or "/tmp"), env)
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
    out = run_py(ctx, code)
    for p in glob.glob(os.path.join(sys.prefix, "libra_backdoor_*")):
        os.unlink(p)
    return Outcome("WROTE" not in out and "DENIED" in out, out.strip()[:120])


@attack("escape")
def basic_call_works(ctx):
    """Not an attack: a trivial program must run (non-root with a venv under /tmp used to fail)."""
    out = run_py(ctx, "print(6 * 7)")
    return Outcome(out.strip() == "42", out.strip()[:160])


@attack("escape")
def setsid_daemon_empty_env(ctx):
    tag = f"{4000 + os.getpid() % 1000}.{uuid.uuid4().int % 10**6}"
    code = f"import subprocess\nsubprocess.Popen(['setsid', 'env', '-i', '/bin/sleep', '{tag}'])\nprint('spawned')"
    out = run_py(ctx, code)
    time.sleep(0.3)
    left = procs_with(tag)
    kill_all(left)
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
        out = run_py(ctx, code)
    finally:
        srv.close()
    return Outcome("BLOCKED" in out, out.strip()[:80])


def _host_unix_socket(d: str, kind=socket.SOCK_STREAM) -> tuple[socket.socket, str]:
    path = os.path.join(d, f"libra-adv-{uuid.uuid4().hex[:8]}.sock")
    srv = socket.socket(socket.AF_UNIX, kind)
    srv.bind(path)
    os.chmod(path, 0o777)
    if kind == socket.SOCK_STREAM:
        srv.listen(1)
    return srv, path


_CONNECT = ("import socket\n"
            "try:\n    s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect({path!r}); print('CONNECTED')\n"
            "except OSError as e: print('BLOCKED', e.errno)\n")


@attack("escape")
def unix_socket_outside_hidden_dirs(ctx):
    d = ctx.socket_dir or ("/run" if os.access("/run", os.W_OK) else "")
    if not d:
        return Outcome(True, "skipped: no writable socket dir")
    srv, path = _host_unix_socket(d)
    try:
        out = run_py(ctx, _CONNECT.format(path=path))
    finally:
        srv.close()
        os.unlink(path)
    return Outcome("BLOCKED" in out, out.strip()[:80])


@attack("escape")
def unix_socket_made_after_start_in_a_bound_dir(ctx):
    """A host socket made after the sandbox started, in a dir the sandbox binds (the interpreter's prefix)."""
    ctx.math_env()  # the sandbox exists before the socket does
    d = next((p for p in (sys.prefix, os.path.dirname(sys.executable)) if os.access(p, os.W_OK)), "")
    if not d:
        return Outcome(True, "skipped: no writable bound dir")
    srv, path = _host_unix_socket(d)
    dgram, dpath = _host_unix_socket(d, socket.SOCK_DGRAM)
    try:
        out = run_py(ctx, _CONNECT.format(path=path) + (
            "try:\n    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM); a.sendto(b'x', %r); print('SENT')\n"
            "except OSError as e: print('BLOCKED', e.errno)\n" % dpath))
    finally:
        for sock, p in ((srv, path), (dgram, dpath)):
            sock.close()
            os.unlink(p)
    return Outcome(out.count("BLOCKED") == 2, out.strip()[:120])


@attack("escape")
def socketpair_raw_is_a_datagram_to_host_sockets(ctx):
    """Issue 30: socketpair(AF_UNIX, SOCK_RAW) passed a guard that denied only SOCK_DGRAM; the kernel makes it a
    datagram pair that sendto()s a host datagram socket. Every type but stream/seqpacket must fail at creation."""
    ctx.math_env()
    d = ctx.socket_dir or next((p for p in (sys.prefix, os.path.dirname(sys.executable)) if os.access(p, os.W_OK)), "")
    if not d:
        return Outcome(True, "skipped: no writable socket dir")
    dgram, path = _host_unix_socket(d, socket.SOCK_DGRAM)
    code = ("import socket\n"
            "for typ in (socket.SOCK_RAW, socket.SOCK_RAW | socket.SOCK_NONBLOCK, socket.SOCK_DGRAM, 9, 15):\n"
            "    try:\n        a, b = socket.socketpair(socket.AF_UNIX, typ); a.sendto(b'x', %r); print('SENT', typ)\n"
            "    except OSError as e: print('BLOCKED', typ, e.errno)\n" % path)
    try:
        out = run_py(ctx, code)
        dgram.setblocking(False)
        try:
            got = dgram.recv(16)
        except BlockingIOError:
            got = b""
    finally:
        dgram.close()
        os.unlink(path)
    lines = out.strip().splitlines()
    blocked = len(lines) == 5 and all(ln.startswith("BLOCKED") and ln.endswith(" 13") for ln in lines)
    return Outcome(blocked and not got, "; ".join(lines)[:160] + f"; host got {got!r}")


@attack("escape")
def non_ip_socket_families(ctx):
    """vsock reaches the VM host and netlink the kernel; only TCP/UDP (useless without interfaces) may be opened."""
    code = ("import socket\nfor fam in (40, 16, 17, 1):\n"
            "    try: socket.socket(fam, socket.SOCK_DGRAM if fam == 17 else socket.SOCK_STREAM if fam in (1, 40) else socket.SOCK_RAW); print('OPENED', fam)\n"
            "    except OSError as e: print('BLOCKED', fam, e.errno)\n")
    out = run_py(ctx, code)
    return Outcome("OPENED" not in out and out.count("BLOCKED") == 4, out.strip().replace("\n", "; ")[:160])


@attack("escape")
def reopen_setup_pipe_through_proc(ctx):
    """Every descriptor the sandbox inherits is reachable again read-write through /proc/self/fd:
    draining the set-up pipe made the next calls fail as infra errors (a dropped trajectory, not a 0)."""
    code = ("import os\nopen_fds = []\n"
            "for fd in os.listdir('/proc/self/fd'):\n"
            "    if int(fd) > 2:\n"
            "        try:\n"
            "            f = os.open('/proc/self/fd/' + fd, os.O_RDONLY | os.O_NONBLOCK); os.read(f, 64); open_fds.append(fd)\n"
            "        except OSError: pass\n"
            "print('HOST_FDS', open_fds)\n")
    env = ctx.math_env()
    ep = env.start(env.tasks()[0])
    try:
        outs = [ep.execute(call("python", code=code)) for _ in range(3)]
    finally:
        ep.close()
    texts = [r.text.strip() for r in outs]
    # the listing's own fd is gone by the time it is read, so nothing may have been readable
    return Outcome(all(r.status == "success" and "HOST_FDS []" in r.text for r in outs), " | ".join(texts)[:160])


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
    ep = env.start(calc_task(ctx))
    loop = _SWAP_LOOP.format(d=str(ep.workdir / "calc"), t=str(secret))
    code = ("import os, subprocess, sys\n"
            "if not os.path.exists('.spawned'):\n"
            "    open('.spawned', 'w').close()\n"
            f"    subprocess.Popen(['setsid', 'env', '-i', sys.executable, '-c', {loop!r}])\n")
    try:
        r = ep.execute(call("replace", path="calc/__init__.py", old=INIT_HEAD, new=code + INIT_HEAD))
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
        kill_all(procs_with("os.link(d + '/.real'"))
        ep.close()
        secret.unlink()
        secret_dir.rmdir()


@attack("escape")
def host_process_through_proc(ctx):
    """Issue 30 (rlimits mode, not root): a call ran as the runtime's own uid, read a secret from the runtime's
    /proc/<ppid>/environ and a hidden value from its memory, and the next call SIGKILLed it. The attacker is handed
    the runtime's pid; reading its environ, memory or fds, or being allowed to signal it (signal 0), is unsafe."""
    pid = os.getpid()
    code = ("import os\ngot = []\n"
            f"for p in sorted({{os.getppid(), {pid}}}):\n"
            "    for what, path in (('environ', f'/proc/{p}/environ'), ('mem', f'/proc/{p}/mem')):\n"
            "        try: open(path, 'rb').read(1); got.append(f'{what}:{p}')\n"
            "        except OSError: pass\n"
            "    try: os.listdir(f'/proc/{p}/fd'); got.append(f'fds:{p}')\n"
            "    except OSError: pass\n"
            "    try:\n"
            "        if p > 1: os.kill(p, 0); got.append(f'signal:{p}')\n"
            "    except OSError: pass\n"
            "print('GOT', got)\n")
    out = run_py(ctx, code)
    return Outcome("GOT []" in out, out.strip()[:160])


@attack("escape")
def other_episode_process_and_workdir(ctx):
    """Issue 30 (rlimits mode, any uid): every call ran as one uid with no PID namespace, so an episode killed its
    siblings' reference runs and overwrote another episode's correct fix. While a victim episode's call runs, an
    attacker episode looks for it through /proc (its cwd is the victim's work dir, whose path it is handed), tries
    to signal it (signal 0: the permission alone) and writes into the victim's work dir."""
    import threading

    env = ctx.math_env()
    victim, attacker = env.start(env.tasks()[0]), env.start(env.tasks()[1])
    vdir = str(victim.workdir)
    started = victim.workdir / "started"
    # the victim runs until the attack is over (the host then writes `done` into its work dir), 6 s at most
    runner = threading.Thread(target=victim.execute, args=(call("python", code=(
        "import os, time\nopen('started', 'w').close()\nt0 = time.monotonic()\n"
        "while not os.path.exists('done') and time.monotonic() - t0 < 6:\n    time.sleep(0.05)\n")),))
    try:
        runner.start()
        deadline = time.monotonic() + 8
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        code = ("import os\nfound, signalled, wrote = [], [], []\n"
                "for p in os.listdir('/proc'):\n"
                "    try:\n"
                f"        if p.isdigit() and int(p) != os.getpid() and os.readlink(f'/proc/{{p}}/cwd') == {vdir!r}: found.append(p)\n"
                "    except OSError: pass\n"
                "for p in found:\n"
                "    try: os.kill(int(p), 0); signalled.append(p)\n"
                "    except OSError: pass\n"
                "try:\n"
                f"    open({vdir!r} + '/pwned', 'w').write('x'); wrote.append('pwned')\n"
                "except OSError as e: pass\n"
                "print('FOUND', len(found), 'SIGNALLED', signalled, 'WROTE', wrote)\n")
        out = attacker.execute(call("python", code=code)).text
        pwned = (victim.workdir / "pwned").exists()
        (victim.workdir / "done").touch()
        return Outcome(started.exists() and "SIGNALLED [] WROTE []" in out and not pwned,
                       f"victim {'running' if started.exists() else 'never started'}; {out.strip()[:140]}")
    finally:
        (victim.workdir / "done").touch()
        runner.join()
        attacker.close()
        victim.close()
