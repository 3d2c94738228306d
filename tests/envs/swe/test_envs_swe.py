"""swe env: tasks and levels, tools against a real mutant work dir, oracle/wrong agents, cleanup."""

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from envs.swe import env as swe
from envs.base import ToolCall, ToolCallError, parse_tool_calls, run_scripted


@pytest.fixture(scope="module")
def env():
    e = swe.SweEnv(seed=0)
    yield e
    e.close()


def _calc_task(env, level=None):
    """A calc task whose bug is in evaluator.py, so lexer.py is pristine and its lines are known."""
    return next(t for t in env.tasks() if t.meta["file"] == "calc/evaluator.py" and (level is None or t.level == level))


def call(name, **arguments):
    return ToolCall(name=name, arguments=arguments)


def test_config_errors():
    with pytest.raises(ValueError, match=r"SweConfig.test_timeout_s=0 must be > 0"):
        swe.SweConfig(test_timeout_s=0)
    with pytest.raises(ValueError, match=r"SweConfig.max_output_chars=0 must be >= 1"):
        swe.SweConfig(max_output_chars=0)
    with pytest.raises(ValueError, match=r"swe level=4 must be in 0..3"):
        swe.SweEnv(level=4)
    with pytest.raises(ValueError, match=r"swe num_tasks=0 must be >= 1"):
        swe.SweEnv(num_tasks=0)


def test_tasks_are_deterministic_and_cycle_levels(env):
    tasks = env.tasks()
    assert len(tasks) >= 200
    again = swe.SweEnv(seed=0, num_tasks=12).tasks()
    assert [(t.task_id, t.messages) for t in again] == [(t.task_id, t.messages) for t in tasks[:12]]
    assert [t.level for t in tasks[:8]] == [0, 1, 2, 3, 0, 1, 2, 3]
    other = swe.SweEnv(seed=1, num_tasks=12).tasks()
    assert [t.task_id for t in other] != [t.task_id for t in tasks[:12]]
    assert {t.level for t in swe.SweEnv(seed=0, level=2, num_tasks=5).tasks()} == {2}
    assert [t["function"]["name"] for t in tasks[0].tools] == ["view_file", "search", "replace", "run_tests", "submit"]


def test_issue_text_per_level(env):
    task = swe.SweEnv(seed=0, level=0, num_tasks=1).tasks()[0]
    a, m = task.answer, task.meta
    user = task.messages[1]["content"]
    assert f"In `{m['file']}` line {m['bug_line']}" in user
    assert f"```\n{a['patch_old']}\n```" in user and f"```\n{a['patch_new']}\n```" in user
    (shown,) = parse_tool_calls(user)
    assert shown.name == "replace" and shown.arguments == {"path": m["file"], "old": a["patch_old"], "new": a["patch_new"]}
    record = {"mutation": a["mutation"], "patch_old": "x", "patch_new": "y", "bug_line": 3,
              "failing_tests": ["tests/t.py::test_a", "tests/t.py::test_b"], "failing_docs": ["A holds.", "B holds."]}
    assert "A holds." in swe.issue_text(record, 1) and a["mutation"]["file"] in swe.issue_text(record, 1)
    assert "the test `tests/t.py::test_a` fails (and 1 more)" in swe.issue_text(record, 2)
    level3 = swe.issue_text(record, 3)
    assert "A holds." in level3 and a["mutation"]["file"] not in level3 and "test_a" not in level3


def test_view_search_and_path_confinement(env, tmp_path):
    ep = env.start(_calc_task(env))
    try:
        r = ep.execute(call("view_file", path="pytest.ini"))
        assert r.status == "success"
        assert r.text == "pytest.ini lines 1-2 of 2:\n   1| [pytest]\n   2| addopts = -p no:cacheprovider"
        r = ep.execute(call("view_file", path="calc/lexer.py", start_line=3, end_line=4))
        assert r.text.startswith("calc/lexer.py lines 3-4 of ") and "   3| OPERATORS = " in r.text
        assert "calc/evaluator.py" in ep.execute(call("view_file", path=".")).text
        r = ep.execute(call("search", pattern="class LexError", path="calc"))
        assert r.text == "1 matches for 'class LexError':\ncalc/lexer.py:21: class LexError(ValueError):"
        assert ep.execute(call("search", pattern="zzz_nothing")).text == "no matches for 'zzz_nothing'"
        os.symlink(tmp_path, ep.workdir / "escape")
        for bad, why in [("../x", "may not contain '..'"), ("/etc/passwd", "must be relative"),
                         ("escape/f", "leaves the repository"), ("nope.py", "no file 'nope.py'")]:
            r = ep.execute(call("view_file", path=bad))
            assert r.status == "failure" and why in r.text, r.text
        r = ep.execute(call("replace", path="escape/f", old="a", new="b"))
        assert r.status == "failure" and "leaves the repository" in r.text
        assert not list(tmp_path.iterdir())
    finally:
        ep.close()


