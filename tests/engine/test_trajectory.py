"""engine/trajectory.py: per-token lists have one length, the prompt is never in the loss, the
dict form round-trips exactly, policy_versions lists the versions that produced model tokens."""

import json

import pytest

from engine.trajectory import Trajectory


def traj(**kw) -> Trajectory:
    base = dict(request_id="s0-p0-n0", task_id="t", group_id="s0-p0", prompt_len=2, token_ids=[5, 6, 7, 8, 9, 10],
                loss_mask=[0, 0, 1, 1, 0, 1], logprobs=[0.0, 0.0, -0.5, -0.25, 0.0, -1.0], versions=[-1, -1, 3, 3, -1, 4],
                turns=[(2, 4), (5, 6)], tool_outcomes=[("run_tests", "failure", "small")], tool_latency_s=[0.2],
                reward=1.0, finish_reason="submit", instances=[0, 2], final_text="done")
    return Trajectory(**{**base, **kw})


def test_a_consistent_trajectory_checks_and_counts_its_tokens():
    t = traj().check()
    assert t.num_tokens == 6 and t.num_model_tokens == 3
    assert t.policy_versions == [3, 4]  # -1 (prompt / tool output) is not a policy version


def test_signal_tokens_is_where_the_second_model_turn_starts():
    assert traj().signal_tokens == 5  # prompt, first turn and the tool's answer: what C-MLFQ had seen at its signal
    assert traj(turns=[(2, 6)], tool_outcomes=[], tool_latency_s=[]).signal_tokens == 6  # no tool call: all of it


def test_per_token_lists_of_different_length_are_refused():
    with pytest.raises(AssertionError, match="per-token lists differ: ids=6 mask=6 logprobs=5"):
        traj(logprobs=[0.0] * 5).check()


def test_a_loss_mask_on_the_prompt_is_refused():
    with pytest.raises(AssertionError, match="loss mask set on the prompt"):
        traj(loss_mask=[1, 0, 1, 1, 0, 1]).check()


def test_to_dict_from_dict_round_trips_exactly_through_json():
    t = traj()
    back = Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back == t and isinstance(back.turns[0], tuple) and isinstance(back.tool_outcomes[0], tuple)
