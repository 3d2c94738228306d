"""Demonstration turns: show a small policy, in chat form, what a tool call looks like.

A 135M instruct model (SmolLM2) reads the tool list and the call format in the system message
and still answers in prose: on our level-0 tasks 1 of 200 samples (50 per env) writes a
well-formed `<tool_call>`. Shown one exchange first, 126 of 200 do: toy and swe 50/50, math 19/50,
search 7/50 (`python -m bench.toolcalls`, temperature 0.7, top-p 0.95). So
`add_demo_turns(tasks, k, oracle_actions)` puts k exchanges between each task's system message
and its own messages: another task's user message, then the env's scripted oracle's first
action on that task (the one that calls a tool). The tool's output is not shown: a model shown a
whole solved episode copies its final answer instead of calling tools.

Any env can supply its own: a task whose `meta["demonstration"]` (`DEMO_KEY`) holds an assistant
message that calls a tool is shown by that message instead of an oracle's (a `--data` row sets it
with `extra_info.demonstration`; a custom `--env` sets it on its tasks), so `--demo-turns` needs a
scripted oracle only for tasks that bring none.

Algorithm: tasks are taken in their list order; task i borrows its demonstrations from tasks
i+1 .. i+k (cyclically), so a demonstration never shows a task its own answer and the same
tasks always get the same prompt (resume, --compare).

Invariants (tests/envs/test_envs_demo.py): task ids, tools and answers are unchanged; every
demonstration comes from another task and holds a tool call; k=0 returns the tasks as they
were; a task's own demonstration wins over the oracle's; fewer than k+1 tasks, an oracle whose
actions call no tool, or a demonstration that calls none (or no oracle and no demonstration), is a
ValueError with the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from envs.base import Task
from envs.toolcalls import parse_tool_calls


DEMO_KEY = "demonstration"  # Task.meta key: an assistant message calling a tool, shown before other tasks
NO_DEMO_FIX = ("give each task a meta['demonstration'] (a --data row: extra_info.demonstration), an assistant message "
               "that calls a tool, or pass --demo-turns 0")


def demo_exchange(task: Task, oracle_actions: Callable[[Task], list[str]] | None) -> tuple[dict, dict]:
    """(user message, assistant message) of `task` solved up to its first tool call: its own
    demonstration when it brings one, else its oracle's first action that calls a tool."""
    given = task.meta.get(DEMO_KEY) if isinstance(task.meta, dict) else None
    if given is not None:
        if not isinstance(given, str) or not parse_tool_calls(given):
            raise ValueError(f"demo turns: task {task.task_id!r} has a {DEMO_KEY} that calls no tool "
                             f"({str(given)[:60]!r}); write one well-formed tool call in it, or pass --demo-turns 0")
        return _user_of(task), {"role": "assistant", "content": given}
    if oracle_actions is None:
        raise ValueError(f"demo turns: task {task.task_id!r} brings no demonstration and its env no scripted oracle; "
                         + NO_DEMO_FIX)
    try:
        actions = oracle_actions(task)
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        raise ValueError(
            f"demo turns: the {task.bench} oracle cannot script task {task.task_id!r} ({exc.__class__.__name__}: {exc}); "
            "tasks loaded with --data carry no oracle data: " + NO_DEMO_FIX
        ) from None
    first_call = next((a for a in actions if parse_tool_calls(a)), None)
    if first_call is None:
        raise ValueError(f"demo turns: the {task.bench} oracle calls no tool on task {task.task_id!r}; pass --demo-turns 0")
    return _user_of(task), {"role": "assistant", "content": first_call}


def _user_of(task: Task) -> dict:
    user = [m for m in task.messages if m["role"] == "user"]
    if not user:
        raise ValueError(f"demo turns: task {task.task_id!r} has no user message to show; pass --demo-turns 0")
    return dict(user[-1])


def add_demo_turns(tasks: list[Task], num_demos: int, oracle_actions: Callable[[Task], list[str]] | None) -> list[Task]:
    """`tasks` with `num_demos` demonstration exchanges after each one's system message."""
    if num_demos == 0:
        return list(tasks)
    if num_demos < 0:
        raise ValueError(f"demo turns: num_demos={num_demos} must be >= 0")
    if len(tasks) <= num_demos:
        raise ValueError(
            f"demo turns: {num_demos} demonstration(s) need at least {num_demos + 1} tasks, the bench gave {len(tasks)}; "
            "raise --num-tasks or lower --demo-turns"
        )
    exchanges = [demo_exchange(t, oracle_actions) for t in tasks]
    out = []
    for i, task in enumerate(tasks):
        demos = [m for j in range(1, num_demos + 1) for m in exchanges[(i + j) % len(tasks)]]
        head = 1 if task.messages and task.messages[0]["role"] == "system" else 0
        out.append(replace(task, messages=(*task.messages[:head], *demos, *task.messages[head:])))
    return out