def test_bad_calls_become_failures(env):
    ep = env.start(_calc_task(env))
    try:
        assert ep.execute(ToolCallError(message="not json")).status == "failure"
        r = ep.execute(call("rm_rf", path="."))
        assert r.status == "failure" and "unknown tool" in r.text
        r = ep.execute(call("replace", path="calc/lexer.py", old="x"))
        assert r.status == "failure" and "missing required argument" in r.text
        r = ep.execute(call("view_file", path="calc/lexer.py", start_line="3"))
        assert r.status == "failure" and "must be integer" in r.text
        r = ep.execute(call("replace", path="calc/lexer.py", old="no such text", new="y"))
        assert r.status == "failure" and "old text not found in calc/lexer.py" in r.text
        r = ep.execute(call("replace", path="calc/lexer.py", old="i += 1", new="i += 2"))
        assert r.status == "failure" and "occurs 4 times" in r.text
        r = ep.execute(call("run_tests", selector="../../etc"))
        assert r.status == "failure" and "may not contain '..'" in r.text
        r = ep.execute(call("run_tests", selector="-p os"))
        assert r.status == "failure" and "not an option" in r.text
        # issue 30: a NUL byte after '::' reached the sandbox (a ValueError inside the tool, one fstab left per call)
        fstabs = set(ep.sandbox._newroot.parent.glob("fstab-*"))
        for selector in ("tests::a\0b", "tests\0x"):
            r = ep.execute(call("run_tests", selector=selector))
            assert r.status == "failure" and "may not contain a NUL byte" in r.text, r.text
        assert set(ep.sandbox._newroot.parent.glob("fstab-*")) <= fstabs
        for path in (".", "./", "calc"):  # issue 30: '.' raised IndexError inside the tool
            r = ep.execute(call("replace", path=path, old="x", new="y"))
            assert r.status == "failure" and f"{path!r} is a directory; replace edits one file" in r.text, r.text
        assert ep.score("I give up") == 0.0
    finally:
        ep.close()


def test_full_oracle_script_on_three_tasks(env):
    tasks = swe.SweEnv(seed=3, num_tasks=3).tasks()
    assert {t.level for t in tasks} != {0}
    for task in tasks:
        reward, results = run_scripted(env, task, swe.oracle_actions(task))
        assert reward == 1.0, (task.task_id, [r.text[:300] for r in results])
        if task.level == 0:  # the issue text shows the fix: no need to look or test first
            assert [r.tool for r in results] == ["replace", "submit"]
        else:
            assert [r.tool for r in results] == ["view_file", "replace", "run_tests", "submit"]
            assert results[2].text.startswith("PASSED: ")
        assert results[-1].done and all(r.status == "success" for r in results)


def test_level0_oracle_follows_the_issue_text(env):
    task = swe.SweEnv(seed=0, level=0, num_tasks=1).tasks()[0]
    reward, results = run_scripted(env, task, swe.oracle_actions(task))
    assert reward == 1.0 and [r.tool for r in results] == ["replace", "submit"]
    assert swe.oracle_actions(task)[0].split(" ", 2)[2] in task.messages[-1]["content"]  # the call the text shows


def test_run_tests_reports_the_failure_first(env):
    task = _calc_task(env)
    ep = env.start(task)
    try:
        r = ep.execute(call("run_tests"))
        assert r.status == "failure" and r.text.startswith("FAILED: ")
        assert task.answer["failing_tests"][0] in r.text
        r = ep.execute(call("run_tests", selector=task.answer["failing_tests"][0]))
        assert r.text.startswith("FAILED: 1 failed (pytest exit code 1)")
    finally:
        ep.close()


def _oracle_submit(env, task):
    ep = env.start(task)
    try:
        fix = ep.execute(call("replace", path=task.meta["file"], old=task.answer["patch_old"], new=task.answer["patch_new"]))
        assert fix.status == "success", fix.text
        done = ep.execute(call("submit"))
        assert done.done
        return ep.score("")
    finally:
        ep.close()


def test_oracle_gets_reward_one_on_a_50_task_sample(env):
    tasks = swe.SweEnv(seed=11, num_tasks=50).tasks()
    with ThreadPoolExecutor(2) as pool:
        rewards = list(pool.map(lambda t: _oracle_submit(env, t), tasks))
    assert rewards == [1.0] * 50


