"""Scheduler benchmark: router decision cost, planner search time, CPU cost-model calibration.

    python -m bench.scheduler [--events 50000] [--in-flight 10000]

1. Calibrate the `cpu` hardware entry: numpy fp32 matmul flops and memcpy bandwidth ->
   `scheduler.costmodel.calibrate_cpu` (the scheduler itself never imports numpy/torch).
2. Router cost: a 64-rank layout (48 rollout ranks: 32 x TP1 short, 4 x TP2 medium, 2 x TP4 long),
   a prefix tree warmed with 2,000 synthetic trajectories, 10,000 requests in flight; then a
   stream of decode boundaries (70%) and tool returns (30%), each call timed on its own.
3. Planner: one full search for G = 8, 48, 160, 1024 on a 512-trajectory long-tailed workload.

Goals (issue): router median <= 20 us per event; planner <= 1 s at G = 1024.
Last line: `router_median_us: X` (C-MLFQ).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np

from scheduler.api import OutcomeState
from scheduler.cmlfq import CMLFQRouter
from scheduler.costmodel import calibrate_cpu, get_cost_model
from scheduler.layout import BucketsConfig, split_role_map
from scheduler.planner import GlobalPlanner, Workload
from scheduler.prefix_tree import PrefixTreeConfig
from scheduler.routers import RouterConfig
from scheduler.systems import ROUTERS

OUTCOMES = [OutcomeState(t, s, x) for t in ("run_tests", "search", "python") for s in ("small", "medium", "large")
            for x in ("success", "failure", "timeout")]


def measure_cpu() -> dict[str, float]:
    a = np.random.rand(1024, 1024).astype(np.float32)
    a @ a
    t = time.perf_counter()
    for _ in range(5):
        a @ a
    flops = 5 * 2 * 1024**3 / (time.perf_counter() - t)
    buf = np.ones(64 * 2**20 // 4, dtype=np.float32)
    out = np.empty_like(buf)
    np.copyto(out, buf)
    t = time.perf_counter()
    for _ in range(5):
        np.copyto(out, buf)
    mem = 5 * 2 * buf.nbytes / (time.perf_counter() - t)  # read + write
    return {"flops_per_s": flops, "mem_bytes_per_s": mem}


def _synthetic(rng: random.Random, cfg: RouterConfig):
    """One trajectory: outcomes drive the length (failures lengthen it), like the SWE workload."""
    n_tools = rng.randint(0, 6)
    outs, at, tok = [], [], rng.randint(100, 400)
    for _ in range(n_tools):
        tok += rng.randint(100, 1500)
        o = rng.choice(OUTCOMES)
        outs.append(o)
        at.append(tok)
        tok += rng.randint(2000, 6000) if o.status == "failure" else 0
    return outs, at, tok + rng.randint(50, 500)


def bench_router(kind: str, num_events: int, in_flight: int, seed: int = 0) -> list[float]:
    cfg = RouterConfig(tree=PrefixTreeConfig(window=2000, rebuild_every=10**9, min_samples=4))
    rm = split_role_map(world_size=64, num_trainer=16,
                        rollout_tp=(("short", 1),) * 32 + (("medium", 2),) * 4 + (("long", 4),) * 2,
                        buckets=BucketsConfig().buckets())
    r = ROUTERS[kind](cfg)
    r.set_layout(rm, 0.0)
    rng = random.Random(seed)
    for i in range(2000):
        outs, at, total = _synthetic(rng, cfg)
        r.admit(f"w{i}", f"p{i % 200}", at[0] if at else 100, 0.0)
        for o, a in zip(outs, at):
            r.on_tool_return(f"w{i}", o, a, 0.0)
        r.on_finish(f"w{i}", total, 0.0)
    if isinstance(r, CMLFQRouter):
        r.tree.rebuild()
    tokens = {}
    for i in range(in_flight):
        r.admit(f"r{i}", f"p{i % 200}", 200, 0.0)
        tokens[f"r{i}"] = 200
    ids = list(tokens)
    plan = [(rng.random() < 0.3, rng.choice(ids), rng.randint(1, 400), rng.choice(OUTCOMES)) for _ in range(num_events)]
    times, clock = [], time.perf_counter_ns
    for is_tool, rid, step, o in plan:
        tok = tokens[rid] + step
        tokens[rid] = tok
        t0 = clock()
        if is_tool:
            r.on_tool_return(rid, o, tok, 1.0)
        else:
            r.on_decode(rid, tok, 1.0)
        times.append((clock() - t0) / 1e3)
    return times


def bench_planner(g: int) -> tuple[float, str]:
    rng = random.Random(0)
    lens = tuple(int(min(32000, rng.paretovariate(1.3) * 1500)) for _ in range(512))
    cm = get_cost_model("a800", "qwen3-14b")
    p = GlobalPlanner(None, cm, g, 100)
    t = time.perf_counter()
    d = p.plan(Workload(trajectory_tokens=lens, num_trajectories=512, train_tokens=sum(lens)))
    return time.perf_counter() - t, d.role_map.describe()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--in-flight", type=int, default=10_000)
    args = ap.parse_args()

    hw = calibrate_cpu(measure_cpu())
    print(f"cpu calibration: {hw.peak_flops / 1e9:.1f} GFLOP/s fp32 matmul, {hw.mem_bw_bytes_s / 1e9:.1f} GB/s memcpy")

    print(f"\nrouter decision cost, {args.in_flight} requests in flight, {args.events} events (us per event)")
    print(f"{'router':<14}{'median':>10}{'p99':>10}{'max':>10}")
    medians = {}
    for kind in ("cmlfq", "la_mlfq", "length_aware", "least_load"):
        ts = sorted(bench_router(kind, args.events, args.in_flight))
        medians[kind] = statistics.median(ts)
        print(f"{kind:<14}{medians[kind]:>10.2f}{ts[int(0.99 * len(ts))]:>10.2f}{ts[-1]:>10.1f}")

    print("\nplanner search time (a800, qwen3-14b, 512 long-tailed trajectories)")
    print(f"{'G':>6}{'seconds':>10}  plan")
    for g in (8, 48, 160, 1024):
        secs, desc = bench_planner(g)
        print(f"{g:>6}{secs:>10.3f}  {desc}")
    print(f"router_median_us: {medians['cmlfq']:.2f}")


if __name__ == "__main__":
    main()
