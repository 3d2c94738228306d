"""Plug-ins: your own environment (`--env module.path:Class`) and reward (`--reward module.path:function`).

`--env` names a class implementing the `Env` protocol of envs/base.py (`name`, `tasks()`,
`start(task) -> Episode`, `close()`); it replaces the bench's env. It is constructed with the
keyword arguments it accepts among `seed`, `num_tasks`, `data_path` and `level` (so a class
that takes none is fine; `--data` given to a class without `data_path` is an error).

`--reward` names a function `reward(final_text: str, ground_truth, task: Task) -> float` that
replaces the env's `Episode.score`: `ground_truth` is `task.answer` (for `--data` rows, the
row's `reward_model.ground_truth`), `final_text` the model's last message. Tools still run in the
env's episodes. It may say why, returning `(value, reason)` (e.g. `(0.0, "no_answer")`) or an
`envs.base.Reward`: each step's metrics row then counts the trained rewards by reason (`score/<reason>`).

Algorithm: split the spec at ':', import the module (the current directory is searched too,
as `python -m` would), fetch the attribute, check its shape (the methods of the protocol; a
reward callable with three positional parameters). `check_plugins` also builds the env once,
checks its tasks (with `--demo-turns`, that each brings a demonstration: envs/demo.py) and calls
the reward on the first task, so a mistake ends the run before any
rank starts (engine/runtime/preflight.py). Torch-free, like all of envs/.

Invariants (tests/envs/test_plugins.py): every malformed spec, import failure, missing attribute,
non-Env class, non-Task task list, and reward of the wrong signature or return type is a
one-line ValueError naming the flag, the value and the fix; a valid env and reward run end to end.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import sys
from collections.abc import Callable

from envs.base import Env, Episode, Reward, Task, ToolCall, ToolCallError, ToolResult
from envs.demo import add_demo_turns

ENV_METHODS = ("tasks", "start", "close")
ENV_KWARGS = ("seed", "num_tasks", "data_path", "level")


def load_object(spec: str, flag: str):
    """The object `module.path:name` names; ValueError with the fix otherwise."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{flag} {spec!r} must be module.path:Name, e.g. {flag} examples.guess_env:GuessEnv")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{flag} {spec!r}: cannot import {module_name!r} ({exc}); "
                         "run from the directory that holds it or add that directory to PYTHONPATH") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in vars(module) if not n.startswith("_"))
            raise ValueError(f"{flag} {spec!r}: module {module_name!r} has no {attr!r}; it defines {public[:12]}")
        obj = getattr(obj, part)
    return obj


def env_class(spec: str) -> type:
    cls = load_object(spec, "--env")
    if not inspect.isclass(cls):
        raise ValueError(f"--env {spec!r} is a {type(cls).__name__}, not a class; name the class of your Env")
    missing = [m for m in ENV_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise ValueError(f"--env {spec!r} does not implement the Env protocol of envs/base.py: it lacks {missing}; "
                         "give it tasks(), start(task) and close() (see examples/guess_env.py)")
    return cls


def build_env(spec: str, **kwargs) -> Env:
    """Instantiate the `--env` class with the common keyword arguments it accepts (None values are left out)."""
    cls = env_class(spec)
    params = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    given = {k: v for k, v in kwargs.items() if k in ENV_KWARGS and v is not None}
    if given.get("data_path") and "data_path" not in params and not takes_any:
        raise ValueError(f"--data {given['data_path']!r}: --env {spec!r} takes no data_path argument; "
                         "add `data_path=None` to its __init__ or drop --data")
    env = cls(**{k: v for k, v in given.items() if k in params or takes_any})
    if not isinstance(getattr(env, "name", None), str):
        env.name = cls.__name__.lower()  # the protocol asks for a name; the class name is the obvious one
    return env


def reward_fn(spec: str) -> Callable:
    fn = load_object(spec, "--reward")
    if not callable(fn):
        raise ValueError(f"--reward {spec!r} is a {type(fn).__name__}, not a function")
    try:
        inspect.signature(fn).bind("text", None, None)
    except TypeError as exc:
        raise ValueError(f"--reward {spec!r} must take (final_text, ground_truth, task): {exc}") from None
    except ValueError:
        pass  # a builtin without a signature: trust it, its first call is checked
    return fn


def reward_value(spec: str, value, task: Task) -> Reward:
    """The reward a `--reward` function returned, as a `Reward` (its reason "" unless it gave one)."""
    reason = getattr(value, "reason", "")
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], str):
        value, reason = value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"--reward {spec!r} returned {value!r} for task {task.task_id}; return a finite float, "
                         "or (float, reason) to say why")
    return Reward(float(value), reason)