def test_an_unsubmitted_episode_is_graded_on_its_final_repository(env):
    task = _calc_task(env)
    fix = call("replace", path=task.meta["file"], old=task.answer["patch_old"], new=task.answer["patch_new"])
    strict = swe.SweEnv(seed=0, cfg=swe.SweConfig(grade_unsubmitted=False))
    for e, fixed, expected in ((env, True, 1.0), (env, False, 0.0), (strict, True, 0.0)):
        ep = e.start(task)
        try:
            if fixed:
                assert ep.execute(fix).status == "success"
            assert ep.score("the model stopped without submit") == expected, (fixed, e.cfg)
        finally:
            ep.close()
    strict.close()


def test_wrong_agent_that_disables_tests_gets_zero(env):
    for task in swe.SweEnv(seed=5, num_tasks=4).tasks():
        reward, results = run_scripted(env, task, swe.wrong_actions(task))
        assert reward == 0.0
        assert results[-2].text.startswith(("PASSED", "FAILED"))
        assert results[-1].done and results[-1].text == "Submitted: hidden tests fail."


def test_exit_zero_cheat_and_deleted_package_get_zero(env):
    task = _calc_task(env)
    ep = env.start(task)
    try:
        init = (ep.workdir / "calc" / "__init__.py").read_text()
        r = ep.execute(call("replace", path="calc/__init__.py", old=init[:20], new="import os; os._exit(0)\n" + init[:20]))
        assert r.status == "success"
        assert ep.execute(call("submit")).text == "Submitted: hidden tests fail."
        assert ep.score("") == 0.0
        assert ep.execute(call("view_file", path=".")).text == "Error: the episode already ended with submit"
    finally:
        ep.close()


def test_episodes_clean_up_their_work_dirs(env):
    import psutil

    me = psutil.Process()
    before_fds, before_children = me.num_fds(), len(me.children(recursive=True))
    probe = env.sandbox.make_workdir("probe")
    root = probe.parent
    env.sandbox.remove_workdir(probe)
    before_dirs = set(os.listdir(root))
    workdirs = []
    for i, task in enumerate(env.tasks()[:3]):
        ep = env.start(task)
        workdirs.append(ep.workdir)
        ep.execute(call("run_tests" if i == 0 else "submit"))
        ep.close()
        ep.close()  # closing twice is harmless
    left = env.start(env.tasks()[5])
    env.close()  # the env closes episodes the caller forgot
    assert not any(w.exists() for w in workdirs + [left.workdir])
    assert set(os.listdir(root)) <= before_dirs
    assert me.num_fds() == before_fds and len(me.children(recursive=True)) == before_children


def test_oracle_actions_are_hermes_calls(env):
    task = _calc_task(env, level=1)
    actions = swe.oracle_actions(task)
    calls = [parse_tool_calls(a)[0] for a in actions]
    assert [c.name for c in calls] == ["view_file", "replace", "run_tests", "submit"]
    assert calls[1].arguments == {"path": task.meta["file"], "old": task.answer["patch_old"], "new": task.answer["patch_new"]}
    assert json.loads(calls[1].raw)["name"] == "replace"


def test_exported_rows_load_back_and_score(env, tmp_path):
    from envs.swe.data import export_rows

    tasks = swe.SweEnv(seed=2, num_tasks=2).tasks()
    path = export_rows(tasks, str(tmp_path / "swe.jsonl"))
    loaded = swe.SweEnv(data_path=str(path))
    try:
        got = loaded.tasks()
        assert [(t.task_id, t.messages, t.level, t.answer) for t in got] == [(t.task_id, t.messages, t.level, t.answer) for t in tasks]
        assert got[0].meta["bug_line"] == tasks[0].meta["bug_line"]
        reward, _ = run_scripted(loaded, got[0], swe.oracle_actions(got[0]))
        assert reward == 1.0
    finally:
        loaded.close()


