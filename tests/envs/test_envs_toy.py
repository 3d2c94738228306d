"""toy env and the registry: deterministic tasks, a reward short outputs can reach, lazy bench lookup."""

import pytest

from envs.base import ToolCall, run_scripted
from envs.registry import BENCHES, make_env, scripted_agents
from envs.toy import WORDS, ToyEnv, toy_reward


def test_same_seed_same_tasks():
    assert ToyEnv(seed=3, num_tasks=8).tasks() == ToyEnv(seed=3, num_tasks=8).tasks()
    assert [t.answer for t in ToyEnv(seed=3, num_tasks=8).tasks()] != [t.answer for t in ToyEnv(seed=4, num_tasks=8).tasks()]
    assert all(t.answer in WORDS and t.messages[-1]["content"] == f"Say the word {t.answer}." for t in ToyEnv(seed=0, num_tasks=20).tasks())


@pytest.mark.parametrize(
    "text, reward",
    [("red", 1.0), ("<answer>Red.</answer>", 1.0), ("ok so red", 1.0), ("xx yy zz red", 0.5), ("blue", 0.0), ("", 0.0), ("reddish", 0.0)],
)
def test_reward(text, reward):
    assert toy_reward(text, "red") == reward


def test_scripted_agents_and_echo():
    env = make_env("toy", seed=0, num_tasks=10)
    oracle, wrong = scripted_agents("toy")
    assert [run_scripted(env, t, oracle(t))[0] for t in env.tasks()] == [1.0] * 10
    assert [run_scripted(env, t, wrong(t))[0] for t in env.tasks()] == [0.0] * 10
    episode = env.start(env.tasks()[0])
    assert episode.execute(ToolCall("echo", {"text": "hé"})).text == "hé"
    assert episode.execute(ToolCall("echo", {"text": 3})).status == "failure"


def test_registry_builds_every_local_bench_and_rejects_unknown():
    assert BENCHES == ("swe", "search", "math", "toy")
    for bench in ("toy", "search", "math"):
        env = make_env(bench, seed=0, num_tasks=2)
        assert env.name == bench and len(env.tasks()) == 2 and env.tasks()[0].bench == bench
    with pytest.raises(ValueError, match=r"unknown bench 'chess'; pick one of swe, search, math, toy."):
        make_env("chess")


def test_toy_errors():
    with pytest.raises(ValueError, match=r"toy: data_path='x.jsonl' is not supported"):
        ToyEnv(data_path="x.jsonl")
    with pytest.raises(ValueError, match=r"toy: num_words=0 must be >= 1"):
        ToyEnv(num_words=0)


def test_profile_writes_a_trace_the_simulator_loads(tmp_path):
    import json

    from envs.profile import format_table, profile, quantiles
    from sim.trace import record_to_spec

    summary = profile("toy", num_tasks=6, out=tmp_path)
    records = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    specs = [record_to_spec(r) for r in records]
    assert [len(s.turn_tokens) for s in specs] == [2] * 6 and all(s.tool_outcomes[0] == ("echo", "small", "success") for s in specs)
    assert summary["reward_mean"] == 1.0 and summary["turns"]["median"] == 2 and summary["outcome_states"] == {"echo/small/success": 6}
    assert json.loads((tmp_path / "profile.json").read_text())["num_trajectories"] == 6
    assert "turns per trajectory" in format_table(summary)
    assert quantiles([1, 2, 3, 4, 100]) == {"median": 3.0, "p90": 100.0, "p99": 100.0, "mean": 22.0, "n": 5}
