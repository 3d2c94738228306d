"""Attacks for reward without a fix and for crashing a rank, through the swe and math tool APIs."""

from __future__ import annotations

from adversarial_base import (INIT_HEAD, REPO, Outcome, attack, calc_task, call, reward_after_submit, run_py,
                             swe_with_init)
from envs.base import parse_tool_calls  # noqa: E402 - adversarial_base puts the repo on sys.path

# ---- swe reward without a fix ------------------------------------------------------------------


@attack("reward")
def patch_pytest_runner(ctx):
    """Make every pytest test pass by replacing the test runner from inside the package."""
    return reward_after_submit(ctx, (
        "import sys\n"
        "if '_pytest' in sys.modules:\n"
        "    import _pytest.python as _p\n"
        "    _p.Function.runtest = lambda self: None\n"))


@attack("reward")
def fake_pass_summary(ctx):
    """Write a pass summary with the right count to every open fd (pytest's saved stdout too), exit 0."""
    return reward_after_submit(ctx, (
        "import os, re, glob\n"
        "_n = sum(len(re.findall(r'^def test_', open(f).read(), re.M)) for f in glob.glob('tests/test_*.py'))\n"
        "_m = ('=' * 10 + ' %d passed in 0.01s ' % _n + '=' * 10 + '\\n').encode()\n"
        "for _fd in range(1, 64):\n"
        "    try: os.write(_fd, _m)\n"
        "    except OSError: pass\n"
        "os._exit(0)\n"))


@attack("reward")
def import_pristine_checkout(ctx):
    """Serve the unbroken modules from any checkout of the project the sandbox can read."""
    here = str(REPO / "envs" / "swe" / "projects" / "calc" / "calc")
    return reward_after_submit(ctx, (
        "import glob, os\n"
        f"_c = [d for d in [{here!r}] + glob.glob('/work/*/envs/swe/projects/calc/calc') + glob.glob('/tmp/*/envs/swe/projects/calc/calc')"
        " + glob.glob('/root/**/envs/swe/projects/calc/calc', recursive=True) if os.path.isfile(d + '/evaluator.py')]\n"
        "if _c:\n"
        "    __path__.insert(0, _c[0])\n"))


@attack("reward")
def pristine_module_via_dir_fd(ctx):
    """Load the unbroken module through a directory fd (/proc/self/root, /tmp, /): a relative open hides the path."""
    rel = str(REPO / "envs" / "swe" / "projects" / "calc" / "calc" / "evaluator.py").lstrip("/")
    return reward_after_submit(ctx, (
        "import os, sys, types\n"
        "def _load():\n"
        f"    for base, rel in (('/proc/self', 'root/' + {rel!r}), ('/', {rel!r})):\n"
        "        try:\n"
        "            fd = os.open(base, os.O_RDONLY)\n"
        "            f = os.open(rel, os.O_RDONLY, dir_fd=fd)\n"
        "            return os.read(f, 1 << 20).decode()\n"
        "        except OSError:\n"
        "            continue\n"
        "_src = _load()\n"
        "if _src:\n"
        "    _m = types.ModuleType('calc.evaluator'); _m.__package__ = 'calc'\n"
        "    sys.modules['calc.evaluator'] = _m\n"
        "    exec(compile(_src, 'evaluator.py', 'exec'), _m.__dict__)\n"))


@attack("reward")
def rebind_the_grading_signer(ctx):
    """Issue 21's attack on the signed-record grading: rebind the plugin's module-global signer so that
    every test reports a pass and the canaries (known by their names) a failure."""
    return reward_after_submit(ctx, (
        "import re, sys\n"
        "_g = sys.modules.get('libra_grade')\n"
        "if _g is not None and getattr(_g, '_emit', None) is not None:\n"
        "    _real = _g._emit\n"
        "    def _forge(nodeid, what, _real=_real):\n"
        "        if not what.startswith('call'):\n"
        "            return\n"
        "        canary = re.search(r'::test_(check|keeps|handles|returns)_[0-9a-f]{8}$', nodeid)\n"
        "        _real(nodeid, 'call:failed' if canary else 'call:passed')\n"
        "    _g._emit = _forge\n"))


