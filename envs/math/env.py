"""`math`: a DAPO-Math-like benchmark of generated word problems with a sandboxed `python` tool.

(Named `mathenv.py` so that it never shadows the standard library's `math`.)

Algorithm:
1. From the seed, generate word problems from templates at four levels (0: multi-step integer
   arithmetic, 1: rates and fractions, 2: modular powers and counting, 3: sums over ranges
   with divisibility conditions). Each answer is computed exactly (int or Fraction) and kept
   with a short Python program that prints it.
2. Tool `python(code)` writes the code to the episode's sandbox work dir and runs it
   (envs/sandbox/sandbox.py): stdout/stderr come back, status success/failure/timeout.
3. The answer goes in `\\boxed{...}` (last one counts); reward 1 when it is equivalent to the
   gold answer (envs/math/grade.py: an exact match, else math_verify in a process of its own
   with a deadline that counts its wait, right on any thread, slow answers never delaying honest
   ones), else 0; the reward says why (correct, wrong, no_answer, timeout, grader_error): a
   grading timeout is a scored 0, never a dropped trajectory.

Tasks can also come from a verl-schema file (`data_path`, DAPO-Math rows; envs/datasets.py).

Invariants (tests/envs/math/test_envs_math.py): same seed -> byte-identical tasks; the oracle agent scores
1 and the wrong agent 0; equivalent forms (`0.5`/`\\frac{1}{2}`, `96.0`, `x = 96`, `\\dfrac`,
`p/q`, units, intervals) score 1 and junk 0 on a worker thread and through the coordinator;
malformed calls give failures.
"""

from __future__ import annotations

import collections
import math
import random
import sys
from dataclasses import dataclass
from fractions import Fraction
from math import comb

from envs.base import Episode, Reward, Task, ToolCall, ToolCallError, ToolResult, dispatch, system_prompt, tool_schema
from envs.config import EnvConfig
from envs.datasets import load_verl_tasks
from envs.sandbox.hostfs import write_file
from envs.math.grade import MathGrader
from envs.sandbox.sandbox import Sandbox, SandboxConfig
from envs.toolcalls import format_tool_call

_NAMES = ("Ava", "Ben", "Chen", "Dara", "Eli", "Farah", "Goro", "Hana", "Ivan", "Jia", "Kofi", "Lena")
_ITEMS = ("apples", "marbles", "stickers", "coins", "books", "stamps")
NUM_LEVELS = 4
# What the sandbox hides from a policy: nothing. A generated task keeps its answer in this process; a `data_path`
# file is read before any call, and is the caller's to keep out of the dirs a sandbox binds (system dirs, the
# interpreter's prefixes).
HIDDEN_DATA_DIRS: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class MathConfig:
    num_tasks: int = 200  # generated tasks when the caller does not say
    timeout_s: float = 5.0  # wall limit of one python call
    memory_mb: int = 512  # address-space limit of one python call
    max_output_bytes: int = 8192  # stdout/stderr each cut to this
    max_code_bytes: int = 32768  # longer code is refused with a failure result
    max_concurrent: int = 8  # python calls running at once across episodes
    grade_timeout_s: float = 5.0  # wall limit of one answer comparison (math_verify in a worker)
    grade_workers: int = 16  # answer comparisons graded at once (each a fork of one warm process); more wait, within their deadline

    def __post_init__(self):
        for name in ("num_tasks", "timeout_s", "memory_mb", "max_output_bytes", "max_code_bytes", "max_concurrent",
                     "grade_timeout_s", "grade_workers"):
            if getattr(self, name) <= 0:
                raise ValueError(f"MathConfig.{name}={getattr(self, name)} must be > 0; pass a positive value.")


def format_answer(value: int | Fraction) -> str:
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


# ---- problem generators: (question, answer, python that prints it) --------------------------


