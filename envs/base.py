"""Agentic environment contract: tasks, tool calls, tool results, episodes.

An `Env` owns a set of `Task`s. The rollout engine starts one `Episode` per trajectory, feeds it
every tool call the model writes (parsed from the Hermes format
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), appends each `ToolResult.text` to the
conversation inside `<tool_response>...</tool_response>`, and when the model stops calling tools
(or a tool result says `done`) asks the episode for the reward.

Threading: the engine runs `Episode.execute` on a worker thread, off the decode loop. Calls on
one episode never overlap; calls on different episodes do.

Failures: a bad call (malformed JSON, unknown tool, bad arguments, a command that fails or times
out) is the model's doing and becomes a `ToolResult` with status failure/timeout that the model
sees. `ToolInfraError` is for the environment itself breaking (sandbox cannot start, disk
full): the trajectory is dropped with a counted reason, never scored 0.

Invariants (tests/test_envs_*.py): every malformed call yields a failure ToolResult, never an
exception; `ToolResult.outcome()` is a pure function of (tool, size, status, thresholds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from scheduler.api import OutcomeState


class ToolInfraError(RuntimeError):
    """The tool infrastructure failed (not the model's call): drop the trajectory, count why."""


@dataclass(frozen=True, kw_only=True)
class Task:
    task_id: str  # unique and stable for a (bench, seed)
    bench: str  # "swe" | "search" | "math" | "toy" | ...
    messages: tuple[dict, ...]  # chat messages to start from: [{"role": "system"|"user", "content": str}]
    tools: tuple[dict, ...]  # OpenAI function schemas: {"type": "function", "function": {name, description, parameters}}
    answer: Any = None  # hidden checker data, JSON-able (never shown to the policy)
    level: int = 0  # difficulty, 0 = easiest
    meta: dict = field(default_factory=dict)  # anything else JSON-able (source file, hops, ...)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict
    raw: str = ""  # the text between the tags, as the model wrote it


@dataclass(frozen=True)
class ToolCallError:
    """A tool call that could not be parsed; the engine turns it into a failure result."""

    message: str  # what is wrong and what a valid call looks like
    raw: str = ""


@dataclass(frozen=True, kw_only=True)
class SizeThresholds:
    small_max_bytes: int = 512  # payloads up to this are "small"
    medium_max_bytes: int = 4096  # up to this "medium", above "large"


@dataclass(frozen=True, kw_only=True)
class ToolResult:
    tool: str  # tool name ("<parse>" for an unparseable call)
    text: str  # what the model sees inside <tool_response>
    status: str  # "success" | "failure" | "timeout"
    latency_s: float = 0.0
    done: bool = False  # the episode ended with this call (e.g. submit)

    @property
    def size_bytes(self) -> int:
        return len(self.text.encode("utf-8", "replace"))

    def outcome(self, thresholds: SizeThresholds = SizeThresholds()) -> OutcomeState:
        n = self.size_bytes
        size = "small" if n <= thresholds.small_max_bytes else "medium" if n <= thresholds.medium_max_bytes else "large"
        return OutcomeState(self.tool, size, self.status)


class Episode(Protocol):
    """One trajectory's environment state (a work dir, a sandbox, ...)."""

    def execute(self, call: ToolCall | ToolCallError) -> ToolResult: ...

    def score(self, final_text: str) -> float:
        """Reward of the finished trajectory; `final_text` is the model's last message."""
        ...

    def close(self) -> None: ...


class Env(Protocol):
    name: str

    def tasks(self) -> list[Task]: ...

    def start(self, task: Task) -> Episode: ...

    def close(self) -> None: ...
