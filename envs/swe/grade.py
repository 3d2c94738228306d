"""swe grading whose verdict is computed on the host, and the per-task split of visible and hidden tests.

Hidden tests are held out per task: `held_out(task_id, ids, keep)` picks a quarter of the
project's tests (never `keep`, the failing test an issue text may name) that the episode's work
dir does not get (`strip_tests` removes them from the visible files). Grading runs them all.

Grading (`Grader.grade`), per submit or final repository:
  1. The suite (envs/swe/probe.py) of the hidden tests is loaded once and its reference run
     made once: the probes on the reference package (the pristine project, or an external
     row's repository with its oracle patch) in a sandboxed dir of its own, where the graded
     package never was. The reference must pass its own probes (else ToolInfraError: the
     tests cannot be graded faithfully).
  2. A fresh grading dir (read-only for the sandbox uid; bound read-only in namespace mode)
     gets the project's other files, the model's package (regular files only, bounded;
     envs/sandbox/hostfs.py), a fresh rendering of the probes (random names, site ids, negations and
     canaries; envs/swe/probe_check.py), the plan and the runner (envs/swe/probe_runner.py).
  3. The runner reports values to a results file; the host decodes them and `verdict` decides,
     test by test, against the reference. No key, signer or expected value is ever in a
     process that imported the package, so its records can lie only about values it would
     have to compute.
Every outcome of the model's state is a reward with a reason (REASONS): passed, tests_failed,
tampered (malformed or duplicated records, a canary that passed), timeout (one deadline,
`GradeLimits.timeout_s` from the start of the grading, bounds its runs and their waits for a
sandbox slot: a hang in `__del__`, a process that ignores signals, a FIFO or a fork bomb costs at
most that, never an infra drop), crashed (the runner
died before it finished), no_package, bad_package (links, FIFOs, too many/too deep/too big
files). Only a fault of the host (the sandbox cannot start, the host's disk) is a ToolInfraError.
Nothing of the checkout, the task index or other episodes is visible inside (envs/sandbox/fs.py).

Invariants (tests/envs/swe/test_swe_probe.py, tests/envs/swe/test_envs_swe.py, tests/envs/sandbox/test_adversarial.py): the
oracle gets 1.0; a package that hangs, or a grading that waits for a busy sandbox, is a 0 with reason
"timeout" within timeout_s + 1 s; the mutant, a constant answer, forged records, an echo of the expected side,
`sys.exit`/`os._exit` in the package, importing a pristine copy and editing the visible tests all
get 0.0 with a reason; hidden tests differ from the visible ones.
"""

from __future__ import annotations

import ast
import errno
import hashlib
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from envs.sandbox import hostfs
from envs.swe import probe
from envs.swe import probe_check as check
from envs.base import ToolInfraError

log = logging.getLogger(__name__)

RUNNER_SOURCE = Path(__file__).resolve().parent / "probe_runner.py"
# one hash seed for the reference and every graded run: a value that is a hash of a str agrees across them
RUNNER_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
REASONS = ("passed", "tests_failed", "tampered", "timeout", "crashed", "no_package", "bad_package")
MAX_RESULTS_BYTES = 8 << 20
_HOST_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS)  # the host's disk, not the model's files


@dataclass(frozen=True, kw_only=True)
class GradeLimits:
    timeout_s: float = 30.0  # wall limit of one grading: its hidden-test runs and their waits for a sandbox slot
    max_package_files: int = 200  # a package with more regular files gets reward 0
    max_package_bytes: int = 4 << 20  # ... or with more bytes in all
    max_package_depth: int = 16  # ... or nested deeper
    copy_timeout_s: float = 5.0  # wall limit of copying the model's package out of its work dir


@dataclass(frozen=True, kw_only=True)
class Grade:
    reward: float
    reason: str  # one of REASONS
    detail: str = ""  # what was missing or wrong, for logs and tests


@dataclass(frozen=True)
class Reference:
    """Where the reference package comes from: `repo` (its `package` dir), with `fix` applied."""

    repo: Path
    package: str
    hidden_tests: Path
    fix: tuple[str, str, str] | None = None  # (file, old, new): the oracle patch of an external row
    fixed: bool = True  # False: the buggy repository itself (no oracle patch), only its expected sides are used


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