def _level0(rng: random.Random) -> tuple[str, Fraction, str]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b, c, d = rng.randint(5, 60), rng.randint(2, 9), rng.randint(3, 15), rng.randint(1, 20)
    q = (f"{name} has {a} {item}, buys {b} boxes with {c} {item} in each, and then gives away {d} {item}. "
         f"How many {item} does {name} have now?")
    return q, Fraction(a + b * c - d), f"print({a} + {b} * {c} - {d})"


def _level1(rng: random.Random) -> tuple[str, Fraction, str]:
    q_, hours = rng.randint(2, 9), rng.randint(2, 12)
    p = rng.randint(1, q_ - 1)
    drain = rng.randint(1, 5)
    rate = Fraction(p, q_)
    ans = rate * hours - Fraction(drain, q_ + 1)
    q = (f"A tank fills at {p}/{q_} liters per hour for {hours} hours, then {drain}/{q_ + 1} liters leak out. "
         f"How many liters are in the tank? Give an exact fraction.")
    code = f"from fractions import Fraction as F\nprint(F({p}, {q_}) * {hours} - F({drain}, {q_ + 1}))"
    return q, ans, code


def _level2(rng: random.Random) -> tuple[str, Fraction, str]:
    if rng.random() < 0.5:
        base, exp, mod = rng.randint(2, 19), rng.randint(50, 500), rng.randint(7, 97)
        q = f"What is the remainder when {base}^{exp} is divided by {mod}?"
        return q, Fraction(pow(base, exp, mod)), f"print(pow({base}, {exp}, {mod}))"
    n, k, m = rng.randint(8, 20), rng.randint(2, 5), rng.randint(2, 4)
    q = f"A club has {n} members. In how many ways can it choose a committee of {k} members and then, from the remaining members, {m} greeters?"
    return q, Fraction(comb(n, k) * comb(n - k, m)), f"from math import comb\nprint(comb({n}, {k}) * comb({n - k}, {m}))"


def _level3(rng: random.Random) -> tuple[str, Fraction, str]:
    lo, hi, a, b, m = rng.randint(1, 50), rng.randint(200, 900), rng.randint(1, 7), rng.randint(0, 9), rng.randint(3, 11)
    ans = sum(n for n in range(lo, hi + 1) if (n * n + a * n + b) % m == 0)
    q = f"Find the sum of all integers n with {lo} <= n <= {hi} such that n^2 + {a}n + {b} is divisible by {m}."
    code = f"print(sum(n for n in range({lo}, {hi + 1}) if (n * n + {a} * n + {b}) % {m} == 0))"
    return q, Fraction(ans), code


_GENERATORS = (_level0, _level1, _level2, _level3)

PYTHON_TOOL = tool_schema("python", "Run a Python 3 program in a sandbox (no network, a few seconds); returns its stdout and stderr.",
                          {"code": ("string", "the complete program; print what you need")})
SYSTEM = system_prompt(
    "Solve the math problem. You may run Python with the tool `python` to compute exactly.",
    format_tool_call("python", {"code": "print(2**10 % 7)"}),
    "give the final answer in \\boxed{...}, e.g. \\boxed{42} or \\boxed{\\frac{3}{4}}.",
)


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


_REASONS = {"exact": "correct", "verified": "correct", "not_equal": "wrong"}  # else timeout / grader_error


class MathEpisode:
    def __init__(self, env: MathEnv, task: Task):
        self.env, self.task = env, task
        self.workdir = env.sandbox.make_workdir("math")

    def _python(self, code: str) -> ToolResult:
        # a fresh file each call (write + rename): a link the last call planted is replaced, not followed
        write_file(self.workdir, "main.py", code.encode("utf-8"), self.env.sandbox.owner)
        r = self.env.sandbox.run([sys.executable, "main.py"], cwd=self.workdir)
        text = r.output + ("\n[output truncated]" if r.truncated else "")
        if r.status == "timeout":
            text += f"\n[timed out after {self.env.cfg.timeout_s:g} s]"
        return ToolResult(tool="python", text=text or "(no output)", status=r.status, latency_s=r.latency_s)

    def execute(self, call: ToolCall | ToolCallError) -> ToolResult:
        return dispatch(call, self.task.tools, {"python": self._python}, max_arg_bytes=self.env.cfg.max_code_bytes,
                        faults=self.env.faults)

    def score(self, final_text: str) -> Reward:
        pred = last_boxed(final_text)
        if pred is None:
            return Reward(0.0, "no_answer")
        equal, why = self.env.grader.equal(pred, _gold(self.task))
        return Reward(1.0 if equal else 0.0, _REASONS.get(why, why))

    def close(self) -> None:
        if self.workdir.exists():
            self.env.sandbox.remove_workdir(self.workdir)


