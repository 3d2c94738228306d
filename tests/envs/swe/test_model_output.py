"""Nothing the model writes ends a rank: adversarial model outputs driven through the real rollout engine.

A tiny model whose logits are biased to write a given text (the test's script) runs in the real
`RolloutEngine`; the tool calls it writes go to real or hand-written episodes. Each case crashed
`engine.step()` (or, for the parser, stalled it) before issue 21.
"""

import os
import pickle
import threading
import time

import pytest
import torch

from engine.models import build_tiny, render_prompt
from engine.runtime.protocol import EnvCall
from engine.rollout.engine import Finished, RolloutConfig, RolloutEngine, RolloutRequest
from envs.swe import env as swe
from envs.base import MAX_ARG_DEPTH, Task, ToolCallError, ToolResult, parse_tool_calls
from scripted_model import Scripted

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(0)


class Recording:
    """An episode that pickles every call it gets, as the mailbox to the coordinator does."""

    def __init__(self, execute=None, score=None):
        self.calls, self.closed = [], False
        self._execute, self._score = execute, score

    def execute(self, call):
        pickle.dumps(EnvCall(0, "r", "execute", call))
        self.calls.append(call)
        if self._execute:
            return self._execute(call)
        return ToolResult(tool=getattr(call, "name", "<parse>"), text="ok", status="success")

    def score(self, final_text):
        return self._score() if self._score else 0.5

    def close(self):
        self.closed = True


def drive(model, tok, episode, text: str, **cfg) -> Finished:
    task = Task(task_id="t", bench="adv", messages=({"role": "user", "content": "go"},), tools=())
    prompt = render_prompt(tok, task.messages, ())
    writes = Scripted.writing(model, tok, len(prompt), text)
    # the scripted turn fits; any later turn is the tiny model's own noise, kept short
    kw = dict(temperature=0.0, max_new_tokens_per_turn=len(writes.script) + 2, max_turns=2, max_total_tokens=8000, max_batch=2)
    engine = RolloutEngine(writes, tok, RolloutConfig(**{**kw, **cfg}), device="cpu")
    engine.add(RolloutRequest("r", task, episode, prompt, "g"))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for ev in engine.step():  # must never raise, whatever the text
            if isinstance(ev, Finished):
                engine.close()
                return ev
        time.sleep(0.0005)
    raise AssertionError("the engine did not finish the trajectory")


def test_an_undecodable_file_name_in_a_tool_result_reaches_the_model_as_text(tiny):
    model, tok = tiny
    env = swe.SweEnv(seed=0, num_tasks=1)
    episode = env.start(env.tasks()[0])
    try:
        fd = os.open(os.path.join(os.fsencode(episode.workdir), b"bad\xff.py"), os.O_CREAT | os.O_WRONLY, 0o644)
        os.close(fd)
        listing = episode.execute(parse_tool_calls('<tool_call>{"name": "view_file", "arguments": {"path": "."}}</tool_call>')[0])
        assert "\udcff" in listing.text  # what os.fsdecode gives: a lone surrogate the tokenizer refuses
        fin = drive(model, tok, episode, '<tool_call>{"name": "view_file", "arguments": {"path": "."}}</tool_call>')
    finally:
        episode.close()
        env.close()
    text = tok.decode(fin.trajectory.token_ids, skip_special_tokens=False)
    response = text.split("<tool_response>", 1)[1].split("</tool_response>", 1)[0]
    assert "bad\ufffd.py" in response and fin.trajectory.reward is not None, response[:300]


def test_arguments_nested_past_the_limit_are_a_failure_the_model_sees(tiny):
    model, tok = tiny
    deep = '<tool_call>{"name": "calc", "arguments": {"x": ' + "[" * 700 + "]" * 700 + "}}</tool_call>"
    call, = parse_tool_calls(deep)
    assert isinstance(call, ToolCallError) and f"the limit is {MAX_ARG_DEPTH}" in call.message
    episode = Recording()
    fin = drive(model, tok, episode, deep)
    assert fin.trajectory.tool_outcomes[0][2] == "failure" or episode.calls  # the failure reached the model
    assert all(isinstance(c, ToolCallError) for c in episode.calls)


def test_an_env_that_raises_is_a_failure_result_and_a_scored_zero(tiny):
    model, tok = tiny

    def boom(call):
        raise KeyError("the plug-in env forgot a key")

    episode = Recording(execute=boom, score=lambda: 1 / 0)
    fin = drive(model, tok, episode, '<tool_call>{"name": "calc", "arguments": {"x": 1}}</tool_call>')
    traj = fin.trajectory
    assert traj.tool_outcomes[0][2] == "failure" and "KeyError" in tok.decode(traj.token_ids)
    assert traj.reward == 0.0 and traj.reward.reason == "score_error" and traj.finish_reason != "tool_infra"
    assert episode.closed


def test_the_second_call_of_a_timed_out_turn_never_runs(tiny):
    """The engine gives up on a slow first call; the tool thread must not go on to the second one
    (its episode gets closed meanwhile, and the coordinator used to assert on the late call)."""
    model, tok = tiny
    release = threading.Event()

    def slow_first(call):
        if len(episode.calls) == 1:
            release.wait(10)
        return ToolResult(tool="calc", text="late", status="success")

    episode = Recording(execute=slow_first)
    two = '<tool_call>{"name": "calc", "arguments": {"x": 1}}</tool_call><tool_call>{"name": "calc", "arguments": {"x": 2}}</tool_call>'
    fin = drive(model, tok, episode, two, tool_timeout_s=0.5, max_turns=3)
    assert fin.trajectory.tool_outcomes[0] == ("<timeout>", "small", "timeout")
    release.set()
    time.sleep(0.3)
    assert [c.arguments for c in episode.calls] == [{"x": 1}]


@pytest.mark.timeout(120)
def test_the_tool_call_parser_is_linear_on_unclosed_tags():
    # the old regex retried from every opening tag: 16,000 tags took 22 s, 200,000 would take an hour
    calls = parse_tool_calls("<tool_call>" * 200_000)
    assert len(calls) == 1 and isinstance(calls[0], ToolCallError) and "missing its closing" in calls[0].message
    calls = parse_tool_calls('<tool_call>{"name": "a", "arguments": {}}</tool_call> x ' * 2 + "<tool_call>" * 100_000)
    assert [type(c).__name__ for c in calls] == ["ToolCall", "ToolCall", "ToolCallError"]
