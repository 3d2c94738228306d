"""What every adversarial attack shares: the outcome, the context with its envs, the registry, helpers.

An attack is a function `(ctx) -> Outcome(safe, detail)` registered with `@attack(class)` in one of
the attack modules (tests/envs/sandbox/adversarial_reward.py, adversarial_escapes.py, adversarial_limits.py);
tests/envs/sandbox/adversarial_drivers.py runs them. Imports no torch, so it runs in a bare venv as an
unprivileged user.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from envs.math import env as mathenv  # noqa: E402
from envs.swe import env as swe  # noqa: E402
from envs.base import ToolCall  # noqa: E402
from envs.sandbox.sandbox import Sandbox, SandboxConfig  # noqa: E402


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
        # it hides what the swe bench hides, so the attacks that look for the swe data through the python
        # tool (read_task_index) check the protection a swe run's sandbox gives
        return Sandbox(self.sandbox_cfg(**{"timeout_s": 10.0, **kw}).hiding(swe.HIDDEN_DATA_DIRS))

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


def calc_task(ctx):
    env = ctx.swe_env()
    return next(t for t in env.tasks() if t.meta["file"] == "calc/evaluator.py" and t.level == 0)


INIT_HEAD = '"""A tiny arithmetic'


def swe_with_init(ctx, code: str):
    """A calc episode whose package __init__ runs `code` first (one `replace`, as a model would)."""
    env = ctx.swe_env()
    ep = env.start(calc_task(ctx))
    r = ep.execute(call("replace", path="calc/__init__.py", old=INIT_HEAD, new=code + "\n" + INIT_HEAD))
    assert r.status == "success", r.text
    return ep


def reward_after_submit(ctx, code: str) -> Outcome:
    ep = swe_with_init(ctx, code)
    try:
        r = ep.execute(call("submit"))
        reward = ep.score("")
        return Outcome(reward == 0.0, f"reward {reward} ({r.text})")
    finally:
        ep.close()


def run_py(ctx, code: str, env=None) -> str:
    env = env or ctx.math_env()
    ep = env.start(env.tasks()[0])
    try:
        return ep.execute(call("python", code=code)).text
    finally:
        ep.close()


def procs_with(needle: str) -> list[int]:
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if needle.encode() in (d / "cmdline").read_bytes():
                out.append(int(d.name))
        except OSError:
            continue
    return out


def kill_all(pids):
    for pid in pids:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
