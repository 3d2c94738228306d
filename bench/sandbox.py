"""Sandbox overhead: median latency of a trivial command in the sandbox vs a bare subprocess.

Runs `true` (and a trivial `python -c pass`) N times each way, alternating so that machine noise
hits both alike, and prints a table; the last line is `sandbox_vs_bare: R`, the ratio of the
medians for `true` (the fixed cost of the isolation: namespaces, mounts, rlimits, cleanup).

    python -m bench.sandbox [--num-calls 100] [--run-tests-calls 4]

Also: swe `run_tests` throughput with 1, 4 and 16 concurrent trajectories (real pytest runs in
the sandbox), to show how far the 2 cores stretch.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from envs.sandbox import Sandbox, SandboxConfig


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
    from envs.swe import SweEnv

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-calls", type=int, default=100)
    ap.add_argument("--run-tests-calls", type=int, default=4, help="run_tests calls per trajectory (0 skips it)")
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
    print(f"sandbox_vs_bare: {ratio:.2f}")


if __name__ == "__main__":
    main()
