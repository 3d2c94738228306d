"""Adversarial attacks through the envs' real tool APIs (tests/envs/sandbox/adversarial_drivers.py), in every mode.

Each attack class of issue 16 (reward without a fix, a crashed rank, sandbox escapes, unbounded
host-side tools, per-process limits) is driven as a model would drive it, and must come out
`safe`: reward 0, contained, and no exception out of `execute`/`score`. Three runs:
  - as the runtime's own user, in this process (root on CI: the host-side tools run as root);
  - as an unprivileged user: a subprocess dropped to uid 65534 (when we are root; otherwise the
    first run already is unprivileged), with the interpreter made reachable in a private mount
    namespace so that it is the same interpreter and packages;
  - in the explicit rlimits mode (as root; without root the runtime refuses it), where only the
    attacks its warning names as lacking (RLIMITS_LACKS: the network and the filesystem view; and
    RLIMITS_MAY_LACK where the kernel gives it no PID namespace) may succeed, and the warning must
    name them. Issue 30's findings each have a driver: host_process_through_proc (a call reading or
    signalling the runtime), other_episode_process_and_workdir (one episode's call signalling
    another's process or writing its work dir), grader_hang_is_a_scored_timeout (a hanging package
    or a busy sandbox: a swe grading is a 0 with reason `timeout` within its deadline).
Where the machine gives no writable cgroup (an unprivileged user here) the per-call limits
(LIMIT_LACKS) are exempt only if the sandbox names that lack in its `isolation` and warning.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import adversarial_drivers as adv
from cli_helpers import expose_interpreter
from envs.sandbox.sandbox import Sandbox, SandboxConfig

DRIVER = Path(adv.__file__).resolve()
NOBODY = 65534
# What the rlimits mode lacks by design, each named in its warning (envs/sandbox/sandbox.py `_rlimits_lacks`).
RLIMITS_LACKS = {
    "read_task_index": "no private filesystem",
    "import_pristine_checkout": "swe rewards can be earned without a fix",
    "pristine_module_via_dir_fd": "swe rewards can be earned without a fix",
    "loopback_port": "no network namespace",
    "umount_to_other_episodes": "work dirs of other episodes",
    "other_episode_under_custom_root": "work dirs of other episodes",
    "tmpfs_not_counted": "no private /tmp",
}
# What rlimits mode lacks only where the kernel gives it no PID namespace (it takes one where it can),
# named in its `isolation` and warning when it does.
RLIMITS_MAY_LACK = {"other_episode_process_and_workdir": "no PID namespace"}
# What a machine may lack in any mode (no cgroup we may write, not root), each named in the
# sandbox's `isolation` and its warning when it does.
LIMIT_LACKS = {
    "memory_across_processes": "no cgroups",
    "tmpfs_not_counted": "no cgroups",
    "cpu_quota": "no cgroups",
    "disk_and_inode_quota": "work dir size polled during each call",
}


def _namespaces_work() -> str | None:
    try:
        Sandbox(SandboxConfig())
        return None
    except RuntimeError as e:
        return str(e)


NO_NS = _namespaces_work()
needs_ns = pytest.mark.skipif(NO_NS is not None, reason=f"user namespaces unavailable: {NO_NS}")


def _assert_safe(results: dict, isolation: str, allowed: dict[str, str] = {}) -> None:
    """Every attack safe, except those in `allowed` or LIMIT_LACKS whose lack `isolation` names."""
    assert set(results) == set(adv.ATTACKS), sorted(set(adv.ATTACKS) ^ set(results))
    allowed = {**allowed, **{k: why for k, why in LIMIT_LACKS.items() if why in isolation}}
    unsafe = {k: f"{v['class']}: {v['detail']}" for k, v in results.items() if not v["safe"] and k not in allowed}
    assert unsafe == {}, isolation


def _custom_root() -> Path:
    # a work-dir root outside /tmp (the old sandbox only hid episodes under /tmp)
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    path = Path(tempfile.mkdtemp(prefix="libra-adv-", dir=base))
    path.chmod(0o755)
    return path


def _run_driver(args: list[str], *, uid: int | None) -> tuple[dict, str]:
    """The drivers' results in a subprocess (`uid`: dropped to it): ({attack: {...}}, the sandbox's isolation)."""
    work = Path(tempfile.mkdtemp(prefix="libra-adv-out-"))  # not tmp_path: /tmp/pytest-of-root is 0700
    work.chmod(0o777)
    out = work / "results.json"
    argv = [sys.executable, str(DRIVER), "--json", str(out), *args]
    if os.geteuid() == 0:
        argv = expose_interpreter(argv, uid=uid, stage=work / "stage")
    env = {**os.environ, "HOME": str(work), "TMPDIR": "/tmp"}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=400, env=env, cwd=str(DRIVER.parents[3]))
        assert proc.returncode == 0 and out.exists(), proc.stderr[-3000:]
        data = json.loads(out.read_text())
        return data["attacks"], data["isolation"]
    finally:
        shutil.rmtree(work, ignore_errors=True)


@needs_ns
def test_every_attack_is_contained_as_the_runtime_user():
    root = _custom_root()
    try:
        ctx = adv.Ctx(isolation="auto", socket_dir="/run" if os.access("/run", os.W_OK) else "")
        ctx.notes["custom_root"] = str(root)
        _assert_safe(adv.run_all(ctx), Sandbox(ctx.sandbox_cfg()).isolation)
    finally:
        shutil.rmtree(root)


@needs_ns
@pytest.mark.skipif(os.geteuid() != 0, reason="already unprivileged: the runtime-user test is the unprivileged run")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="util-linux setpriv is needed to drop to uid 65534")
def test_every_attack_is_contained_as_an_unprivileged_user():
    sock = Path(tempfile.mkdtemp(prefix="libra-adv-sock-"))  # a host socket dir the unprivileged runtime can use
    sock.chmod(0o777)
    try:
        results, isolation = _run_driver(["--socket-dir", str(sock)], uid=NOBODY)
    finally:
        shutil.rmtree(sock, ignore_errors=True)
    _assert_safe(results, isolation)


@pytest.mark.skipif(os.geteuid() != 0, reason="rlimits mode is refused without root (tests/envs/sandbox/test_sandbox.py)")
def test_rlimits_mode_contains_all_but_what_its_warning_names(caplog):
    with caplog.at_level("WARNING", logger="envs.sandbox.sandbox"):
        isolation = Sandbox(SandboxConfig(isolation="rlimits")).isolation
    for lack in set(RLIMITS_LACKS.values()):
        assert lack in isolation, lack
    root = _custom_root()
    root.chmod(0o777)
    try:
        results, isolation = _run_driver(["--isolation", "rlimits", "--custom-root", str(root)], uid=None)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    may_lack = {k: why for k, why in RLIMITS_MAY_LACK.items() if why in isolation}
    _assert_safe(results, isolation, allowed={**RLIMITS_LACKS, **may_lack})
