"""Plug-ins: `--env module:Class` and `--reward module:function`; every mistake is one line before the run dir exists."""

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import libra
from envs.base import Task, ToolCall, run_scripted
from envs.plugins import build_env, check_plugins, make_run_env, reward_fn, reward_value
from examples.guess_env import GuessEnv
from examples.my_reward import exact_answer

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--model", "tiny", "--device", "cpu", "--steps", "1", "--nproc", "2", "--system", "static",
         "--step.prompts-per-step", "2", "--step.samples-per-prompt", "2", "--rollout.max-new-tokens-per-turn", "12",
         "--rollout.max-turns", "2"]


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module `userplug` in a temp dir on sys.path, with good and bad plug-ins."""
    (tmp_path / "userplug.py").write_text(textwrap.dedent('''
        from envs.base import Task

        class NoStart:
            def tasks(self): return []
            def close(self): pass

        class NotTasks:
            name = "nt"
            def __init__(self, seed=0): pass
            def tasks(self): return ["not a task"]
            def start(self, task): return None
            def close(self): pass

        class Dup(NotTasks):
            def tasks(self): return [Task(task_id="a", bench="x", messages=(), tools=())] * 2

        def two_args(text, truth): return 1.0
        def says_yes(text, truth, task): return "yes"
        def boom(text, truth, task): raise KeyError("answer")
        not_callable = 3
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("userplug", None)
    yield "userplug"
    sys.modules.pop("userplug", None)


@pytest.mark.parametrize("spec, message", [
    ("examples.guess_env", "must be module.path:Name, e.g. --env examples.guess_env:GuessEnv"),
    ("no_such_mod_xyz:Env", "cannot import 'no_such_mod_xyz' (No module named 'no_such_mod_xyz'); run from the directory"),
    ("examples.guess_env:Nope", "module 'examples.guess_env' has no 'Nope'; it defines"),
    ("examples.guess_env:SYSTEM", "is a str, not a class"),
    ("userplug:NoStart", "does not implement the Env protocol of envs/base.py: it lacks ['start']"),
])
def test_env_spec_errors(user_module, spec, message):
    with pytest.raises(ValueError, match=None) as err:
        build_env(spec, seed=0)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_env_tasks_are_checked(user_module):
    with pytest.raises(ValueError, match=r"tasks\(\) holds a str, not an envs.base.Task"):
        check_plugins("toy", env_spec="userplug:NotTasks", reward_spec="", seed=0)
    with pytest.raises(ValueError, match="task_id 'a' appears more than once"):
        check_plugins("toy", env_spec="userplug:Dup", reward_spec="", seed=0)
    with pytest.raises(ValueError, match=r"--data 'rows.jsonl': --env 'userplug:NotTasks' takes no data_path argument"):
        build_env("userplug:NotTasks", seed=0, data_path="rows.jsonl")


def test_reward_spec_errors(user_module):
    with pytest.raises(ValueError, match=r"must take \(final_text, ground_truth, task\)"):
        reward_fn("userplug:two_args")
    with pytest.raises(ValueError, match="is a int, not a function"):
        reward_fn("userplug:not_callable")
    with pytest.raises(ValueError, match=r"returned 'yes' for task toy-0-0; return a finite float, or \(float, reason\)"):
        check_plugins("toy", env_spec="", reward_spec="userplug:says_yes", seed=0)
    assert reward_value("x", (0.5, "half"), Task(task_id="t", bench="toy", messages=(), tools=())).reason == "half"
    assert reward_value("x", 1, Task(task_id="t", bench="toy", messages=(), tools=())) == 1.0
    with pytest.raises(ValueError, match="raised KeyError: 'answer' on task toy-0-0 with an empty completion"):
        check_plugins("toy", env_spec="", reward_spec="userplug:boom", seed=0)


def test_example_env_plays_by_the_protocol():
    env = GuessEnv(seed=3, num_tasks=4)
    task = env.tasks()[0]
    secret = task.answer
    call = '<tool_call>{"name": "guess", "arguments": {"number": %d}}</tool_call>'
    reward, results = run_scripted(env, task, [call % secret, f"<answer>{secret}</answer>"])
    assert reward == 1.0 and results[0].text == "correct"
    reward, results = run_scripted(env, task, [call % (secret % 16 + 1), "<answer>0</answer>"])
    assert reward == 0.0 and results[0].text in ("higher", "lower")
    bad = env.start(task).execute(ToolCall(name="guess", arguments={"number": "eight"}))
    assert bad.status == "failure" and "must be integer" in bad.text


def test_example_reward_and_the_wrapped_env():
    assert exact_answer("so <answer> Paris </answer>", ["paris"], None) == 1.0
    assert exact_answer("<answer>Mars</answer>", {"target": ["Mars"]}, None) == 1.0
    assert exact_answer("8", "8", None) == 1.0 and exact_answer("<answer>7</answer>", "8", None) == 0.0
    env = make_run_env("search", reward_spec="examples.my_reward:exact_answer", seed=0,
                       data_path=str(ROOT / "examples" / "qa_rows.jsonl"))
    tasks = env.tasks()
    assert [t.task_id for t in tasks] == ["qa-0", "qa-1", "qa-2", "qa-3"]
    episode = env.start(tasks[1])
    try:
        assert episode.score("<answer>mars</answer>") == 1.0 and episode.score("<answer>venus</answer>") == 0.0
    finally:
        episode.close()


def _fail(caplog, *args):
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="libra"):
        assert libra.main(list(args)) == 2
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    return lines[0]


def test_bad_plugins_fail_before_the_run_dir(tmp_path, caplog):
    out = tmp_path / "run"
    assert "cannot import 'nope_mod'" in _fail(caplog, *SMALL, "--env", "nope_mod:Env", "--out", str(out))
    assert "--env and --reward cannot be simulated" in _fail(
        caplog, "--sim", "--env", "examples.guess_env:GuessEnv", "--reward", "examples.my_reward:exact_answer", "--out", str(out))
    assert "brings no demonstration and its env no scripted oracle" in _fail(
        caplog, *SMALL, "--env", "examples.digits_env:DigitEnv", "--demo-turns", "1", "--out", str(out))
    assert not out.exists()


def test_a_run_trains_on_the_example_env(tmp_path):
    out = tmp_path / "run"
    assert libra.main([*SMALL, "--env", "examples.guess_env:GuessEnv", "--num-tasks", "4", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["bench"] == "guess"
    assert summary["trained_task_ids"] and all(t.startswith("guess-0-") for t in summary["trained_task_ids"])
    assert json.loads((out / "config.json").read_text())["run"]["env"] == "examples.guess_env:GuessEnv"


def test_a_run_scores_data_rows_with_a_reward_from_the_working_dir(tmp_path):
    # as a user would: their module in the directory they run from, libra.py elsewhere
    (tmp_path / "quarter.py").write_text("def reward(final_text, ground_truth, task):\n    return 0.25, 'quarter'\n")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(ROOT / "libra.py"), *SMALL, "--bench", "search",
                           "--data", str(ROOT / "examples" / "qa_rows.jsonl"), "--reward", "quarter:reward", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert rows and all(r["reward"] == 0.25 and r["reward_reason"] == "quarter" for r in rows)
    assert all(r["task_id"].startswith("qa-") for r in rows)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum(m.get("score/quarter", 0) for m in metrics) == len(rows)  # the reason reaches each step's row


def test_env_flag_coexists_with_an_env_section():
    # the sandbox work adds an `env` config section (`--env.isolation`); `--env` must stay its own flag
    from config import build_parser

    parser = build_parser()
    if not any("--env.isolation" in a.option_strings for a in parser._actions):
        parser.add_argument("--env.isolation", dest="env.isolation")
    ns = vars(parser.parse_args(["--env", "examples.guess_env:GuessEnv", "--env.isolation", "x"]))
    assert ns["run.env"] == "examples.guess_env:GuessEnv" and ns["env.isolation"] == "x"