# ---- results ----------------------------------------------------------------------------------------


class Tampered(ValueError):
    """The results file holds something the runner never writes."""


def _empty_trace() -> dict:
    return {"sites": {}, "others": {}, "end": None}


def parse_results(data: bytes, num_tests: int, site_of: dict[int, int]) -> tuple[list[dict], dict[str, str], bool]:
    """(a trace per plan entry, import failures by module, whether the runner finished); Tampered on junk."""
    traces = [_empty_trace() for _ in range(num_tests)]
    failed: dict[str, str] = {}
    finished = False
    for line in data.split(b"\n"):
        if not line:
            continue
        try:
            finished = _take(json.loads(line), traces, failed, site_of) or finished
        except Tampered:
            raise
        except Exception as e:  # noqa: BLE001 - any junk (bad JSON, nesting, odd types) is the package's doing
            raise Tampered(f"a result line is malformed ({type(e).__name__})") from None
    return traces, failed, finished


def _take(rec, traces: list[dict], failed: dict[str, str], site_of: dict[int, int]) -> bool:
    """File one result record; True for the runner's last line."""
    num_tests = len(traces)
    if not isinstance(rec, dict):
        raise Tampered("a result line is not an object")
    if rec.keys() == {"done"}:
        return True
    if "m" in rec:
        failed[str(rec["m"])[:200]] = json.dumps(rec.get("x"))[:300]
        return False
    t = rec.get("t")
    if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < num_tests:
        raise Tampered(f"a record names test {str(t)[:20]}")
    trace = traces[t]
    if "end" in rec:
        if trace["end"] is not None:
            raise Tampered("a test ended twice")
        trace["end"] = rec["end"]
        return False
    k = site_of.get(rec.get("k")) if isinstance(rec.get("k"), int) else None
    if k is None or trace["end"] is not None:
        raise Tampered("a record names a check the probes do not have, or comes after its test ended")
    if "o" in rec:
        trace["sites"].setdefault(k, []).append(rec["o"])
    elif "r" in rec and isinstance(rec["r"], list) and rec["r"]:
        trace["others"].setdefault(k, []).append(rec["r"][0])
    else:
        raise Tampered("a record holds neither an outcome nor expected values")
    return False


@dataclass
class Run:
    """One sandbox run of a rendering, parsed."""

    rendering: check.Rendering
    traces: list[dict]
    failed: dict[str, str]  # module path -> why its import failed
    finished: bool  # the runner wrote its last line


def read_run(rendering: check.Rendering, data: bytes) -> Run | Grade:
    """The run's results parsed, or reward 0 "tampered" for what no runner writes."""
    try:
        traces, failed, finished = parse_results(data, len(rendering.plan), rendering.site_of)
    except Tampered as e:
        return Grade(reward=0.0, reason="tampered", detail=str(e))
    return Run(rendering, traces, failed, finished and len(data) < MAX_RESULTS_BYTES)


def check_entries(suite: probe.Suite, run: Run, equality: Run | None = None) -> tuple[dict[str, str], list[str]]:
    """({failed real test id: why}, canaries that passed while their twin passed too) of a grading."""
    reference = suite.reference or {}
    bad: dict[str, str] = {}
    passed_canaries = []
    for i, (test_id, canary) in enumerate(run.rendering.entries):
        ok, why = check.check_test(suite, run.traces[i], reference[test_id], run.rendering.flipped,
                                   inverted=run.rendering.inverted.get(i))
        if canary and ok:
            passed_canaries.append(test_id)
        elif not canary and not ok:
            path = test_id.split("::")[0]
            bad[test_id] = f"import failed: {run.failed[path]}" if path in run.failed else why
    for i, (test_id, _) in enumerate(equality.rendering.entries if equality else ()):
        ok, why = check.check_equality(suite, equality.traces[i], reference[test_id])
        if not ok and test_id not in bad:
            bad[test_id] = why
    # a canary is a copy of a real test: with the same output the twin passes only if the canary does
    # not, so both passing means the answers depended on which copy asked
    return bad, [t for t in passed_canaries if t not in bad]


