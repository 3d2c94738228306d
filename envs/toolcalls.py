"""The tool-call format, in one place: Hermes/Qwen `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

What lives here: the tags (`CALL_OPEN`/`CALL_CLOSE`, `RESPONSE_OPEN`/`RESPONSE_CLOSE`), the writer
(`format_tool_call`), the detector (`has_tool_call`), the parser (`parse_tool_calls`, into `ToolCall` or
`ToolCallError`) and the wrapper a tool's output gets (`wrap_tool_response`, i.e. `RESPONSE_HEAD` + output
+ `RESPONSE_TAIL`). Every writer and parser
of the repo uses these: envs/base.py re-exports the parser and the parsed types, the benches' prompt
examples and scripted agents (envs/toy.py, envs/search.py, envs/math/env.py, envs/swe/spec.py,
examples/) write with `format_tool_call`, and engine/chat.py renders the chat template and the
tool-response tokens from these tags. Torch-free, imports nothing of the project.

Two spellings of a call, parsed alike: `format_tool_call(name, args)` is compact with ASCII JSON (the
benches' prompt examples and scripted agents); `template=True` puts the tags on lines of their own and
leaves the JSON unescaped, as the chat template renders an assistant message's `tool_calls` (Qwen's does
the same).

Parsing never raises on what a model wrote: huge integers, deep nesting and lone surrogates become
`ToolCallError`s that say what to fix; a call without its closing tag is one error; text without
`<tool_call>` parses to [].

Invariants (tests/envs/test_toolcalls.py, tests/envs/test_envs_base.py): `format_tool_call` then
`parse_tool_calls` gives back the name and arguments in either spelling; every other writer (the
benches' prompts and scripted agents, the chat template) writes exactly what `format_tool_call` writes;
every malformed call parses to a ToolCallError, never an exception; parsing is linear in the text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
RESPONSE_HEAD, RESPONSE_TAIL = f"{RESPONSE_OPEN}\n", f"\n{RESPONSE_CLOSE}"  # what one tool's output is wrapped in
MAX_ARG_DEPTH = 32  # deeper arguments are refused: nothing needs them, and they overflow pickling on the way to the tools
CALL_FORMAT_HINT = f'{CALL_OPEN}{{"name": "<tool>", "arguments": {{"<arg>": <value>}}}}{CALL_CLOSE}'
_PREVIEW_CHARS = 80


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


# ---- writing and detecting ---------------------------------------------------------------------


def format_tool_call(name: str, arguments: dict, *, template: bool = False) -> str:
    """The text of one call: compact with ASCII JSON, or (`template`) the chat template's spelling."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=not template)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}" if template else f"{CALL_OPEN}{body}{CALL_CLOSE}"


def has_tool_call(text: str) -> bool:
    """Whether `text` opens a tool call (complete or not)."""
    return CALL_OPEN in text


def wrap_tool_response(text: str) -> str:
    """One tool's output as the model sees it: between the response tags, each on a line of its own."""
    return f"{RESPONSE_HEAD}{text}{RESPONSE_TAIL}"


# ---- parsing -----------------------------------------------------------------------------------


def preview(text: str) -> str:
    """`text` stripped and cut to a short preview for an error message."""
    text = text.strip()
    return text if len(text) <= _PREVIEW_CHARS else text[:_PREVIEW_CHARS] + "..."


def safe_text(text: str) -> str:
    """`text` with what is not valid Unicode replaced, so that a message can be shown and logged."""
    return text.encode("utf-8", "replace").decode("utf-8")


def bad_unicode(value: Any, depth: int = 0) -> str | None:
    """The first string in `value` that is not valid Unicode (a lone surrogate such as "\\ud800")."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value
        return None
    if depth > 64:  # json.loads already refused deeper nesting than the recursion limit
        return None
    items = value.items() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for item in items:
        for v in item if isinstance(value, dict) else (item,):
            bad = bad_unicode(v, depth + 1)
            if bad is not None:
                return bad
    return None


def _loads(raw: str) -> tuple[Any, str | None]:
    """(object, None) or (None, why): JSON the model wrote, never an exception."""
    try:
        return json.loads(raw), None
    except (ValueError, RecursionError) as e:  # ValueError: bad JSON, or an int of more than 4300 digits
        return None, f"{e.__class__.__name__}: {str(e)[:160]}"


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value (iterative: a value may be nested past the recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def _parse_one(raw: str) -> ToolCall | ToolCallError:
    obj, why = _loads(raw)
    if why is not None:
        return ToolCallError(message=f"tool call is not valid JSON ({why}); expected {CALL_FORMAT_HINT}", raw=raw)
    depth = _depth(obj)
    if depth > MAX_ARG_DEPTH + 1:
        return ToolCallError(message=f"tool call arguments are nested {depth - 1} levels deep; the limit is {MAX_ARG_DEPTH}",
                             raw=raw[:200])
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return ToolCallError(message=f"tool call needs a JSON object with a string 'name'; expected {CALL_FORMAT_HINT}", raw=raw)
    args = obj.get("arguments", {})
    if isinstance(args, str):
        # Some chat templates serialise arguments as a JSON string; accept that spelling too.
        parsed, why = _loads(args) if args.strip() else ({}, None)
        if why is None:
            args = parsed
    if not isinstance(args, dict):
        return ToolCallError(message=f"'arguments' of tool '{preview(safe_text(obj['name']))}' must be a JSON object, got {type(args).__name__}", raw=raw)
    if _depth(args) > MAX_ARG_DEPTH:  # arguments given as a JSON string are only parsed here
        return ToolCallError(message=f"tool call arguments are nested {_depth(args)} levels deep; the limit is {MAX_ARG_DEPTH}",
                             raw=raw[:200])
    if bad_unicode(obj["name"]) is not None or bad_unicode(args) is not None:
        return ToolCallError(message="tool call holds a lone surrogate escape (e.g. \\ud800), which is not valid Unicode; write plain text", raw=raw)
    return ToolCall(name=obj["name"], arguments=args, raw=raw)


def parse_tool_calls(text: str) -> list[ToolCall | ToolCallError]:
    """All Hermes tool calls in `text`, in order; [] when it holds no `<tool_call>` tag.

    Linear in len(text): each call is the text from an opening tag to the first closing tag
    after it (what a non-greedy regex matches, without its quadratic retries on unclosed tags).
    """
    out: list[ToolCall | ToolCallError] = []
    end = 0
    while (start := text.find(CALL_OPEN, end)) >= 0:
        close = text.find(CALL_CLOSE, start + len(CALL_OPEN))
        if close < 0:  # no closing tag after this one means none after any later one either
            break
        out.append(_parse_one(text[start + len(CALL_OPEN):close]))
        end = close + len(CALL_CLOSE)
    tail = text[end:]
    if CALL_OPEN in tail:
        # An unterminated call (the model hit max_tokens or forgot the tag) still counts as one.
        raw = tail.split(CALL_OPEN, 1)[1]
        out.append(ToolCallError(message=f"tool call is missing its closing {CALL_CLOSE} tag: {preview(raw)!r}", raw=raw))
    return out
