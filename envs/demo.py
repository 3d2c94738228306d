"""Demonstration turns: show a small policy, in chat form, what a tool call looks like.

A 135M instruct model (SmolLM2) reads the tool list and the call format in the system message
and still answers in prose: on our level-0 tasks 1 of 200 samples (50 per env) writes a
well-formed `<tool_call>`. Shown one exchange first, 126 of 200 do: toy and swe 50/50, math 19/50,
search 7/50 (`python -m bench.toolcalls`, temperature 0.7, top-p 0.95). So
`add_demo_turns(tasks, k, oracle_actions)` puts k exchanges between each task's system message
and its own messages: another task's user message, then the env's scripted oracle's first
action on that task (the one that calls a tool). The tool's output is not shown: a model shown a
whole solved episode copies its final answer instead of calling tools.

Algorithm: tasks are taken in their list order; task i borrows its demonstrations from tasks
i+1 .. i+k (cyclically), so a demonstration never shows a task its own answer and the same
tasks always get the same prompt (resume, --compare).

Invariants (tests/envs/test_envs_demo.py): task ids, tools and answers are unchanged; every
demonstration comes from another task and holds a tool call; k=0 returns the tasks as they
were; fewer than k+1 tasks, or an oracle whose actions call no tool, is a ValueError with the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from envs.base import Task
from envs.toolcalls import parse_tool_calls


def demo_exchange(task: Task, oracle_actions: Callable[[Task], list[str]]) -> tuple[dict, dict]:
    """(user message, assistant message) of `task` solved up to its first tool call."""
    try:
        actions = oracle_actions(task)
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        raise ValueError(
            f"demo turns: the {task.bench} oracle cannot script task {task.task_id!r} ({exc.__class__.__name__}: {exc}); "
            "tasks loaded with --data carry no oracle data: pass --demo-turns 0"
        ) from None
    first_call = next((a for a in actions if parse_tool_calls(a)), None)
    if first_call is None:
        raise ValueError(f"demo turns: the {task.bench} oracle calls no tool on task {task.task_id!r}; pass --demo-turns 0")
    user = [m for m in task.messages if m["role"] == "user"]
    if not user:
        raise ValueError(f"demo turns: task {task.task_id!r} has no user message to show; pass --demo-turns 0")
    return dict(user[-1]), {"role": "assistant", "content": first_call}


def add_demo_turns(tasks: list[Task], num_demos: int, oracle_actions: Callable[[Task], list[str]]) -> list[Task]:
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
