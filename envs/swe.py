"""The `swe` benchmark (R2E-Gym-like): fix an injected bug in a small Python project, reward by tests.

Algorithm:
  1. Tasks come from the committed index `envs/swe_tasks/index_seed0.json` (AST-mutation bugs
     verified against each project's pytest suite; see `envs/swe_mutate.py`), ordered by a
     shuffle with the env's `seed`, each rendered as an issue at a difficulty level: 0 = file,
     line, the exact wrong/right text and the replace call to make (a 135M policy can copy it);
     1 = file and function plus the symptom; 2 = the failing test named; 3 = only the broken
     behaviour described. `level=None` cycles 0,1,2,3.
     Rows of a verl-schema parquet/jsonl (`data_path`) are loaded instead when given.
  2. `start(task)`: a sandbox work dir with the project copied in and the mutant written over
     its module. Tools: view_file, search, replace, run_tests (pytest in the sandbox, a
     PASSED/FAILED summary line first), submit.
  3. `submit()` copies the model's package next to a pristine copy of the project's tests (the
     hidden tests) in a second sandbox dir and runs them; reward 1.0 if pytest exits 0 with every
     test passed, else 0.0. An episode that ends without a submit (the model stops calling
     tools, or runs out of turns or tokens) is graded the same way on its final repository, as
     SWE-bench grades the final diff (`SweConfig.grade_unsubmitted=False`: only a submit earns).
  4. `close()` removes the episode's work dirs.

Invariants (tests/test_envs_swe*.py): an oracle agent that applies the known patch gets 1.0 and an
agent that only edits the visible tests gets 0.0; a bad call yields a failure ToolResult, never
an exception; paths never leave the work dir; closed episodes leave no work dir behind.

CLI: `python -m envs.swe --generate [--seed 0] [--num-per-project 40]` rebuilds the index;
`python -m envs.swe --export FILE.jsonl` writes the tasks as verl rows (see envs/swe_data.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import random
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from envs import swe_mutate as mut
from envs import swe_tools as tools
from envs.base import Task, ToolCall, ToolCallError, ToolInfraError, ToolResult, dispatch, failure, system_prompt, tool_schema
from envs.sandbox import Sandbox, SandboxConfig

logger = logging.getLogger(__name__)

NUM_LEVELS = 4
_INFRA_RCS = (3, 126, 127)  # pytest internal error, interpreter not executable / not found


@dataclass(frozen=True, kw_only=True)
class SweConfig:
    test_timeout_s: float = 30.0  # wall limit of one pytest run (a suite takes ~0.3 s)
    max_output_chars: int = 3000  # run_tests output beyond this is cut in the middle
    view_max_lines: int = 120  # lines one view_file call shows at most
    search_max_hits: int = 40  # matches one search call lists at most
    grade_unsubmitted: bool = True  # grade an episode that ends without submit on its final repository

    def __post_init__(self):
        if self.test_timeout_s <= 0:
            raise ValueError(f"SweConfig.test_timeout_s={self.test_timeout_s} must be > 0; a suite needs ~0.3 s, use e.g. 30")
        for name in ("max_output_chars", "view_max_lines", "search_max_hits"):
            if getattr(self, name) < 1:
                raise ValueError(f"SweConfig.{name}={getattr(self, name)} must be >= 1; pass a positive limit")


TOOLS = (
    tool_schema("view_file", "Show a file with line numbers (or list a directory, e.g. '.').", {
        "path": ("string", "path relative to the repository root"),
        "start_line": ("integer", "first line to show (1-based)"),
        "end_line": ("integer", "last line to show")}, required=("path",)),
    tool_schema("search", "Find lines containing an exact text in the repository's files.", {
        "pattern": ("string", "text to look for (case-sensitive)"),
        "path": ("string", "file or directory to search, default the whole repository")}, required=("pattern",)),
    tool_schema("replace", "Replace an exact text that occurs exactly once in a file.", {
        "path": ("string", "file to edit"), "old": ("string", "the exact current text"),
        "new": ("string", "the text to put in its place")}),
    tool_schema("run_tests", "Run the repository's pytest suite, or one test file or test id.", {
        "selector": ("string", "e.g. 'tests/test_x.py' or 'tests/test_x.py::test_y'")}, required=()),
    tool_schema("submit", "Submit your fix; hidden tests decide the reward and the episode ends.", {}),
)

_INTRO = ("You are a software engineer fixing a bug in a small Python repository. Use the tools to "
          "read the code, edit it with exact-text replacements, and run the tests. Fix the package, "
          "not the tests.")
_EXAMPLE = '<tool_call>{"name": "view_file", "arguments": {"path": "pkg/module.py", "start_line": 1, "end_line": 40}}</tool_call>'


def _call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def issue_text(record: dict, level: int) -> str:
    """The user message of a task at a level (see the module docstring)."""
    m = record["mutation"]
    project, file = m["project"], m["file"]
    failing, docs = record["failing_tests"], record["failing_docs"]
    others = f" (and {len(failing) - 1} more)" if len(failing) > 1 else ""
    if level == 0:
        return (f"Bug in the `{project}` package. In `{file}` line {record['bug_line']}, this code is wrong:\n"
                f"```\n{record['patch_old']}\n```\nIt should be:\n```\n{record['patch_new']}\n```\n"
                f"Fix it with this call, then call `submit`:\n"
                f"{_call('replace', path=file, old=record['patch_old'], new=record['patch_new'])}")
    if level == 1:
        where = f"function `{m['function']}`" if m["function"] else "module-level code"
        return (f"Bug in the `{project}` package: the {where} in `{file}` is wrong. "
                f"As a result this no longer holds: {docs[0]}\nFix the code, run the tests, then call `submit`.")
    if level == 2:
        return (f"In the `{project}` repository the test `{failing[0]}` fails{others}. "
                f"Find the bug in the package (the tests are right), fix it, then call `submit`.")
    return (f"Users of the `{project}` package report that this is broken: {docs[0]}\n"
            f"Find the bug in the package, fix it, then call `submit`.")


def _bug_line(record: dict) -> int:
    m = mut.Mutation(**record["mutation"])
    mutant = m.apply((mut.PROJECTS_DIR / m.project / m.file).read_text())
    return mutant[: mutant.index(record["patch_old"])].count("\n") + 1


def _system_text() -> str:
    return system_prompt(_INTRO, _EXAMPLE, "call the `submit` tool.")


def make_task(record: dict, level: int) -> Task:
    record = {**record, "bug_line": _bug_line(record)}
    messages = ({"role": "system", "content": _system_text()},
                {"role": "user", "content": issue_text(record, level)})
    m = record["mutation"]
    meta = {k: m[k] for k in ("project", "file", "kind", "line", "function")}
    return Task(task_id=f"{record['task_id']}-L{level}", bench="swe", messages=messages, tools=TOOLS,
                answer={"package": m["project"], "mutation": m, "num_tests": _num_tests(m["project"]),
                        "patch_old": record["patch_old"], "patch_new": record["patch_new"],
                        "failing_tests": record["failing_tests"]},
                level=level, meta={**meta, "failing_tests": record["failing_tests"], "bug_line": record["bug_line"]})


def oracle_actions(task: Task) -> list[str]:
    """A scripted agent that knows the patch: view, replace back to the original, run tests, submit.

    At level 0 the issue text shows the code and the call, so it does what that text says: the
    fix, then submit (the first action is also what `--demo-turns` shows a policy).
    """
    a, file, line = task.answer, task.meta["file"], task.meta["bug_line"]
    fix = "Fix it. " + _call("replace", path=file, old=a["patch_old"], new=a["patch_new"])
    if task.level == 0:
        return [fix, _call("submit")]
    return [
        "Let me look at the code. " + _call("view_file", path=file, start_line=max(1, line - 3), end_line=line + 3),
        fix,
        _call("run_tests"),
        _call("submit"),
    ]


def wrong_actions(task: Task) -> list[str]:
    """A scripted cheat: rename the failing visible tests so they no longer run, leave the bug, submit."""
    actions = []
    for test_id in task.answer["failing_tests"]:
        path, name = test_id.split("::")
        actions.append(_call("replace", path=path, old=f"def {name}(", new=f"def disabled_{name}("))
    return actions + [_call("run_tests"), _call("submit")]


class SweEpisode:
    """One repair attempt: a work dir holding the mutant repository."""

    def __init__(self, task: Task, sandbox: Sandbox, cfg: SweConfig):
        self.task, self.sandbox, self.cfg = task, sandbox, cfg
        self.reward: float | None = None
        a = task.answer
        self._package = a["package"]  # the directory whose contents are scored
        self._repo = Path(a.get("repo_dir") or mut.PROJECTS_DIR / self._package)
        self._hidden_tests = Path(a.get("hidden_tests_dir") or self._repo / "tests")
        self._num_tests = a.get("num_tests")
        self.workdir = sandbox.make_workdir("swe")
        try:
            shutil.copytree(self._repo, self.workdir, dirs_exist_ok=True, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
            if a.get("mutation"):
                m = mut.Mutation(**a["mutation"])
                target = self.workdir / m.file
                target.write_text(m.apply(target.read_text()))
            sandbox.own(self.workdir)
        except OSError as e:
            self.close()
            raise ToolInfraError(f"swe: could not prepare the work dir for {task.task_id}: {e}") from e
        self._handlers = {"view_file": self._view, "search": self._search, "replace": self._replace,
                          "run_tests": self._run_tests, "submit": self._submit}

    def execute(self, call: ToolCall | ToolCallError) -> ToolResult:
        if self.reward is not None and not isinstance(call, ToolCallError):
            return failure(call.name, "the episode already ended with submit")
        try:
            return dispatch(call, TOOLS, self._handlers)
        except tools.PathError as e:
            return failure(call.name, str(e))

    def _ok(self, tool: str, text: str, done: bool = False) -> ToolResult:
        return ToolResult(tool=tool, text=text, status="success", done=done)

    def _view(self, path, start_line=None, end_line=None):
        return self._ok("view_file", tools.view(self.workdir, path, start_line, end_line, self.cfg.view_max_lines))

    def _search(self, pattern, path=None):
        return self._ok("search", tools.search(self.workdir, pattern, path, self.cfg.search_max_hits))

    def _replace(self, path, old, new):
        return self._ok("replace", tools.replace(self.workdir, path, old, new))

    def _pytest(self, cwd: Path, selectors: tuple[str, ...]):
        res = self.sandbox.run(mut.pytest_argv(*selectors), cwd=cwd, timeout_s=self.cfg.test_timeout_s, env=mut.PYTEST_ENV)
        if res.status != "timeout" and res.returncode in _INFRA_RCS:
            raise ToolInfraError(f"swe: pytest could not run (exit {res.returncode}): {res.output[-300:]}")
        return res

    def _run_tests(self, selector=None):
        selectors = ()
        if selector:
            if selector.startswith("-"):
                raise tools.PathError(f"selector {selector!r} must be a test path or id like 'tests/test_x.py::test_y', not an option")
            tools.confine(self.workdir, selector.split("::")[0])
            selectors = (selector,)
        res = self._pytest(self.workdir, selectors)
        if res.status == "timeout":
            return ToolResult(tool="run_tests", text=f"tests timed out after {self.cfg.test_timeout_s:.0f} s (an endless loop?)", status="timeout")
        text = tools.summarize_tests(res.output, res.returncode, self.cfg.max_output_chars)
        return ToolResult(tool="run_tests", text=text, status="success" if res.returncode == 0 else "failure")

    def _submit(self):
        self.reward = self._hidden_tests_pass()
        verdict = "all hidden tests pass" if self.reward == 1.0 else "hidden tests fail"
        return self._ok("submit", f"Submitted: {verdict}.", done=True)

    def _hidden_tests_pass(self) -> float:
        """1.0 if the model's package passes a pristine copy of the hidden tests, else 0.0."""
        package = tools.confine(self.workdir, self._package)
        if not package.is_dir():
            return 0.0  # the model deleted or replaced its package
        skip = shutil.ignore_patterns("__pycache__", self._package, "tests")
        with self.sandbox.workdir("swe-score") as score_dir:
            shutil.copytree(self._repo, score_dir, dirs_exist_ok=True, ignore=skip, symlinks=True)
            shutil.copytree(package, score_dir / self._package, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
            shutil.copytree(self._hidden_tests, score_dir / "tests", ignore=shutil.ignore_patterns("__pycache__"))
            self.sandbox.own(score_dir)
            res = self._pytest(score_dir, ())
        counts = tools.count_results(res.output)
        # exit 0 alone could come from a package that calls os._exit(0) at import: count the passes too
        expected = self._num_tests if self._num_tests is not None else counts.get("passed", 0)
        passed = res.status == "success" and counts.get("passed", 0) == expected > 0 and len(counts) == 1
        return 1.0 if passed else 0.0

    def score(self, final_text: str) -> float:
        if self.reward is None and self.cfg.grade_unsubmitted:
            self.reward = self._hidden_tests_pass()
        return 0.0 if self.reward is None else self.reward

    def close(self) -> None:
        if self.workdir.exists():
            self.sandbox.remove_workdir(self.workdir)


@functools.cache
def _num_tests(project: str) -> int:
    return len(mut._test_docs(project))


class SweEnv:
    name = "swe"

    def __init__(self, *, seed: int = 0, num_tasks: int | None = None, data_path: str | None = None,
                 level: int | None = None, sandbox_cfg: SandboxConfig | None = None, cfg: SweConfig = SweConfig()):
        if level is not None and not 0 <= level < NUM_LEVELS:
            raise ValueError(f"swe level={level} must be in 0..{NUM_LEVELS - 1} or None (mixed); 0 is the easiest")
        if num_tasks is not None and num_tasks < 1:
            raise ValueError(f"swe num_tasks={num_tasks} must be >= 1 or None (all tasks)")
        self.cfg, self.seed, self.level = cfg, seed, level
        self.sandbox = Sandbox(sandbox_cfg or SandboxConfig(timeout_s=cfg.test_timeout_s))
        if data_path is not None:
            from envs.swe_data import load_rows  # only users with dataset files need it

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

    def tasks(self) -> list[Task]:
        return list(self._tasks)

    def start(self, task: Task) -> SweEpisode:
        self._episodes = [e for e in self._episodes if e.workdir.exists()]
        episode = SweEpisode(task, self.sandbox, self.cfg)
        self._episodes.append(episode)
        return episode

    def close(self) -> None:
        for episode in self._episodes:
            episode.close()
        self._episodes = []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs.swe", description=__doc__.split("\n")[0])
    parser.add_argument("--generate", action="store_true", help="rebuild envs/swe_tasks/index_seed<seed>.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-per-project", type=int, default=40)
    parser.add_argument("--export", metavar="FILE.jsonl", help="write the built-in tasks (this seed's order) as verl rows")
    args = parser.parse_args(argv)
    if args.export:
        from envs.swe_data import export_rows

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
