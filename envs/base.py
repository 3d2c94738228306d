"""Agentic environment contract: tasks, tool calls, tool results, episodes.

An `Env` owns a set of `Task`s. The rollout engine starts one `Episode` per trajectory, feeds it
every tool call the model writes (parsed from the Hermes format
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, envs/toolcalls.py), appends each
`ToolResult.text` to the conversation inside `<tool_response>...</tool_response>`, and when the
model stops calling tools (or a tool result says `done`) asks the episode for the reward.

Threading: the engine runs `Episode.execute` on a worker thread, off the decode loop. Calls on
one episode never overlap; calls on different episodes do.

Failures: a bad call (malformed JSON, unknown tool, bad arguments, a command that fails or times
out) is the model's doing and becomes a `ToolResult` with status failure/timeout that the model
sees. `ToolInfraError` is for the environment itself breaking (sandbox cannot start, disk
full): the trajectory is dropped with a counted reason, never scored 0.

Helpers every env shares: `parse_tool_calls` (Hermes tags -> ToolCall | ToolCallError, in
order; re-exported with both types from envs/toolcalls.py, the format's one home), `validate_call` (a call against the task's OpenAI schemas: unknown tool, missing, extra
or wrong-typed arguments, oversized strings), `dispatch` (parse error / validation / handler ->
ToolResult), `tool_schema` (concise schema builder), `system_prompt`, and `run_scripted` (drives
an env with scripted assistant messages for tests and workload profiles).

Model-caused faults never raise: `parse_tool_calls` turns huge integers, deep nesting and lone
surrogates into `ToolCallError`s; `validate_call` refuses arguments that are not valid Unicode;
`dispatch` turns any other exception a handler raises (except `ToolInfraError`) into a failure
result and counts it in the env's `faults` counter by "tool:ExceptionType".

Invariants (tests/envs/test_envs_base.py, tests/envs/sandbox/test_adversarial.py): every malformed call yields a
failure ToolResult, never an exception; `ToolResult.outcome()` is a pure function of (tool,
size, status, thresholds); text without `<tool_call>` parses to [].
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

# the call format lives in envs/toolcalls.py; the parsed types, the parser and its depth limit are re-exported here
from envs.toolcalls import (
    MAX_ARG_DEPTH, RESPONSE_CLOSE, RESPONSE_OPEN, ToolCall, ToolCallError, bad_unicode, parse_tool_calls, preview,
    safe_text,
)
from scheduler.api import OutcomeState

logger = logging.getLogger(__name__)


class ToolInfraError(RuntimeError):
    """The tool infrastructure failed (not the model's call): drop the trajectory, count why."""


class Reward(float):
    """A reward that says why (swe "tests_failed", math "wrong", ...): a float everywhere, `reason` for metrics."""

    __slots__ = ("reason",)

    def __new__(cls, value: float, reason: str = ""):
        obj = super().__new__(cls, value)
        obj.reason = reason
        return obj

    def __reduce__(self):
        return (Reward, (float(self), self.reason))

    def __repr__(self) -> str:
        return f"Reward({float(self)!r}, {self.reason!r})"


class ToolRefused(ValueError):
    """A handler refuses the model's call (a bad path, text not found); the message, shown as is, says why."""


@dataclass(frozen=True, kw_only=True)
class Task:
    task_id: str  # unique and stable for a (bench, seed)
    bench: str  # "swe" | "search" | "math" | "toy" | ...
    messages: tuple[dict, ...]  # chat messages to start from: [{"role": "system"|"user", "content": str}]
    tools: tuple[dict, ...]  # OpenAI function schemas: {"type": "function", "function": {name, description, parameters}}
    answer: Any = None  # hidden checker data, JSON-able (never shown to the policy)
    level: int = 0  # difficulty, 0 = easiest
    meta: dict = field(default_factory=dict)  # anything else JSON-able (source file, hops, ...)


@dataclass(frozen=True, kw_only=True)
class SizeThresholds:
    small_max_bytes: int = 512  # payloads up to this are "small"
    medium_max_bytes: int = 4096  # up to this "medium", above "large"

    def __post_init__(self):
        if not 0 <= self.small_max_bytes <= self.medium_max_bytes:
            raise ValueError(
                f"SizeThresholds: small_max_bytes={self.small_max_bytes}, medium_max_bytes={self.medium_max_bytes} "
                "must satisfy 0 <= small <= medium; raise medium_max_bytes or lower small_max_bytes."
            )


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


# --------------------------------------------------------------------------------------------
# Schema validation and the shared dispatch/driver helpers (the call format: envs/toolcalls.py).
# --------------------------------------------------------------------------------------------

_JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def tool_schema(name: str, description: str, params: dict[str, tuple[str, str]], required: tuple[str, ...] | list[str] | None = None) -> dict:
    """OpenAI function schema from {arg: (json type name, description)}; all args required by default."""
    for arg, (type_name, _) in params.items():
        if type_name not in _JSON_TYPES:
            raise ValueError(f"tool_schema: argument {arg!r} of {name!r} has type {type_name!r}; use one of {sorted(_JSON_TYPES)}.")
    props = {arg: {"type": t, "description": d} for arg, (t, d) in params.items()}
    req = list(params) if required is None else list(required)
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {"type": "object", "properties": props, "required": req}}}


