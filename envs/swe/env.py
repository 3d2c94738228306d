"""The `swe` benchmark (R2E-Gym-like): fix an injected bug in a small Python project, reward by hidden tests.

Algorithm:
  1. Tasks come from the committed index `envs/swe/tasks/index_seed0.json` (AST-mutation bugs
     verified against each project's pytest suite; see `envs/swe/mutate.py`), ordered by a
     shuffle with the env's `seed`, each rendered as an issue at a difficulty level
     (envs/swe/spec.py); `level=None` cycles 0,1,2,3. Rows of a verl-schema parquet/jsonl
     (`data_path`) are loaded instead when given (envs/swe/data.py).
  2. `start(task)`: a sandbox work dir with the project copied in, the mutant written over its
     module, and a quarter of the tests held out (envs/swe/grade.py). Tools: view_file, search,
     replace (host-side, bounded, never following links: envs/swe/tools.py), run_tests (pytest
     in the sandbox, a PASSED/FAILED summary line first), submit.
  3. `submit()` grades: the model's package goes into a fresh grading dir with the rest of the
     project and probes of every hidden test; the graded process reports values and the host
     decides against a reference run of the pristine package (envs/swe/grade.py,
     envs/swe/probe.py); reward 1.0 only if every hidden test passed. An episode
     that ends without a submit is graded the same way on its final repository, as SWE-bench
     grades the final diff (`SweConfig.grade_unsubmitted=False`: only a submit earns).
     `SweEnv.grades` counts the reasons (passed, tests_failed, tampered, crashed, ...); `score`
     returns the reward with its reason (`envs.base.Reward`) for the run's metrics.
  4. `close()` removes the episode's work dirs.

Invariants (tests/envs/swe/test_envs_swe*.py, tests/envs/sandbox/test_adversarial.py): an oracle agent that applies the
known patch gets 1.0 and an agent that only edits the visible tests gets 0.0; whatever the
model writes, `execute` returns a ToolResult and `score` a reward (only the sandbox failing to
start raises ToolInfraError); paths never leave the work dir; closed episodes leave no work dir; no
sandboxed call can read the pristine projects or the task index (`HIDDEN_DATA_DIRS`, hidden by the
sandbox the env builds, whatever config its caller passed).

CLI: `python -m envs.swe.env --generate [--seed 0] [--num-per-project 40]` rebuilds the index;
`python -m envs.swe.env --export FILE.jsonl` writes the tasks as verl rows (see envs/swe/data.py).
"""

from __future__ import annotations

import argparse
import collections
import logging
import random
import shutil
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from envs.swe import grade as grading
from envs.swe import mutate as mut
from envs.swe import tools
from envs.base import Reward, Task, ToolCall, ToolCallError, ToolInfraError, ToolResult, dispatch, failure
from envs.config import EnvConfig
from envs.sandbox.sandbox import Sandbox, SandboxConfig
from envs.swe.spec import NUM_LEVELS, TOOLS, issue_text, make_task, oracle_actions, wrong_actions

__all__ = ["HIDDEN_DATA_DIRS", "SweConfig", "SweEnv", "SweEpisode", "NUM_LEVELS", "TOOLS", "issue_text", "make_task",
           "oracle_actions", "wrong_actions"]

logger = logging.getLogger(__name__)

# What a policy must not read (the unbroken sources and the task index, which holds every patch): the sandbox
# covers them where a dir it binds holds them (a checkout inside the interpreter's prefix, an exposed path).
HIDDEN_DATA_DIRS = (str(mut.PROJECTS_DIR), str(mut.TASKS_DIR))


@dataclass(frozen=True, kw_only=True)
class SweConfig:
    test_timeout_s: float = 30.0  # wall limit of one pytest run (a suite takes ~0.3 s)
    max_output_chars: int = 3000  # run_tests output beyond this is cut in the middle
    view_max_lines: int = 120  # lines one view_file call shows at most
    search_max_hits: int = 40  # matches one search call lists at most
    max_line_chars: int = 400  # a line shown by view_file/search/replace is cut after this many characters
    max_listing_entries: int = 300  # files one directory listing names at most
    host_timeout_s: float = 2.0  # wall limit of one host-side listing, search or package copy
    grade_unsubmitted: bool = True  # grade an episode that ends without submit on its final repository

    def __post_init__(self):
        if self.test_timeout_s <= 0:
            raise ValueError(f"SweConfig.test_timeout_s={self.test_timeout_s} must be > 0; a suite needs ~0.3 s, use e.g. 30")
        for name in ("max_output_chars", "view_max_lines", "search_max_hits", "max_line_chars", "max_listing_entries"):
            if getattr(self, name) < 1:
                raise ValueError(f"SweConfig.{name}={getattr(self, name)} must be >= 1; pass a positive limit")
        if self.host_timeout_s <= 0:
            raise ValueError(f"SweConfig.host_timeout_s={self.host_timeout_s} must be > 0; use e.g. 2")

    @property
    def limits(self) -> tools.Limits:
        return tools.Limits(view_max_lines=self.view_max_lines, search_max_hits=self.search_max_hits,
                            max_line_chars=self.max_line_chars, max_listing_entries=self.max_listing_entries,
                            host_timeout_s=self.host_timeout_s)


