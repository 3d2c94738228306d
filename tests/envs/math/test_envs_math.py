"""math env: deterministic problems, sandboxed python tool, boxed-answer equivalence, scripted agents."""

import json
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import pytest

from envs.base import ToolCall, run_scripted
from envs.math.grade import MathGrader
from envs.math.env import MathConfig, MathEnv, format_answer, last_boxed, oracle_actions, wrong_actions
from envs.registry import make_env


@pytest.fixture(scope="module")
def env():
    return make_env("math", seed=0, num_tasks=50, cfg=MathConfig(timeout_s=3.0, memory_mb=256))


def _dump(env: MathEnv) -> str:
    return json.dumps([t.__dict__ for t in env.tasks()], sort_keys=True)


def test_same_seed_same_tasks_byte_for_byte(env):
    assert _dump(MathEnv(seed=0, num_tasks=50)) == _dump(env)
    assert _dump(MathEnv(seed=1, num_tasks=50)) != _dump(env)
    assert [t.level for t in env.tasks()[:5]] == [0, 1, 2, 3, 0]
    assert {t.level for t in MathEnv(seed=0, num_tasks=6, level=3).tasks()} == {3}


def test_oracle_scores_one_and_wrong_scores_zero_on_50_tasks(env):
    tasks = env.tasks()
    with ThreadPoolExecutor(4) as pool:  # episodes may run concurrently; this also keeps the test short
        oracle = list(pool.map(lambda t: run_scripted(env, t, oracle_actions(t)), tasks))
    assert [r for r, _ in oracle] == [1.0] * 50
    assert all(len(res) == 1 and res[0].status == "success" for _, res in oracle)
    # The program the oracle runs prints the gold answer (Fraction prints 7/2, the gold is \frac{7}{2}).
    assert [format_answer(Fraction(res[0].text.strip())) for _, res in oracle] == [t.answer["answer"] for t in tasks]
    assert [run_scripted(env, t, wrong_actions(t))[0] for t in tasks] == [0.0] * 50


def test_python_tool_statuses(env):
    episode = env.start(env.tasks()[0])
    try:
        ok = episode.execute(ToolCall("python", {"code": "print(sum(range(10)))"}))
        assert (ok.tool, ok.text, ok.status) == ("python", "45\n", "success")
        err = episode.execute(ToolCall("python", {"code": "1/0"}))
        assert err.status == "failure" and "ZeroDivisionError" in err.text
        slow = episode.execute(ToolCall("python", {"code": "while True: pass"}))
        assert slow.status == "timeout" and slow.text.endswith("[timed out after 3 s]")
        bad = episode.execute(ToolCall("python", {"source": "print(1)"}))
        assert bad.status == "failure" and "missing required argument(s) ['code']" in bad.text
    finally:
        episode.close()
    assert not episode.workdir.exists()


def test_python_tool_has_no_network_where_the_sandbox_isolates_it(env):
    if not env.sandbox.isolation.startswith("pid+net"):
        pytest.skip(f"sandbox isolation is {env.sandbox.isolation!r} here: no network namespace to test")
    episode = env.start(env.tasks()[0])
    try:
        code = "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 80), 1); print('up')\nexcept OSError: print('down')"
        assert episode.execute(ToolCall("python", {"code": code})).text == "down\n"
    finally:
        episode.close()


@pytest.mark.parametrize(
    "text, boxed",
    [("x \\boxed{3} and \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"), ("\\boxed{ {a}{b} }", "{a}{b}"), ("none", None), ("\\boxed{unclosed", None)],
)
def test_last_boxed(text, boxed):
    assert last_boxed(text) == boxed


def test_formatting():
    assert format_answer(Fraction(-7, 2)) == "-\\frac{7}{2}" and format_answer(Fraction(6, 3)) == "2"


