"""The tool-call format's one home (envs/toolcalls.py): a round trip, and every other writer writes what it writes.

The writers checked: the benches' system prompts, task messages and scripted agents (toy, search,
math, swe), the example env, and engine/chat.py's text and Jinja chat templates and tool-response
text. A writer's call is compared with `format_tool_call` of what it parses to, so a call spelled by
hand (another key order, other separators, other escaping, other tags) fails here.
"""

import pytest

from envs.registry import BENCHES, make_env, scripted_agents
from envs.toolcalls import (
    CALL_CLOSE, CALL_OPEN, RESPONSE_CLOSE, RESPONSE_OPEN, ToolCall, ToolCallError, format_tool_call, has_tool_call,
    parse_tool_calls, wrap_tool_response,
)

ARGS = [{}, {"text": "red"}, {"query": "Kalo Venmar", "k": 3}, {"code": 'print("é\\n", 2**10 % 7)\n'},
        {"path": "a b/ünï.py", "nested": {"xs": [1, 2.5, None, True, {"y": "\u2603"}]}}]


@pytest.mark.parametrize("template", [False, True])
@pytest.mark.parametrize("args", ARGS)
def test_format_then_parse_gives_back_the_call(args, template):
    text = format_tool_call("tool_x", args, template=template)
    assert text.startswith(CALL_OPEN) and text.endswith(CALL_CLOSE) and has_tool_call(text)
    (call,) = parse_tool_calls(f"before {text} after")
    assert isinstance(call, ToolCall) and (call.name, call.arguments) == ("tool_x", args)
    assert CALL_OPEN + call.raw + CALL_CLOSE == text
    if not template:
        assert text.isascii() and "\n" not in text  # the compact spelling: one line, ASCII JSON


def test_two_calls_in_one_message_parse_in_order():
    text = format_tool_call("a", {"x": 1}) + " and " + format_tool_call("b", {"y": [2]}, template=True)
    assert [(c.name, c.arguments) for c in parse_tool_calls(text)] == [("a", {"x": 1}), ("b", {"y": [2]})]


def test_detect_and_parse_agree_on_the_tags():
    assert not has_tool_call("no call here </tool_call>") and parse_tool_calls("no call here </tool_call>") == []
    assert has_tool_call(CALL_OPEN) and isinstance(parse_tool_calls(CALL_OPEN)[0], ToolCallError)
    assert wrap_tool_response("out") == f"{RESPONSE_OPEN}\nout\n{RESPONSE_CLOSE}"


def _assert_module_spelling(text: str, where: str) -> int:
    """Every call in `text` is exactly `format_tool_call` of what it parses to; returns how many there were."""
    calls = parse_tool_calls(text)
    for c in calls:
        assert isinstance(c, ToolCall), f"{where}: {c}"
        assert CALL_OPEN + c.raw + CALL_CLOSE == format_tool_call(c.name, c.arguments), f"{where}: {c.raw!r}"
    assert text.count(CALL_OPEN) == len(calls), where
    return len(calls)


@pytest.mark.parametrize("bench", BENCHES)
def test_each_bench_writes_calls_as_the_module_does(bench):
    env = make_env(bench, seed=0, num_tasks=None if bench in ("swe", "math") else 8)
    try:
        oracle, wrong = scripted_agents(bench)
        found = 0
        for task in env.tasks():
            for m in task.messages:
                found += _assert_module_spelling(m["content"], f"{bench} {task.task_id} {m['role']} message")
            for action in [*oracle(task), *wrong(task)]:
                found += _assert_module_spelling(action, f"{bench} {task.task_id} scripted action")
        assert found > len(env.tasks())  # at least the system prompt's example in each task, and the oracle's calls
    finally:
        env.close()


def test_the_example_env_writes_calls_as_the_module_does():
    from examples import guess_env

    assert _assert_module_spelling(guess_env.SYSTEM, "examples/guess_env.py SYSTEM") == 1


CHAT = [{"role": "user", "content": "hi"},
        {"role": "assistant", "content": "let me", "tool_calls": [{"function": {"name": "calc", "arguments": {"x": "é"}}},
                                                                  {"name": "echo", "arguments": {}}]},
        {"role": "tool", "content": "2"}]
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "d", "parameters": {"type": "object", "properties": {}}}}]


def test_the_chat_template_writes_calls_and_responses_as_the_module_does():
    from engine import chat

    assert (chat.TOOL_CALL_OPEN, chat.TOOL_CALL_CLOSE, chat.TOOL_RESPONSE_OPEN, chat.TOOL_RESPONSE_CLOSE) == (
        CALL_OPEN, CALL_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE)
    text = chat.render_text(CHAT, TOOLS)
    calls = format_tool_call("calc", {"x": "é"}, template=True) + "\n" + format_tool_call("echo", {}, template=True)
    assert f"let me\n{calls}{chat.IM_END}" in text
    assert f"user\n{wrap_tool_response('2')}{chat.IM_END}" in text
    assert wrap_tool_response("a") + "\n" + wrap_tool_response("b") in chat.tool_response_text(["a", "b"])
    assert chat.has_tool_call is has_tool_call


def test_the_jinja_chat_template_renders_what_render_text_does():
    utils = pytest.importorskip("transformers.utils.chat_template_utils")
    from engine import chat

    rendered = utils.render_jinja_template(conversations=[CHAT], tools=TOOLS, chat_template=chat.HERMES_CHAT_TEMPLATE,
                                           add_generation_prompt=True)[0][0]
    assert rendered == chat.render_text(CHAT, TOOLS)
