"""swe task generation: mutation enumeration, fix windows, the committed index, re-verification."""

import json
import random
import subprocess

import pytest

from envs.swe import mutate as mut


def test_generate_config_errors():
    with pytest.raises(ValueError, match=r"num_per_project=0 must be >= 1"):
        mut.GenerateConfig(num_per_project=0)
    with pytest.raises(ValueError, match=r"test_timeout_s=0 must be > 0"):
        mut.GenerateConfig(test_timeout_s=0)
    with pytest.raises(ValueError, match=r"num_workers=0 must be >= 1"):
        mut.GenerateConfig(num_workers=0)


def test_at_least_six_projects_of_real_size():
    names = mut.project_names()
    assert len(names) >= 6
    for name in names:
        num_lines = sum(len((mut.PROJECTS_DIR / name / f).read_text().splitlines()) for f in mut.module_files(name))
        assert 100 <= num_lines + len((mut.PROJECTS_DIR / name / name / "__init__.py").read_text().splitlines()) <= 400, name
        assert list((mut.PROJECTS_DIR / name / "tests").glob("test_*.py")), name


def test_enumeration_is_deterministic_and_covers_every_kind():
    kinds = set()
    for name in mut.project_names():
        first, second = mut.enumerate_mutations(name), mut.enumerate_mutations(name)
        assert first == second
        kinds |= {m.kind for m in first}
    assert kinds == {"operator_swap", "comparison_flip", "boolean_swap", "off_by_one", "wrong_constant",
                     "swapped_args", "removed_branch"}


def test_mutation_edits_are_local():
    source = "def f(a, b):\n    if a < b:\n        return a + 1\n    return g(a, b)\n"
    m = mut.Mutation(project="p", file="p/x.py", kind="comparison_flip", start=21, end=24, replacement=" <= ",
                     line=2, function="f")
    assert m.apply(source) == "def f(a, b):\n    if a <= b:\n        return a + 1\n    return g(a, b)\n"


def test_fix_window_restores_the_original_for_every_candidate():
    num_windows = num_total = 0
    for name in mut.project_names():
        sources = {f: (mut.PROJECTS_DIR / name / f).read_text() for f in mut.module_files(name)}
        for m in mut.enumerate_mutations(name):
            original = sources[m.file]
            mutant = m.apply(original)
            num_total += 1
            window = mut.fix_window(original, mutant)
            if window is not None:
                num_windows += 1
                old, new = window
                assert mutant.count(old) == 1 and mutant.replace(old, new) == original
    assert num_windows / num_total > 0.9


def test_fix_window_single_line_drops_indentation_and_deletion_takes_context():
    original = "a = 1\nif x:\n    y = 2\nz = 3\n"
    assert mut.fix_window(original, "a = 1\nif x:\n    y = 3\nz = 3\n") == ("y = 3", "y = 2")
    old, new = mut.fix_window(original, "a = 1\nz = 3\n")
    assert "a = 1\nz = 3".find(old) >= 0 and ("a = 1\nz = 3\n").replace(old, new) == original


def test_failed_tests_parses_the_rf_summary():
    out = "..F\nFAILED tests/test_a.py::test_x - assert 1 == 2\nFAILED tests/test_a.py::test_y\n1 failed, 2 passed in 0.1s\n"
    assert mut.failed_tests(out) == ["tests/test_a.py::test_x", "tests/test_a.py::test_y"]


def test_committed_index_is_current_large_and_consistent():
    index = mut.load_index(0)
    tasks = index["tasks"]
    assert len(tasks) >= 200
    assert sorted(index["projects"]) == mut.project_names()
    assert len({t["task_id"] for t in tasks}) == len(tasks)
    for t in tasks:
        m = mut.Mutation(**t["mutation"])
        original = (mut.PROJECTS_DIR / m.project / m.file).read_text()
        mutant = m.apply(original)
        assert mutant.count(t["patch_old"]) == 1
        assert mutant.replace(t["patch_old"], t["patch_new"]) == original
        assert t["failing_tests"] and len(t["failing_docs"]) == len(t["failing_tests"])
    # the file on disk is exactly what dump_index writes: byte-deterministic, sorted keys
    assert mut.index_path(0).read_text() == mut.dump_index(index)


def _run_suite(root):
    return subprocess.run(mut.pytest_argv(), cwd=root, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", **mut.PYTEST_ENV})


def test_resample_verifies_original_passes_and_mutants_fail(tmp_path):
    tasks = mut.load_index(0)["tasks"]
    sample = random.Random(7).sample(tasks, 3)
    project = sample[0]["mutation"]["project"]
    import shutil

    root = tmp_path / "orig"
    shutil.copytree(mut.PROJECTS_DIR / project, root)
    assert _run_suite(root).returncode == 0
    for t in sample:
        m = mut.Mutation(**t["mutation"])
        root = tmp_path / t["task_id"]
        shutil.copytree(mut.PROJECTS_DIR / m.project, root)
        (root / m.file).write_text(m.apply((root / m.file).read_text()))
        proc = _run_suite(root)
        assert proc.returncode == 1, proc.stdout[-500:]
        assert mut.failed_tests(proc.stdout) == t["failing_tests"]


def test_regeneration_reproduces_the_committed_prefix_of_one_project():
    index = mut.load_index(0)
    project = "calc"
    committed = [t for t in index["tasks"] if t["mutation"]["project"] == project]
    fresh = mut.generate_project(project, mut.GenerateConfig(seed=index["seed"], num_per_project=3))
    assert json.dumps(fresh, sort_keys=True) == json.dumps(committed[:3], sort_keys=True)


def test_missing_and_stale_index_are_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(mut, "TASKS_DIR", tmp_path)
    with pytest.raises(ValueError, match=r"no swe task index for seed=5 at .*index_seed5.json; build it with `python -m envs.swe.env --generate --seed 5`"):
        mut.load_index(5)
    (tmp_path / "index_seed5.json").write_text(json.dumps({"projects": {"calc": "0" * 64}, "tasks": []}))
    with pytest.raises(ValueError, match=r"is stale for projects \['calc'\]"):
        mut.load_index(5)
