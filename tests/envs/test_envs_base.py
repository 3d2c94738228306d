"""Tool-call parsing, schema validation, dispatch, outcome states, and a 1,000-call fuzz."""

import json
import random

import pytest

from envs.base import (
    SizeThresholds, ToolCall, ToolCallError, ToolResult, dispatch, parse_tool_calls, run_scripted, tool_schema,
    validate_call,
)
from envs.registry import make_env

ADD = tool_schema("add", "add two ints", {"a": ("integer", "first"), "b": ("integer", "second"), "note": ("string", "opt")}, required=["a", "b"])
TOOLS = (ADD, tool_schema("flag", "set a flag", {"on": ("boolean", "value"), "xs": ("array", "list"), "x": ("number", "num")}, required=[]))


def _add(a: int, b: int, note: str = "") -> ToolResult:
    return ToolResult(tool="add", text=str(a + b) + note, status="success")


def test_text_without_calls_parses_to_empty():
    assert parse_tool_calls("") == []
    assert parse_tool_calls("The answer is <answer>4</answer>, no tools {\"name\": 1}") == []


def test_parses_calls_in_order_and_reports_errors():
    text = ('a <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> b '
            '<tool_call>{"name": "flag", "arguments": "{\\"on\\": true}"}</tool_call>'
            '<tool_call>{oops}</tool_call><tool_call>["x"]</tool_call><tool_call>{"name": "add", "arguments": [1]}</tool_call>'
            '<tool_call>{"name": "add"')
    out = parse_tool_calls(text)
    assert out[0] == ToolCall(name="add", arguments={"a": 1, "b": 2}, raw='{"name": "add", "arguments": {"a": 1, "b": 2}}')
    assert out[1].name == "flag" and out[1].arguments == {"on": True}
    assert isinstance(out[2], ToolCallError) and out[2].message.startswith("tool call is not valid JSON")
    assert out[3].message.startswith("tool call needs a JSON object with a string 'name'")
    assert out[4].message == "'arguments' of tool 'add' must be a JSON object, got list"
    assert out[5].message == "tool call is missing its closing </tool_call> tag: '{\"name\": \"add\"'"
    assert len(out) == 6


def test_missing_arguments_default_to_empty():
    assert parse_tool_calls('<tool_call>{"name": "flag"}</tool_call>') == [ToolCall(name="flag", arguments={}, raw='{"name": "flag"}')]


@pytest.mark.parametrize(
    "call, expected",
    [
        (ToolCall("add", {"a": 1, "b": 2}), None),
        (ToolCall("mul", {}), "unknown tool 'mul'; available tools: add, flag"),
        (ToolCall("add", {"a": 1}), "tool 'add' is missing required argument(s) ['b']; it takes ['a', 'b', 'note']"),
        (ToolCall("add", {"a": 1, "b": 2, "c": 3}), "tool 'add' got unknown argument(s) ['c']; it takes ['a', 'b', 'note']"),
        (ToolCall("add", {"a": 1.5, "b": 2}), "argument 'a' of tool 'add' must be integer, got float"),
        (ToolCall("add", {"a": True, "b": 2}), "argument 'a' of tool 'add' must be integer, got bool"),
        (ToolCall("flag", {"x": 2}), None),
        (ToolCall("flag", {"on": 1}), "argument 'on' of tool 'flag' must be boolean, got int"),
        (ToolCall("flag", {"xs": "1,2"}), "argument 'xs' of tool 'flag' must be array, got str"),
        (ToolCall("add", {"a": 1, "b": 2, "note": "x" * 70000}), "argument 'note' of tool 'add' is 70000 bytes; the limit is 65536"),
    ],
)
def test_validate_call(call, expected):
    assert validate_call(call, TOOLS) == expected


def test_tool_schema_shape_and_error():
    assert ADD["function"]["parameters"]["required"] == ["a", "b"]
    assert ADD["function"]["parameters"]["properties"]["a"] == {"type": "integer", "description": "first"}
    with pytest.raises(ValueError, match=r"tool_schema: argument 'a' of 'f' has type 'int'; use one of"):
        tool_schema("f", "d", {"a": ("int", "x")})


def test_dispatch_runs_handler_and_turns_mistakes_into_failures():
    ok = dispatch(ToolCall("add", {"a": 2, "b": 3}), TOOLS, {"add": _add})
    assert (ok.tool, ok.text, ok.status) == ("add", "5", "success") and ok.latency_s >= 0
    bad = dispatch(ToolCallError(message="tool call is not valid JSON"), TOOLS, {"add": _add})
    assert (bad.tool, bad.text, bad.status) == ("<parse>", "Error: tool call is not valid JSON", "failure")
    unknown = dispatch(ToolCall("rm", {}), TOOLS, {"add": _add})
    assert unknown.tool == "<unknown>" and unknown.text.startswith("Error: unknown tool 'rm'")


@pytest.mark.parametrize("size, cls", [(0, "small"), (512, "small"), (513, "medium"), (4096, "medium"), (4097, "large")])
def test_outcome_size_classes(size, cls):
    r = ToolResult(tool="search", text="x" * size, status="timeout")
    assert r.outcome() == ("search", cls, "timeout")
    assert ToolResult(tool="t", text="x" * size, status="success").outcome(SizeThresholds(small_max_bytes=0, medium_max_bytes=1)).size_class == (
        "small" if size == 0 else "medium" if size <= 1 else "large")


