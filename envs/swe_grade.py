"""swe grading that the graded code cannot touch, and the per-task split of visible and hidden tests.

Hidden tests are held out per task: `held_out(task_id, ids, keep)` picks a quarter of the
project's tests (never `keep`, the failing test an issue text may name) that the episode's work
dir does not get (`strip_tests` removes them from the visible files). Grading runs them all.

Grading (`grade`), per submit or final repository:
  1. A fresh grading dir (not owned by the sandbox uid: read-only for the graded code, and
     bound read-only in namespace mode) gets a clean copy of the project without its package
     and tests, the model's package (its regular files only, bounded; envs/hostfs.py: links,
     FIFOs and oversize trees are refused), the pristine hidden tests plus two canary tests
     with random names that must fail, and the plugin envs/swe_grade_plugin.py.
  2. pytest runs there in the sandbox. The plugin reads a random key from a pipe and signs one
     record per test phase into an unlinked temp file: no path to it exists, only the fd.
  3. The verdict counts verified records by test id: reward 1.0 only when every expected id
     passed and both canaries failed. A missing id (crash, `sys.exit`, collection error), a
     passing canary (a patched test runner), a record that does not verify (forged output), a
     timeout or an unusable package is reward 0 with its reason; never an infrastructure error
     (only the sandbox failing to start is one: ToolInfraError).
Nothing of the checkout, the task index or other episodes is visible inside (envs/sandbox_fs.py).

Invariants (tests/test_envs_swe.py, tests/test_adversarial.py): the oracle gets 1.0; patching
pytest, forging a summary, `sys.exit`/`os._exit` in the package, importing a pristine copy and
editing the visible tests all get 0.0 with a reason; hidden tests differ from the visible ones.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import os
import random
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from envs import hostfs
from envs.base import ToolInfraError

PLUGIN_SOURCE = Path(__file__).resolve().parent / "swe_grade_plugin.py"
PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}
NUM_CANARIES = 2
REASONS = ("passed", "tests_failed", "missing_ids", "tampered", "timeout", "no_package", "bad_package")


@dataclass(frozen=True, kw_only=True)
class GradeLimits:
    timeout_s: float = 30.0  # wall limit of the hidden-test run
    max_package_files: int = 200  # a package with more regular files gets reward 0
    max_package_bytes: int = 4 << 20  # ... or with more bytes in all
    copy_timeout_s: float = 5.0  # wall limit of copying the model's package out of its work dir


@dataclass(frozen=True, kw_only=True)
class Grade:
    reward: float
    reason: str  # one of REASONS
    detail: str = ""  # what was missing or wrong, for logs and tests


def test_ids(tests_dir: Path) -> list[str]:
    """Ids of the test functions (module level and in Test* classes) of `tests_dir/test_*.py`."""
    ids = []
    for path in sorted(tests_dir.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                ids.append(f"tests/{path.name}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                ids += [f"tests/{path.name}::{node.name}::{f.name}" for f in node.body
                        if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")]
    return ids


def held_out(task_id: str, ids: list[str], keep: str | None) -> list[str]:
    """The quarter of `ids` (at least one, never `keep`) that task `task_id` keeps hidden."""
    pool = sorted(i for i in ids if i != keep and i.count("::") == 1)
    num = max(1, len(ids) // 4) if pool else 0
    return sorted(random.Random(f"held-out:{task_id}").sample(pool, min(num, len(pool))))


def strip_tests(source: str, names: set[str]) -> str:
    """`source` without the module-level test functions in `names` (decorators included)."""
    lines = source.split("\n")
    drop: set[int] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            drop.update(range(start - 1, node.end_lineno))
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)


def _canaries(rng: random.Random) -> tuple[list[str], str]:
    names = [f"test_{rng.choice(('check', 'keeps', 'handles', 'returns'))}_{secrets.token_hex(4)}" for _ in range(NUM_CANARIES)]
    body = "".join(f"\n\ndef {n}():\n    assert {rng.randint(2, 99)} == {rng.randint(100, 999)}\n" for n in names)
    return names, body


def _records(data: bytes, key: bytes) -> tuple[dict[str, list[str]], int]:
    """({nodeid: [when:outcome, ...]} of the records whose tag verifies, number that did not)."""
    out: dict[str, list[str]] = {}
    forged = 0
    for line in data.split(b"\n"):
        if not line:
            continue
        tag, _, msg = line.partition(b"\t")
        if not hmac.compare_digest(tag, hmac.new(key, msg, hashlib.sha256).hexdigest().encode()):
            forged += 1
            continue
        nodeid, _, what = msg.decode("utf-8", "replace").partition("\t")
        out.setdefault(nodeid, []).append(what)
    return out, forged


def verdict(records: dict[str, list[str]], forged: int, expected: list[str], canaries: list[str]) -> Grade:
    if forged:
        return Grade(reward=0.0, reason="tampered", detail=f"{forged} result records did not verify")
    bad_canary = [c for c in canaries if records.get(c) != ["call:failed"]]
    if bad_canary:
        return Grade(reward=0.0, reason="tampered", detail=f"canary tests did not fail: {bad_canary}")

    def phases(test_id: str) -> list[str]:  # a parametrized test has one node per case
        return [w for node, ws in records.items() if node == test_id or node.startswith(test_id + "[") for w in ws]

    missing = [t for t in expected if "call:passed" not in phases(t) and not any(w.endswith(":failed") for w in phases(t))]
    if missing:
        return Grade(reward=0.0, reason="missing_ids", detail=f"{len(missing)} hidden tests did not run, e.g. {missing[0]}")
    failed = [t for t in expected if any(not w.endswith(":passed") for w in phases(t))]
    if failed:
        return Grade(reward=0.0, reason="tests_failed", detail=f"{len(failed)} hidden tests failed, e.g. {failed[0]}")
    return Grade(reward=1.0, reason="passed", detail=f"{len(expected)} hidden tests passed")


def _build(grade_dir: Path, repo: Path, package: str, workdir: Path, hidden_tests: Path, lim: GradeLimits) -> tuple[list[str], list[str]]:
    """Fill the grading dir; (expected ids, canary ids). HostFsError: the model's package is unusable."""
    try:
        for entry in repo.iterdir():
            if entry.name in (package, "tests", "__pycache__"):
                continue
            if entry.is_dir():
                shutil.copytree(entry, grade_dir / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(entry, grade_dir / entry.name)
        shutil.copytree(hidden_tests, grade_dir / "tests", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(PLUGIN_SOURCE, grade_dir / "libra_grade.py")
    except OSError as e:
        raise ToolInfraError(f"swe grading: could not copy the pristine project {repo}: {e}") from e
    expected = test_ids(grade_dir / "tests")
    files = sorted((grade_dir / "tests").glob("test_*.py"))
    canaries: list[str] = []
    if files:
        names, body = _canaries(random.Random(secrets.randbits(64)))
        with files[-1].open("a") as f:
            f.write(body)
        canaries = [f"tests/{files[-1].name}::{n}" for n in names]
    (grade_dir / package).mkdir(mode=0o755)
    hostfs.copy_tree(workdir, package, grade_dir / package, max_files=lim.max_package_files,
                     max_bytes=lim.max_package_bytes, deadline=time.monotonic() + lim.copy_timeout_s)
    for d, dirs, names in os.walk(grade_dir):
        os.chmod(d, 0o755)
        for n in names:
            os.chmod(os.path.join(d, n), 0o644)
    return expected, canaries


def grade(sandbox, workdir: Path, package: str, repo: Path, hidden_tests: Path, lim: GradeLimits = GradeLimits()) -> Grade:
    """Run the hidden tests against the model's package (see the module docstring)."""
    try:
        is_dir = hostfs.kind(workdir, package) == "dir"
    except hostfs.HostFsError:  # a symlink
        is_dir = False
    if not is_dir:
        return Grade(reward=0.0, reason="no_package", detail=f"{package}/ is missing or not a directory")
    with sandbox.workdir("swe-grade", owned=False) as grade_dir:
        try:
            expected, canaries = _build(grade_dir, repo, package, workdir, hidden_tests, lim)
        except hostfs.HostFsError as e:
            return Grade(reward=0.0, reason="bad_package", detail=str(e))
        if not expected:
            raise ToolInfraError(f"swe grading: no hidden tests found in {hidden_tests}")
        key = secrets.token_bytes(32)
        key_r, key_w = os.pipe()
        os.write(key_w, key)
        os.close(key_w)
        try:
            with tempfile.TemporaryFile() as results:
                fds = (key_r, results.fileno())
                argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "libra_grade", "tests"]
                res = sandbox.run(argv, cwd=grade_dir, timeout_s=lim.timeout_s, pass_fds=fds, read_only=True,
                                  env={**PYTEST_ENV, "LIBRA_GRADE_FDS": f"{key_r},{results.fileno()}"})
                results.seek(0)
                data = results.read(1 << 20)
        finally:
            os.close(key_r)
    if res.status == "timeout":
        return Grade(reward=0.0, reason="timeout", detail=f"hidden tests ran past {lim.timeout_s:g} s")
    return verdict(*_records(data, key), expected, canaries)
