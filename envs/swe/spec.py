"""What a `swe` task is: its tools, system prompt, issue text per level, and the scripted agents.

Tasks are built from records of the committed index (envs/swe/mutate.py) by `make_task`; a
record's issue text depends on the level: 0 = file, line, the exact wrong/right text and the
replace call to make (a 135M policy can copy it); 1 = file and function plus the symptom; 2 =
the failing test named; 3 = only the broken behaviour described. `oracle_actions` knows the
patch; `wrong_actions` disables the failing visible tests instead of fixing the bug.

Kept apart from envs/swe/env.py (the episode and env) so that envs/swe/data.py can build tasks
without importing the env, and the env can load data rows without an import cycle.

Invariants (tests/envs/swe/test_envs_swe.py): issue texts name what their level promises and nothing
more; the level-0 text shows exactly the oracle's first call; oracle calls are Hermes calls.
"""

from __future__ import annotations

from envs.swe import mutate as mut
from envs.base import Task, system_prompt, tool_schema
from envs.toolcalls import format_tool_call

NUM_LEVELS = 4

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
_EXAMPLE = format_tool_call("view_file", {"path": "pkg/module.py", "start_line": 1, "end_line": 40})


def call_text(name: str, **arguments) -> str:
    return format_tool_call(name, arguments)


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
                f"{call_text('replace', path=file, old=record['patch_old'], new=record['patch_new'])}")
    if level == 1:
        where = f"function `{m['function']}`" if m["function"] else "module-level code"
        return (f"Bug in the `{project}` package: the {where} in `{file}` is wrong. "
                f"As a result this no longer holds: {docs[0]}\nFix the code, run the tests, then call `submit`.")
    if level == 2:
        return (f"In the `{project}` repository the test `{failing[0]}` fails{others}. "
                f"Find the bug in the package (the tests are right), fix it, then call `submit`.")
    return (f"Users of the `{project}` package report that this is broken: {docs[0]}\n"
            f"Find the bug in the package, fix it, then call `submit`.")


def bug_line(record: dict) -> int:
    m = mut.Mutation(**record["mutation"])
    mutant = m.apply((mut.PROJECTS_DIR / m.project / m.file).read_text())
    return mutant[: mutant.index(record["patch_old"])].count("\n") + 1


def system_text() -> str:
    return system_prompt(_INTRO, _EXAMPLE, "call the `submit` tool.")


def make_task(record: dict, level: int) -> Task:
    record = {**record, "bug_line": bug_line(record)}
    messages = ({"role": "system", "content": system_text()},
                {"role": "user", "content": issue_text(record, level)})
    m = record["mutation"]
    meta = {k: m[k] for k in ("project", "file", "kind", "line", "function")}
    return Task(task_id=f"{record['task_id']}-L{level}", bench="swe", messages=messages, tools=TOOLS,
                answer={"package": m["project"], "mutation": m, "patch_old": record["patch_old"],
                        "patch_new": record["patch_new"], "failing_tests": record["failing_tests"]},
                level=level, meta={**meta, "failing_tests": record["failing_tests"], "bug_line": record["bug_line"]})


def oracle_actions(task: Task) -> list[str]:
    """A scripted agent that knows the patch: view, replace back to the original, run tests, submit.

    At level 0 the issue text shows the code and the call, so it does what that text says: the
    fix, then submit (the first action is also what `--demo-turns` shows a policy).
    """
    a, file, line = task.answer, task.meta["file"], task.meta["bug_line"]
    fix = "Fix it. " + call_text("replace", path=file, old=a["patch_old"], new=a["patch_new"])
    if task.level == 0:
        return [fix, call_text("submit")]
    return [
        "Let me look at the code. " + call_text("view_file", path=file, start_line=max(1, line - 3), end_line=line + 3),
        fix,
        call_text("run_tests"),
        call_text("submit"),
    ]


def wrong_actions(task: Task) -> list[str]:
    """A scripted cheat: rename the failing visible tests so they no longer run, leave the bug, submit."""
    actions = []
    for test_id in task.answer["failing_tests"]:
        path, name = test_id.split("::")
        actions.append(call_text("replace", path=path, old=f"def {name}(", new=f"def disabled_{name}("))
    return actions + [call_text("run_tests"), call_text("submit")]
