"""The probe grader (envs/swe/probe.py, envs/swe/grade.py): faithful to pytest on real mutants, and
nothing the graded process writes can make a pass the host did not see computed.

Real sandboxed runs of the six projects' hidden tests, plus the verdict on hand-made records.
"""

import ast
import json
import random

import pytest

from envs.swe import env as swe
from envs.swe import grade as grading
from envs.swe import probe
from envs.swe import probe_check as check
from envs.base import ToolCall
from envs.swe.mutate import PROJECTS_DIR


@pytest.fixture(scope="module")
def env():
    e = swe.SweEnv(seed=0)
    yield e
    e.close()


def _probe(env, task, fix: bool = False, init_code: str | None = None):
    ep = env.start(task)
    try:
        if fix:
            r = ep.execute(ToolCall("replace", {"path": task.meta["file"], "old": task.answer["patch_old"],
                                                "new": task.answer["patch_new"]}))
            assert r.status == "success", r.text
        if init_code is not None:
            init = ep.workdir / task.answer["package"] / "__init__.py"
            init.write_text(init_code + "\n" + init.read_text())
        runs = env.grader.probe(ep.workdir, ep._reference())
        return runs if isinstance(runs, grading.Grade) else (runs, grading.verdict(*runs))
    finally:
        ep.close()


def _task(env, task_id_prefix: str):
    return next(t for t in env.tasks() if t.task_id.startswith(task_id_prefix))


def test_each_project_passes_its_own_probes_and_its_fix_scores_one(env):
    projects = sorted({t.meta["project"] for t in env.tasks()})
    assert len(projects) == 6
    for project in projects:
        task = next(t for t in env.tasks() if t.meta["project"] == project)
        (runs, grade) = _probe(env, task, fix=True)
        assert (grade.reward, grade.reason) == (1.0, "passed"), (project, grade)
        suite = runs[0]
        assert suite.reference is not None and len(suite.tests) >= 14


def test_mutants_fail_every_test_pytest_fails(env):
    """Two tasks per project, and the two whose bug is in an `__eq__` (only the equality run sees it)."""
    rng = random.Random(0)
    by_project: dict[str, list] = {}
    for t in env.tasks():
        by_project.setdefault(t.meta["project"], []).append(t)
    tasks = [t for ts in by_project.values() for t in rng.sample(ts, 2)]
    tasks += [_task(env, "swe-calc-720119e746"), _task(env, "swe-intervals-5d80292fc6")]
    for task in tasks:
        runs, grade = _probe(env, task)
        bad, canaries = grading.check_entries(*runs)
        # pytest's failures are all seen; the probes may see more (an __eq__ that hides a wrong value)
        assert set(task.answer["failing_tests"]) <= set(bad), (task.task_id, sorted(bad))
        assert (grade.reward, grade.reason, canaries) == (0.0, "tests_failed", []), (task.task_id, grade)


