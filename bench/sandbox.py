"""Sandbox overhead: median latency of a trivial command in the sandbox vs a bare subprocess.

Runs `true` (and a trivial `python -c pass`) N times each way, alternating so that machine noise
hits both alike, and prints a table; the last line is `sandbox_vs_bare: R`, the ratio of the
medians for `true` (the fixed cost of the isolation: namespaces, mounts, rlimits, cleanup).

    python -m bench.sandbox [--num-calls 100] [--run-tests-calls 4]

Also: swe `run_tests` throughput with 1, 4 and 16 concurrent trajectories (real pytest runs in
the sandbox), to show how far the 2 cores stretch; and the cost of one swe grading (the probe
runs of envs/swe/grade.py, the reference run made beforehand) against a plain pytest run of the
hidden tests in a copy of the package (`_pytest_grade`, the grading before issue 16, kept here
only as the baseline), alternated in one run: `grading_probe_vs_pytest: R`. (The signed-record
grading that the probes replaced measured 1.20x of this baseline on the same machine.)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from envs.sandbox.sandbox import Sandbox, SandboxConfig


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def measure(num_calls: int) -> dict[str, dict[str, list[float]]]:
    sb = Sandbox(SandboxConfig(timeout_s=10))
    out: dict[str, dict[str, list[float]]] = {}
    with sb.workdir("bench") as w:
        for label, argv in (("true", ["true"]), ("python -c pass", [sys.executable, "-c", "pass"])):
            bare, boxed = [], []
            for _ in range(num_calls):
                t0 = time.perf_counter()
                subprocess.run(argv, cwd=w, check=True)
                bare.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                r = sb.run(argv, cwd=w)
                boxed.append(time.perf_counter() - t0)
                assert r.status == "success", r
            out[label] = {"bare": bare, "sandbox": boxed}
    out["_isolation"] = sb.isolation  # type: ignore[assignment]
    return out


def run_tests_throughput(concurrency: int, calls_each: int) -> float:
    """swe `run_tests` calls per second with `concurrency` trajectories calling at once."""
    from concurrent.futures import ThreadPoolExecutor

    from envs.base import ToolCall
    from envs.swe.env import SweEnv

    env = SweEnv(seed=0, num_tasks=concurrency)
    episodes = [env.start(t) for t in env.tasks()[:concurrency]]

    def one(ep):
        for _ in range(calls_each):
            ep.execute(ToolCall("run_tests", {}))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, episodes))
    rate = concurrency * calls_each / (time.perf_counter() - t0)
    for ep in episodes:
        ep.close()
    env.close()
    return rate


def _pytest_grade(sb: Sandbox, workdir, package: str, repo) -> float:
    """The grading before issue 16: copy package + pristine tests, trust pytest's exit code and summary."""
    import shutil

    from envs.swe import mutate as mut
    from envs.swe.tools import count_results

    with sb.workdir("swe-score") as score_dir:
        shutil.copytree(repo, score_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", package, "tests"))
        shutil.copytree(workdir / package, score_dir / package, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(repo / "tests", score_dir / "tests", ignore=shutil.ignore_patterns("__pycache__"))
        sb.own(score_dir)
        res = sb.run(mut.pytest_argv(), cwd=score_dir, timeout_s=30.0, env=mut.PYTEST_ENV)
    counts = count_results(res.output)
    return 1.0 if res.status == "success" and counts.get("passed", 0) > 0 and len(counts) == 1 else 0.0


def grading_cost(num_calls: int, project: str = "calc") -> dict[str, list[float]]:
    """Seconds per grading of one episode with its bug fixed, pytest and probes alternated."""
    from envs.swe import mutate as mut
    from envs.base import ToolCall
    from envs.swe.env import SweEnv

    env = SweEnv(seed=0)
    task = next(t for t in env.tasks() if t.meta["project"] == project)
    ep = env.start(task)
    ep.execute(ToolCall("replace", {"path": task.meta["file"], "old": task.answer["patch_old"], "new": task.answer["patch_new"]}))
    repo = mut.PROJECTS_DIR / project
    ref = ep._reference()
    env.grader.suite(ref)  # the reference run: once per suite and process, not per grading
    out: dict[str, list[float]] = {"pytest": [], "probe": []}
    for _ in range(num_calls):
        t0 = time.perf_counter()
        assert _pytest_grade(env.sandbox, ep.workdir, project, repo) == 1.0
        out["pytest"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        g = env.grader.grade(ep.workdir, ref)
        assert g.reward == 1.0, g
        out["probe"].append(time.perf_counter() - t0)
    ep.close()
    env.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-calls", type=int, default=100)
    ap.add_argument("--run-tests-calls", type=int, default=4, help="run_tests calls per trajectory (0 skips it)")
    ap.add_argument("--grading-calls", type=int, default=10, help="swe gradings each way (0 skips it)")
    args = ap.parse_args()
    if args.run_tests_calls:
        print(f"{'concurrent trajectories':<24}{'run_tests/s':>12}")
        for n in (1, 4, 16):
            print(f"{n:<24}{run_tests_throughput(n, args.run_tests_calls):>12.2f}")
    res = measure(args.num_calls)
    print(f"isolation: {res.pop('_isolation')}   calls per cell: {args.num_calls}")
    print(f"{'command':<16}{'mode':<9}{'median ms':>10}{'p90 ms':>9}{'p99 ms':>9}")
    for label, modes in res.items():
        for mode, xs in modes.items():
            print(f"{label:<16}{mode:<9}{1e3 * statistics.median(xs):>10.1f}{1e3 * _quantile(xs, 0.9):>9.1f}{1e3 * _quantile(xs, 0.99):>9.1f}")
        ratio = statistics.median(modes["sandbox"]) / statistics.median(modes["bare"])
        print(f"{label:<16}{'ratio':<9}{ratio:>10.2f}")
    ratio = statistics.median(res["true"]["sandbox"]) / statistics.median(res["true"]["bare"])
    if args.grading_calls:
        print(f"{'swe grading':<16}{'mode':<9}{'median ms':>10}{'p90 ms':>9}")
        ratios = []
        for project in ("calc", "intervals"):  # one equality-run test vs eight
            g = grading_cost(args.grading_calls, project)
            for mode, xs in g.items():
                print(f"{project:<16}{mode:<9}{1e3 * statistics.median(xs):>10.1f}{1e3 * _quantile(xs, 0.9):>9.1f}")
            ratios.append(statistics.median(g["probe"]) / statistics.median(g["pytest"]))
        print(f"grading_probe_vs_pytest: {max(ratios):.2f}")
    print(f"sandbox_vs_bare: {ratio:.2f}")


if __name__ == "__main__":
    main()
