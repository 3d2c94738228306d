"""envs/demo.py: demonstration exchanges come from other tasks, show one tool call, and change nothing else."""

import pytest

from envs.base import ToolCall, parse_tool_calls
from envs.demo import add_demo_turns
from envs.registry import make_env, scripted_agents


@pytest.mark.parametrize("bench", ["toy", "math", "search", "swe"])
def test_demos_come_from_other_tasks_and_call_a_tool(bench):
    tasks = make_env(bench, seed=0, level=0 if bench != "toy" else None).tasks()[:5]
    oracle, _ = scripted_agents(bench)
    shown = add_demo_turns(tasks, 1, oracle)
    for i, (before, after) in enumerate(zip(tasks, shown)):
        assert (after.task_id, after.tools, after.answer) == (before.task_id, before.tools, before.answer)
        system, demo_user, demo_reply, *rest = after.messages
        assert system == before.messages[0] and tuple(rest) == before.messages[1:]
        donor = tasks[(i + 1) % len(tasks)]
        assert donor.task_id != before.task_id and demo_user == donor.messages[-1]
        calls = parse_tool_calls(demo_reply["content"])
        assert demo_reply["role"] == "assistant" and calls and all(isinstance(c, ToolCall) for c in calls)


def test_several_demos_in_order_and_zero_is_identity():
    tasks = make_env("toy", seed=1, num_tasks=4).tasks()
    oracle, _ = scripted_agents("toy")
    assert add_demo_turns(tasks, 0, oracle) == tasks
    shown = add_demo_turns(tasks, 2, oracle)
    assert len(shown[3].messages) == len(tasks[3].messages) + 4
    assert [m["content"] for m in shown[3].messages[1:5:2]] == [tasks[0].messages[-1]["content"], tasks[1].messages[-1]["content"]]
    assert add_demo_turns(tasks, 2, oracle) == shown  # deterministic


def test_errors_name_the_fix():
    tasks = make_env("toy", seed=0, num_tasks=2).tasks()
    oracle, _ = scripted_agents("toy")
    with pytest.raises(ValueError, match=r"2 demonstration\(s\) need at least 3 tasks, the bench gave 2; raise --num-tasks or lower --demo-turns"):
        add_demo_turns(tasks, 2, oracle)
    with pytest.raises(ValueError, match=r"the toy oracle calls no tool on task 'toy-0-0'; pass --demo-turns 0"):
        add_demo_turns(tasks, 1, lambda t: ["<answer>red</answer>"])
    with pytest.raises(ValueError, match=r"cannot script task 'toy-0-0' \(KeyError: 'file'\); tasks loaded with --data carry no oracle data"):
        add_demo_turns(tasks, 1, lambda t: [t.meta["file"]])


def test_a_task_brings_its_own_demonstration_and_needs_no_oracle():
    from dataclasses import replace

    from envs.toolcalls import format_tool_call

    call = format_tool_call("guess", {"number": 8})
    tasks = [replace(t, meta={**t.meta, "demonstration": call}) for t in make_env("toy", seed=0, num_tasks=3).tasks()]
    shown = add_demo_turns(tasks, 1, None)
    assert shown[0].messages[1] == tasks[1].messages[-1] and shown[0].messages[2] == {"role": "assistant", "content": call}
    # its own wins over an oracle's
    assert add_demo_turns(tasks, 1, scripted_agents("toy")[0]) == shown
    bare = make_env("toy", seed=0, num_tasks=3).tasks()
    with pytest.raises(ValueError, match=r"task 'toy-0-0' brings no demonstration and its env no scripted oracle; give each "
                                         r"task a meta\['demonstration'\]"):
        add_demo_turns(bare, 1, None)
    prose = [replace(t, meta={"demonstration": "I would guess eight."}) for t in bare]
    with pytest.raises(ValueError, match=r"task 'toy-0-0' has a demonstration that calls no tool \('I would guess eight.'\)"):
        add_demo_turns(prose, 1, None)


def test_data_rows_carry_demonstrations(tmp_path):
    import json

    from envs.datasets import load_verl_tasks
    from envs.toolcalls import format_tool_call

    call = format_tool_call("search", {"query": "capital of France"})
    rows = [{"prompt": [{"role": "user", "content": f"question {i}"}], "reward_model": {"ground_truth": "Paris"},
             "extra_info": {"index": f"q{i}", "demonstration": call}} for i in range(3)]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    tasks = load_verl_tasks(path, bench="search", tools=(), system="sys")
    shown = add_demo_turns(tasks, 1, None)
    assert [m["content"] for m in shown[2].messages[1:3]] == ["question 0", call]