def verdict(suite: probe.Suite, run: Run, equality: Run | None = None) -> Grade:
    bad, canary_passed = check_entries(suite, run, equality)
    finished = run.finished and (equality is None or equality.finished)
    if canary_passed:
        return Grade(reward=0.0, reason="tampered", detail=f"canary copies of {canary_passed} passed a check no honest run passes")
    if not finished:
        return Grade(reward=0.0, reason="crashed", detail=f"the test run died before it finished; {len(bad)} tests without a pass")
    if bad:
        first = next(iter(bad))
        return Grade(reward=0.0, reason="tests_failed", detail=f"{len(bad)} hidden tests failed, e.g. {first} ({bad[first]})")
    real = sum(1 for _, c in run.rendering.entries if not c)
    return Grade(reward=1.0, reason="passed", detail=f"{real} hidden tests passed")


# ---- the grader ---------------------------------------------------------------------------------------


def _suite_key(ref: Reference) -> str:
    h = hashlib.sha256()
    for f in sorted(ref.hidden_tests.glob("test_*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return f"{ref.repo}|{ref.package}|{ref.fix}|{h.hexdigest()}"


class Grader:
    """Grades packages of one env; caches each hidden-test suite with its reference run (thread-safe)."""

    def __init__(self, sandbox, lim: GradeLimits = GradeLimits()):
        self.sandbox, self.lim = sandbox, lim
        self._suites: dict[str, probe.Suite] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def suite(self, ref: Reference) -> probe.Suite:
        """The loaded suite with its reference traces (made on first use)."""
        key = _suite_key(ref)
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._suites:
                try:
                    suite = probe.load_suite(ref.hidden_tests)
                except probe.ProbeUnsupported as e:
                    raise ToolInfraError(f"swe grading: the hidden tests in {ref.hidden_tests} cannot be probed: {e}") from e
                if not suite.tests:
                    raise ToolInfraError(f"swe grading: no hidden tests found in {ref.hidden_tests}")
                self._reference(suite, ref)
                self._suites[key] = suite
            return self._suites[key]

    def _reference(self, suite: probe.Suite, ref: Reference) -> None:
        t0 = time.monotonic()
        plan = [[t.split("::", 1)[0], t.split("::", 1)[1]] for t in suite.tests]
        with self.sandbox.workdir("swe-ref", owned=False) as d:
            try:
                self._copy_project(d, ref.repo, ref.package, suite.reference_sources)
                shutil.copytree(ref.repo / ref.package, d / ref.package, ignore=shutil.ignore_patterns("__pycache__"))
                if ref.fix is not None:
                    file, old, new = ref.fix
                    target = d / file
                    text = target.read_text()
                    if old not in text:
                        raise ToolInfraError(f"swe grading: the oracle patch of {ref.repo} does not apply to {file}")
                    target.write_text(text.replace(old, new, 1))
                self._seal(d)
            except OSError as e:
                raise ToolInfraError(f"swe grading: could not prepare the reference run of {ref.repo}: {e}") from e
            res, data = self._run(d, plan, timeout_s=max(60.0, self.lim.timeout_s * 2))
        if res.status == "timeout":
            raise ToolInfraError(f"swe grading: the reference run of {ref.repo} timed out")
        try:
            traces, failed, finished = parse_results(data, len(plan), {s.index: s.index for s in suite.sites})
        except Tampered as e:
            raise ToolInfraError(f"swe grading: the reference run of {ref.repo} wrote bad results ({e})") from e
        if not finished or failed:
            raise ToolInfraError(f"swe grading: the reference run of {ref.repo} failed: {failed or res.stderr[-500:]}")
        reference = dict(zip(suite.tests, traces))
        suite.set_reference(reference)
        if ref.fixed:
            wrong = [(t, why) for t in suite.tests for ok, why in [check.check_test(suite, reference[t], reference[t], set())] if not ok]
            if wrong:
                raise ToolInfraError(f"swe grading: {len(wrong)} hidden tests fail on the fixed reference under probing, "
                                     f"e.g. {wrong[0][0]}: {wrong[0][1]}; they cannot be graded faithfully")
        log.info("swe grading: reference of %s (%d tests, %d checks; %d tests also in the equality run) in %.2f s",
                 ref.repo.name, len(suite.tests), len(suite.sites), len(suite.eq_tests), time.monotonic() - t0)

    @staticmethod
    def _copy_project(d: Path, repo: Path, package: str, sources: dict[str, str]) -> None:
        for entry in repo.iterdir():
            if entry.name in (package, "tests", "__pycache__"):
                continue
            if entry.is_dir():
                shutil.copytree(entry, d / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(entry, d / entry.name)
        (d / "tests").mkdir()
        for path, source in sources.items():
            (d / path).write_text(source)
        shutil.copy(RUNNER_SOURCE, d / "libra_probe.py")

    @staticmethod
    def _seal(d: Path) -> None:
        for dirpath, _, names in os.walk(d):
            os.chmod(dirpath, 0o755)
            for n in names:
                os.chmod(os.path.join(dirpath, n), 0o644)

    def _run(self, d: Path, plan: list[list], timeout_s: float, deadline: float | None = None):
        (d / "plan.json").write_text(json.dumps({"tests": plan}))
        os.chmod(d / "plan.json", 0o644)
        with tempfile.TemporaryFile() as results:
            fd = results.fileno()
            argv = [sys.executable, "-s", "-B", "libra_probe.py", "plan.json", str(fd)]
            res = self.sandbox.run(argv, cwd=d, timeout_s=timeout_s, pass_fds=(fd,), read_only=True, env=RUNNER_ENV,
                                   deadline=deadline)
            results.seek(0)
            return res, results.read(MAX_RESULTS_BYTES)

    def grade(self, workdir: Path, ref: Reference) -> Grade:
        """Run the hidden tests against the model's package in `workdir` (see the module docstring)."""
        runs = self.probe(workdir, ref)
        return runs if isinstance(runs, Grade) else verdict(*runs)

    def probe(self, workdir: Path, ref: Reference) -> Grade | tuple:
        """A Grade when a run ended early (no package, bad package, timeout, tampered records),
        else `verdict`'s arguments: (suite, probe run, equality run or None)."""
        package = ref.package
        try:
            is_dir = hostfs.kind(workdir, package) == "dir"
        except hostfs.HostFsError:  # a symlink
            is_dir = False
        if not is_dir:
            return Grade(reward=0.0, reason="no_package", detail=f"{package}/ is missing or not a directory")
        suite = self.suite(ref)  # the reference run (once per suite) is the host's: not on the grading's clock
        deadline = time.monotonic() + self.lim.timeout_s
        runs = []
        for rendering in [check.render(suite)] + ([check.render(suite, equality=True)] if suite.eq_tests else []):
            run = self._graded_run(workdir, ref, rendering, deadline)
            if isinstance(run, Grade):
                return run
            runs.append(run)
        return suite, runs[0], runs[1] if len(runs) > 1 else None

    def _graded_run(self, workdir: Path, ref: Reference, rendering: check.Rendering, deadline: float) -> Grade | Run:
        package = ref.package
        with self.sandbox.workdir("swe-grade", owned=False) as d:
            try:
                self._copy_project(d, ref.repo, package, rendering.sources)
            except OSError as e:
                raise ToolInfraError(f"swe grading: could not copy the pristine project {ref.repo}: {e}") from e
            try:
                (d / package).mkdir(mode=0o755)
                hostfs.copy_tree(workdir, package, d / package, max_files=self.lim.max_package_files,
                                 max_bytes=self.lim.max_package_bytes, max_depth=self.lim.max_package_depth,
                                 deadline=time.monotonic() + self.lim.copy_timeout_s)
                self._seal(d)
            except hostfs.HostFsError as e:
                return Grade(reward=0.0, reason="bad_package", detail=str(e))
            except OSError as e:
                if e.errno in _HOST_ERRNOS:
                    raise ToolInfraError(f"swe grading: the host could not write the grading dir: {e}") from e
                return Grade(reward=0.0, reason="bad_package", detail=f"the package cannot be copied ({e.strerror or e})")
            res, data = self._run(d, rendering.plan, self.lim.timeout_s, deadline)
        if res.status == "timeout":
            return Grade(reward=0.0, reason="timeout", detail=f"the grading ran past {self.lim.timeout_s:g} s "
                                                              "(its hidden-test runs and their waits for a sandbox slot)")
        return read_run(rendering, data)