def test_equivalence_off_the_main_thread_is_bounded_and_survives_a_killed_grader_process():
    grader = MathGrader(timeout_s=2.0, max_concurrent=1)
    try:
        with ThreadPoolExecutor(2) as pool:  # where the coordinator scores: not the main thread
            assert pool.submit(grader.equal, "96.0", "96").result() == (True, "verified")
            assert pool.submit(grader.equal, "3", "4").result() == (False, "not_equal")
            assert pool.submit(grader.equal, "0.5", "0.5").result() == (True, "exact")
            t0 = time.monotonic()
            assert pool.submit(grader.equal, "9^{9^{9^{9}}}", "4").result() == (False, "timeout")
            assert time.monotonic() - t0 < 2.0 + 1.0
        assert grader.equal("x = 96", "96") == (True, "verified")  # the timed-out child was killed, nothing else
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(grader.equal, "9^{9^{9^{9}}}", "4")
            time.sleep(0.5)
            grader._zygote.proc.kill()  # the grader process dies under a comparison
            assert slow.result() == (False, "grader_error")
        assert grader.equal("\\dfrac{1}{2}", "0.5") == (True, "verified")  # a new one took over
    finally:
        grader.close()
    with pytest.raises(ValueError, match=r"timeout_s=0 must be > 0"):
        MathGrader(timeout_s=0)


def test_sixteen_slow_answers_do_not_delay_an_honest_one():
    """Issue 30: behind 8 slow answers an honest `x = 96` waited 29.3 s (and became an infra drop upstream).
    Now the honest one is scored 1 within its own deadline, and the slow ones are scored 0 "timeout"."""
    grader = MathGrader(timeout_s=4.0)
    try:
        assert grader.equal("\\frac{1}{2}", "0.5") == (True, "verified")  # started: the start-up is not what is measured
        with ThreadPoolExecutor(17) as pool:
            slow = [pool.submit(grader.equal, "9^{9^{9^{%d}}}" % (9 + i), "4") for i in range(16)]
            time.sleep(0.2)  # all 16 in flight first
            t0 = time.monotonic()
            honest = pool.submit(grader.equal, "x = 96", "96")
            assert honest.result() == (True, "verified")
            honest_s = time.monotonic() - t0
            assert [f.result() for f in slow] == [(False, "timeout")] * 16
    finally:
        grader.close()
    assert honest_s < grader.timeout_s, honest_s


def test_close_with_comparisons_in_flight_returns_at_once():
    grader = MathGrader(timeout_s=20.0)
    with ThreadPoolExecutor(3) as pool:
        slow = [pool.submit(grader.equal, "9^{9^{9^{9}}}", "%d" % i) for i in range(3)]
        time.sleep(1.0)
        t0 = time.monotonic()
        grader.close()
        assert [f.result(timeout=5) for f in slow] == [(False, "grader_error")] * 3
        assert time.monotonic() - t0 < 5.0
    assert grader.equal("x = 96", "96") == (True, "verified")  # a later comparison starts a new grader process
    grader.close()


def test_dapo_rows(tmp_path):
    row = {"prompt": [{"role": "user", "content": "What is 1/2 + 1/4?"}], "reward_model": {"ground_truth": "\\frac{3}{4}"}, "extra_info": {"index": 3}}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(row) + "\n")
    env = make_env("math", data_path=str(path))
    (task,) = env.tasks()
    assert task.task_id == "3" and task.answer == "\\frac{3}{4}"
    assert run_scripted(env, task, oracle_actions(task)) == (1.0, [])
    assert run_scripted(env, task, ["\\boxed{0.75}"])[0] == 1.0
    assert run_scripted(env, task, wrong_actions(task))[0] == 0.0


@pytest.mark.parametrize("kw, msg", [({"timeout_s": 0}, r"MathConfig.timeout_s=0 must be > 0"), ({"num_tasks": -2}, r"MathConfig.num_tasks=-2 must be > 0")])
def test_config_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        MathConfig(**kw)


def test_level_out_of_range():
    with pytest.raises(ValueError, match=r"math: level=9 must be in \[0, 3\]"):
        MathEnv(level=9)
