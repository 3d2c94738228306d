"""An environment of your own: guess a secret number with a `guess` tool that says higher or lower.

    python libra.py --env examples.guess_env:GuessEnv --model tiny --steps 2

This file is the whole user code. A Libra env is a class with `tasks()`, `start(task)` and
`close()` (the `Env` protocol of envs/base.py); `start` returns an episode with `execute(call)`
(run one tool call the model wrote, return a `ToolResult`), `score(final_text)` (the reward
when the model stops calling tools) and `close()`. Tools are OpenAI function schemas;
`dispatch` turns every malformed call into a failure result the model sees. A task's
`meta["demonstration"]`, one assistant message that calls a tool, is what `--demo-turns N`
shows a small policy before other tasks (envs/demo.py).
Tested by tests/envs/test_plugins.py (scripted oracle scores 1, a wrong answer 0, a real run trains on it).
"""

import random
import re

from envs.base import Task, ToolResult, dispatch, system_prompt, tool_schema
from envs.toolcalls import format_tool_call

GUESS = tool_schema("guess", "Guess the secret number; says higher, lower or correct.",
                    {"number": ("integer", "your guess")})
SYSTEM = system_prompt(
    "I picked a secret whole number from 1 to 16. Find it with the `guess` tool.",
    format_tool_call("guess", {"number": 8}),
    "write the number as <answer>N</answer>.",
)


class GuessEpisode:
    def __init__(self, task: Task):
        self.task = task

    def _guess(self, number: int) -> ToolResult:
        secret = self.task.answer
        text = "correct" if number == secret else "higher" if number < secret else "lower"
        return ToolResult(tool="guess", text=text, status="success")

    def execute(self, call) -> ToolResult:
        return dispatch(call, self.task.tools, {"guess": self._guess})

    def score(self, final_text: str) -> float:
        found = re.findall(r"<answer>\s*(-?\d+)\s*</answer>", final_text)
        return 1.0 if found and int(found[-1]) == self.task.answer else 0.0

    def close(self) -> None:
        pass


class GuessEnv:
    name = "guess"

    def __init__(self, seed: int = 0, num_tasks: int | None = None):
        rng = random.Random(f"guess-{seed}")
        self._tasks = [
            Task(task_id=f"guess-{seed}-{i}", bench="guess", tools=(GUESS,), answer=rng.randint(1, 16),
                 messages=({"role": "system", "content": SYSTEM}, {"role": "user", "content": "Find my number."}),
                 meta={"demonstration": format_tool_call("guess", {"number": 8})})  # what --demo-turns shows
            for i in range(num_tasks or 16)
        ]

    def tasks(self) -> list[Task]:
        return list(self._tasks)

    def start(self, task: Task) -> GuessEpisode:
        return GuessEpisode(task)

    def close(self) -> None:
        pass