class SweEpisode:
    """One repair attempt: a work dir holding the mutant repository with some tests held out."""

    def __init__(self, task: Task, env: SweEnv):
        self.task, self.sandbox, self.cfg, self._env = task, env.sandbox, env.cfg, env
        self.reward: float | None = None
        self.grade: grading.Grade | None = None
        a = task.answer
        self._package = a["package"]  # the directory whose contents are scored
        self._repo = Path(a.get("repo_dir") or mut.PROJECTS_DIR / self._package)
        self._hidden_tests = Path(a.get("hidden_tests_dir") or self._repo / "tests")
        self.workdir = self.sandbox.make_workdir("swe")
        try:
            shutil.copytree(self._repo, self.workdir, dirs_exist_ok=True, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
            if a.get("mutation"):
                m = mut.Mutation(**a["mutation"])
                target = self.workdir / m.file
                target.write_text(m.apply(target.read_text()))
            self._hold_out_tests()
            self.sandbox.own(self.workdir)
        except OSError as e:
            self.close()
            raise ToolInfraError(f"swe: could not prepare the work dir for {task.task_id}: {e}") from e
        self._handlers = {"view_file": self._view, "search": self._search, "replace": self._replace,
                          "run_tests": self._run_tests, "submit": self._submit}

    def _hold_out_tests(self) -> None:
        """Remove this task's held-out tests from the visible suite (only for the built-in projects)."""
        if self._hidden_tests != self._repo / "tests":
            return  # an external row brings its own hidden tests
        failing = self.task.answer.get("failing_tests") or [None]
        hidden = grading.held_out(self.task.task_id, grading.test_ids(self._hidden_tests), failing[0])
        by_file: dict[str, set[str]] = collections.defaultdict(set)
        for test_id in hidden:
            path, name = test_id.split("::")
            by_file[path].add(name)
        for path, names in by_file.items():
            f = self.workdir / path
            f.write_text(grading.strip_tests(f.read_text(), names))

    def execute(self, call: ToolCall | ToolCallError) -> ToolResult:
        if self.reward is not None and not isinstance(call, ToolCallError):
            return failure(call.name, "the episode already ended with submit")
        return dispatch(call, TOOLS, self._handlers, faults=self._env.faults)

    def _ok(self, tool: str, text: str, done: bool = False) -> ToolResult:
        return ToolResult(tool=tool, text=text, status="success", done=done)

    def _view(self, path, start_line=None, end_line=None):
        return self._ok("view_file", tools.view(self.workdir, path, start_line, end_line, self.cfg.limits))

    def _search(self, pattern, path=None):
        return self._ok("search", tools.search(self.workdir, pattern, path, self.cfg.limits))

    def _replace(self, path, old, new):
        return self._ok("replace", tools.replace(self.workdir, path, old, new, self.cfg.limits, self.sandbox.owner))

    def _run_tests(self, selector=None):
        selectors = ()
        if selector:
            tools.check_selector(self.workdir, selector)
            selectors = (selector,)
        res = self.sandbox.run(mut.pytest_argv(*selectors), cwd=self.workdir, timeout_s=self.cfg.test_timeout_s, env=mut.PYTEST_ENV)
        if res.status == "timeout":
            return ToolResult(tool="run_tests", text=f"tests timed out after {self.cfg.test_timeout_s:.0f} s (an endless loop?)", status="timeout")
        # Any exit code is the model's doing here (an internal error from `sys.exit` at import,
        # say): the sandbox has already raised for a set-up that failed before its code ran.
        text = tools.summarize_tests(res.output, res.returncode, self.cfg.max_output_chars)
        return ToolResult(tool="run_tests", text=text, status="success" if res.returncode == 0 else "failure")

    def _submit(self):
        self.reward = self._grade()
        verdict = "all hidden tests pass" if self.reward == 1.0 else "hidden tests fail"
        return self._ok("submit", f"Submitted: {verdict}.", done=True)

    def _reference(self) -> grading.Reference:
        """The package the hidden tests' expected values come from (never the model's)."""
        a = self.task.answer
        file, old, new = self.task.meta.get("file", ""), a.get("patch_old"), a.get("patch_new")
        if a.get("mutation"):  # a built-in task: the project dir is the pristine package
            return grading.Reference(repo=self._repo, package=self._package, hidden_tests=self._hidden_tests)
        fix = (file, old, new) if file and old and new is not None else None
        return grading.Reference(repo=self._repo, package=self._package, hidden_tests=self._hidden_tests, fix=fix,
                                 fixed=fix is not None)

    def _grade(self) -> float:
        self.grade = self._env.grader.grade(self.workdir, self._reference())
        self._env.count_grade(self.grade.reason)
        return self.grade.reward

    def score(self, final_text: str) -> Reward:
        if self.reward is None and self.cfg.grade_unsubmitted:
            self.reward = self._grade()
        if self.reward is None:
            return Reward(0.0, "no_submit")
        return Reward(self.reward, self.grade.reason if self.grade is not None else "")

    def close(self) -> None:
        if self.workdir.exists():
            self.sandbox.remove_workdir(self.workdir)


class SweEnv:
    name = "swe"

    def __init__(self, *, seed: int = 0, num_tasks: int | None = None, data_path: str | None = None,
                 level: int | None = None, sandbox_cfg: SandboxConfig | None = None, cfg: SweConfig = SweConfig(),
                 env_cfg: EnvConfig | None = None):
        if level is not None and not 0 <= level < NUM_LEVELS:
            raise ValueError(f"swe level={level} must be in 0..{NUM_LEVELS - 1} or None (mixed); 0 is the easiest")
        if num_tasks is not None and num_tasks < 1:
            raise ValueError(f"swe num_tasks={num_tasks} must be >= 1 or None (all tasks)")
        self.cfg, self.seed, self.level = cfg, seed, level
        sandbox_cfg = sandbox_cfg or SandboxConfig.from_env(env_cfg, timeout_s=cfg.test_timeout_s)
        self.sandbox = Sandbox(sandbox_cfg.hiding(HIDDEN_DATA_DIRS))
        self.sandbox.check_interpreter(["-c", "import pytest"], "pytest")
        self.grader = grading.Grader(self.sandbox, grading.GradeLimits(timeout_s=cfg.test_timeout_s,
                                                                        copy_timeout_s=cfg.host_timeout_s))
        self.faults: collections.Counter = collections.Counter()  # "tool:ExceptionType" of model-caused tool errors
        self.grades: collections.Counter = collections.Counter()  # grading outcomes by reason
        self._lock = threading.Lock()
        if data_path is not None:
            from envs.swe.data import load_rows  # only users with dataset files need it

            self._tasks = load_rows(data_path, level=level)
        else:
            self._tasks = self._builtin_tasks()
        if num_tasks is not None:
            self._tasks = self._tasks[:num_tasks]
        self._episodes: list[SweEpisode] = []

    def _builtin_tasks(self) -> list[Task]:
        records = mut.load_index(0)["tasks"]
        order = list(range(len(records)))
        random.Random(self.seed).shuffle(order)
        return [make_task(records[i], self.level if self.level is not None else n % NUM_LEVELS) for n, i in enumerate(order)]

    def count_grade(self, reason: str) -> None:
        with self._lock:
            self.grades[reason] += 1

    def tasks(self) -> list[Task]:
        return list(self._tasks)

    def start(self, task: Task) -> SweEpisode:
        with self._lock:
            self._episodes = [e for e in self._episodes if e.workdir.exists()]
        episode = SweEpisode(task, self)
        with self._lock:
            self._episodes.append(episode)
        return episode

    def close(self) -> None:
        with self._lock:
            episodes, self._episodes = self._episodes, []
        for episode in episodes:
            episode.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs.swe.env", description=__doc__.split("\n")[0])
    parser.add_argument("--generate", action="store_true", help="rebuild envs/swe/tasks/index_seed<seed>.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-per-project", type=int, default=40)
    parser.add_argument("--export", metavar="FILE.jsonl", help="write the built-in tasks (this seed's order) as verl rows")
    args = parser.parse_args(argv)
    if args.export:
        from envs.swe.data import export_rows

        print(f"wrote {export_rows(SweEnv(seed=args.seed).tasks(), args.export)}")
        return 0
    if not args.generate:
        parser.print_help()
        return 0
    cfg = mut.GenerateConfig(seed=args.seed, num_per_project=args.num_per_project)

    def progress(project, num_done, num_total, num_kept):
        print(f"\r{project:>10}: verified {num_done}/{num_total} candidates, kept {num_kept}", end="", file=sys.stderr, flush=True)
        if num_done == num_total or num_kept >= cfg.num_per_project:
            print(file=sys.stderr)

    path = mut.write_index(mut.generate_index(cfg, progress=progress))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
