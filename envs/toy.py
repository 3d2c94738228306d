"""`toy`: a one-tool env a tiny random policy can learn in ~30 GRPO steps (the trainer's test).

Algorithm: task i asks the model to say one word W from a small vocabulary ("Say the word W.").
The tool `echo(text)` is optional: it returns its text, so a call is a cheap, always-successful
tool turn. Reward: 1.0 when W (case-insensitive, punctuation ignored) is among the first
`num_words` words of the final text (tags such as <answer> are ignored), 0.5 when it occurs
later, else 0.0. The partial credit gives GRPO a gradient before the model gets it exactly right.

Invariants (tests/envs/test_envs_toy.py): same seed -> same tasks; "W" scores 1, "xx yy zz W" 0.5,
"" 0; the oracle gets 1 and the wrong agent 0; bad calls give failure results.
"""

from __future__ import annotations

import random
import re

from envs.base import Episode, Task, ToolCall, ToolCallError, ToolResult, dispatch, system_prompt, tool_schema
from envs.toolcalls import format_tool_call

WORDS = ("red", "blue", "green", "gold")
ECHO_TOOL = tool_schema("echo", "Return the given text unchanged.", {"text": ("string", "text to echo")})
SYSTEM = system_prompt(
    "Say the word you are asked for. A tool `echo` is available but not needed.",
    format_tool_call("echo", {"text": "red"}),
    "write the word, e.g. <answer>red</answer>.",
)
_TAG_RE = re.compile(r"</?[a-z_]+>")


def toy_reward(final_text: str, word: str, num_words: int = 3) -> float:
    words = re.sub(r"[^a-z0-9 ]", " ", _TAG_RE.sub(" ", final_text.lower())).split()
    if word in words[:num_words]:
        return 1.0
    return 0.5 if word in words else 0.0


class ToyEpisode:
    def __init__(self, task: Task, num_words: int):
        self.task, self.num_words = task, num_words

    def _echo(self, text: str) -> ToolResult:
        return ToolResult(tool="echo", text=text, status="success")

    def execute(self, call: ToolCall | ToolCallError) -> ToolResult:
        return dispatch(call, self.task.tools, {"echo": self._echo}, max_arg_bytes=4096)

    def score(self, final_text: str) -> float:
        return toy_reward(final_text, self.task.answer, self.num_words)

    def close(self) -> None:
        pass


class ToyEnv:
    name = "toy"

    def __init__(self, seed: int = 0, num_tasks: int | None = 16, *, data_path: str | None = None,
                 level: int | None = None, num_words: int = 3):
        if data_path is not None:
            raise ValueError(f"toy: data_path={data_path!r} is not supported; the toy env only generates its tasks, pass data_path=None.")
        if num_words < 1:
            raise ValueError(f"toy: num_words={num_words} must be >= 1; the reward looks at the first num_words words.")
        rng = random.Random(f"toy-{seed}")
        n = 16 if num_tasks is None else num_tasks
        self.num_words = num_words
        self._tasks = [
            Task(task_id=f"toy-{seed}-{i}", bench="toy", answer=(w := rng.choice(WORDS)), tools=(ECHO_TOOL,),
                 messages=({"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Say the word {w}."}))
            for i in range(n)
        ]

    def tasks(self) -> list[Task]:
        return list(self._tasks)

    def start(self, task: Task) -> Episode:
        return ToyEpisode(task, self.num_words)

    def close(self) -> None:
        pass


def oracle_actions(task: Task) -> list[str]:
    return [format_tool_call("echo", {"text": task.answer}), f"<answer>{task.answer}</answer>"]


def wrong_actions(task: Task) -> list[str]:
    return [f"<answer>{next(w for w in WORDS if w != task.answer)}</answer>"]
