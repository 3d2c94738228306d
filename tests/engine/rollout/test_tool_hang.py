"""A tool that never returns: the trajectory gets a timeout result and ends, the others keep decoding."""

import threading
import time

import torch

from engine.models import build_tiny, render_prompt
from engine.rollout.engine import Finished, RolloutConfig, RolloutEngine, RolloutRequest, ToolReturned
from envs.base import ToolResult
from rollout_helpers import make_script, task_for
from scripted_model import Scripted

torch.set_num_threads(1)


class HangingEpisode:
    """Its tool call blocks until the test ends (like a tool whose process never exits)."""

    def __init__(self, hang: bool, release: threading.Event):
        self.hang, self.release, self.closed = hang, release, False

    def execute(self, call):
        if self.hang:
            self.release.wait()
        return ToolResult(tool="calc", text="ok", status="success")

    def score(self, final_text):
        return 1.0

    def close(self):
        self.closed = True


def test_hanging_tool_times_out_and_the_step_completes():
    model, tok = build_tiny(0)
    release = threading.Event()
    engine = RolloutEngine(Scripted(model, make_script(tok)), tok, RolloutConfig(
        temperature=0.0, max_new_tokens_per_turn=60, max_turns=4, max_total_tokens=400, tool_timeout_s=1.0), device="cpu")
    reqs = [RolloutRequest(f"r{i}", task_for(i), HangingEpisode(i == 0, release),
                           render_prompt(tok, task_for(i).messages, ()), "g") for i in range(3)]
    for r in reqs:
        engine.add(r)
    finished, outcomes, finish_time = {}, [], {}
    t0 = time.monotonic()
    try:
        while not engine.idle and time.monotonic() - t0 < 60:
            for ev in engine.step():
                if isinstance(ev, ToolReturned):
                    outcomes.append((ev.request_id, ev.outcome.status))
                elif isinstance(ev, Finished):
                    finished[ev.request_id] = ev.trajectory
                    finish_time[ev.request_id] = time.monotonic() - t0
            time.sleep(0.001)
    finally:
        release.set()
        engine.close()
    assert engine.idle and set(finished) == {"r0", "r1", "r2"}
    assert ("r0", "timeout") in outcomes
    assert all(status == "success" for rid, status in outcomes if rid != "r0")
    # the others did not wait for the hung tool
    assert max(finish_time["r1"], finish_time["r2"]) < finish_time["r0"]
