"""A dense-reward task a random policy can climb: reply with digits only.

    python libra.py --env examples.digits_env:DigitEnv --model tiny --steps 30

The reward is the share of digit characters in the reply, so even the tiny random policy gets
a graded signal from its first step (envs/toy.py's word answers are never sampled by it).
`bench/convergence.py` trains it to a reward target with every system; tests/engine/runtime/test_learning.py
checks that GRPO climbs it.
"""

from envs.base import Task, ToolCall, ToolCallError, ToolResult


class DigitEpisode:
    def execute(self, call: ToolCall | ToolCallError) -> ToolResult:
        return ToolResult(tool="<none>", text="this task has no tools", status="failure")

    def score(self, final_text: str) -> float:
        chars = [c for c in final_text if not c.isspace()]
        return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0

    def close(self) -> None:
        pass


class DigitEnv:
    name = "digits"

    def __init__(self, num_tasks: int | None = None):
        self._tasks = [Task(task_id=f"digits-{i}", bench="digits", tools=(),
                            messages=({"role": "user", "content": f"Reply with digits only, please ({i})."},))
                       for i in range(num_tasks or 8)]

    def tasks(self) -> list[Task]:
        return list(self._tasks)

    def start(self, task: Task) -> DigitEpisode:
        return DigitEpisode()

    def close(self) -> None:
        pass