def _type_ok(value: Any, type_name: str) -> bool:
    types = _JSON_TYPES.get(type_name)
    if types is None:
        return True
    if isinstance(value, bool) and bool not in types:
        return False  # JSON true/false are not numbers, though Python says bool is an int
    return isinstance(value, types)


def validate_call(call: ToolCall, tools: tuple[dict, ...] | list[dict], *, max_arg_bytes: int = 65536) -> str | None:
    """None if `call` fits one of the OpenAI schemas in `tools`, else a message saying what to fix."""
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    fn = by_name.get(call.name)
    if fn is None:
        return f"unknown tool {preview(safe_text(call.name))!r}; available tools: {', '.join(sorted(by_name)) or '(none)'}"
    bad = bad_unicode(call.arguments)
    if bad is not None:
        return f"tool {call.name!r} got text with a lone surrogate ({preview(ascii(bad))}), which is not valid Unicode; write plain text"
    params = fn.get("parameters", {})
    props: dict = params.get("properties", {})
    missing = [a for a in params.get("required", []) if a not in call.arguments]
    if missing:
        return f"tool {call.name!r} is missing required argument(s) {missing}; it takes {sorted(props)}"
    extra = [a for a in call.arguments if a not in props]
    if extra and not params.get("additionalProperties", False):
        return f"tool {call.name!r} got unknown argument(s) {[preview(safe_text(str(a))) for a in extra]}; it takes {sorted(props)}"
    for arg, value in call.arguments.items():
        spec = props.get(arg, {})
        if not _type_ok(value, spec.get("type", "")):
            return f"argument {arg!r} of tool {call.name!r} must be {spec['type']}, got {type(value).__name__}"
        if "enum" in spec and value not in spec["enum"]:
            return f"argument {arg!r} of tool {call.name!r} must be one of {spec['enum']}, got {preview(safe_text(str(value)))!r}"
        if isinstance(value, str) and len(value.encode("utf-8", "replace")) > max_arg_bytes:
            return f"argument {arg!r} of tool {call.name!r} is {len(value.encode('utf-8', 'replace'))} bytes; the limit is {max_arg_bytes}"
    return None


def failure(tool: str, message: str, *, latency_s: float = 0.0) -> ToolResult:
    return ToolResult(tool=tool, text=f"Error: {message}", status="failure", latency_s=latency_s)


def dispatch(call: ToolCall | ToolCallError, tools: tuple[dict, ...], handlers: dict[str, Callable[..., ToolResult]], *,
             max_arg_bytes: int = 65536, faults: collections.Counter | None = None) -> ToolResult:
    """Validate `call` against `tools` and run its handler; every model mistake becomes a failure result.

    Handlers take the call's arguments as keywords and return a ToolResult (latency is filled in
    here when the handler leaves it 0). `ToolInfraError` propagates: it is not the model's fault.
    Any other exception of a handler was caused by what the model wrote (a handler checks its
    own infrastructure and raises ToolInfraError): it becomes a failure result, is logged, and
    is counted in `faults` as "tool:ExceptionType".
    """
    if isinstance(call, ToolCallError):
        return failure("<parse>", call.message)
    problem = validate_call(call, tools, max_arg_bytes=max_arg_bytes)
    if problem is not None:
        return failure(call.name if call.name in handlers else "<unknown>", problem)
    t0 = time.monotonic()
    try:
        result = handlers[call.name](**call.arguments)
    except ToolInfraError:
        raise
    except ToolRefused as e:
        return failure(call.name, str(e), latency_s=time.monotonic() - t0)
    except Exception as e:  # noqa: BLE001 - counted and shown to the model; it must not end the rank
        key = f"{call.name}:{type(e).__name__}"
        if faults is not None:
            faults[key] += 1
        logger.warning("tool %s raised on the model's call (%s): %s", call.name, key, str(e)[:200])
        return failure(call.name, f"the tool could not do this ({type(e).__name__}: {safe_text(str(e))[:300]})",
                       latency_s=time.monotonic() - t0)
    if result.latency_s == 0.0:
        result = replace(result, latency_s=time.monotonic() - t0)
    return result


def system_prompt(intro: str, example: str, answer_format: str) -> str:
    """The system message every env uses: the job, the call format with one example, the answer format."""
    return (
        f"{intro}\n\nTo call a tool, write exactly one JSON object inside tags, e.g.\n{example}\n"
        f"The tool's output comes back inside {RESPONSE_OPEN}...{RESPONSE_CLOSE}. "
        f"When you are done, {answer_format}"
    )


def run_scripted(env: Env, task: Task, actions: list[str]) -> tuple[float, list[ToolResult]]:
    """Play scripted assistant messages: run every tool call of each, score the first message without calls.

    The last action is scored when every action had calls (or a result said `done`).
    """
    results: list[ToolResult] = []
    episode = env.start(task)
    try:
        final = actions[-1] if actions else ""
        for action in actions:
            calls = parse_tool_calls(action)
            if not calls:
                final = action
                break
            results.extend(episode.execute(c) for c in calls)
            if results and results[-1].done:
                final = action
                break
        return episode.score(final), results
    finally:
        episode.close()