def test_the_probe_source_holds_no_expected_value(env):
    task = next(t for t in env.tasks() if t.meta["project"] == "calc")
    suite = env.grader.suite(env.start(task)._reference())
    rendering = check.render(suite, random.Random(1))
    source = rendering.sources["tests/test_calc.py"]
    original = (PROJECTS_DIR / "calc" / "tests" / "test_calc.py").read_text()
    assert 'evaluate("2 ^ 3 ^ 2") == 512' in original and "512" not in source
    assert "pytest" not in source and '"""' not in source  # no pytest, no docstrings
    tree = ast.parse(source)
    sites = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == probe.SITE_FN]
    assert len(sites) >= len(suite.sites) and all(len(s.args) == 2 for s in sites)  # no expected side
    names = [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")]
    assert not set(names) & {n.split("::")[-1] for n in suite.tests}  # opaque names
    assert len(names) == len(suite.tests) + check.NUM_CANARIES  # canaries look like any other test
    again = check.render(suite, random.Random(2)).sources["tests/test_calc.py"]
    assert again != source  # ids, names, negations and canaries differ per grading


def test_unsupported_pytest_features_are_refused_with_where(tmp_path):
    cases = {
        "@pytest.mark.parametrize('x', [1, 2])\ndef test_a(x):\n    assert x\n": "decorated tests",
        "def test_a(capsys):\n    assert 1\n": "only the tmp_path fixture",
        "def test_a():\n    pytest.skip('no')\n": "pytest outside an assert",
        "assert 1 == 1\n": "asserts at module level",
    }
    for body, message in cases.items():
        (tmp_path / "test_x.py").write_text("import pytest\n\n" + body)
        with pytest.raises(probe.ProbeUnsupported, match=message):
            probe.load_suite(tmp_path)


def _fake_run(suite, rendering, records: list[dict], done: bool = True):
    lines = [json.dumps(r).encode() for r in records] + ([b'{"done": true}'] if done else [])
    run = grading.read_run(rendering, b"\n".join(lines))
    return run if isinstance(run, grading.Grade) else grading.verdict(suite, run)


def _honest_records(suite, rendering):
    """What an honest run of the reference package would write, in the rendering's names and ids."""
    shown = {index: shown for shown, index in rendering.site_of.items()}
    out = []
    for i, (test_id, _) in enumerate(rendering.entries):
        ref = suite.reference[test_id]
        for index, outcomes in ref["sites"].items():
            for o in outcomes:
                if index in rendering.flipped:
                    o = ["v", not o[1]]
                out.append({"t": i, "k": shown[index], "o": o})
        out.append({"t": i, "end": ["ok"]})
    return out


def test_the_verdict_is_the_hosts_whatever_the_records_say(env):
    task = next(t for t in env.tasks() if t.meta["project"] == "calc")
    ref = env.start(task)._reference()
    suite = env.grader.suite(ref)
    rendering = check.render(suite, random.Random(3))
    honest = _honest_records(suite, rendering)
    assert _fake_run(suite, rendering, honest).reason == "passed"
    # every check answered True, every test ended well: flipped and false-expected checks fail
    shown_sites = [r for r in honest if "k" in r]
    constant = [{**r, "o": ["v", True]} if "k" in r else r for r in honest]
    assert _fake_run(suite, rendering, constant).reason == "tests_failed"
    # ends without the checks
    assert _fake_run(suite, rendering, [r for r in honest if "end" in r]).reason == "tests_failed"
    # junk, a second end, a check after the end, an unknown check id, a malformed value
    junk = [
        honest + [{"t": 0, "end": ["ok"]}],
        honest + [shown_sites[0]],
        honest[:1] + [{"t": 0, "k": 1, "o": ["v", 1]}] + honest[1:],
        [{**shown_sites[0], "o": ["v", {"I": 5}]}] + honest[1:],
        [{"t": "0", "end": ["ok"]}],
    ]
    reasons = [_fake_run(suite, rendering, records).reason for records in junk]
    assert reasons[:3] == ["tampered"] * 3 and reasons[4] == "tampered", reasons
    assert reasons[3] in ("tests_failed", "tampered")
    assert _fake_run(suite, rendering, honest, done=False).reason == "crashed"
    # a canary answered differently from its twin (which passes): the answers depended on the copy
    canary = next(i for i, (_, c) in enumerate(rendering.entries) if c)
    inverted = rendering.inverted[canary]
    shown = {index: s for s, index in rendering.site_of.items()}
    forged, seen = [], False
    for r in honest:
        if r.get("t") == canary and r.get("k") == shown[inverted] and not seen:
            seen = True
            o = r["o"]
            r = {**r, "o": ["v", not o[1]] if isinstance(o[1], bool) else ["v", {"L": ["forged"]}]}
        forged.append(r)
    assert _fake_run(suite, rendering, forged).reason == "tampered"


def test_decode_is_total_on_hostile_values():
    for bad in ({"I": 5}, {"L": 3}, {"D": [[1]]}, {"O": "x", "a": [1]}, {"zz": 1}, [1], {"S": [[]]}, {}):
        with pytest.raises(ValueError):
            check.decode(bad)
    deep = 1
    for _ in range(200):
        deep = {"L": [deep]}
    with pytest.raises(ValueError):
        check.decode(deep)
    assert check.decode({"T": [1, {"S": [2, 3]}, {"O": "P", "a": {"x": 1}}]}) == (1, frozenset({2, 3}), check.Obj("P", (("x", 1),)))