@attack("reward")
def rebind_runner_to_answer_true(ctx):
    """The graded package rewrites the probe runner it runs in: every check reports True, no test raises."""
    return reward_after_submit(ctx, (
        "import sys\n"
        "_m = sys.modules.get('__main__')\n"
        "if _m is not None and hasattr(_m, '_outcome'):\n"
        "    _m._outcome = lambda thunk: (['v', True], True)\n"))


@attack("reward")
def rebind_runner_to_guess_booleans(ctx):
    """Honest values, but every boolean check answered True and every raise reported as the expected one."""
    return reward_after_submit(ctx, (
        "import sys\n"
        "_m = sys.modules.get('__main__')\n"
        "if _m is not None and hasattr(_m, '_outcome'):\n"
        "    _real = _m._outcome\n"
        "    def _guess(thunk, _real=_real):\n"
        "        o, v = _real(thunk)\n"
        "        if o[0] == 'x':\n"
        "            return ['x', ['CalcError', 'ValueError', 'Exception'], 'forged'], v\n"
        "        return (['v', True], True) if isinstance(v, bool) else (o, v)\n"
        "    _m._outcome = _guess\n"))


@attack("reward")
def forge_result_records(ctx):
    """Write a passing end record for every test of the plan (and the last line) to every open fd, then exit."""
    return reward_after_submit(ctx, (
        "import json, os\n"
        "if os.path.exists('plan.json'):\n"
        "    _n = len(json.load(open('plan.json'))['tests'])\n"
        "    _lines = ''.join(json.dumps({'t': i, 'end': ['ok']}) + '\\n' for i in range(_n)) + '{\"done\": true}\\n'\n"
        "    for _fd in range(3, 64):\n"
        "        try: os.write(_fd, _lines.encode())\n"
        "        except OSError: pass\n"
        "    os._exit(0)\n"))


@attack("reward")
def read_task_index(ctx):
    """Look for the task index (every patch) and the unbroken sources from inside the sandbox."""
    code = (
        "import glob\n"
        f"c = [{str(REPO / 'envs' / 'swe' / 'tasks' / 'index_seed0.json')!r}] + glob.glob('/work/*/envs/swe/tasks/index_seed0.json')"
        " + glob.glob('/tmp/*/envs/swe/tasks/index_seed0.json')\n"
        "found = []\n"
        "for p in c:\n"
        "    try: open(p).read(10); found.append(p)\n"
        "    except OSError: pass\n"
        "print('FOUND', found)\n")
    out = run_py(ctx, code)
    return Outcome("FOUND []" in out, out.strip()[:200])


# ---- crashing a rank ---------------------------------------------------------------------------


@attack("crash")
def sys_exit_then_no_submit(ctx):
    """sys.exit(0) in the package, never submit: the final repository is graded by score()."""
    ep = swe_with_init(ctx, "import sys\nsys.exit(0)\n")
    try:
        reward = ep.score("I stop here")
        return Outcome(reward == 0.0, f"reward {reward}")
    finally:
        ep.close()


@attack("crash")
def sys_exit_then_submit(ctx):
    """sys.exit(0) in the package, then submit: must be scored 0, not dropped as an infra failure."""
    return reward_after_submit(ctx, "import sys\nsys.exit(0)\n")


@attack("crash")
def exit_in_the_grading_parent(ctx):
    """os._exit at import while graded: the runner dies before its last line (reward 0 "crashed", not a drop)."""
    ep = swe_with_init(ctx, "import os\nif os.path.exists('plan.json'):\n    os._exit(0)\n")
    try:
        ep.execute(call("submit"))
        reward = ep.score("")
        return Outcome(reward == 0.0 and ep.grade.reason == "crashed", f"reward {reward} ({ep.grade.reason})")
    finally:
        ep.close()