def test_size_thresholds_error():
    with pytest.raises(ValueError, match=r"SizeThresholds: small_max_bytes=10, medium_max_bytes=5 must satisfy 0 <= small <= medium"):
        SizeThresholds(small_max_bytes=10, medium_max_bytes=5)


def _fuzz_case(rng: random.Random) -> tuple[str, str]:
    """(assistant text with one malformed call, substring the failure must contain)."""
    kind = rng.randrange(9)
    junk = "".join(rng.choice("{}[]\":,\\ab1é🙂\x00\n") for _ in range(rng.randint(0, 40)))
    if kind == 0:
        good = json.dumps({"name": "search", "arguments": {"query": "x"}})
        return f"<tool_call>{good[: rng.randint(0, len(good) - 1)]}{junk}</tool_call>", "not valid JSON"
    if kind == 1:
        return f"<tool_call>{json.dumps({'name': junk + 'tool', 'arguments': {}})}</tool_call>", "unknown tool"
    if kind == 2:
        return f"<tool_call>{json.dumps({'name': 'search', 'arguments': {'k': 2}})}</tool_call>", "missing required"
    if kind == 3:
        args = {"query": "q", junk + "extra": rng.choice([1, "s", None, [1]])}
        return f"<tool_call>{json.dumps({'name': 'search', 'arguments': args})}</tool_call>", "unknown argument"
    if kind == 4:
        args = rng.choice([{"query": rng.choice([1, 2.5, None, True, [junk], {"a": junk}])}, {"query": "q", "k": rng.choice(["3", 2.5, True, None, [3]])}])
        return f"<tool_call>{json.dumps({'name': 'search', 'arguments': args})}</tool_call>", "must be"
    if kind == 5:
        return f"<tool_call>{json.dumps({'name': 'search', 'arguments': {'query': junk + 'é' * 70000}})}</tool_call>", "the limit is"
    if kind == 6:
        args = rng.choice([[1], 3, "not json {", None])
        return f"<tool_call>{json.dumps({'name': 'search', 'arguments': args})}</tool_call>", "must be a JSON object"
    if kind == 7:
        return f"<tool_call>{json.dumps({'name': rng.choice([None, 3, '', ['search']]), 'arguments': {}})}</tool_call>", "string 'name'"
    return f"<tool_call>{'[' * rng.randint(1, 5000)}{junk}", "closing </tool_call>"


def test_fuzz_1000_malformed_calls_give_useful_failures():
    rng = random.Random(1234)
    env = make_env("search", num_tasks=1)
    episode = env.start(env.tasks()[0])
    for i in range(1000):
        text, expect = _fuzz_case(rng)
        calls = parse_tool_calls(text)
        assert len(calls) == 1, (i, text[:200])
        result = episode.execute(calls[0])
        assert result.status == "failure", (i, text[:200], result)
        assert result.text.startswith("Error: ") and expect in result.text, (i, expect, result.text[:300])
        assert result.size_bytes < 1000, (i, result.text[:300])


def test_run_scripted_stops_at_first_message_without_calls():
    env = make_env("toy", num_tasks=1)
    task = env.tasks()[0]
    call = json.dumps({"name": "echo", "arguments": {"text": "hi"}})
    reward, results = run_scripted(env, task, [f"<tool_call>{call}</tool_call>", f"<answer>{task.answer}</answer>", "ignored"])
    assert reward == 1.0 and [r.text for r in results] == ["hi"]


def test_hostile_json_never_raises():
    texts = [
        '<tool_call>{"name": "add", "arguments": {"a": 1' + "1" * 4301 + ', "b": 2}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1' + "1" * 4301 + '}"}</tool_call>',
        '<tool_call>{"name": "add", "arguments": ' + "[" * 100000 + "]" * 100000 + "}</tool_call>",
        '<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"note": ["\\udfff"], "a": 1, "b": 2}}</tool_call>',
    ]
    for text in texts:
        (out,) = parse_tool_calls(text)
        assert isinstance(out, ToolCallError), out
        res = dispatch(out, TOOLS, {"add": _add})
        assert res.status == "failure" and res.text.encode("utf-8")
    assert "4300 digits" in parse_tool_calls(texts[0])[0].message
    assert "lone surrogate" in parse_tool_calls(texts[3])[0].message


def test_dispatch_turns_handler_errors_into_counted_failures():
    import collections

    from envs.base import ToolInfraError, ToolRefused

    def boom(a, b, note=""):
        raise {"refused": ToolRefused("no such text"), "bug": UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogate"),
               "infra": ToolInfraError("disk gone")}[note]

    faults = collections.Counter()
    refused = dispatch(ToolCall("add", {"a": 1, "b": 2, "note": "refused"}), TOOLS, {"add": boom}, faults=faults)
    assert (refused.status, refused.text) == ("failure", "Error: no such text") and not faults
    bug = dispatch(ToolCall("add", {"a": 1, "b": 2, "note": "bug"}), TOOLS, {"add": boom}, faults=faults)
    assert bug.status == "failure" and "UnicodeEncodeError" in bug.text and faults == {"add:UnicodeEncodeError": 1}
    with pytest.raises(ToolInfraError):
        dispatch(ToolCall("add", {"a": 1, "b": 2, "note": "infra"}), TOOLS, {"add": boom}, faults=faults)
    surrogate = dispatch(ToolCall("add", {"a": 1, "b": 2, "note": "\ud800"}), TOOLS, {"add": _add})
    assert surrogate.status == "failure" and "lone surrogate" in surrogate.text