class MathEnv:
    name = "math"

    def __init__(self, *, seed: int = 0, num_tasks: int | None = None, data_path: str | None = None,
                 level: int | None = None, cfg: MathConfig = MathConfig(), sandbox: Sandbox | None = None,
                 env_cfg: EnvConfig | None = None):
        if level is not None and not 0 <= level < NUM_LEVELS:
            raise ValueError(f"math: level={level} must be in [0, {NUM_LEVELS - 1}]; pick one of those or None.")
        self.cfg, self.seed, self.level = cfg, seed, level
        # the CPU limit a second past the wall timeout: equal, a busy loop on a quiet machine could be killed
        # for CPU a moment before the timeout is seen, and report "failure" instead of "timeout"
        self.sandbox = sandbox or Sandbox(SandboxConfig.from_env(
            env_cfg, timeout_s=cfg.timeout_s, cpu_s=math.ceil(cfg.timeout_s) + 1, memory_mb=cfg.memory_mb,
            max_output_bytes=cfg.max_output_bytes, max_concurrent=cfg.max_concurrent).hiding(HIDDEN_DATA_DIRS))
        self.sandbox.check_interpreter(["-c", "pass"], "its standard library")
        self.grader = MathGrader(timeout_s=cfg.grade_timeout_s, max_concurrent=cfg.grade_workers)
        self.faults: collections.Counter = collections.Counter()  # "tool:ExceptionType" of model-caused tool errors
        if data_path is not None:
            self._tasks = load_verl_tasks(data_path, bench="math", tools=(PYTHON_TOOL,), system=SYSTEM)[:num_tasks]
        else:
            self._tasks = self._generate(cfg.num_tasks if num_tasks is None else num_tasks)

    def _generate(self, num_tasks: int) -> list[Task]:
        rng = random.Random(f"math-tasks-{self.seed}")
        tasks = []
        for i in range(num_tasks):
            level = self.level if self.level is not None else i % NUM_LEVELS
            question, answer, code = _GENERATORS[level](rng)
            tasks.append(Task(
                task_id=f"math-{self.seed}-{i}", bench="math", level=level,
                messages=({"role": "system", "content": SYSTEM}, {"role": "user", "content": question}),
                tools=(PYTHON_TOOL,), answer={"answer": format_answer(answer), "code": code},
            ))
        return tasks

    def tasks(self) -> list[Task]:
        return list(self._tasks)

    def start(self, task: Task) -> Episode:
        return MathEpisode(self, task)

    def close(self) -> None:
        self.grader.close()


def _call(code: str) -> str:
    return format_tool_call("python", {"code": code})


def _gold(task: Task) -> str:
    return task.answer["answer"] if isinstance(task.answer, dict) else str(task.answer)


def oracle_actions(task: Task) -> list[str]:
    """Run the known program (when there is one), then box the known answer."""
    code = task.answer.get("code") if isinstance(task.answer, dict) else None
    first = [f"Let me compute it.\n{_call(code)}"] if code else []
    return [*first, f"The answer is \\boxed{{{_gold(task)}}}."]


def wrong_actions(task: Task) -> list[str]:
    """Box a number that differs from the answer, without computing anything."""
    gold = _gold(task)
    wrong = "-7" if gold.strip() != "-7" else "-8"
    if gold.lstrip("-").isdigit():
        wrong = str(int(gold) + 1)
    return [f"I guess.\nThe answer is \\boxed{{{wrong}}}."]