class RewardEpisode:
    """An env's episode whose score comes from the `--reward` function."""

    def __init__(self, inner: Episode, task: Task, fn: Callable, spec: str):
        self.inner, self.task, self.fn, self.spec = inner, task, fn, spec

    def execute(self, call: ToolCall | ToolCallError) -> ToolResult:
        return self.inner.execute(call)

    def score(self, final_text: str) -> float:
        return reward_value(self.spec, self.fn(final_text, self.task.answer, self.task), self.task)

    def close(self) -> None:
        self.inner.close()


class RewardEnv:
    """`env` with every episode scored by the `--reward` function."""

    def __init__(self, env: Env, spec: str):
        self.env, self.spec, self.fn = env, spec, reward_fn(spec)
        self.name = env.name

    def tasks(self) -> list[Task]:
        return self.env.tasks()

    def start(self, task: Task) -> Episode:
        return RewardEpisode(self.env.start(task), task, self.fn, self.spec)

    def close(self) -> None:
        self.env.close()


def check_tasks(spec: str, tasks) -> None:
    if not isinstance(tasks, list) or not tasks:
        raise ValueError(f"--env {spec!r}: tasks() returned {type(tasks).__name__} {str(tasks)[:60]!r}; return a non-empty list of envs.base.Task")
    bad = next((t for t in tasks if not isinstance(t, Task)), None)
    if bad is not None:
        raise ValueError(f"--env {spec!r}: tasks() holds a {type(bad).__name__}, not an envs.base.Task; build each with Task(task_id=..., ...)")
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"--env {spec!r}: task_id {dup!r} appears more than once; task ids must be unique")


def make_run_env(bench: str, *, env_spec: str = "", reward_spec: str = "", **kwargs) -> Env:
    """The env of a run: the bench's (envs/registry.py) or the `--env` class, scored by `--reward` if given."""
    if env_spec:
        env = build_env(env_spec, **kwargs)
    else:
        from envs.registry import make_env

        env = make_env(bench, **kwargs)
    return RewardEnv(env, reward_spec) if reward_spec else env


def check_plugins(bench: str, *, env_spec: str, reward_spec: str, demo_turns: int = 0, **kwargs) -> None:
    """Build the run's env once, check its tasks (and their demonstrations, for `demo_turns`) and one reward
    call; raises ValueError naming the fix."""
    env = make_run_env(bench, env_spec=env_spec, reward_spec=reward_spec, **kwargs)
    try:
        tasks = env.tasks()
        if env_spec:
            check_tasks(env_spec, tasks)
            if demo_turns > 0:  # a custom env has no scripted oracle: each task must bring its own (envs/demo.py)
                add_demo_turns(tasks, demo_turns, None)
        if reward_spec and tasks:
            try:
                value = env.fn("", tasks[0].answer, tasks[0])
            except Exception as exc:
                raise ValueError(f"--reward {reward_spec!r} raised {type(exc).__name__}: {exc} on task "
                                 f"{tasks[0].task_id} with an empty completion; it must score any text") from None
            reward_value(reward_spec, value, tasks[0])
    finally:
        env.close()