def test_external_repository_row(tmp_path):
    import shutil

    from envs.swe.mutate import PROJECTS_DIR

    repo = tmp_path / "repo"
    shutil.copytree(PROJECTS_DIR / "wraptext", repo, ignore=shutil.ignore_patterns("__pycache__"))
    hidden = tmp_path / "hidden_tests"
    shutil.move(repo / "tests", hidden)  # the user sees no tests; submit brings them in
    (repo / "tests").mkdir()
    src = repo / "wraptext" / "wrap.py"
    src.write_text(src.read_text().replace("left = total // 2", "left = total // 3"))
    row = {"prompt": [{"role": "user", "content": "center() is off."}],
           "reward_model": {"ground_truth": json.dumps({"file": "wraptext/wrap.py", "patch_old": "left = total // 3",
                                                        "patch_new": "left = total // 2"})},
           "extra_info": {"index": "ext-1", "repo_dir": "repo", "package": "wraptext", "hidden_tests_dir": "hidden_tests"}}
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(row) + "\n")
    env = swe.SweEnv(data_path=str(data), level=1)
    try:
        (task,) = env.tasks()
        assert task.task_id == "ext-1" and task.level == 1 and task.messages[0]["role"] == "system"
        assert run_scripted(env, task, swe.oracle_actions(task))[0] == 1.0
        assert run_scripted(env, task, ['<tool_call>{"name": "submit", "arguments": {}}</tool_call>'])[0] == 0.0
    finally:
        env.close()
    data.write_text(json.dumps({**row, "extra_info": {"index": "x"}}) + "\n")
    with pytest.raises(ValueError, match=r"swe data row 0 has no extra_info.repo_dir"):
        swe.SweEnv(data_path=str(data))


def test_hidden_tests_are_held_out_per_task(env):
    from envs.swe import grade as swe_grade
    from envs.swe.mutate import PROJECTS_DIR

    held = {}
    for task in [t for t in env.tasks() if t.meta["project"] == "calc"][:3]:
        ep = env.start(task)
        try:
            visible = swe_grade.test_ids(ep.workdir / "tests")
        finally:
            ep.close()
        every = swe_grade.test_ids(PROJECTS_DIR / "calc" / "tests")
        held[task.task_id] = sorted(set(every) - set(visible))
        assert held[task.task_id] and len(held[task.task_id]) == len(every) // 4
        assert set(visible) | set(held[task.task_id]) == set(every)
        assert task.answer["failing_tests"][0] in visible  # the test a level-2 issue names stays visible
    assert len({tuple(h) for h in held.values()}) > 1  # the split is per task


def test_host_tools_refuse_fifos_and_cap_outputs(env):
    task = _calc_task(env)
    ep = env.start(task)
    try:
        os.mkfifo(ep.workdir / "calc" / "zz.py")
        (ep.workdir / "calc" / "big.py").write_text("needle" + "x" * (3 << 20) + "\n")
        os.makedirs(ep.workdir / "many")
        for i in range(1000):
            (ep.workdir / "many" / f"f{i:04d}.py").touch()
        r = ep.execute(call("view_file", path="calc/zz.py"))
        assert r.status == "failure" and "not a regular file" in r.text
        s = ep.execute(call("search", pattern="needle"))
        assert s.status == "success" and "calc/big.py:1: needle" in s.text and len(s.text) < 2000
        v = ep.execute(call("view_file", path="calc/big.py"))
        assert len(v.text) < 2000 and "more characters" in v.text
        listing = ep.execute(call("view_file", path="."))
        assert "more files; view a subdirectory" in listing.text and len(listing.text.splitlines()) <= 303
        assert ep.execute(call("replace", path="calc/zz.py", old="a", new="b")).status == "failure"
        assert ep.score("") == 0.0  # the FIFO in the package is skipped, the bug is still there
    finally:
        ep.close()
    assert env.faults == {}  # refusals are the model's mistakes, not tool faults


def test_the_env_names_the_data_dirs_its_sandbox_hides():
    """The swe data under a bound dir: a plain sandbox shows it, the swe env's sandbox covers it, whatever config it got."""
    import sys
    from pathlib import Path

    from envs.sandbox.sandbox import Sandbox, SandboxConfig

    envs_dir = str(Path(swe.__file__).resolve().parents[1])  # holds swe/projects and swe/tasks
    cfg = SandboxConfig(timeout_s=30.0, expose_paths=(envs_dir,))
    plain = Sandbox(cfg)
    if not plain.isolation.startswith("pid+net"):
        pytest.skip(f"no namespaces here (rlimits mode hides nothing): {plain.isolation}")
    paths = [os.path.join(envs_dir, "base.py"), *(os.path.join(d, sorted(os.listdir(d))[0]) for d in swe.HIDDEN_DATA_DIRS)]
    code = "import os, sys; print([os.path.exists(p) for p in sys.argv[1:]])"
    env = swe.SweEnv(seed=0, num_tasks=1, sandbox_cfg=cfg)
    try:
        for sb, seen in ((plain, [True, True, True]), (env.sandbox, [True, False, False])):
            with sb.workdir("t") as w:
                r = sb.run([sys.executable, "-c", code, *paths], cwd=w)
            assert r.stdout.strip() == str(seen), r.output
    finally:
        env.close()