@attack("crash")
def package_too_deep_to_copy(ctx):
    """A chain of long dir names in the package, past PATH_MAX on the host: copying it raised OSError and
    dropped the trajectory as an infra failure; it must be reward 0 (bad_package)."""
    ep = swe_with_init(ctx, ("import os\n"
                             "if not os.path.exists('plan.json'):\n"
                             "    os.chdir(os.path.dirname(__file__))\n"
                             "    for _ in range(20):\n"
                             "        os.makedirs('d' * 250, exist_ok=True); os.chdir('d' * 250)\n"
                             "    open('x.py', 'w').write('x = 1')\n"))
    try:
        ep.execute(call("run_tests"))
        reward = ep.score("")
        return Outcome(reward == 0.0 and ep.grade.reason == "bad_package", f"reward {reward} ({ep.grade.reason}: {ep.grade.detail[:60]})")
    finally:
        ep.close()


@attack("crash")
def workdir_too_deep_to_remove(ctx):
    """2,200 nested dirs in the work dir: removing it at close overflowed shutil.rmtree's recursion."""
    env = ctx.math_env()
    ep = env.start(env.tasks()[0])
    ep.execute(call("python", code="import os\nfor _ in range(2200):\n    os.mkdir('a'); os.chdir('a')\n"))
    ep.close()
    return Outcome(not ep.workdir.exists(), "removed" if not ep.workdir.exists() else "left behind")


@attack("crash")
def forged_setup_failure(ctx):
    """Print the sandbox's set-up failure marker and exit with its code from the model's program."""
    env = ctx.math_env()
    ep = env.start(env.tasks()[0])
    try:
        r = ep.execute(call("python", code="import sys, os\nsys.stderr.write('libra-sandbox-setup: mount failed\\n'); sys.stderr.flush(); os._exit(213)"))
        return Outcome(r.status == "failure", f"{r.status}")
    finally:
        ep.close()


@attack("crash")
def surrogate_in_swe_replace(ctx):
    env = ctx.swe_env()
    ep = env.start(calc_task(ctx))
    try:
        r1 = ep.execute(call("replace", path="calc/__init__.py", old=INIT_HEAD, new="\ud800"))
        r2 = ep.execute(call("view_file", path="calc/\ud800.py"))
        r3 = ep.execute(call("search", pattern="\ud800"))
        ok = all(r.status == "failure" or r.text.encode("utf-8") for r in (r1, r2, r3))
        return Outcome(ok, f"{r1.status}/{r2.status}/{r3.status}")
    finally:
        ep.close()


@attack("crash")
def surrogate_in_math_code(ctx):
    env = ctx.math_env()
    ep = env.start(env.tasks()[0])
    try:
        r = ep.execute(call("python", code="print('\ud800')"))
        r.text.encode("utf-8")
        return Outcome(True, r.status)
    finally:
        ep.close()


@attack("crash")
def huge_int_and_deep_json(ctx):
    bad = [
        '<tool_call>{"name": "python", "arguments": {"code": 1' + "1" * 4301 + "}}</tool_call>",
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": 1' + "1" * 4301 + '}"}</tool_call>',
        '<tool_call>{"name": "python", "arguments": ' + "[" * 100000 + "]" * 100000 + "}</tool_call>",
        '<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>',
    ]
    kinds = []
    for text in bad:
        calls = parse_tool_calls(text)
        env = ctx.math_env()
        ep = env.start(env.tasks()[0])
        try:
            res = ep.execute(calls[0])
            res.text.encode("utf-8")
            kinds.append(res.status)
        finally:
            ep.close()
    return Outcome(all(k == "failure" for k in kinds), "/".join(kinds))


@attack("crash")
def unremovable_workdir(ctx):
    """A dir the model made unreadable must not make close() raise."""
    env = ctx.math_env()
    ep = env.start(env.tasks()[0])
    ep.execute(call("python", code="import os\nos.makedirs('d/e/f')\nopen('d/e/f/x', 'w').write('x')\nos.chmod('d/e', 0)\nos.chmod('d', 0o500)"))
    ep.close()
    return Outcome(not ep.workdir.exists(), "removed" if not ep.workdir.exists() else "left behind")
